"""The model sees exactly the picture that was sent.

- Through the UI's chat function (an uploaded file) and through `/v1/chat/completions` (a data URL),
  the picture a pipeline receives is pixel-identical to the sent bytes decoded with Pillow, turned
  upright by EXIF, alpha flattened onto white (the documented flattening, written out here by hand).
- A JPEG's bytes are stored as they came; other formats keep their pixels (PNG kept, the rest as PNG).
- A history written by older versions (PNG bytes under the jpeg label) still works.
(`tests/test_exact_pixels_vs_hf.py`: the same PNGs give Hugging Face's own tokens.) The pipeline is the fake one (`tests/multimodal_fake_pipeline.py`): what is under
test is the path from bytes to the pipeline's input, not a model.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from extensions.multimodal.core.image_codec import IMAGE_TAG_RE
from modules import chat, shared, ui_chat
from fixtures import api_helpers, host_helpers
from tests.conftest import ROOT
from tests.multimodal_fake_pipeline import encoded, noise_image
from extensions.multimodal.tgw import serving


def with_alpha() -> Image.Image:
    rgba = np.dstack([np.asarray(noise_image(5, (30, 20))), np.tile(np.linspace(0, 255, 30, dtype=np.uint8), (20, 1))])
    return Image.fromarray(rgba, "RGBA")


def palette() -> bytes:
    image = noise_image(6, (24, 16)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    return encoded(image, "PNG", transparency=3)


def exif_rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees when shown
    return encoded(noise_image(7, (40, 24)), "JPEG", quality=85, exif=exif.tobytes())


PICTURES = {
    "png rgb": lambda: encoded(noise_image(1, (36, 20)), "PNG"),
    "png rgba": lambda: encoded(with_alpha(), "PNG"),
    "png palette": palette,
    "jpeg": lambda: encoded(noise_image(2, (33, 21)), "JPEG", quality=75),
    "jpeg exif rotated": exif_rotated_jpeg,
    "webp": lambda: encoded(noise_image(3, (26, 18)), "WEBP", quality=60),
    "gif": lambda: encoded(noise_image(4, (22, 22)).convert("P", palette=Image.Palette.ADAPTIVE), "GIF"),
}


def as_sent(data: bytes) -> np.ndarray:
    """The picture as its bytes show it: Pillow's decode, upright, transparency flattened onto white."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return np.asarray(image.convert("RGB"))


@pytest.fixture(scope="module")
def fake_served(llama_dir):
    """The tiny Llama with the multimodal extension on the fake pipeline: the UI built, the API serving."""
    saved = host_helpers.snapshot()
    host_helpers.load(llama_dir, ["multimodal"], argv=["--multimodal-pipeline", "fake-linear"],
                      settings={"multimodal-pipeline_dirs": [str(ROOT / "tests" / "multimodal_pipelines")],
                                "max_new_tokens": 2})
    ui_chat.create_interface()
    api = api_helpers.start_api()
    try:
        yield api
    finally:
        api.stop()
        shared.gradio.clear()
        host_helpers.restore(saved)


@pytest.fixture
def received(fake_served, monkeypatch):
    """What the pipeline's `embed_images` is given, and the prompts the tokenizer hook sees."""
    import extensions.multimodal.script as script

    seen = {"images": [], "prompts": []}
    pipeline = script.served_model.embedder(script.params).pipeline
    embed_images, tokenizer_modifier = pipeline.embed_images, script.tokenizer_modifier

    def recording_embed(images, **prepared):  # the prepared inputs, where the layout kept some, pass through
        seen["images"].extend(np.asarray(image) for image in images)
        return embed_images(images, **prepared)

    def recording_hook(state, prompt, input_ids, input_embeds):
        seen["prompts"].append(prompt)
        return tokenizer_modifier(state, prompt, input_ids, input_embeds)

    monkeypatch.setattr(pipeline, "embed_images", recording_embed)
    monkeypatch.setattr(script, "tokenizer_modifier", recording_hook)
    script.served_model.embedder(script.params).images.cache.clear()
    return seen


def stored_bytes(prompt: str) -> bytes:
    return base64.b64decode(IMAGE_TAG_RE.search(prompt).group("data"))


@pytest.mark.parametrize("kind", list(PICTURES))
def test_the_pipeline_gets_the_pixels_sent_through_the_ui_and_the_api(received, fake_served, tmp_path, kind):
    sent = PICTURES[kind]()
    expected = as_sent(sent)
    path = tmp_path / "upload.bin"
    path.write_bytes(sent)
    values = [2, 0.0, 1.0, shared.settings["truncation_length"]]
    history = list(ui_chat.generate("What is this?", chat.new_history(), *values, [str(path)]))[-1][1]
    assert "Generation failed" not in history["visible"][-1][1]
    import extensions.multimodal.script as script

    assert len(script.served_model.embedder(script.params).images.cache) == 1
    script.served_model.embedder(script.params).images.cache.clear()  # the same stored bytes would come from the cache: embed them again
    url = api_helpers.data_url(sent, "image/" + ("jpeg" if sent[:2] == b"\xff\xd8" else "png"))
    fake_served.client().chat.completions.create(model="any", max_tokens=2, temperature=0, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}])
    assert len(received["images"]) == 2, "one picture per path"
    for route, pixels in zip(("ui", "api"), received["images"]):
        assert pixels.shape == expected.shape and np.array_equal(pixels, expected), route
    for prompt in received["prompts"]:
        kept = stored_bytes(prompt)
        if Image.open(io.BytesIO(sent)).format in ("JPEG", "PNG"):
            assert kept == sent, "JPEG and PNG bytes are stored as they came"
        else:
            assert Image.open(io.BytesIO(kept)).format == "PNG", "other formats are stored losslessly"
        mime = IMAGE_TAG_RE.search(prompt).group("mime")
        assert mime == ("image/jpeg" if kept[:2] == b"\xff\xd8" else "image/png"), "the label says what the bytes are"


def test_an_old_history_with_png_bytes_under_the_jpeg_label_still_works(received, fake_served):
    import extensions.multimodal.script as script

    png = encoded(noise_image(9, (20, 20)), "PNG")
    data = base64.b64encode(png).decode()
    state = host_helpers.greedy_state()
    _, _, old = script.tokenizer_modifier(state, f'<img src="data:image/jpeg;base64,{data}">\nHi', None, None)
    _, _, new = script.tokenizer_modifier(state, f'<img src="data:image/png;base64,{data}">\nHi', None, None)
    assert torch.equal(old, new)
    assert np.array_equal(received["images"][0], as_sent(png))
