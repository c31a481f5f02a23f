"""Pixtral's processor (Mistral 3) for the tests, where transformers' own class cannot be imported.

In transformers 5.23 `PixtralProcessor` is declared to need torchvision (`@requires`), and its module
imports a size helper from the torchvision image-processor module, so without torchvision the
top-level name is a placeholder that raises `ImportError`. What the class does for pictures is small
and written out here from transformers 5.23's `processing_pixtral.py`, on transformers' public
`ProcessorMixin`: the PIL image processor (`PixtralImageProcessorPil`) resizes to whole merged
patches, and each `[IMG]` in the text becomes one `[IMG]` per merged patch of a row, `[IMG_BREAK]`
after each row, the last one replaced by `[IMG_END]`.

Its constructor takes and saves the same settings under the same names, and its saved folder names
`PixtralProcessor`, so a folder it saves is the one transformers' class saves (tests/tiny_processors.py
builds Mistral 3 checkpoints with it). Used only where `transformers.PixtralProcessor` is unusable
(`tests/hf_reference.py`, `tests/tiny_processors.py`). It imports nothing from the extension.
"""
from __future__ import annotations

from transformers.processing_utils import ProcessorMixin


class PixtralProcessor(ProcessorMixin):
    """`PixtralProcessor(image_processor, tokenizer, patch_size, spatial_merge_size, chat_template)`:
    pictures and text in, `input_ids`, `pixel_values` `(images, 3, H, W)` and `image_sizes` out."""

    text_kwargs = {"return_tensors": "pt"}
    images_kwargs = {"return_tensors": "pt"}

    def __init__(self, image_processor=None, tokenizer=None, patch_size: int = 16, spatial_merge_size: int = 1,
                 chat_template=None, image_token="[IMG]", image_break_token="[IMG_BREAK]",
                 image_end_token="[IMG_END]", **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template)
        self.patch_size = patch_size
        self.spatial_merge_size = spatial_merge_size
        self.image_token, self.image_break_token, self.image_end_token = image_token, image_break_token, image_end_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.image_break_token_id = tokenizer.convert_tokens_to_ids(image_break_token)
        self.image_end_token_id = tokenizer.convert_tokens_to_ids(image_end_token)

    @property
    def image_token_ids(self) -> list[int]:
        return [self.image_token_id, self.image_break_token_id, self.image_end_token_id]

    def _process_images(self, images, **images_kwargs):
        # The image processor resizes to whole merged patches (patch 8, merge 2: 16 pixels).
        images_kwargs["patch_size"] = self.patch_size * self.spatial_merge_size
        return super()._process_images(images, **images_kwargs)

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        """The text for image `image_idx`: rows of `[IMG]`, each ended by `[IMG_BREAK]`, the last by `[IMG_END]`."""
        merged = self.patch_size * self.spatial_merge_size
        height, width = image_inputs["image_sizes"][image_idx]
        row = [self.image_token] * (width // merged) + [self.image_break_token]
        tokens = row * (height // merged)
        tokens[-1] = self.image_end_token
        return "".join(tokens)

    @property
    def model_input_names(self):
        return self.tokenizer.model_input_names + self.image_processor.model_input_names + ["image_sizes"]
