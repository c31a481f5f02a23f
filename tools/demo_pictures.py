"""Synthetic pictures for the demo model: one or two flat shapes on a light background.

In: a `random.Random`. Out: PIL images plus what is in them (`Scene`), and per-patch labels for the
vision warm-up (`patch_labels`). Every shape lies inside the picture's central square, which the
CLIP processor's centre crop keeps; positions are cells of a 3 x 3 grid over that square, so a
shape's position has one right name. Knows nothing about prompts or models.
"""
from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 150, 50), "blue": (30, 70, 220), "yellow": (235, 205, 10),
    "purple": (130, 40, 170), "orange": (245, 120, 20), "black": (25, 25, 25),
}
SHAPES = ("circle", "square", "triangle", "star")
# Grid cells in reading order (row by row), named as the answers name them.
POSITIONS = ("in the top left", "at the top", "in the top right", "on the left", "in the center",
             "on the right", "in the bottom left", "at the bottom", "in the bottom right")
CENTER = 4
# Upright shapes turned by at most this much: a ViT trained from scratch on 2 CPU cores learns
# shapes slowly when they turn freely.
MAX_TURN = math.radians(20)
HOST_JPEG_QUALITY = 90  # the multimodal extension's history JPEG


@dataclass(frozen=True)
class Item:
    colour: str
    shape: str
    cell: int  # index into POSITIONS
    cx: float  # centre and circumradius as fractions of the central square's side
    cy: float
    r: float
    turn: float


@dataclass(frozen=True)
class Scene:
    items: tuple[Item, ...]  # in reading order of their cells


def random_kind(rng: random.Random) -> tuple[str, str]:
    return rng.choice(list(COLOURS)), rng.choice(SHAPES)


def place(colour: str, shape: str, cell: int, rng: random.Random, alone: bool) -> Item:
    """A shape in a grid cell. A lone shape in the centre cell may be large; others fit their cell."""
    row, col = divmod(cell, 3)
    if alone and cell == CENTER:
        r = rng.uniform(0.14, 0.42)
    else:
        r = rng.uniform(0.10, 0.155)
    jitter = max(0.0, 1 / 6 - r) * 0.6  # the centre stays well inside its cell
    cx = (col + 0.5) / 3 + rng.uniform(-jitter, jitter)
    cy = (row + 0.5) / 3 + rng.uniform(-jitter, jitter)
    return Item(colour, shape, cell, cx, cy, r, rng.uniform(-MAX_TURN, MAX_TURN))


def random_scene(rng: random.Random, count: int | None = None, kinds: list[tuple[str, str]] | None = None) -> Scene:
    """One or two shapes; two shapes always differ in colour, so "the red shape" names one."""
    if kinds is None:
        count = count or rng.choice((1, 2))
        colours = rng.sample(list(COLOURS), count)
        kinds = [(colour, rng.choice(SHAPES)) for colour in colours]
    if len(kinds) == 1:
        cell = CENTER if rng.random() < 0.45 else rng.randrange(9)
        return Scene((place(*kinds[0], cell, rng, alone=True),))
    cells = sorted(rng.sample(range(9), len(kinds)))
    return Scene(tuple(place(c, s, cell, rng, alone=False) for (c, s), cell in zip(kinds, cells)))


def outline(item: Item, side: float, x0: float, y0: float) -> list[tuple[float, float]]:
    """The item's polygon in pixels, for a central square of `side` pixels starting at (x0, y0)."""
    cx, cy, r = x0 + item.cx * side, y0 + item.cy * side, item.r * side
    upright = {"triangle": -math.pi / 2, "star": -math.pi / 2, "square": math.pi / 4}.get(item.shape, 0.0)
    angle = upright + item.turn
    if item.shape == "circle":
        radii, count = [r], 48
    elif item.shape == "square":
        radii, count = [r], 4
    elif item.shape == "triangle":
        radii, count = [r * 1.1], 3  # a little larger: a triangle covers less of its circle
    elif item.shape == "star":
        radii, count = [r * 1.1, 0.45 * r * 1.1], 10
    else:
        raise ValueError(f"Unknown shape {item.shape!r}; known: {', '.join(SHAPES)}")
    return [(cx + radii[i % len(radii)] * math.cos(angle + 2 * math.pi * i / count),
             cy + radii[i % len(radii)] * math.sin(angle + 2 * math.pi * i / count)) for i in range(count)]


def background(width: int, height: int, rng: random.Random) -> Image.Image:
    """White, a light tint, or light noise: always light, so every colour (black too) stands out."""
    kind = rng.random()
    if kind < 0.4:
        return Image.new("RGB", (width, height), tuple(rng.randint(240, 255) for _ in range(3)))
    base = tuple(rng.randint(200, 255) for _ in range(3))
    if kind < 0.7:
        return Image.new("RGB", (width, height), base)
    noise = np.random.default_rng(rng.randrange(2**31)).normal(base, rng.uniform(5, 22), (height, width, 3))
    return Image.fromarray(noise.clip(0, 255).astype(np.uint8), "RGB")


def random_size(rng: random.Random) -> tuple[int, int]:
    side = rng.randint(56, 160)
    if rng.random() < 0.7:
        return side, side
    aspect = math.exp(rng.uniform(-0.5, 0.5))
    return (round(side * aspect), side) if aspect >= 1 else (side, round(side / aspect))


def draw_scene(scene: Scene, rng: random.Random, size: tuple[int, int] | None = None) -> Image.Image:
    """The scene, anti-aliased, on a random light background."""
    width, height = size or random_size(rng)
    side = min(width, height)
    x0, y0 = (width - side) / 2, (height - side) / 2
    picture = background(width, height, rng)
    scale = 3  # draw each mask 3x larger, then shrink it: smooth edges like a real picture
    for item in scene.items:
        mask = Image.new("L", (width * scale, height * scale), 0)
        pts = [(x * scale, y * scale) for x, y in outline(item, side, x0, y0)]
        ImageDraw.Draw(mask).polygon(pts, fill=255)
        mask = mask.resize((width, height), Image.Resampling.BOX)
        fill = tuple(min(255, max(0, c + rng.randint(-15, 15))) for c in COLOURS[item.colour])
        picture = Image.composite(Image.new("RGB", (width, height), fill), picture, mask)
    return picture


def as_host_stores(image: Image.Image, rng: random.Random, quality: int | None = None) -> Image.Image:
    """The picture after the history's JPEG (quality 90 in the host; varied here), sometimes shrunk."""
    if rng.random() < 0.15:
        image = image.copy()
        image.thumbnail((rng.choice([56, 64, 96]),) * 2, Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality or rng.choice([HOST_JPEG_QUALITY, rng.randint(70, 95)]))
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def picture(scene: Scene, rng: random.Random, quality: int | None = None) -> Image.Image:
    return as_host_stores(draw_scene(scene, rng), rng, quality)


def patch_labels(scene: Scene, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """Per patch of the processor's crop: (colour index, shape index), or -1 where no shape covers
    at least a fifth of the patch. Shapes are (grid * grid,) int arrays in row-major patch order."""
    cell = 8  # label pixels per patch
    side = grid * cell
    canvas = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(canvas)
    for index, item in enumerate(scene.items):
        draw.polygon(outline(item, side, 0, 0), fill=index + 1)
    owners = np.asarray(canvas).reshape(grid, cell, grid, cell).transpose(0, 2, 1, 3).reshape(grid * grid, -1)
    colours = np.full(grid * grid, -1)
    shapes = np.full(grid * grid, -1)
    for index, item in enumerate(scene.items):
        covered = (owners == index + 1).mean(axis=1) >= 0.2
        colours[covered] = list(COLOURS).index(item.colour)
        shapes[covered] = SHAPES.index(item.shape)
    return colours, shapes
