"""The id that stands in `input_ids` for an image row, chosen so that no host masks the row as padding.

text-generation-webui calls `generate(inputs=ids, inputs_embeds=...)` without an attention mask, so
transformers masks every position whose id is the pad id: with LLaVA-1.5's placeholder `<unk>` = 0 =
Vicuna's pad id the image would silently vanish. The embeddings carry the picture either way; only
the ids handed beside them change.
"""
from __future__ import annotations

import torch

from extensions.multimodal.core import loaded_model


def image_row_id(pipeline) -> int:
    """The pipeline's placeholder id, unless it is a pad id: then the first id that is neither pad nor EOS."""
    placeholder = int(pipeline.placeholder_token_id())
    pads = loaded_model.pad_token_ids()
    if placeholder not in pads:
        return placeholder
    tokenizer = loaded_model.tokenizer()
    candidates = [getattr(tokenizer, "unk_token_id", None), getattr(tokenizer, "bos_token_id", None)]
    candidates += range(int(loaded_model.input_embedding().num_embeddings))
    eos = getattr(tokenizer, "eos_token_id", None)  # a prompt full of EOS would skew repetition penalties
    return next(int(i) for i in candidates if isinstance(i, int) and i not in pads and i != eos)


def unmaskable(input_ids: torch.Tensor, feature_positions: torch.Tensor, pipeline) -> torch.Tensor:
    """`input_ids` `(n,)` with each feature position `(n,)` bool set to `image_row_id(pipeline)`."""
    row_id = image_row_id(pipeline)
    if row_id == int(pipeline.placeholder_token_id()):
        return input_ids
    return torch.where(feature_positions.to(input_ids.device), torch.full_like(input_ids, row_id), input_ids)
