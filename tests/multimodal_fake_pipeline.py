"""A tiny real multimodal pipeline for tests, built on the loaded fixture Llama.

`embed_images` is a fixed random linear map of average-pooled pixels into the model's hidden size
(one row per pooling cell), so different pixels give different embeddings; `embed_tokens` is the
model's own input embedding. Variants are data (`FakeSpec`), not subclasses: a per-image token
count, a wrong row count, MiniGPT-4-style short placeholders, a limit on images, a failure.
Also: small image builders for tests.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from extensions.multimodal.abstract_pipeline import AbstractMultimodalPipeline
from extensions.multimodal.core.image_codec import IMAGE_TAG_RE
# Imported once, with the test modules: the `host` fixture drops extension modules from sys.modules
# after each test, and a fresh import would raise error classes the tests do not hold.
from extensions.multimodal.core.multimodal_embedder import MultimodalEmbedder
from modules import shared


FAKE_PIPELINE_MODULES = Path(__file__).resolve().parent / "multimodal_pipelines"  # holds fake-pipelines/


@dataclass(frozen=True)
class FakeSpec:
    name: str
    grid: Tuple[int, int] = (2, 2)  # pooling cells = tokens per image
    image_start: Optional[str] = "<im_start>"
    image_end: Optional[str] = "<im_end>"
    varies_with_size: bool = False  # portrait images get twice the rows of the grid
    extra_rows: int = 0  # embed_images returns this many rows too many (negative: too few)
    placeholder_rows: Optional[int] = None  # MiniGPT-4-style: fewer placeholder rows than num_image_embeds()
    max_images: Optional[int] = None
    fails: bool = False
    seed: int = 0


SPECS = {spec.name: spec for spec in [
    FakeSpec("fake-linear"),
    FakeSpec("fake-img-markers", image_start="<Img>", image_end="</Img>"),
    FakeSpec("fake-no-markers", image_start=None, image_end=None),
    FakeSpec("fake-varying", varies_with_size=True),
    FakeSpec("fake-wrong-rows", extra_rows=-1),
    FakeSpec("fake-short-placeholder", placeholder_rows=2),
    FakeSpec("fake-one-image", max_images=1),
    FakeSpec("fake-failing", fails=True),
    FakeSpec("fake-big", grid=(4, 4)),
]}


class FakePipeline(AbstractMultimodalPipeline):
    def __init__(self, spec: FakeSpec, params: dict):
        self.spec = spec
        self.params = params
        generator = torch.Generator().manual_seed(spec.seed)
        hidden = shared.model.get_input_embeddings().weight.shape[1]
        self.projection = torch.randn(3, hidden, generator=generator)  # (rgb, hidden)
        self.batches: List[int] = []  # the number of images in each embed_images call

    def name(self) -> str:
        return self.spec.name

    def image_start(self) -> Optional[str]:
        return self.spec.image_start

    def image_end(self) -> Optional[str]:
        return self.spec.image_end

    def placeholder_token_id(self) -> int:
        return shared.tokenizer.convert_tokens_to_ids("<image>")

    def num_image_embeds(self) -> int:
        return self.spec.grid[0] * self.spec.grid[1]

    def grid_for(self, image: Image.Image) -> Tuple[int, int]:
        rows, cols = self.spec.grid
        if self.spec.varies_with_size and image.size[1] > image.size[0]:
            return rows * 2, cols
        return rows, cols

    def max_images_per_prompt(self) -> Optional[int]:
        return self.spec.max_images

    def preferred_image_size(self) -> Optional[int]:
        return 64

    def embed_images(self, images: List[Image.Image]):
        self.batches.append(len(images))
        if self.spec.fails:
            raise RuntimeError("CUDA out of memory (fake pipeline)")
        embeddings = [self.embed_one(image) for image in images]
        if self.spec.extra_rows < 0:
            embeddings = [e[:self.spec.extra_rows] for e in embeddings]
        elif self.spec.extra_rows > 0:
            embeddings = [torch.cat([e, e[:self.spec.extra_rows]]) for e in embeddings]
        same = len({e.shape for e in embeddings}) == 1
        return torch.stack(embeddings) if same else embeddings  # (images, tokens, hidden) or a list

    def embed_one(self, image: Image.Image) -> torch.Tensor:
        pixels = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
        pooled = F.adaptive_avg_pool2d(pixels, self.grid_for(image))  # (3, rows, cols)
        features = pooled.flatten(1).T  # (tokens, 3)
        weight = shared.model.get_input_embeddings().weight
        return (features @ self.projection).to(weight.device, weight.dtype)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return shared.model.get_input_embeddings()(input_ids)

    def placeholder_embeddings(self) -> torch.Tensor:
        rows = self.spec.placeholder_rows or self.num_image_embeds()
        ids = torch.full((rows,), self.placeholder_token_id(), dtype=torch.int64,
                         device=shared.model.get_input_embeddings().weight.device)
        return self.embed_tokens(ids)


class VaryingFakePipeline(FakePipeline):
    """Declares a per-image token count, as LLaVA-NeXT does (the one capability tested by its presence)."""

    def num_image_embeds_for(self, image: Image.Image) -> int:
        rows, cols = self.grid_for(image)
        return rows * cols


def make_pipeline(name: str, params: dict) -> FakePipeline:
    spec = SPECS[name]
    return (VaryingFakePipeline if spec.varies_with_size else FakePipeline)(spec, params)


def make_embedder(name: str = "fake-linear", **overrides):
    """A MultimodalEmbedder over the fake pipeline `name`, found as a third-party module is (the
    `pipeline_dirs` and `pipeline` settings); `overrides` change the extension params."""
    params = {"add_all_images_to_prompt": False, "vision_device": None, "vision_bits": 32, "projector_device": None,
              "projector_bits": 32, "embedding_cache_mb": 256, "max_images_per_prompt": None,
              "max_image_pixels": 40_000_000, "pipeline_dirs": [str(FAKE_PIPELINE_MODULES)], "pipeline": name}
    params.update(overrides)
    return MultimodalEmbedder(params)


# -- Images for tests --------------------------------------------------------------------------

def solid_image(color=(255, 0, 0), size=(32, 32), mode: str = "RGB") -> Image.Image:
    return Image.new(mode, size, color)


def noise_image(seed: int, size=(32, 32)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def encoded(image: Image.Image, fmt: str = "JPEG", **kwargs) -> bytes:
    buffer = BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def tag_of_bytes(data: bytes) -> str:
    """A history tag around arbitrary bytes (the jpeg label, whatever the bytes are)."""
    return f'<img src="data:image/jpeg;base64,{base64.b64encode(data).decode("ascii")}">'


def tag(image: Image.Image, fmt: str = "JPEG") -> str:
    return tag_of_bytes(encoded(image, fmt))


def tag_payloads(text: str) -> list[str]:
    """The base64 data of every image tag in `text`, in order."""
    return [match.group("data") for match in IMAGE_TAG_RE.finditer(text)]
