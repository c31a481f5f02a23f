"""Tiny real transformers models for tests: random weights, fixed seeds, a real BPE tokenizer
(`tests/tiny_tokenizer.py`).

Each builder writes a Hugging Face model folder with `save_pretrained`, so tests load it through
the same code users run (`modules.models.load_model`). Nothing is downloaded.
- `build_llama(path)`: a Llama causal LM with a chat template.
- `build_llava(path)`: a `LlavaForConditionalGeneration` with its `LlavaProcessor` (CLIP tower, 32 px, 16 image tokens).
- `build_llava_next(path)`: a `LlavaNextForConditionalGeneration` (token count depends on the image size).
- `build_llava_original(path, clip_path)`: an original LLaVA layout: `llava_llama` config with
  `model.mm_projector.*` tensors in the LM folder, plus a separate tiny CLIP vision folder.
- `with_sampler_defaults(source, path)`: a copy of a model folder whose generation_config.json holds
  a checkpoint's own sampler defaults (`CHECKPOINT_SAMPLERS`), which the host must never apply.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import (CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel, GenerationConfig, LlamaConfig,
                          LlamaForCausalLM, LlavaConfig, LlavaForConditionalGeneration, LlavaNextConfig,
                          LlavaNextForConditionalGeneration, LlavaNextProcessor, LlavaProcessor,
                          PreTrainedTokenizerFast)
from safetensors.torch import load_file, save_file

from tests import tiny_tokenizer

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "<im_start>", "<im_end>", "<im_patch>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}USER: {{ m['content'] }}\n"
    "{% else %}ASSISTANT: {{ m['content'] }}</s>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
CORPUS = [
    "USER: What is in the picture? ASSISTANT: A red circle on a white background.",
    "USER: Describe the image. ASSISTANT: There is a blue square and a green triangle.",
    "The quick brown fox jumps over the lazy dog. Hello world! How are you today?",
    "Images, colours, shapes: red green blue yellow purple orange circle square triangle star.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 <script>alert(1)</script> <img src=x onerror=alert(1)>",
    "A long chat with many turns, questions and answers about pictures and text.",
]
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
              image_size=32, patch_size=8, projection_dim=32)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE over `CORPUS` (400 ids, `SPECIAL_TOKENS` first) that puts "<s>" before every encoding."""
    return tiny_tokenizer.build_tokenizer(SPECIAL_TOKENS, bos="<s>", eos="</s>", pad="<pad>", unk="<unk>", add_bos=True,
                                          extra=SPECIAL_TOKENS[4:], chat_template=CHAT_TEMPLATE, corpus=CORPUS,
                                          vocab_size=400)


def text_config(tokenizer) -> LlamaConfig:
    return LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **TEXT)


def build_llama(path: Path, seed: int = 0) -> Path:
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(text_config(tokenizer)).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


# Qwen2's Instruct checkpoints ship do_sample, temperature 0.7, top_p 0.8, top_k 20 and repetition_penalty
# 1.05 in their generation_config.json; min_p and typical_p stand for the samplers the host has no setting for.
CHECKPOINT_SAMPLERS = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05,
                           min_p=0.5, typical_p=0.3)


def with_sampler_defaults(source: Path, path: Path) -> Path:
    """A copy of the model folder `source` (same weights) with `CHECKPOINT_SAMPLERS` in its generation config."""
    shutil.copytree(source, path)
    config = GenerationConfig.from_pretrained(source)
    config.update(**CHECKPOINT_SAMPLERS)
    config.save_pretrained(path)
    return Path(path)


def image_processor(size: int = 32) -> CLIPImageProcessor:
    return CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})


def build_llava(path: Path, seed: int = 0) -> Path:
    tokenizer = build_tokenizer()
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    config = LlavaConfig(vision_config=CLIPVisionConfig(**VISION), text_config=text_config(tokenizer),
                         image_token_index=image_token, image_seq_length=16, vision_feature_layer=-2,
                         vision_feature_select_strategy="default")
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(path)
    # Real llava-hf checkpoints count the CLS token the "default" strategy drops.
    processor = LlavaProcessor(image_processor=image_processor(), tokenizer=tokenizer, patch_size=VISION["patch_size"],
                               vision_feature_select_strategy="default", chat_template=CHAT_TEMPLATE,
                               num_additional_image_tokens=1)
    processor.save_pretrained(path)
    return Path(path)


def build_llava_next(path: Path, seed: int = 0) -> Path:
    tokenizer = build_tokenizer()
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    config = LlavaNextConfig(vision_config=CLIPVisionConfig(**VISION), text_config=text_config(tokenizer),
                             image_token_index=image_token, vision_feature_layer=-2,
                             vision_feature_select_strategy="default",
                             image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]])
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = LlavaNextForConditionalGeneration(config).eval()
    model.save_pretrained(path)
    from transformers import LlavaNextImageProcessor

    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                                image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]]),
        tokenizer=tokenizer, patch_size=VISION["patch_size"], vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE, num_additional_image_tokens=1)
    processor.save_pretrained(path)
    return Path(path)


def build_clip_vision(path: Path, image_size: int = 32, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = CLIPVisionModel(CLIPVisionConfig(**{**VISION, "image_size": image_size})).eval()
    model.save_pretrained(path)
    image_processor(image_size).save_pretrained(path)
    return Path(path)


def build_llava_original(path: Path, clip_path: Path, seed: int = 0) -> Path:
    """An original LLaVA-1.5 layout: Llama LM + `model.mm_projector.{0,2}` (2-layer GELU MLP) tensors."""
    build_llama(path, seed)
    build_clip_vision(clip_path, seed=seed + 1)
    config = json.loads((Path(path) / "config.json").read_text())
    config.update(model_type="llava_llama", architectures=["LlavaLlamaForCausalLM"],
                  mm_vision_tower=str(clip_path), mm_hidden_size=VISION["hidden_size"],
                  mm_projector_type="mlp2x_gelu", mm_vision_select_layer=-2, mm_vision_select_feature="patch",
                  image_aspect_ratio="pad", mm_use_im_start_end=False)
    (Path(path) / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(seed + 2)
    hidden = TEXT["hidden_size"]
    projector = {
        "model.mm_projector.0.weight": torch.randn(hidden, VISION["hidden_size"]) * 0.1,
        "model.mm_projector.0.bias": torch.randn(hidden) * 0.1,
        "model.mm_projector.2.weight": torch.randn(hidden, hidden) * 0.1,
        "model.mm_projector.2.bias": torch.randn(hidden) * 0.1,
    }
    # Original releases keep the projector inside the LM's own shards.
    weights = Path(path) / "model.safetensors"
    save_file({**load_file(str(weights)), **projector}, str(weights), metadata={"format": "pt"})
    return Path(path)
