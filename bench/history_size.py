"""How large a chat history gets with a few big screenshots: `exact` (the default) vs `jpeg`.

Draws five desktop-sized screenshots with Pillow (small text, thin lines, flat panels, a photo-like
gradient: what people send a vision model to read), saves each as a PNG as a screenshot tool would,
and stores it the way the multimodal extension does under each `history_image_format`. Prints the
tag sizes side by side and their ratio.

    python bench/history_size.py
"""
from __future__ import annotations

import io
import random
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from extensions.multimodal.core.image_codec import store_bytes  # noqa: E402
# the jpeg format's longest side when the pipeline states none
from extensions.multimodal.core.history_images import DEFAULT_HISTORY_MAX_SIDE  # noqa: E402

SIZES = ((1366, 768), (1920, 1080), (1440, 900), (2560, 1440), (1280, 800))


def screenshot(size: tuple[int, int], seed: int) -> bytes:
    rng = random.Random(seed)
    width, height = size
    image = Image.new("RGB", size, (250, 250, 252))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    draw.rectangle((0, 0, width, 40), fill=(45, 50, 60))  # a title bar
    draw.rectangle((0, 40, 260, height), fill=(235, 237, 240))  # a side panel
    for y in range(60, height - 20, 18):  # lines of small text
        x = 280 if y % 3 else 20
        words = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
                         for _ in range(rng.randint(3, 14)))
        draw.text((x, y), words, fill=(20, 20, 20), font=font)
    for x in range(300, width, 120):  # thin rules
        draw.line((x, 60, x, height // 3), fill=(200, 200, 210), width=1)
    photo = np.linspace(0, 255, 400)[None, :, None] * np.array([0.9, 0.6, 0.3]) + \
        np.random.default_rng(seed).normal(0, 12, (300, 400, 3))
    image.paste(Image.fromarray(photo.clip(0, 255).astype(np.uint8)), (width - 440, height - 340))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def main() -> None:
    exact_total = jpeg_total = 0
    print(f"{'screenshot':>12} {'PNG sent':>10} {'exact tag':>10} {'jpeg tag':>10}")
    for seed, size in enumerate(SIZES):
        sent = screenshot(size, seed)
        exact = len(store_bytes(sent).tag)
        jpeg = len(store_bytes(sent, history_format="jpeg", max_side=DEFAULT_HISTORY_MAX_SIDE).tag)
        exact_total, jpeg_total = exact_total + exact, jpeg_total + jpeg
        print(f"{size[0]:>6}x{size[1]:<5} {len(sent) / 1e6:9.2f}M {exact / 1e6:9.2f}M {jpeg / 1e6:9.2f}M")
    print(f"history of all five: exact {exact_total / 1e6:.2f} MB, jpeg {jpeg_total / 1e6:.2f} MB, "
          f"exact/jpeg {exact_total / jpeg_total:.2f}")


if __name__ == "__main__":
    main()
