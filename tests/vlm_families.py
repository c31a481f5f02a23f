"""Tiny random image-text checkpoints, one per vision-language family, for differential tests.

Each `build_<family>(path) -> path` writes a folder that `AutoModelForImageTextToText.from_pretrained`,
the core's `load_processor` and the tests' reference (`tests/hf_reference.py`) load as a user's download
would be: config and safetensors weights (`save_pretrained`), a BPE tokenizer trained here
(`tests/tiny_tokenizer.py`) that carries the family's special tokens, the family's processor class
with its PIL image processor (built by `tests/tiny_processors.py`, images only), and a chat
template that writes the family's image placeholder where the real one does. Nothing is downloaded; building one takes
well under a second.

What makes them worth testing (see ../shared/notes/vlm-families.md, beside this repository): the LM
head is untied from the token embedding, weights are drawn LeCun-normal (std 1/sqrt(fan_in)) rather
than std 0.02, and the tokenizer is ASCII-only. Sizes: text hidden 64, 2 layers; vision hidden 32,
1-2 layers; images of a few dozen pixels give 4-40 tokens each.

Chat templates: each family's template exactly as on the hub (`tests/hub_templates/`, whose README
says where each comes from), so the code meets what users' folders hold: five of them (llava-hf,
LLaVA-NeXT, LLaVA-OneVision, Idefics3, SmolVLM) take content only as a list of parts, two (Llama 3.2
Vision, Mistral Small 3.1) write the date. Aya Vision's could not be found verbatim; it gets a compact
template with its turn markers and image placeholder (`AYA_TEMPLATE`).

`FAMILIES` maps a family name (the config's model_type) to its builder; `llava` and `llava_next`
reuse `tests/tiny_models.py` with this module's weights and their hub templates.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from transformers import PreTrainedTokenizerFast

from tests import tiny_models, tiny_processors, tiny_tokenizer

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048)
# Token embeddings small next to what attention brings in, so replies depend on the image rows.
EMBEDDING_STD = 0.3
CORPUS = tiny_models.CORPUS + [
    "What is in the picture?\n\nIt is a red circle.\n\n\nAnd this one?\nA blue square.\n",
    "Describe both images.\n\nThe first is dark, the second is bright.\n\n\n\nThank you!",
    "Which image is larger? How many shapes? Where is the star? Yes. No. The first. The second.",
]


# -- Tokenizers ------------------------------------------------------------------------------------

def build_tokenizer(specials: list[str], **settings) -> PreTrainedTokenizerFast:
    """`tests/tiny_tokenizer.build_tokenizer` trained on this module's `CORPUS` (ASCII text with runs of newlines)."""
    return tiny_tokenizer.build_tokenizer(specials, corpus=CORPUS, **settings)


def token_id(tokenizer, token: str) -> int:
    return tokenizer.convert_tokens_to_ids(token)


# -- Weights ---------------------------------------------------------------------------------------

@torch.no_grad()
def lecun_init(model: nn.Module, seed: int, embedding_std: float = EMBEDDING_STD) -> nn.Module:
    """Redraw every weight LeCun-normal (std 1/sqrt(fan_in)), embeddings with std `embedding_std`,
    biases to zero, norms left as built; free parameters that would shut the image out are set too.

    With transformers' std 0.02 a tiny model says the same token whatever it sees; with this the
    reply depends on the picture and greedy steps are rarely near-ties.
    """
    generator = torch.Generator().manual_seed(seed)
    for name, module in sorted(model.named_modules(), key=lambda item: item[0]):
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            fan_in = module.weight[0].numel()
            module.weight.copy_(torch.randn(module.weight.shape, generator=generator) / math.sqrt(fan_in))
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * embedding_std)
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        # Free parameters some towers keep outside modules (class embeddings, NeXT's image_newline, ...).
        if name.endswith(("class_embedding", "image_newline", "position_embedding")) and param.dim() >= 1:
            param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[-1]))
        elif name.endswith("mm_input_projection_weight"):  # Gemma 3: x @ W, zeros as built
            param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[0]))
        elif name.endswith(("_gate", ".gate", "gate_attn", "gate_ffn")) and param.numel() == 1:
            param.fill_(1.0)  # Mllama's tanh gates: zero as built, which shuts the image out entirely
    return model


def save(path: Path, model_class, config, processor, seed: int, embedding_std: float = EMBEDDING_STD) -> Path:
    """Build `model_class(config)` with LeCun weights, save it and `processor` to `path`."""
    config.tie_word_embeddings = False
    text_config = config.get_text_config()
    text_config.tie_word_embeddings = False
    torch.manual_seed(seed)
    model = lecun_init(model_class(config), seed, embedding_std).eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return Path(path)


def text_config(tokenizer, **overrides) -> dict:
    return {**TEXT, "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
            "tie_word_embeddings": False, **overrides}


# -- Chat templates --------------------------------------------------------------------------------

HUB_TEMPLATES = Path(__file__).resolve().parent / "hub_templates"


def hub_template(family: str) -> str:
    """The family's chat template as on the hub (tests/hub_templates/README.md: which checkpoint, from where)."""
    return (HUB_TEMPLATES / f"{family}.jinja").read_text()


def content_loop(image: str, text: str = "{{ part['text'] }}") -> str:
    return ("{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
            "{% if part['type'] == 'image' %}" + image + "{% elif part['type'] == 'text' %}" + text +
            "{% endif %}{% endfor %}{% endif %}")


# Aya Vision's hub template was not found verbatim: its turn markers and image placeholder, compactly.
AYA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|START_OF_TURN_TOKEN|>"
    "{{ '<|USER_TOKEN|>' if m['role'] == 'user' else '<|CHATBOT_TOKEN|>' }}" + content_loop("<image>") +
    "<|END_OF_TURN_TOKEN|>{% endfor %}{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}")


# What each family's chat template above writes for one image part, written out (not derived), for
# the tests that check the text the extension puts where a picture goes.
TEMPLATE_IMAGE_TEXT = {
    "llava": "<image>\n", "llava_next": "<image>\n", "llava_onevision": "<image>",
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>", "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>", "gemma3": "<start_of_image>", "mistral3": "[IMG]",
    "idefics3": "<image>", "smolvlm": "<image>", "internvl": "<IMG_CONTEXT>\n", "aya_vision": "<image>",
    "mllama": "<|image|>",
}


# -- Families --------------------------------------------------------------------------------------

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]


def qwen_tokenizer(template: str, bos: str | None = None):
    return build_tokenizer(QWEN_SPECIALS, bos=bos, eos="<|im_end|>", pad="<|endoftext|>", chat_template=template,
                           extra={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                  "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"})


def qwen_vision_ids(tokenizer) -> dict:
    return dict(image_token_id=token_id(tokenizer, "<|image_pad|>"), video_token_id=token_id(tokenizer, "<|video_pad|>"),
                vision_start_token_id=token_id(tokenizer, "<|vision_start|>"),
                vision_end_token_id=token_id(tokenizer, "<|vision_end|>"))


def qwen_image_processor():
    """16-pixel tokens (patch 8, merge 2); between 4 and 64 tokens per image."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, temporal_patch_size=2,
                                    size={"shortest_edge": 4 * 16 * 16, "longest_edge": 64 * 16 * 16})


MODEL_TYPES = {"Qwen2VL": "qwen2_vl", "Qwen2_5_VL": "qwen2_5_vl", "Qwen3VL": "qwen3_vl"}


def build_qwen(path: Path, seed: int, family: str, vision: dict, text: dict | None = None,
               rope: dict | None = None, bos: str | None = None) -> Path:
    """A Qwen-VL family checkpoint: `family` is the transformers class prefix (Qwen2VL, Qwen2_5_VL, Qwen3VL).
    `bos`: a BOS token the tokenizer defines but neither adds nor its template writes."""
    import transformers

    template = hub_template(MODEL_TYPES[family])
    tokenizer = qwen_tokenizer(template, bos=bos)
    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], **(rope or {})}
    config = getattr(transformers, f"{family}Config")(
        text_config=text_config(tokenizer, rope_parameters=rope_parameters, **(text or {})),
        vision_config=dict(depth=2, num_heads=2, patch_size=8, spatial_merge_size=2, temporal_patch_size=2, **vision),
        **qwen_vision_ids(tokenizer))
    processor = tiny_processors.build(f"{family}Processor", image_processor=qwen_image_processor(),
                                      tokenizer=tokenizer, chat_template=template)
    return save(path, getattr(transformers, f"{family}ForConditionalGeneration"), config, processor, seed)


def build_qwen2_5_vl(path: Path, seed: int = 0, bos: str | None = None) -> Path:
    return build_qwen(path, seed, "Qwen2_5_VL", dict(hidden_size=32, intermediate_size=64, window_size=32,
                                                     out_hidden_size=64, fullatt_block_indexes=[1]), bos=bos)


def build_qwen2_vl(path: Path, seed: int = 0) -> Path:
    return build_qwen(path, seed, "Qwen2VL", dict(embed_dim=32, hidden_size=64, mlp_ratio=2))


def build_qwen3_vl(path: Path, seed: int = 0) -> Path:
    return build_qwen(path, seed, "Qwen3VL", dict(hidden_size=32, intermediate_size=64, out_hidden_size=64,
                                                  num_position_embeddings=64, deepstack_visual_indexes=[0]),
                      text=dict(head_dim=16), rope=dict(mrope_interleaved=True))


def siglip(image_size: int = 32, **overrides) -> dict:
    return dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, image_size=image_size, patch_size=8, **overrides)


def build_gemma3(path: Path, seed: int = 0, sliding_window: int = 64, layer_types: list[str] | None = None) -> Path:
    """Gemma 3: 32-pixel images, 16 image tokens each between "\n\n<start_of_image>" and "<end_of_image>\n\n".
    Both layers slide by default (Gemma's pattern puts a full layer every sixth)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                "<end_of_image>", "<image_soft_token>"]
    tokenizer = build_tokenizer(specials, bos="<bos>", eos="<eos>", pad="<pad>", unk="<unk>", add_bos=True,
                                style="sentencepiece", chat_template=hub_template("gemma3"),
                                extra={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                       "image_token": "<image_soft_token>"})
    text = text_config(tokenizer, head_dim=16, query_pre_attn_scalar=16, sliding_window=sliding_window,
                       **({"layer_types": layer_types} if layer_types else {}))
    config = Gemma3Config(text_config=text, vision_config=siglip(vision_use_head=False), mm_tokens_per_image=16,
                          boi_token_index=token_id(tokenizer, "<start_of_image>"),
                          eoi_token_index=token_id(tokenizer, "<end_of_image>"),
                          image_token_index=token_id(tokenizer, "<image_soft_token>"))
    image_processor = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    processor = tiny_processors.build("Gemma3Processor", image_processor=image_processor, tokenizer=tokenizer,
                                      chat_template=hub_template("gemma3"), image_seq_length=16)
    # Gemma scales token embeddings by sqrt(hidden) (8 here), image rows not.
    return save(path, Gemma3ForConditionalGeneration, config, processor, seed, embedding_std=EMBEDDING_STD / 8)


def build_mistral3(path: Path, seed: int = 0, tokenizer_style: str = "byte_level") -> Path:
    """Mistral 3 (Pixtral tower): 16-pixel tokens after a 2x2 merge, a [IMG_BREAK] after each row, [IMG_END] last."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralImageProcessorPil

    specials = ["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
    tokenizer = build_tokenizer(specials, bos="<s>", eos="</s>", pad="<pad>", unk="<unk>", add_bos=True,
                                style=tokenizer_style, chat_template=hub_template("mistral3"))
    config = Mistral3Config(
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, head_dim=16, image_size=64, patch_size=8),
        text_config=text_config(tokenizer, model_type="mistral", head_dim=16, sliding_window=None),
        image_token_index=token_id(tokenizer, "[IMG]"), spatial_merge_size=2, vision_feature_layer=-1)
    image_processor = PixtralImageProcessorPil(size={"longest_edge": 64}, patch_size={"height": 8, "width": 8})
    processor = tiny_processors.build("PixtralProcessor", image_processor=image_processor, tokenizer=tokenizer,
                                      patch_size=8, spatial_merge_size=2, chat_template=hub_template("mistral3"))
    return save(path, Mistral3ForConditionalGeneration, config, processor, seed)


IDEFICS3_SPECIALS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]


def idefics3_image_processor(class_name: str):
    """Up to 64 pixels, split into 32-pixel tiles plus the whole image at 32 pixels."""
    import transformers

    return getattr(transformers, class_name)(size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
                                             do_image_splitting=True)


def build_idefics3_layout(path: Path, seed: int, family: str, tokenizer) -> Path:
    """Idefics3's layout (`family`: Idefics3 or SmolVLM): 4 tokens per 32-pixel tile (pixel shuffle by 2),
    tiles with row/col tokens, then the global image."""
    import transformers

    config = getattr(transformers, f"{family}Config")(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        text_config=text_config(tokenizer, model_type="llama"), image_token_id=token_id(tokenizer, "<image>"),
        scale_factor=2)
    image_processor = idefics3_image_processor(f"{family}ImageProcessorPil")
    processor = tiny_processors.build(f"{family}Processor", image_processor=image_processor, tokenizer=tokenizer,
                                      image_seq_len=4, chat_template=tokenizer.chat_template)
    return save(path, getattr(transformers, f"{family}ForConditionalGeneration"), config, processor, seed)


def build_idefics3(path: Path, seed: int = 0) -> Path:
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>"] + IDEFICS3_SPECIALS
    tokenizer = build_tokenizer(specials, bos="<|begin_of_text|>", eos="<end_of_utterance>",
                                pad="<|finetune_right_pad_id|>", add_bos=True, chat_template=hub_template("idefics3"))
    return build_idefics3_layout(path, seed, "Idefics3", tokenizer)


def build_smolvlm(path: Path, seed: int = 0) -> Path:
    """SmolVLM: Idefics3's layout with a ChatML-style tokenizer (no BOS)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<video>"] + IDEFICS3_SPECIALS
    tokenizer = build_tokenizer(specials, bos="<|im_start|>", eos="<end_of_utterance>", pad="<|endoftext|>",
                                chat_template=hub_template("smolvlm"))
    return build_idefics3_layout(path, seed, "SmolVLM", tokenizer)


def build_internvl(path: Path, seed: int = 0) -> Path:
    """InternVL (hf layout): 32-pixel tiles (up to 4, plus a thumbnail), 4 tokens each, between <img> and </img>."""
    from transformers import GotOcr2ImageProcessorPil, InternVLConfig, InternVLForConditionalGeneration

    specials = QWEN_SPECIALS[:3] + ["<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
    tokenizer = build_tokenizer(specials, bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                                chat_template=hub_template("internvl"),
                                extra={"start_image_token": "<img>", "end_image_token": "</img>",
                                       "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})
    config = InternVLConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=[32, 32], patch_size=[8, 8]),
        text_config=text_config(tokenizer, model_type="qwen2"), image_token_id=token_id(tokenizer, "<IMG_CONTEXT>"),
        image_seq_length=4, downsample_ratio=0.5)
    image_processor = GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=True,
                                               min_patches=1, max_patches=4)
    processor = tiny_processors.build("InternVLProcessor", image_processor=image_processor, tokenizer=tokenizer,
                                      image_seq_length=4, chat_template=hub_template("internvl"))
    return save(path, InternVLForConditionalGeneration, config, processor, seed)


PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64], [32, 96], [96, 32]]


def build_llava_onevision(path: Path, seed: int = 0) -> Path:
    """LLaVA-OneVision: anyres over 32-pixel tiles (16 tokens each) when alone, base tile + newline when several."""
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, LlavaOnevisionImageProcessorPil

    specials = QWEN_SPECIALS[:3] + ["<image>", "<video>"]
    tokenizer = build_tokenizer(specials, bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                                chat_template=hub_template("llava_onevision"))
    config = LlavaOnevisionConfig(
        vision_config=siglip(vision_use_head=False), text_config=text_config(tokenizer, model_type="qwen2"),
        image_token_index=token_id(tokenizer, "<image>"), video_token_index=token_id(tokenizer, "<video>"),
        image_grid_pinpoints=PINPOINTS, vision_feature_select_strategy="full", vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9")
    image_processor = LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32}, image_grid_pinpoints=PINPOINTS)
    processor = tiny_processors.build("LlavaOnevisionProcessor", image_processor=image_processor,
                                      tokenizer=tokenizer, num_image_tokens=16, vision_feature_select_strategy="full",
                                      chat_template=hub_template("llava_onevision"), vision_aspect_ratio="anyres_max_9")
    return save(path, LlavaOnevisionForConditionalGeneration, config, processor, seed)


def build_aya_vision(path: Path, seed: int = 0, sliding_window: int = 64) -> Path:
    """Aya Vision: 32-pixel tiles (up to 4) of 4 tokens each, TILE_i markers, then the global tile."""
    from transformers import AyaVisionConfig, AyaVisionForConditionalGeneration, GotOcr2ImageProcessorPil

    specials = ["<PAD>", "<UNK>", "<BOS_TOKEN>", "<EOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>", "<image>", "<|START_OF_IMG|>",
                "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>", "TILE", "TILE_GLOBAL"] + [
        f"TILE_{i}" for i in range(1, 13)]
    tokenizer = build_tokenizer(specials, bos="<BOS_TOKEN>", eos="<|END_OF_TURN_TOKEN|>", pad="<PAD>", unk="<UNK>",
                                add_bos=True, chat_template=AYA_TEMPLATE)
    config = AyaVisionConfig(
        vision_config=siglip(vision_use_head=False),
        text_config=text_config(tokenizer, model_type="cohere2", head_dim=16, sliding_window=sliding_window,
                                layer_types=["sliding_attention", "full_attention"]),
        downsample_factor=2, image_token_index=token_id(tokenizer, "<|IMG_PATCH|>"),
        vision_feature_select_strategy="full", vision_feature_layer=-1)
    image_processor = GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=True,
                                               min_patches=1, max_patches=4)
    processor = tiny_processors.build("AyaVisionProcessor", image_processor=image_processor, tokenizer=tokenizer,
                                      patch_size=8, img_size=32, downsample_factor=2, chat_template=AYA_TEMPLATE)
    return save(path, AyaVisionForConditionalGeneration, config, processor, seed)


def build_mllama(path: Path, seed: int = 0) -> Path:
    """Mllama: one <|image|> token per image in the prompt; the image (up to 4 tiles of 32 pixels) enters
    through cross-attention layers (layer 1 of 3 here)."""
    from transformers import MllamaConfig, MllamaForConditionalGeneration, MllamaImageProcessorPil

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>"]
    tokenizer = build_tokenizer(specials, bos="<|begin_of_text|>", eos="<|eot_id|>", pad="<|finetune_right_pad_id|>",
                                add_bos=True, chat_template=hub_template("mllama"))
    config = MllamaConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1,
                           attention_heads=2, image_size=32, patch_size=8, max_num_tiles=4,
                           intermediate_layers_indices=[0], vision_output_dim=64,
                           supported_aspect_ratios=[[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]),
        text_config=text_config(tokenizer, num_hidden_layers=3, cross_attention_layers=[1]),
        image_token_index=token_id(tokenizer, "<|image|>"))
    image_processor = MllamaImageProcessorPil(size={"height": 32, "width": 32}, max_image_tiles=4)
    processor = tiny_processors.build("MllamaProcessor", image_processor=image_processor, tokenizer=tokenizer,
                                      chat_template=hub_template("mllama"))
    return save(path, MllamaForConditionalGeneration, config, processor, seed)


def build_llava(path: Path, seed: int = 0) -> Path:
    return relaxed(tiny_models.build_llava(path, seed), seed, hub_template("llava"))


def build_llava_next(path: Path, seed: int = 0) -> Path:
    return relaxed(tiny_models.build_llava_next(path, seed), seed, hub_template("llava_next"))


def relaxed(path: Path, seed: int, template: str) -> Path:
    """A `tests/tiny_models.py` checkpoint with this module's weights (untied head, LeCun init) and
    `template` as its chat template."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(path)
    processor.chat_template = template
    processor.save_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path)
    model.config.tie_word_embeddings = False
    model.config.get_text_config().tie_word_embeddings = False
    fresh = type(model)(model.config)
    lecun_init(fresh, seed).eval().save_pretrained(path)
    return Path(path)


# Seeds: the first for which every scenario of the family tests (tests/test_vlm_families_*.py,
# test_checkpoint_variants.py, test_processor_route.py) has no near-tie and a reply that changes with
# the picture, on the hub templates (the tests check both; seed 0 failed one of them here).
FAMILIES: dict[str, Callable[[Path], Path]] = {
    "llava": functools.partial(build_llava, seed=2),
    "llava_next": build_llava_next,
    "qwen2_vl": build_qwen2_vl,
    "qwen2_5_vl": build_qwen2_5_vl,
    "gemma3": build_gemma3,
    "mistral3": functools.partial(build_mistral3, seed=6),
    "idefics3": build_idefics3,
    "smolvlm": build_smolvlm,
    "internvl": functools.partial(build_internvl, seed=1),
    "llava_onevision": functools.partial(build_llava_onevision, seed=1),
    "aya_vision": functools.partial(build_aya_vision, seed=1),
    "qwen3_vl": build_qwen3_vl,
    "mllama": functools.partial(build_mllama, seed=3),
}
