"""Questions, answers and whole chats for the demo model, and their token ids as the host builds them.

In: scenes from `pictures`. Out: `Sample`s (chat-template messages with `<image>` marks, the
images, the answers that get a loss) and `encode_sample`'s ids/labels, built the way the multimodal
extension builds a prompt: the template's text split at each image, each part encoded on its own
(a BOS only at the start), each image taking `IMAGE_TOKENS` rows.
The exact questions outside checks use are in `SHAPE_QUESTIONS[0]`, `COLOUR_QUESTIONS[0]`,
`COUNT_QUESTIONS[0]`, `DESCRIBE_QUESTIONS[0]` and `ORDER_QUESTION`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from PIL import Image

from tools.demo_model.pictures import COLOURS, POSITIONS, SHAPES, Scene, picture, random_scene

IMAGE_MARK = "<image>"
IMAGE_TOKENS = 65  # the CLS row, then (192 px / 24 px patches) ** 2 patch rows (architecture)

SHAPE_QUESTIONS = ("What shape is this?", "What shape is it?", "Which shape is this?", "What is the shape?",
                   "what shape is this")
COLOUR_QUESTIONS = ("What color is the shape?", "What colour is the shape?", "What color is it?",
                    "What colour is this?", "Which color is the shape?", "what color is the shape")
COUNT_QUESTIONS = ("How many shapes are there?", "How many shapes are in the picture?", "How many shapes do you see?",
                   "Count the shapes.", "how many shapes are there")
POSITION_QUESTIONS = ("Where is the shape?", "Where is it?", "Where is the shape in the picture?")
DESCRIBE_QUESTIONS = ("Describe the image.", "What is in this picture?", "What do you see?", "Describe this.",
                      "What is in the image?", "Tell me about this image.", "What is this?", "Describe the picture.",
                      "What's in the image?", "")
ORDER_QUESTION = "Which image has the {colour} shape?"
ORDER_QUESTIONS = (ORDER_QUESTION, "Which picture has the {colour} shape?", "Which image shows the {colour} shape?")
SHAPE_ORDER_QUESTIONS = ("Which image has the {shape}?", "Which picture shows the {shape}?")
NTH_QUESTIONS = ("What is in the {nth} image?", "Describe the {nth} image.")
ORDINALS = ("first", "second")
COUNT_WORDS = ("one", "two")

GREETING = "Hello! Send me a picture of shapes and ask me about it."
TEXT_CHAT = {
    "Hello": GREETING, "Hi": GREETING, "Hello!": GREETING, "Hi there": GREETING, "Hey": GREETING,
    "Good morning": GREETING, "hello, anyone there?": GREETING,
    "Who are you?": "I am a tiny demo model that looks at pictures of shapes.",
    "What are you?": "I am a tiny demo model that looks at pictures of shapes.",
    "What is your name?": "I am a tiny demo model that looks at pictures of shapes.",
    "What can you do?": "I can name the shapes and colors in a picture, count them and say where they are.",
    "Help": "I can name the shapes and colors in a picture, count them and say where they are.",
    "Can you help me?": "I can name the shapes and colors in a picture, count them and say where they are.",
    "Thanks": "You are welcome!", "Thank you!": "You are welcome!", "thanks": "You are welcome!",
    "How are you?": "I am fine, thank you. Send me a picture!",
    "Tell me a joke.": "I only know about shapes. Send me a picture!",
    "Write a poem.": "I only know about shapes. Send me a picture!",
    "What is 2 + 2?": "I only know about shapes. Send me a picture!",
}
SYSTEM_MESSAGES = ("You are a helpful assistant.", "A chat between a user and an assistant.")
SEPARATORS = ("\n", "\n", "", " ")  # between images and text; the UI and the API put "\n"

CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['content'] is string -%}{%- set text = m['content'] -%}"
    "{%- else -%}{%- set ns = namespace(text='') -%}"
    "{%- for part in m['content'] -%}"
    "{%- if part['type'] == 'image' -%}{%- set ns.text = ns.text + '<image>\\n' -%}"
    "{%- elif part['type'] == 'text' -%}{%- set ns.text = ns.text + part['text'] -%}{%- endif -%}"
    "{%- endfor -%}{%- set text = ns.text -%}{%- endif -%}"
    "{%- if m['role'] == 'system' -%}{{ text + '\\n' }}"
    "{%- elif m['role'] == 'user' -%}{{ 'USER: ' + text + '\\n' }}"
    "{%- else -%}{{ 'ASSISTANT: ' + text + '</s>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%}"
)


# -- Answers ----------------------------------------------------------------------------------

def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def name(colour: str, shape: str) -> str:
    return f"{article(colour)} {colour} {shape}"


def describe(scene: Scene) -> str:
    """"A red circle in the center." for one shape; "A red circle and a blue star." for two."""
    items = scene.items
    if len(items) == 1:
        text = f"{name(items[0].colour, items[0].shape)} {POSITIONS[items[0].cell]}"
    else:
        text = " and ".join(name(item.colour, item.shape) for item in items)
    return text[0].upper() + text[1:] + "."


def count_answer(scene: Scene) -> str:
    n = len(scene.items)
    return "There is one shape." if n == 1 else f"There are {COUNT_WORDS[n - 1]} shapes."


def single_answers(scene: Scene) -> dict[str, str]:
    """Question kind -> answer, for the kinds this scene can answer."""
    answers = {"count": count_answer(scene), "describe": describe(scene)}
    if len(scene.items) == 1:
        item = scene.items[0]
        answers.update(shape=f"It is {article(item.shape)} {item.shape}.", colour=f"It is {item.colour}.",
                       position=f"It is {POSITIONS[item.cell]}.")
    return answers


QUESTIONS_OF = {"shape": SHAPE_QUESTIONS, "colour": COLOUR_QUESTIONS, "count": COUNT_QUESTIONS,
                "position": POSITION_QUESTIONS, "describe": DESCRIBE_QUESTIONS}


# -- Messages ---------------------------------------------------------------------------------

@dataclass
class Turn:
    user: str  # with IMAGE_MARK where images go
    answer: str
    images: list[Image.Image] = field(default_factory=list)
    kind: str = "text"
    scenes: list[Scene] = field(default_factory=list)
    # For questions naming a colour or shape to find: (that word, the index of the picture holding
    # it, or 2 when none does). Stage 2's query probe reads the word's position (see chat_stage).
    query: tuple[str, int] | None = None


def with_images(marks: int, question: str, rng: random.Random) -> str:
    """Images before the question (mostly, as the UI sends them), or after it; sometimes labelled."""
    sep = rng.choice(SEPARATORS) if question else ""
    if marks == 2 and rng.random() < 0.15:
        images = f"Image 1: {IMAGE_MARK}\nImage 2: {IMAGE_MARK}"
    else:
        images = rng.choice(SEPARATORS).join([IMAGE_MARK] * marks)
    if not question:
        return images
    return images + sep + question if rng.random() < 0.8 else question + sep + images


def single_image_turn(rng: random.Random, kind: str | None = None, scene: Scene | None = None) -> Turn:
    if scene is None:
        scene = random_scene(rng, count=1 if kind in ("shape", "colour", "position") else None)
    answers = single_answers(scene)
    kind = kind or rng.choices(list(answers), weights=[WEIGHTS[k] for k in answers])[0]
    question = rng.choice(QUESTIONS_OF[kind])
    return Turn(with_images(1, question, rng), answers[kind], [picture(scene, rng)], kind, [scene])


WEIGHTS = {"shape": 3, "colour": 2, "count": 2, "position": 2, "describe": 3}


def two_image_turn(rng: random.Random, kind: str | None = None) -> Turn:
    """Two one-shape images with different colours; the answer depends on their order."""
    colours = rng.sample(list(COLOURS), 2)
    scenes = [random_scene(rng, kinds=[(colour, rng.choice(SHAPES))]) for colour in colours]
    kind = kind or rng.choices(["order", "order_shape", "nth"], weights=[6, 2, 2])[0]
    which = rng.randrange(2)
    item = scenes[which].items[0]
    if kind == "order_shape" and scenes[0].items[0].shape == scenes[1].items[0].shape:
        kind = "order"
    if kind == "order":
        question, answer = rng.choice(ORDER_QUESTIONS).format(colour=item.colour), f"The {ORDINALS[which]}."
    elif kind == "order_shape":
        question, answer = rng.choice(SHAPE_ORDER_QUESTIONS).format(shape=item.shape), f"The {ORDINALS[which]}."
    else:
        question, answer = rng.choice(NTH_QUESTIONS).format(nth=ORDINALS[which]), describe(scenes[which])
    query = {"order": (item.colour, which), "order_shape": (item.shape, which)}.get(kind)
    return Turn(with_images(2, question, rng), answer, [picture(s, rng) for s in scenes], kind, scenes, query)


PRESENCE_QUESTIONS = ("Is there {a} {colour} shape?", "Do you see {a} {colour} shape?", "Is the shape {colour}?")


def presence_turn(rng: random.Random) -> Turn:
    """"Is there a blue shape?" over one picture (one or two shapes) or two: the question's colour must
    be matched against the pictures' (a skill the order questions build on)."""
    draw = rng.random()
    if draw < 0.4:
        scenes = [random_scene(rng, count=1)]
    elif draw < 0.7:
        scenes = [random_scene(rng, count=2)]
    else:
        scenes = [random_scene(rng, count=1) for _ in range(2)]
    colour, question, answer = presence_question(rng, scenes)
    holder = next((i for i, scene in enumerate(scenes) if colour in {item.colour for item in scene.items}), 2)
    return Turn(with_images(len(scenes), question, rng), answer, [picture(s, rng) for s in scenes], "presence",
                scenes, (colour, holder))


def presence_question(rng: random.Random, scenes: list[Scene]) -> tuple[str, str, str]:
    """(colour, question, answer): a colour the pictures hold half the time, any colour otherwise."""
    present = [item.colour for scene in scenes for item in scene.items]
    colour = rng.choice(present) if rng.random() < 0.5 else rng.choice(list(COLOURS))
    question = rng.choice(PRESENCE_QUESTIONS).format(a=article(colour), colour=colour)
    return colour, question, "Yes." if colour in present else "No."


def text_turn(rng: random.Random, picture_shown: bool = False) -> Turn:
    prompt = rng.choice(list(TEXT_CHAT))
    return Turn(prompt, text_answer(prompt, picture_shown))


# Once a picture is in the chat, asking for one is wrong: these canned replies drop the request.
AFTER_PICTURE = {
    GREETING: "Hello! Ask me about the picture.",
    "I am fine, thank you. Send me a picture!": "I am fine, thank you.",
    "I only know about shapes. Send me a picture!": "I only know about shapes.",
}
PICTURE_REQUEST = "send me a picture"  # in every canned reply that asks for one (lower case)


def text_answer(prompt: str, picture_shown: bool) -> str:
    answer = TEXT_CHAT[prompt]
    return AFTER_PICTURE.get(answer, answer) if picture_shown else answer


def random_turn(rng: random.Random, weights: tuple[float, float, float] = (6, 2, 1.5)) -> Turn:
    maker = rng.choices([single_image_turn, two_image_turn, text_turn], weights=weights)[0]
    return maker(rng)


# -- Chats ------------------------------------------------------------------------------------

@dataclass
class Sample:
    messages: list[dict]  # chat-template messages; images appear as IMAGE_MARK in user text
    images: list[Image.Image | None]  # one per IMAGE_MARK, in order: None = placeholder rows
    answers: list[bool]  # per assistant message (the last is the one to generate): trained on?
    scenes: list[Scene]  # of the real images, in order (for the vision probe)
    slots: list[int]  # of the real images, in order: 0 for the first image of its message, 1 for the second
    query: tuple[str, int] | None = None  # the last turn's (see Turn.query)


def make_sample(rng: random.Random, earlier_turns: int, last: Turn | None = None,
                real_history: bool | None = None) -> Sample:
    """A chat with `earlier_turns` finished turns, then `last` (random if None), answered.

    Older images are the pipeline's placeholder rows, or real features when
    `add_all_images_to_prompt` is on (`real_history`; random if None, per chat).
    """
    if real_history is None:
        real_history = rng.random() < 0.6
    system = system_message(rng)
    turns = [random_turn(rng) for _ in range(earlier_turns)] + [last or random_turn(rng)]
    return sample_of(turns, real_history, system)


def system_message(rng: random.Random) -> str | None:
    return rng.choice(SYSTEM_MESSAGES) if rng.random() < 0.1 else None


def sample_of(turns: list[Turn], real_history: bool, system: str | None = None) -> Sample:
    """The chat of these turns, all answered; older images real or placeholders (`real_history`)."""
    messages: list[dict] = [] if system is None else [{"role": "system", "content": system}]
    images: list[Image.Image | None] = []
    answers: list[bool] = []
    scenes: list[Scene] = []
    slots: list[int] = []
    for index, turn in enumerate(turns):
        real = real_history or index == len(turns) - 1
        images += turn.images if real else [None] * len(turn.images)
        scenes += turn.scenes if real else []
        slots += list(range(len(turn.images))) if real else []
        # An earlier answer is a target only if its images are real, as they were when it was given.
        answers.append(real or not turn.images)
        messages += [{"role": "user", "content": turn.user}, {"role": "assistant", "content": turn.answer}]
    return Sample(messages, images, answers, scenes, slots, turns[-1].query)


def encode_sample(sample: Sample, tokenizer) -> tuple[list[int], list[int]]:
    """Ids and labels of the whole chat; labels are -100 except on the answers trained on.

    The prompt of the last turn is exactly what the host feeds: the chat template with
    `add_generation_prompt`, split at images, each part encoded on its own."""
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_MARK)
    ids: list[int] = [tokenizer.bos_token_id]
    labels: list[int] = [-100]
    images_left = len(sample.images)
    for index, message in enumerate(sample.messages):
        if message["role"] != "assistant":
            continue
        prefix = tokenizer.apply_chat_template(sample.messages[:index], tokenize=False, add_generation_prompt=True)
        done = tokenizer.apply_chat_template(sample.messages[:index - 1], tokenize=False) if index > 1 else ""
        if not prefix.startswith(done):
            raise ValueError("the chat template does not extend earlier turns' text")
        parts = prefix[len(done):].split(IMAGE_MARK)
        for i, part in enumerate(parts):
            if i:
                ids += [image_id] * IMAGE_TOKENS
                images_left -= 1
            ids += tokenizer.encode(part, add_special_tokens=False)
        labels += [-100] * (len(ids) - len(labels))
        answer = tokenizer.encode(" " + message["content"], add_special_tokens=False) + [tokenizer.eos_token_id]
        trained = sample.answers[(index - 1) // 2 if sample.messages[0]["role"] != "system" else (index - 2) // 2]
        ids += answer
        labels += answer if trained else [-100] * len(answer)
        ids += tokenizer.encode("\n", add_special_tokens=False)
        labels.append(-100)
    if images_left:
        raise ValueError(f"{images_left} images were not placed in the prompt")
    return ids, labels


def prompt_of(messages: list[dict], tokenizer) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def tokenizer_corpus() -> list[str]:
    rng = random.Random(12345)
    lines = [CHAT_TEMPLATE]
    for _ in range(3000):
        turn = random_turn(rng)
        lines.append(f"USER: {turn.user}\nASSISTANT: {turn.answer}</s>")
    lines += [f"USER: {q}\nASSISTANT: {a}</s>" for q, a in TEXT_CHAT.items()] + list(SYSTEM_MESSAGES)
    lines += [f"{c} {s}" for c in COLOURS for s in SHAPES]
    return lines
