"""A second picture renderer, written for the eval only: pictures as other people draw them.

The demo model is trained on `pictures`; measuring it only on that renderer's pictures hides
how it does on anyone else's. This one shares no drawing code with it: Pillow's own primitives
(`ellipse`, `regular_polygon`, `polygon`), hard or anti-aliased edges, canvases of 96 to 300 px
in any aspect ratio from 3:5 to 5:3, CSS-like shades of each colour, thin outlines, tinted, noisy
or graded light backgrounds, PNG or JPEG of any quality.

Position is the person's: a 3 x 3 grid over the **whole picture** as the user sees it, each shape
centred (with a little jitter) in its cell and inside it, so every position question has one right
answer. In: a `random.Random`. Out: `Scene`s (the training renderer's type, so answers and checks are
shared; `cx`, `cy`, `r` are fractions of the whole picture here) and PIL images.
"""
from __future__ import annotations

import io
import math
import random

import numpy as np
from PIL import Image, ImageDraw

from tools.demo_model.pictures import COLOURS, SHAPES, Item, Scene

# Shades a person might pick for each colour name (web colours and paint-program defaults).
SHADES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "red": ((255, 0, 0), (200, 16, 46), (178, 34, 34), (230, 50, 40), (220, 20, 60)),
    "green": ((0, 128, 0), (34, 139, 34), (0, 170, 60), (60, 160, 60), (46, 139, 87)),
    "blue": ((0, 0, 255), (30, 90, 200), (0, 70, 170), (65, 105, 225), (0, 0, 205)),
    "yellow": ((255, 215, 0), (250, 230, 40), (240, 200, 0), (255, 255, 0)),
    "purple": ((128, 0, 128), (148, 0, 211), (110, 50, 160), (102, 51, 153)),
    "orange": ((255, 140, 0), (255, 120, 0), (240, 110, 30), (255, 127, 39)),
    "black": ((0, 0, 0), (30, 30, 30), (50, 50, 50), (20, 20, 40)),
}
assert set(SHADES) == set(COLOURS)


def random_scene(rng: random.Random, count: int | None = None, kinds: list[tuple[str, str]] | None = None) -> Scene:
    """One or two shapes in distinct cells of the whole picture; two shapes differ in colour."""
    if kinds is None:
        count = count or rng.choice((1, 2))
        kinds = [(colour, rng.choice(SHAPES)) for colour in rng.sample(list(COLOURS), count)]
    cells = sorted(rng.sample(range(9), len(kinds)))
    items = []
    for (colour, shape), cell in zip(kinds, cells):
        row, col = divmod(cell, 3)
        size = rng.uniform(0.45, 0.85)  # the shape's extent, as a fraction of its cell's shorter side
        jitter = (1 - size) / 2 * 0.5  # the shape stays inside its cell
        items.append(Item(colour, shape, cell, (col + 0.5 + rng.uniform(-jitter, jitter)) / 3,
                          (row + 0.5 + rng.uniform(-jitter, jitter)) / 3, size / 6, rng.uniform(-15, 15)))
    return Scene(tuple(items))


def canvas_size(rng: random.Random) -> tuple[int, int]:
    side = rng.randint(96, 300)
    if rng.random() < 0.4:
        return side, side
    aspect = math.exp(rng.uniform(math.log(0.6), math.log(1 / 0.6)))
    return (side, max(32, round(side / aspect))) if aspect >= 1 else (max(32, round(side * aspect)), side)


def background(size: tuple[int, int], rng: random.Random) -> Image.Image:
    width, height = size
    kind = rng.choice(("white", "tint", "noise", "gradient"))
    base = np.array([255, 255, 255]) if kind == "white" else np.array([rng.randint(215, 255) for _ in range(3)])
    pixels = np.broadcast_to(base, (height, width, 3)).astype(float)
    if kind == "noise":
        pixels = pixels + np.random.default_rng(rng.randrange(2**31)).normal(0, rng.uniform(3, 15), pixels.shape)
    elif kind == "gradient":
        pixels = pixels - np.linspace(0, rng.uniform(10, 35), height)[:, None, None]
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")


def star(cx: float, cy: float, r: float, inner: float, turn: float) -> list[tuple[float, float]]:
    return [(cx + (r if i % 2 == 0 else r * inner) * math.sin(math.radians(turn) + i * math.pi / 5),
             cy - (r if i % 2 == 0 else r * inner) * math.cos(math.radians(turn) + i * math.pi / 5)) for i in range(10)]


def draw_item(draw: ImageDraw.ImageDraw, item: Item, size: tuple[int, int], scale: int, fill, outline) -> None:
    width, height = size[0] * scale, size[1] * scale
    cell = min(width, height) / 3
    cx, cy, r = item.cx * width, item.cy * height, item.r * 3 * cell
    line = dict(outline=outline, width=max(1, scale * (1 if outline else 0)))
    if item.shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill, **line)
    elif item.shape == "square":
        draw.regular_polygon((cx, cy, r * 1.2), 4, rotation=item.turn, fill=fill, **line)
    elif item.shape == "triangle":
        draw.regular_polygon((cx, cy + r * 0.2, r * 1.15), 3, rotation=item.turn, fill=fill, **line)
    elif item.shape == "star":
        draw.polygon(star(cx, cy, r * 1.1, 0.42, item.turn), fill=fill, **line)
    else:
        raise ValueError(f"Unknown shape {item.shape!r}")


def picture(scene: Scene, rng: random.Random) -> Image.Image:
    """The scene on a fresh canvas: hard or smooth edges, sometimes outlined, PNG or JPEG."""
    size = canvas_size(rng)
    scale = rng.choice((1, 4))  # 1: hard edges; 4: drawn larger and shrunk (anti-aliased)
    image = background(size, rng).resize((size[0] * scale, size[1] * scale), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(image)
    for item in scene.items:
        fill = rng.choice(SHADES[item.colour])
        outline = tuple(max(0, c - 60) for c in fill) if rng.random() < 0.2 else None
        draw_item(draw, item, size, scale, fill, outline)
    if scale > 1:
        image = image.resize(size, Image.Resampling.LANCZOS)
    if rng.random() < 0.5:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=rng.randint(60, 95))
        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    return image
