"""Synthetic pictures for the demo model: one or two flat shapes on a light background.

In: a `random.Random`. Out: PIL images plus what is in them (`Scene`), and per-patch labels for the
vision warm-up (`patch_labels`). Knows nothing about prompts or models.

Position is the person's: a 3 x 3 grid over the **whole picture** as the user sees it, whatever its
aspect ratio (the model's processor squashes the picture to a square, cropping nothing), and each
shape lies inside its cell, so a position question has one right answer. Only a lone shape in the
centre cell may be large (and spill over its cell: "in the center" is still what a person says).
The pictures vary the way other people's do: canvas size and aspect ratio, shape size, hard or
smooth edges, shades of each colour, thin outlines, tinted, noisy or graded backgrounds, PNG or
JPEG of any quality.
"""
from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

# Colour names and the shades drawn for each (every shade is further jittered a little).
SHADES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "red": ((220, 30, 30), (250, 10, 10), (185, 25, 40), (235, 60, 50), (205, 15, 70)),
    "green": ((30, 150, 50), (10, 125, 10), (60, 175, 75), (25, 105, 45), (10, 185, 90), (70, 140, 70)),
    "blue": ((30, 70, 220), (10, 10, 245), (20, 60, 160), (75, 110, 230), (15, 20, 190), (40, 100, 195)),
    "yellow": ((235, 205, 10), (250, 235, 30), (245, 245, 20), (230, 190, 0), (250, 220, 70)),
    "purple": ((130, 40, 170), (125, 10, 125), (150, 20, 205), (100, 50, 150), (110, 45, 175)),
    "orange": ((245, 120, 20), (250, 145, 10), (255, 105, 10), (235, 130, 45), (245, 115, 35)),
    "black": ((25, 25, 25), (0, 0, 0), (50, 50, 55), (30, 25, 45), (40, 40, 40)),
}
COLOURS: dict[str, tuple[int, int, int]] = {name: shades[0] for name, shades in SHADES.items()}
SHAPES = ("circle", "square", "triangle", "star")
# Grid cells in reading order (row by row), named as the answers name them.
POSITIONS = ("in the top left", "at the top", "in the top right", "on the left", "in the center",
             "on the right", "in the bottom left", "at the bottom", "in the bottom right")
CENTER = 4
# Upright shapes turned by at most this much: a ViT trained from scratch on 2 CPU cores learns
# shapes slowly when they turn freely.
MAX_TURN = math.radians(20)
CELL_HALF = 1 / 6  # half a cell, as a fraction of the picture's side


@dataclass(frozen=True)
class Item:
    colour: str
    shape: str
    cell: int  # index into POSITIONS
    cx: float  # centre as fractions of the picture's width and height
    cy: float
    r: float  # circumradius as a fraction of the picture's shorter side
    turn: float


@dataclass(frozen=True)
class Scene:
    items: tuple[Item, ...]  # in reading order of their cells
    size: tuple[int, int] | None = None  # the canvas (width, height) it was planned for


def place(colour: str, shape: str, cell: int, rng: random.Random, alone: bool) -> Item:
    """A shape inside a grid cell (for any aspect ratio: r is a fraction of the shorter side, the
    jitter of each side); a lone shape in the centre cell may be large."""
    row, col = divmod(cell, 3)
    if alone and cell == CENTER and rng.random() < 0.5:
        r = rng.uniform(0.16, 0.40)
    else:
        r = CELL_HALF * rng.uniform(0.45, 0.95)
    jitter = max(0.0, CELL_HALF - r) * 0.7
    cx = (col + 0.5) / 3 + rng.uniform(-jitter, jitter)
    cy = (row + 0.5) / 3 + rng.uniform(-jitter, jitter)
    return Item(colour, shape, cell, cx, cy, r, rng.uniform(-MAX_TURN, MAX_TURN))


def random_scene(rng: random.Random, count: int | None = None, kinds: list[tuple[str, str]] | None = None) -> Scene:
    """One or two shapes; two shapes always differ in colour, so "the red shape" names one."""
    if kinds is None:
        count = count or rng.choice((1, 2))
        colours = rng.sample(list(COLOURS), count)
        kinds = [(colour, rng.choice(SHAPES)) for colour in colours]
    size = random_size(rng)
    if len(kinds) == 1:
        cell = CENTER if rng.random() < 0.3 else rng.randrange(9)
        return Scene((place(*kinds[0], cell, rng, alone=True),), size)
    cells = sorted(rng.sample(range(9), len(kinds)))
    return Scene(tuple(place(c, s, cell, rng, alone=False) for (c, s), cell in zip(kinds, cells)), size)


def outline(item: Item, width: float, height: float) -> list[tuple[float, float]]:
    """The item's polygon in pixels of a `width` x `height` picture."""
    cx, cy, r = item.cx * width, item.cy * height, item.r * min(width, height)
    upright = {"triangle": -math.pi / 2, "star": -math.pi / 2, "square": math.pi / 4}.get(item.shape, 0.0)
    angle = upright + item.turn
    if item.shape == "circle":
        radii, count = [r], 48
    elif item.shape == "square":
        radii, count = [r], 4
    elif item.shape == "triangle":
        radii, count = [r * 1.1], 3  # a little larger: a triangle covers less of its circle
        cy += r * 0.15  # centred on its area, not its circle
    elif item.shape == "star":
        radii, count = [r * 1.1, 0.45 * r * 1.1], 10
    else:
        raise ValueError(f"Unknown shape {item.shape!r}; known: {', '.join(SHAPES)}")
    return [(cx + radii[i % len(radii)] * math.cos(angle + 2 * math.pi * i / count),
             cy + radii[i % len(radii)] * math.sin(angle + 2 * math.pi * i / count)) for i in range(count)]


def background(width: int, height: int, rng: random.Random) -> Image.Image:
    """White, a light tint, light noise or a light gradient: always light, so every colour stands out."""
    kind = rng.random()
    base = np.array([rng.randint(240, 255)] * 3 if kind < 0.3 else [rng.randint(205, 255) for _ in range(3)], float)
    pixels = np.broadcast_to(base, (height, width, 3)).copy()
    if 0.55 <= kind < 0.8:
        pixels += np.random.default_rng(rng.randrange(2**31)).normal(0, rng.uniform(3, 20), pixels.shape)
    elif kind >= 0.8:
        ramp = np.linspace(0, rng.uniform(10, 40), height if rng.random() < 0.5 else width)
        pixels -= ramp[:, None, None] if len(ramp) == height else ramp[None, :, None]
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")


def random_size(rng: random.Random) -> tuple[int, int]:
    """56 to 320 px on the shorter side; square or any aspect ratio from 1:1.8 to 1.8:1."""
    side = rng.randint(56, 320)
    if rng.random() < 0.35:
        return side, side
    aspect = math.exp(rng.uniform(-0.6, 0.6))
    return (round(side * aspect), side) if aspect >= 1 else (side, round(side / aspect))


def shade(colour: str, rng: random.Random) -> tuple[int, int, int]:
    return tuple(min(255, max(0, c + rng.randint(-18, 18))) for c in rng.choice(SHADES[colour]))


def draw_scene(scene: Scene, rng: random.Random, size: tuple[int, int] | None = None) -> Image.Image:
    """The scene on a random light background: hard or smooth edges, sometimes a thin darker outline."""
    width, height = size or scene.size or random_size(rng)
    picture = background(width, height, rng)
    # 1: hard edges; 2-4: drawn larger and shrunk (anti-aliased), less for big canvases (speed)
    scale = rng.choice((1, 2, 4)) if max(width, height) <= 200 else rng.choice((1, 2))
    for item in scene.items:
        fill = shade(item.colour, rng)
        mask = Image.new("L", (width * scale, height * scale), 0)
        pts = [(x * scale, y * scale) for x, y in outline(item, width, height)]
        draw = ImageDraw.Draw(mask)
        draw.polygon(pts, fill=255)
        layer = Image.new("RGB", (width, height), fill)
        if rng.random() < 0.25:  # an outline: a darker edge, 1-3 px
            edge = Image.new("L", mask.size, 0)
            ImageDraw.Draw(edge).polygon(pts, outline=255, width=scale * rng.randint(1, 3))
            edge = edge.resize((width, height), Image.Resampling.BOX)
            dark = tuple(max(0, c - rng.randint(40, 90)) for c in fill)
            layer = Image.composite(Image.new("RGB", (width, height), dark), layer, edge)
        mask = mask.resize((width, height), Image.Resampling.BOX) if scale > 1 else mask
        picture = Image.composite(layer, picture, mask)
    return picture


def as_sent(image: Image.Image, rng: random.Random, quality: int | None = None) -> Image.Image:
    """The picture as a user sends it: exact pixels (a PNG) or a JPEG of any quality."""
    if quality is None and rng.random() < 0.4:
        return image
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality or rng.randint(55, 95))
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def picture(scene: Scene, rng: random.Random, quality: int | None = None) -> Image.Image:
    """The scene drawn and sent; `quality` fixes a JPEG round trip (None: random, sometimes none)."""
    return as_sent(draw_scene(scene, rng), rng, quality)


def patch_labels(scene: Scene, grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per patch of the processor's square (the whole picture, squashed): (colour index, shape index,
    cell index) of the shape covering at least a fifth of the patch, or -1 where none does.
    Arrays of shape (grid * grid,), row-major patch order."""
    cell = 8  # label pixels per patch
    side = grid * cell
    width, height = scene.size or (side, side)
    canvas = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(canvas)
    for index, item in enumerate(scene.items):
        draw.polygon([(x * side / width, y * side / height) for x, y in outline(item, width, height)], fill=index + 1)
    owners = np.asarray(canvas).reshape(grid, cell, grid, cell).transpose(0, 2, 1, 3).reshape(grid * grid, -1)
    colours, shapes, cells = (np.full(grid * grid, -1) for _ in range(3))
    for index, item in enumerate(scene.items):
        covered = (owners == index + 1).mean(axis=1) >= 0.2
        colours[covered] = list(COLOURS).index(item.colour)
        shapes[covered] = SHAPES.index(item.shape)
        cells[covered] = item.cell
    return colours, shapes, cells


SCENE_SLOTS = 2  # shapes a scene holds at most


def scene_labels(scene: Scene) -> np.ndarray:
    """What the whole picture holds, in reading order: (colour, shape, cell) of each of its
    `SCENE_SLOTS` shapes, -1 for a slot no shape fills. Shape (3 * SCENE_SLOTS,)."""
    labels = np.full(3 * SCENE_SLOTS, -1)
    for slot, item in enumerate(scene.items):
        labels[3 * slot:3 * slot + 3] = (list(COLOURS).index(item.colour), SHAPES.index(item.shape), item.cell)
    return labels
