"""Measure the demo model through the path users take: the host's chat, the multimodal extension.

    python -m tools.demo_model.eval                       # the shipped model, 100 questions per kind
    python -m tools.demo_model.eval --model /tmp/m --seed 7 --n 50
    python -m tools.demo_model.eval --renderer independent   # pictures from eval_pictures

Run from the repository root. Each question is a chat turn sent as the UI sends it: the pictures go
in `state['message_images']`, the extension stores them as `<img>` tags in the history (a lossless
PNG of each picture), splits the prompt, embeds the images with the llava-hf pipeline and stitches
`inputs_embeds`; the host generates greedily. Pictures are fresh: drawn from `--seed`, which
training (seed 0 and its stream) never used, by the training renderer (`pictures`) or by
`--renderer independent` (`eval_pictures`: other code, other shades, sizes and edges, positions on
the whole picture).

First-turn kinds ask about the pictures of the message. Follow-up kinds (`follow-shape` ...) are
chats as people have them: a picture with a question of another kind at turn 1, then text-only
turns about that picture (other follow-ups, chit-chat) with the measured question at turn 2, 3 or 4
(`--n` chats for each turn); every reply after turn 1 that asks for a picture ("Send me a
picture") is counted too. A follow-up missed is asked again about the same picture as the first
question of a fresh chat: a miss there too means the picture was misread (a first-turn error), not
the follow-up. Prints the accuracy per kind (follow-ups per turn), then one JSON line of those
accuracies ("follow-shape@2" ...), with counts when follow-ups ran: the misses missed alone too
("follow-shape:missed alone" ...) and "asking_for_a_picture".
"""
from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from PIL import Image

from tools.demo_model import eval_pictures, pictures
from tools.demo_model.chats import (
    COUNT_WORDS,
    ORDER_QUESTION,
    PICTURE_REQUEST,
    PRESENCE_QUESTIONS,
    QUESTIONS_OF,
    SHAPE_QUESTIONS,
    TEXT_CHAT,
    article,
    describe,
)
from tools.demo_model.pictures import COLOURS, POSITIONS, SHAPES, Scene

ROOT = Path(__file__).resolve().parents[2]
FIRST_TURN = ("shape", "colour", "count", "position", "describe", "order", "yesno", "history", "text")
# Text-only questions about the picture of turn 1, asked at turn 2, 3 or 4 ("follow-shape" ...).
FOLLOW_UPS = ("shape", "colour", "count", "position", "describe", "yesno")
FOLLOW_TURNS = (2, 3, 4)
KINDS = FIRST_TURN + tuple(f"follow-{kind}" for kind in FOLLOW_UPS)
ONE_SHAPE = ("shape", "colour", "position")  # asked of one-shape pictures only


class Renderer(NamedTuple):
    random_scene: Callable[..., Scene]  # (rng, count=None, kinds=None)
    picture: Callable[[Scene, random.Random], Image.Image]


RENDERERS = {
    "training": Renderer(pictures.random_scene, pictures.picture),
    "independent": Renderer(eval_pictures.random_scene, eval_pictures.picture),
}


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def names_only(reply: str, right: str, vocabulary) -> bool:
    """The reply names `right` and no other word of `vocabulary`."""
    said = words(reply) & set(vocabulary)
    return said == {right}


def count_said(reply: str) -> int | None:
    said = {COUNT_WORDS.index(w) + 1 for w in words(reply) & set(COUNT_WORDS)}
    said |= {int(w) for w in words(reply) if w.isdigit()}
    return said.pop() if len(said) == 1 else None


def order_said(reply: str) -> int | None:
    said = words(reply) & {"first", "second"}
    return ["first", "second"].index(said.pop()) if len(said) == 1 else None


def is_right(kind: str, reply: str, scenes: list[Scene], which: int | None) -> bool:
    item = scenes[-1].items[0]
    if kind in ("shape", "history"):
        return names_only(reply, item.shape, SHAPES)
    if kind == "colour":
        return names_only(reply, item.colour, COLOURS)
    if kind == "count":
        return count_said(reply) == len(scenes[0].items)
    if kind == "position":
        return POSITIONS[item.cell] in reply.lower() and sum(p in reply.lower() for p in POSITIONS) == 1
    if kind == "describe":
        return reply.strip() == describe(scenes[0])
    if kind == "order":
        return order_said(reply) == which
    raise ValueError(f"unknown kind {kind!r}")


def load_host(model: Path, threads: int, add_all_images: bool | None = None) -> None:
    import logging

    import torch

    import server
    from modules import shared
    from modules.logging_colors import logger

    torch.set_num_threads(threads)
    logger.setLevel(logging.WARNING)  # one line per generation would bury the figures
    shared.args = shared.parse_args(["--model", str(model), "--cpu"])
    if add_all_images is not None:  # as a settings file would, over models/config.yaml
        shared.settings["multimodal-add_all_images_to_prompt"] = add_all_images
        shared.user_setting_keys.add("multimodal-add_all_images_to_prompt")
    server.load_model_and_extensions()


def chat_turn(text: str, history: dict, images: list) -> tuple[str, dict]:
    from modules import shared
    from modules.chat import generate_chat_reply

    state = dict(shared.settings, do_sample=False, max_new_tokens=24, seed=0, history=history,
                 message_images=list(images))
    history = list(generate_chat_reply(text, state, loading_message=False))[-1]
    return history["internal"][-1][1], history


def new_history() -> dict:
    return {"internal": [], "visible": []}


def question_about(kind: str, scene: Scene, rng: random.Random) -> tuple[str, Callable[[str], bool]]:
    """The README's question of this kind (a FOLLOW_UPS kind) about `scene`, and its reply's check.
    "Is there a blue shape?" names one of the picture's colours half the time."""
    if kind == "yesno":
        present = {item.colour for item in scene.items}
        colour = rng.choice(sorted(present)) if rng.random() < 0.5 else rng.choice(list(COLOURS))
        question = PRESENCE_QUESTIONS[0].format(a=article(colour), colour=colour)
        return question, lambda reply: words(reply) & {"yes", "no"} == {"yes" if colour in present else "no"}
    return QUESTIONS_OF[kind][0], lambda reply: is_right(kind, reply, [scene], None)


def asks_for_picture(reply: str) -> bool:
    return PICTURE_REQUEST in reply.lower()


def ask(kind: str, rng: random.Random, renderer: str = "training") -> bool:
    """One fresh question of this kind (a FIRST_TURN kind) through the host; True when answered right."""
    chosen = RENDERERS[renderer]
    if kind in ASK_WHOLE_CHAT:
        return ASK_WHOLE_CHAT[kind](rng, chosen)
    scene = chosen.random_scene(rng, count=1 if kind in ONE_SHAPE else None)
    question, check = question_about(kind, scene, rng)
    reply, _ = chat_turn(question, new_history(), [chosen.picture(scene, rng)])
    return check(reply)


def ask_text(rng: random.Random, renderer: Renderer) -> bool:
    prompt = rng.choice(list(TEXT_CHAT))
    return chat_turn(prompt, new_history(), [])[0] == TEXT_CHAT[prompt]


def ask_order(rng: random.Random, renderer: Renderer) -> bool:
    """Two one-shape pictures of different colours: which one has the named colour."""
    colours = rng.sample(list(COLOURS), 2)
    scenes = [renderer.random_scene(rng, kinds=[(c, rng.choice(SHAPES))]) for c in colours]
    which = rng.randrange(2)
    question = ORDER_QUESTION.format(colour=colours[which])
    reply, _ = chat_turn(question, new_history(), [renderer.picture(s, rng) for s in scenes])
    return is_right("order", reply, scenes, which)


def ask_yesno(rng: random.Random, renderer: Renderer) -> bool:
    """"Is there a blue shape?" about one picture: its colour half the time."""
    scene = renderer.random_scene(rng)
    question, check = question_about("yesno", scene, rng)
    reply, _ = chat_turn(question, new_history(), [renderer.picture(scene, rng)])
    return check(reply)


def ask_history(rng: random.Random, renderer: Renderer) -> bool:
    """An earlier picture, answered by the model itself, then a new one: the answer is about the new one."""
    earlier, now = renderer.random_scene(rng, count=1), renderer.random_scene(rng, count=1)
    _, history = chat_turn(SHAPE_QUESTIONS[0], new_history(), [renderer.picture(earlier, rng)])
    reply, _ = chat_turn(SHAPE_QUESTIONS[0], history, [renderer.picture(now, rng)])
    return is_right("history", reply, [earlier, now], None)


# The kinds that are more than one question about one picture.
ASK_WHOLE_CHAT: dict[str, Callable[[random.Random, Renderer], bool]] = {
    "text": ask_text, "order": ask_order, "yesno": ask_yesno, "history": ask_history,
}


class FollowUp(NamedTuple):
    right: bool  # the follow-up of the kind measured
    asking: int  # replies after turn 1 that ask for a picture (one is in the chat already)
    replies: int  # replies after turn 1
    # A miss that the same question about the same picture, first in a fresh chat, misses too: the
    # picture was misread, not the follow-up (False when the follow-up is right).
    missed_alone: bool


def ask_follow_up(kind: str, turn: int, rng: random.Random, renderer: Renderer) -> FollowUp:
    """A chat as people have them: a picture with a question of another kind (turn 1), other
    follow-ups about it or chit-chat (turns 2 to `turn` - 1), then `kind` about it at `turn`, all
    text-only (the picture is in the history). `kind` is asked once: its answer is not in the chat yet."""
    scene = renderer.random_scene(rng, count=1 if kind in ONE_SHAPE else None)
    others = [k for k in FOLLOW_UPS if k != kind and (k not in ONE_SHAPE or len(scene.items) == 1)]
    question, _ = question_about(rng.choice(others), scene, rng)
    shown = renderer.picture(scene, rng)
    _, history = chat_turn(question, new_history(), [shown])
    asking = 0
    for _ in range(turn - 2):
        if rng.random() < 0.25:
            text = rng.choice(list(TEXT_CHAT))
        else:
            text, _ = question_about(rng.choice(others), scene, rng)
        reply, history = chat_turn(text, history, [])
        asking += asks_for_picture(reply)
    question, check = question_about(kind, scene, rng)
    reply, _ = chat_turn(question, history, [])
    right = check(reply)
    # Only on a miss, and drawing nothing from `rng`: the accuracies are those of a run without it.
    missed_alone = not right and not check(chat_turn(question, new_history(), [shown])[0])
    return FollowUp(right, asking + asks_for_picture(reply), turn - 1, missed_alone)


def measure_follow_up(kind: str, rng: random.Random, renderer: str, n: int) -> tuple[dict[str, float], int]:
    """n chats per turn, asking at turn 2, 3 and 4 in turn: accuracy per turn ("follow-shape@2" ...),
    the misses that the same question misses as the first about the picture ("follow-shape:missed
    alone", a count), and how many replies after turn 1 asked for a picture."""
    results = [(turn, ask_follow_up(kind.removeprefix("follow-"), turn, rng, RENDERERS[renderer]))
               for turn in (FOLLOW_TURNS[i % len(FOLLOW_TURNS)] for i in range(n * len(FOLLOW_TURNS)))]
    accuracies, line = {}, []
    for turn in FOLLOW_TURNS:
        rights = [result.right for at, result in results if at == turn]
        accuracies[f"{kind}@{turn}"] = round(sum(rights) / len(rights), 4)
        line.append(f"turn {turn} {sum(rights)}/{len(rights)} {sum(rights) / len(rights):.1%}")
    asking, replies = sum(r.asking for _, r in results), sum(r.replies for _, r in results)
    misses = sum(not r.right for _, r in results)
    accuracies[f"{kind}:missed alone"] = sum(r.missed_alone for _, r in results)
    print(f"{kind:16s} {'  '.join(line)}  misses also missed alone {accuracies[f'{kind}:missed alone']}/{misses}"
          f"  asking for a picture {asking}/{replies}", end="  ")
    return accuracies, asking


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-llava-shapes")
    parser.add_argument("--seed", type=int, default=20261122, help="a seed training never used")
    parser.add_argument("--n", type=int, default=100,
                        help="questions per kind (follow-up kinds: per turn, so 3n chats)")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--renderer", choices=list(RENDERERS), default="training",
                        help="who draws the pictures: the training renderer, or eval_pictures")
    parser.add_argument("--add-all-images", choices=("on", "off"),
                        help="override the model's add_all_images_to_prompt (the demo's is on)")
    args = parser.parse_args(argv)
    load_host(args.model, args.threads, None if args.add_all_images is None else args.add_all_images == "on")
    accuracies: dict[str, float] = {}
    asking = 0
    for kind in args.kinds:
        rng = random.Random(f"{args.seed}-{kind}")
        start = time.time()
        if kind in FIRST_TURN:
            right = sum(ask(kind, rng, args.renderer) for _ in range(args.n))
            accuracies[kind] = round(right / args.n, 4)
            print(f"{kind:16s} {right:4d}/{args.n}  {accuracies[kind]:.1%}", end="  ")
        else:
            measured, asked = measure_follow_up(kind, rng, args.renderer, args.n)
            accuracies.update(measured)
            asking += asked
        print(f"({time.time() - start:.0f} s)", flush=True)
    if any(kind not in FIRST_TURN for kind in args.kinds):
        accuracies["asking_for_a_picture"] = asking  # a count: follow-up replies that ask for one
    print(json.dumps(accuracies))
    return accuracies


if __name__ == "__main__":
    main()
