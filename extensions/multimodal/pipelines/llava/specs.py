"""The original LLaVA releases as data: one `LlavaSpec` per pipeline name.

The values are those text-generation-webui shipped for each release. Sizes that a loaded tower or
projector already knows (hidden sizes, tokens per image) are read from the loaded weights at run
time, so a tiny test tower and a real 336 px CLIP go through the same code; `tokens_per_image`
here documents what the published tower gives. This module imports nothing heavy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

CLIP_L14_224 = "openai/clip-vit-large-patch14"
CLIP_L14_336 = "openai/clip-vit-large-patch14-336"


@dataclass(frozen=True)
class LlavaSpec:
    name: str
    vision_repo: str  # the CLIP tower on the hub (overridden by the `vision_tower` param)
    projector_repo: str  # the hub repo holding `projector_filename` (overridden by `projector_path`)
    projector_filename: str
    projector_type: str  # 'linear' or 'mlp2x_gelu' (Linear, GELU, Linear)
    tokens_per_image: int  # with the published tower: (image_size / patch_size) ** 2
    placeholder_token: str  # the text token standing in for image positions
    placeholder_id: int  # its id in the release's tokenizer, used when the tokenizer does not know it
    image_start: str = ""
    image_end: str = ""
    pad_to_square: bool = False  # pad with the processor's mean colour instead of centre-cropping
    feature_layer: int = -2  # CLIP hidden state fed to the projector; the CLS position is always dropped
    model_hidden_size: Optional[int] = None  # the LM width of the published release (for error messages)


_V0 = dict(vision_repo=CLIP_L14_224, projector_filename="mm_projector.bin", projector_type="linear",
           tokens_per_image=256, placeholder_token="<im_patch>", image_start="<im_start>", image_end="<im_end>")
_V15 = dict(vision_repo=CLIP_L14_336, projector_filename="mm_projector.bin", projector_type="mlp2x_gelu",
            tokens_per_image=576, placeholder_token="<unk>", placeholder_id=0, pad_to_square=True)

SPECS: dict[str, LlavaSpec] = {spec.name: spec for spec in [
    # LLaVA v0 added `<im_patch>` to the vocabulary: id 32000 in the 13B tokenizer; the 7B delta
    # added a pad token first, so text-generation-webui used 32001 there.
    LlavaSpec(name="llava-7b", projector_repo="liuhaotian/LLaVA-7b-delta-v0", placeholder_id=32001,
              model_hidden_size=4096, **_V0),
    LlavaSpec(name="llava-13b", projector_repo="liuhaotian/LLaVA-13b-delta-v0", placeholder_id=32000,
              model_hidden_size=5120, **_V0),
    # The Llama-2 preview: v0's tower and linear projector, but no markers and `<unk>` placeholders.
    LlavaSpec(name="llava-llama-2-13b", projector_repo="liuhaotian/llava-llama-2-13b-chat-lightning-preview",
              vision_repo=CLIP_L14_224, projector_filename="mm_projector.bin", projector_type="linear",
              tokens_per_image=256, placeholder_token="<unk>", placeholder_id=0, model_hidden_size=5120),
    LlavaSpec(name="llava-v1.5-7b", projector_repo="liuhaotian/llava-v1.5-7b", model_hidden_size=4096, **_V15),
    LlavaSpec(name="llava-v1.5-13b", projector_repo="liuhaotian/llava-v1.5-13b", model_hidden_size=5120, **_V15),
]}


def get_spec(name: str) -> LlavaSpec:
    if name not in SPECS:
        raise ValueError(f"Unknown original LLaVA pipeline '{name}'. Known: {', '.join(SPECS)}")
    return SPECS[name]
