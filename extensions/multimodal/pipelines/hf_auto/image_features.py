"""Per image, exactly the rows the model scatters at that image's image-token positions.

In: a loaded `*ForConditionalGeneration` model and `ProcessedImages` (`image_tokens.process_images`:
the processor's tensors and each image's ids, for the images of one prompt). Out (`features_of`):
one `(rows, hidden)` tensor per image from one batched call of the model's own `get_image_features`
(its vision tower, feature layer, projector, pooling, newline rows, anyres packing), fed with the
processor's tensors: `pixel_values` plus whatever this family's `get_image_features` names
(Qwen `image_grid_thw`, Idefics3/SmolVLM `pixel_attention_mask`, LLaVA-NeXT/Mistral3 `image_sizes`,
LLaVA-OneVision `image_sizes` + `batch_num_images`). Rows are split per image by the number of
image tokens in each image's ids, so a count mismatch is caught here, naming both counts.

Qwen3-VL's DeepStack features (rows added to the hidden states of the first LM layers at the same
positions) come per image too, as `features_of`'s second result.
"""
from __future__ import annotations

import inspect

import torch

from extensions.multimodal.core import loaded_model

from .image_tokens import ProcessedImages, image_token_id

# Submodules holding the vision tower, then the projector, by family.
VISION_PARTS = ("vision_tower", "visual", "vision_model", "multi_modal_projector", "connector")


def tower_inputs(model, processed: ProcessedImages) -> dict[str, torch.Tensor]:
    """The processor's tensors that this model's `get_image_features` names, on the tower's device/dtype."""
    accepted = inspect.signature(model.get_image_features).parameters
    device, dtype = vision_device_dtype(model)
    inputs = {}
    for name, value in processed.inputs.items():
        if name not in accepted or not isinstance(value, torch.Tensor):
            continue
        inputs[name] = loaded_model.placed(value, device, dtype)
    if "pixel_values" not in inputs:
        raise ValueError(f"the processor gave no pixel_values for {type(model).__name__} (got {list(processed.inputs)})")
    return inputs


def features_of(model, processed: ProcessedImages) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Rows per image (and DeepStack rows per image when the model has them) from one batched call."""
    with torch.inference_mode():
        output = model.get_image_features(**tower_inputs(model, processed), return_dict=True)
    counts = [int((tokens.ids == image_token_id(model)).sum()) for tokens in processed.tokens]
    rows = split_rows(flatten(output.pooler_output), counts, type(model).__name__)
    deepstack = getattr(output, "deepstack_features", None)
    if deepstack is None:
        return rows, None
    layers = [split_rows(flatten(layer), counts, type(model).__name__) for layer in deepstack]
    return rows, [torch.stack([layer[i] for layer in layers]) for i in range(len(counts))]


def flatten(features) -> torch.Tensor:
    """`(total rows, hidden)` from a tensor of any leading shape or a list/tuple of per-image tensors."""
    if isinstance(features, torch.Tensor):
        return features.reshape(-1, features.shape[-1])
    return torch.cat([f.reshape(-1, f.shape[-1]) for f in features])


def split_rows(rows: torch.Tensor, counts: list[int], model_name: str) -> list[torch.Tensor]:
    if rows.shape[0] != sum(counts):
        raise ValueError(f"{model_name}: image features and image tokens do not match: tokens {sum(counts)} "
                         f"({counts} per image), feature rows {rows.shape[0]}")
    return list(torch.split(rows, counts))


def vision_device_dtype(model) -> tuple[torch.device, torch.dtype]:
    """Where the vision tower's weights live (pixel tensors go there, in its float dtype)."""
    tower = next(iter(vision_parts(model)), model)
    parameter = next(p for p in tower.parameters() if p.is_floating_point())
    return parameter.device, parameter.dtype


def vision_parts(model) -> list[torch.nn.Module]:
    """The vision tower, then the projector, of an image-text model (`model.<name>` or `model.model.<name>`)."""
    inner = getattr(model, "model", None)
    found = []
    for name in VISION_PARTS:
        for candidate in (model, inner):
            part = getattr(candidate, name, None) if candidate is not None else None
            if isinstance(part, torch.nn.Module):
                found.append(part)
                break
    return found
