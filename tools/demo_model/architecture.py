"""The demo model's parts: tokenizer, `LlavaForConditionalGeneration`, `LlavaProcessor`, sizes.

In: nothing but a seed. Out: untrained Hugging Face objects, saved and loaded like any LLaVA
checkpoint. Training lives in `vision_stage` (stage 1), `chat_stage` (2) and `polish_stage` (3).

The tower sees the whole picture squashed to IMAGE_SIZE x IMAGE_SIZE (nothing cropped: a position is
the picture's cell, as the user sees it, whatever its aspect ratio) in PATCH_SIZE patches, and the
language model gets all of its last layer's rows, the CLS row first ('full' strategy,
`vision_feature_layer -1`): each patch row says what covers its patch; the CLS row says what the
whole picture holds (see `vision_stage`).
"""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    GenerationConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

from tools.demo_model.chats import CHAT_TEMPLATE, IMAGE_MARK, IMAGE_TOKENS, tokenizer_corpus

# 192 px in 24-px patches: 8 x 8 patch rows. Small shapes need the pixels (at 128 px a shape in a
# corner of a wide picture is 11 px across); 24-px patches keep the rows, and so the cost, of 128/16.
IMAGE_SIZE, PATCH_SIZE = 192, 24
GRID = IMAGE_SIZE // PATCH_SIZE
FEATURE_LAYER, FEATURE_STRATEGY = -1, "full"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", IMAGE_MARK]
VISION = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
              image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, projection_dim=128)
TEXT = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False)
assert GRID * GRID + 1 == IMAGE_TOKENS, "chats.IMAGE_TOKENS: the patch rows and the CLS row"


def build_tokenizer(vocab_size: int = 640) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", extra_special_tokens={"image_token": IMAGE_MARK})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer, seed: int) -> LlavaForConditionalGeneration:
    text_config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                              **TEXT)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**VISION), text_config=text_config,
                         image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_MARK), image_seq_length=IMAGE_TOKENS,
                         vision_feature_layer=FEATURE_LAYER, vision_feature_select_strategy=FEATURE_STRATEGY,
                         projector_hidden_act="gelu", tie_word_embeddings=False)
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return model


def build_processor(tokenizer) -> LlavaProcessor:
    # The whole picture squashed to a square, nothing cropped: a position means the picture's cell,
    # as the user sees it, whatever its aspect ratio.
    image_processor = CLIPImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_center_crop=False,
                                         crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    # num_additional_image_tokens=1 counts CLS, which 'full' keeps: GRID * GRID + 1 rows per image.
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy=FEATURE_STRATEGY, num_additional_image_tokens=1,
                          chat_template=CHAT_TEMPLATE)


def image_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """(images, IMAGE_TOKENS, hidden): the rows the language model gets, CLS first."""
    features = model.model.get_image_features(pixel_values=pixel_values, vision_feature_layer=FEATURE_LAYER,
                                              vision_feature_select_strategy=FEATURE_STRATEGY).pooler_output
    return torch.stack(list(features))


def vision_parameters(model) -> list[torch.nn.Parameter]:
    inner = model.model
    return [*inner.vision_tower.parameters(), *inner.multi_modal_projector.parameters()]
