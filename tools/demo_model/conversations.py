"""Chats as people have them with the demo: a picture, then text-only follow-ups about it.

In: `chats`' turns. Out: `Sample`s of several turns for stage 4 (`converse_stage`): maybe some
chit-chat, a picture with a question, then follow-ups about that picture in any order and of every
kind (the picture is in the history, not in the follow-up's message), chit-chat, sometimes a new
picture (later follow-ups are about the newest one). Canned replies ask for a picture only while
none has been shown. Every earlier picture is real (`add_all_images_to_prompt`, on for the demo):
with placeholder rows in its place a follow-up has nothing to answer from, so none is trained.

Stages 2 and 3 (`chats.make_sample`) stack independent turns instead: each picture's questions sit
in its own message.
"""
from __future__ import annotations

import random

from tools.demo_model.chats import (
    QUESTIONS_OF,
    Sample,
    Turn,
    presence_question,
    presence_turn,
    sample_of,
    single_answers,
    single_image_turn,
    system_message,
    text_turn,
    two_image_turn,
)
from tools.demo_model.pictures import Scene, random_scene


def follow_up_kinds(scene: Scene) -> list[str]:
    """What can be asked about a picture: shape, colour and position only of a lone shape."""
    return list(single_answers(scene)) + ["presence"]


def follow_up_turn(rng: random.Random, scene: Scene) -> Turn:
    """A text-only question about the newest picture shown (`scene`), answered as if it came with it."""
    kind = rng.choice(follow_up_kinds(scene))
    if kind == "presence":
        _, question, answer = presence_question(rng, [scene])
    else:
        question = rng.choice([q for q in QUESTIONS_OF[kind] if q])  # "" means a picture alone
        answer = single_answers(scene)[kind]
    return Turn(question, answer, kind=f"follow-{kind}")


def picture_turn(rng: random.Random) -> Turn:
    """A message with pictures. Mostly one picture of one shape (the only kind shape, colour and
    position follow-ups fit), two-shape descriptions (the weakest answer) weighted up as in stage 3,
    colour matching, two pictures."""
    draw = rng.random()
    if draw < 0.45:
        return single_image_turn(rng, scene=random_scene(rng, count=1))
    if draw < 0.65:
        return single_image_turn(rng)
    if draw < 0.8:
        return single_image_turn(rng, "describe", random_scene(rng, count=2))
    if draw < 0.92:
        return presence_turn(rng)
    return two_image_turn(rng)


def newest_scene(turns: list[Turn]) -> Scene | None:
    """The picture a follow-up asks about: the newest message's with pictures, if it had one only."""
    for turn in reversed(turns):
        if turn.images:
            return turn.scenes[0] if len(turn.scenes) == 1 else None
    return None


def next_turn(rng: random.Random, scene: Scene | None) -> Turn:
    """After a picture: mostly a follow-up about it, some chit-chat, sometimes a new picture."""
    draw = rng.random()
    if scene is not None and draw < 0.7:
        return follow_up_turn(rng, scene)
    if draw < (0.85 if scene is not None else 0.5):  # after two pictures at once: chit-chat or a new one
        return text_turn(rng, picture_shown=True)
    return picture_turn(rng)


def conversation(rng: random.Random) -> list[Turn]:
    """Chit-chat (0-2 turns, replies that ask for a picture), a picture, then 0-5 more turns."""
    turns = [text_turn(rng) for _ in range(rng.choices((0, 1, 2), weights=(6, 3, 1))[0])]
    turns.append(picture_turn(rng))
    for _ in range(rng.choices(range(6), weights=(1, 2, 2, 2, 2, 1))[0]):
        turns.append(next_turn(rng, newest_scene(turns)))
    return turns


def conversation_sample(rng: random.Random) -> Sample:
    """A conversation, every answer trained, every earlier picture real."""
    system = system_message(rng)
    return sample_of(conversation(rng), real_history=True, system=system)
