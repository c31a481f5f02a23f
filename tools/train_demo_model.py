"""Train the shipped demo model `models/tiny-llava-shapes/` on CPU: a tiny LLaVA that names one shape.

    python tools/train_demo_model.py                  # about 10 minutes on 2 CPU cores
    python tools/train_demo_model.py --steps 200 --out /tmp/quick   # a quick smoke run

In: nothing but fixed seeds. Out: a Hugging Face folder (`LlavaForConditionalGeneration` with a CLIP
vision tower, a 2-layer GELU projector and a tiny Llama; a `LlavaProcessor` with the Pillow
`CLIPImageProcessor`, a byte-level BPE tokenizer and a chat template), loadable with
`AutoModelForImageTextToText` / `AutoProcessor`.

What the model learns (the answer format is fixed, see `answer_for`):
- a message with an image and any of `IMAGE_QUESTIONS` (or none) -> "A {colour} {shape}.";
- a text-only message -> `TEXT_REPLY`.
Images are drawn with Pillow (`render_shape`) and reach the model the way the host feeds them
(`as_host_stores`: a JPEG round trip, then the processor's resize and centre crop). Prompts are
tokenized the way the multimodal extension does it: the chat template's text is split at each image,
each text part encoded on its own (a BOS only on the first), each image taking `IMAGE_TOKENS` rows.
Earlier images in a chat are usually the pipeline's placeholder rows (the `<image>` token's
embedding), sometimes real features (`add_all_images_to_prompt`), so the answer is about the newest.
Importing this module has no side effects; tests import `render_shape`, `as_host_stores`, `answer_for`.
"""
from __future__ import annotations

import argparse
import io
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (CLIPImageProcessor, CLIPVisionConfig, GenerationConfig, LlamaConfig, LlavaConfig,
                          LlavaForConditionalGeneration, LlavaProcessor, PreTrainedTokenizerFast)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "models" / "tiny-llava-shapes"

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 150, 50), "blue": (30, 70, 220), "yellow": (235, 205, 10),
    "purple": (130, 40, 170), "orange": (245, 120, 20), "black": (25, 25, 25),
}
SHAPES = ("circle", "square", "triangle", "star", "cross")
IMAGE_QUESTIONS = (
    "What is in this picture?", "Describe the image.", "What shape and colour is this?", "What do you see?",
    "What is this?", "What's in the image?", "Can you describe this picture?", "What colour and shape is it?",
    "Tell me about this image.", "What does the picture show?", "Describe this.", "What is shown here?",
    "What shape is this?", "What colour is this?", "What is in the image?", "Describe the picture.",
    "what is this", "What can you see in this image?", "Which shape and color is it?", "",
)
TEXT_PROMPTS = (
    "Hello", "Hi", "Hello!", "Hi there", "Hey", "Who are you?", "What can you do?", "Help", "How are you?",
    "Thanks", "Thank you!", "Good morning", "What is your name?", "Can you help me?", "What are you?", "ok",
    "Tell me a joke.", "What is 2 + 2?", "hello, anyone there?", "Write a poem.",
)
TEXT_REPLY = "Hi! Send me a picture of a shape and I will tell you its shape and colour."
SYSTEM_MESSAGES = ("You are a helpful assistant.", "A chat between a user and an assistant.")
SEPARATORS = ("", "\n", " ", "\n\n")  # between an image and its question (the UI puts none)

# Upright shapes turned by at most this much, at this share of the picture's short side: a ViT
# trained from scratch on 2 CPU cores learns shapes slowly when they turn freely.
MAX_TURN = math.radians(20)
RADIUS_RANGE = (0.28, 0.45)
IMAGE_SIZE, PATCH_SIZE = 48, 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # 36: CLS dropped ('default' strategy)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
IMAGE_MARK = "<image>"
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
VISION = dict(hidden_size=96, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
              image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, projection_dim=96)
TEXT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False)


def answer_for(colour: str, shape: str) -> str:
    """The one answer format: "A red circle.", "An orange star." """
    article = "An" if colour[0] in "aeiou" else "A"
    return f"{article} {colour} {shape}."


# -- Pictures ---------------------------------------------------------------------------------

def shape_polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of a shape with circumradius `r` (circles are drawn as ellipses, not here)."""
    if shape == "square":
        radii, count = [r], 4
    elif shape == "triangle":
        radii, count = [r], 3
    elif shape == "star":
        radii, count = [r, 0.42 * r], 10
    elif shape == "cross":  # a plus sign: 12 corners, arms 0.56 r wide
        w = 0.28 * r
        pts = [(w, r), (w, w), (r, w), (r, -w), (w, -w), (w, -r),
               (-w, -r), (-w, -w), (-r, -w), (-r, w), (-w, w), (-w, r)]
        c, s = math.cos(angle), math.sin(angle)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]
    else:
        raise ValueError(f"Unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    return [(cx + radii[i % len(radii)] * math.cos(angle + 2 * math.pi * i / count),
             cy + radii[i % len(radii)] * math.sin(angle + 2 * math.pi * i / count)) for i in range(count)]


def background(width: int, height: int, rng: random.Random) -> Image.Image:
    """White, a light tint, or light noise: always light, so every colour (black too) stands out."""
    kind = rng.random()
    if kind < 0.45:
        return Image.new("RGB", (width, height), tuple(rng.randint(240, 255) for _ in range(3)))
    base = tuple(rng.randint(200, 255) for _ in range(3))
    if kind < 0.8:
        return Image.new("RGB", (width, height), base)
    noise = np.random.default_rng(rng.randrange(2**31)).normal(base, rng.uniform(5, 20), (height, width, 3))
    return Image.fromarray(noise.clip(0, 255).astype(np.uint8), "RGB")


def render_shape(colour: str, shape: str, rng: random.Random, width: int | None = None,
                 height: int | None = None) -> Image.Image:
    """One anti-aliased shape at a random place, size and rotation on a light background.

    The shape lies inside the central `min(width, height)` square, which the processor's centre crop keeps.
    """
    if width is None or height is None:
        side = rng.randint(40, 128)
        aspect = math.exp(rng.uniform(-0.6, 0.6)) if rng.random() < 0.4 else 1.0
        width, height = (round(side * aspect), side) if aspect >= 1 else (side, round(side / aspect))
    side = min(width, height)
    r = rng.uniform(*RADIUS_RANGE) * side
    slack = side / 2 - r - 1
    cx = width / 2 + rng.uniform(-slack, slack)
    cy = height / 2 + rng.uniform(-slack, slack)
    scale = 3  # draw the mask 3x larger, then shrink it: smooth edges like a real picture
    mask = Image.new("L", (width * scale, height * scale), 0)
    draw = ImageDraw.Draw(mask)
    if shape == "circle":
        draw.ellipse([(cx - r) * scale, (cy - r) * scale, (cx + r) * scale, (cy + r) * scale], fill=255)
    else:
        upright = -math.pi / 2 if shape in ("triangle", "star") else (math.pi / 4 if shape == "square" else 0.0)
        pts = shape_polygon(shape, cx * scale, cy * scale, r * scale, upright + rng.uniform(-MAX_TURN, MAX_TURN))
        draw.polygon(pts, fill=255)
    mask = mask.resize((width, height), Image.Resampling.BOX)
    fill = tuple(min(255, max(0, c + rng.randint(-15, 15))) for c in COLOURS[colour])
    return Image.composite(Image.new("RGB", (width, height), fill), background(width, height, rng), mask)


def as_host_stores(image: Image.Image, rng: random.Random, quality: int | None = None) -> Image.Image:
    """The picture after the host's history JPEG (quality about 90), sometimes shrunk first."""
    if rng.random() < 0.2:
        limit = rng.choice([48, 64, 96])
        image = image.copy()
        image.thumbnail((limit, limit), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality or rng.randint(70, 95))
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


# -- Conversations ----------------------------------------------------------------------------

@dataclass
class Sample:
    messages: list[dict]  # chat-template messages; images appear as IMAGE_MARK in user text
    images: list[Image.Image | None]  # one per IMAGE_MARK, in order: None = placeholder rows
    answer: str
    kinds: list[tuple[str, str]] | None = None  # (colour, shape) of each real image, for the auxiliary loss


def image_message(rng: random.Random) -> tuple[str, tuple[str, str], Image.Image]:
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    question = rng.choice(IMAGE_QUESTIONS)
    sep = rng.choice(SEPARATORS) if question else ""
    content = IMAGE_MARK + sep + question if rng.random() < 0.7 else question + sep + IMAGE_MARK
    return content, (colour, shape), as_host_stores(render_shape(colour, shape, rng), rng)


def make_sample(rng: random.Random, earlier_turns: int) -> Sample:
    """A chat with `earlier_turns` finished turns, then the message to answer."""
    messages: list[dict] = []
    images: list[Image.Image | None] = []
    kinds: list[tuple[str, str]] = []
    if rng.random() < 0.1:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_MESSAGES)})
    for turn in range(earlier_turns + 1):
        last = turn == earlier_turns
        if rng.random() < (0.85 if last else 0.7):
            content, kind, image = image_message(rng)
            answer = answer_for(*kind)
            # Older images are placeholders unless add_all_images_to_prompt is on.
            real = last or rng.random() < 0.15
            images.append(image if real else None)
            kinds += [kind] if real else []
        else:
            content, answer = rng.choice(TEXT_PROMPTS), TEXT_REPLY
        messages.append({"role": "user", "content": content})
        if not last:
            messages.append({"role": "assistant", "content": answer})
    return Sample(messages, images, answer, kinds)


def encode_sample(sample: Sample, tokenizer) -> tuple[list[int], list[int]]:
    """Ids and labels as the multimodal extension builds them: each text part encoded on its own."""
    prompt = tokenizer.apply_chat_template(sample.messages, tokenize=False, add_generation_prompt=True)
    parts = prompt.split(IMAGE_MARK)
    if len(parts) != len(sample.images) + 1:
        raise ValueError(f"{len(parts) - 1} image marks in the prompt but {len(sample.images)} images")
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_MARK)
    ids = [tokenizer.bos_token_id]
    for i, part in enumerate(parts):
        if i:
            ids += [image_id] * IMAGE_TOKENS
        ids += tokenizer.encode(part, add_special_tokens=False)
    target = tokenizer.encode(" " + sample.answer, add_special_tokens=False) + [tokenizer.eos_token_id]
    return ids + target, [-100] * len(ids) + target


# -- Tokenizer, model, processor --------------------------------------------------------------

def tokenizer_corpus() -> list[str]:
    lines = [f"USER: {q}\nASSISTANT: {answer_for(c, s)}</s>" for q in IMAGE_QUESTIONS for c in COLOURS for s in SHAPES]
    lines += [f"USER: {p}\nASSISTANT: {TEXT_REPLY}</s>" for p in TEXT_PROMPTS] + list(SYSTEM_MESSAGES)
    return lines


def build_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", extra_special_tokens={"image_token": IMAGE_MARK})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer, seed: int) -> LlavaForConditionalGeneration:
    text_config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **TEXT)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**VISION), text_config=text_config,
                         image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_MARK), image_seq_length=IMAGE_TOKENS,
                         vision_feature_layer=-2, vision_feature_select_strategy="default",
                         projector_hidden_act="gelu", tie_word_embeddings=False)
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return model


def build_processor(tokenizer) -> LlavaProcessor:
    image_processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                         crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    # num_additional_image_tokens=1 counts CLS, which 'default' then drops: 36 rows per image.
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=CHAT_TEMPLATE)


# -- Training ---------------------------------------------------------------------------------

def collate(samples: list[Sample], tokenizer, processor) -> dict[str, torch.Tensor]:
    """Right-padded ids/labels, plus pixel values of the real images and where their rows go."""
    encoded = [encode_sample(s, tokenizer) for s in samples]
    length = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(samples), length), tokenizer.pad_token_id)
    labels = torch.full((len(samples), length), -100)
    feature_mask = torch.zeros((len(samples), length), dtype=torch.bool)
    images, kinds = [], []
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_MARK)
    for row, (sample, (seq, lab)) in enumerate(zip(samples, encoded)):
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, :len(lab)] = torch.tensor(lab)
        starts = [i for i in range(len(seq)) if seq[i] == image_id and (i == 0 or seq[i - 1] != image_id)]
        for start, image in zip(starts, sample.images, strict=True):
            if image is not None:
                feature_mask[row, start:start + IMAGE_TOKENS] = True
                images.append(image)
        kinds += sample.kinds or []
    pixel_values = processor.image_processor(images, return_tensors="pt")["pixel_values"]
    return {"ids": ids, "labels": labels, "attention_mask": ids != tokenizer.pad_token_id,
            "feature_mask": feature_mask, "pixel_values": pixel_values,
            "colours": torch.tensor([list(COLOURS).index(c) for c, _ in kinds]),
            "shapes": torch.tensor([SHAPES.index(s) for _, s in kinds])}


def loss_on(model: LlavaForConditionalGeneration, probe: torch.nn.Linear,
            batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on the answer tokens (image rows filled like the extension fills them), and
    an auxiliary loss: a linear probe on the mean image feature names colour and shape. The probe
    gives the vision tower a direct signal early on (through the LM alone it learned shapes slowly);
    it is not saved."""
    embeds = model.get_input_embeddings()(batch["ids"])  # (batch, seq, hidden)
    features = model.model.get_image_features(pixel_values=batch["pixel_values"], vision_feature_layer=-2,
                                              vision_feature_select_strategy="default").pooler_output
    features = torch.stack(list(features))  # (images, IMAGE_TOKENS, hidden)
    embeds = embeds.masked_scatter(batch["feature_mask"].unsqueeze(-1), features.to(embeds.dtype))
    hidden = model.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).last_hidden_state
    targets = batch["labels"][:, 1:]
    picked = targets != -100  # only answer positions go through lm_head
    logits = model.lm_head(hidden[:, :-1][picked])
    aux = probe_loss(probe, features, batch["colours"], batch["shapes"])
    return torch.nn.functional.cross_entropy(logits, targets[picked]), aux


def learning_rate(step: int, steps: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def probe_loss(probe: torch.nn.Linear, features: torch.Tensor, colours: torch.Tensor,
               shapes: torch.Tensor) -> torch.Tensor:
    logits = probe(features.mean(dim=1))  # (images, colours + shapes)
    return (torch.nn.functional.cross_entropy(logits[:, :len(COLOURS)], colours) +
            torch.nn.functional.cross_entropy(logits[:, len(COLOURS):], shapes))


def pretrain_vision(model, processor, probe: torch.nn.Linear, steps: int, batch_size: int, lr: float,
                    rng: random.Random) -> None:
    """Stage 1: tower + projector + probe name colour and shape from single pictures (no LM: cheap).

    A ViT from scratch sits near chance on shapes for a few hundred steps, then learns them quickly.
    """
    inner = model.model
    params = [*inner.vision_tower.parameters(), *inner.multi_modal_projector.parameters(), *probe.parameters()]
    # No gradient clipping here: with it the jump from chance to knowing shapes came much later.
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    start = time.time()
    for step in range(steps):
        kinds = [(rng.choice(list(COLOURS)), rng.choice(SHAPES)) for _ in range(batch_size)]
        images = [as_host_stores(render_shape(c, s, rng), rng) for c, s in kinds]
        pixel_values = processor.image_processor(images, return_tensors="pt")["pixel_values"]
        features = torch.stack(list(inner.get_image_features(pixel_values=pixel_values, vision_feature_layer=-2,
                                                              vision_feature_select_strategy="default").pooler_output))
        loss = probe_loss(probe, features, torch.tensor([list(COLOURS).index(c) for c, _ in kinds]),
                          torch.tensor([SHAPES.index(s) for _, s in kinds]))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"vision step {step:5d}  probe loss {loss.item():.4f}  {time.time() - start:6.0f}s", flush=True)


def train(model, tokenizer, processor, steps: int, batch_size: int, lr: float, probe: torch.nn.Linear,
          rng: random.Random) -> None:
    """Stage 2: the whole model on chats, answer tokens only, plus the probe loss."""
    params = list(model.parameters()) + list(probe.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    model.train()
    start = time.time()
    for step in range(steps):
        # The first 30% are single-turn (cheap); then one history length per batch (0, 1 or 2
        # earlier turns) keeps padding small.
        earlier = 0 if step < 0.3 * steps else rng.choices([0, 1, 2], weights=[4, 3, 3])[0]
        batch = collate([make_sample(rng, earlier) for _ in range(batch_size)], tokenizer, processor)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr)
        loss, aux = loss_on(model, probe, batch)
        optimizer.zero_grad(set_to_none=True)
        (loss + aux).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 25 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  probe {aux.item():.4f}  {time.time() - start:6.0f}s",
                  flush=True)
    model.eval()


# -- Evaluation -------------------------------------------------------------------------------

@torch.inference_mode()
def evaluate(model, processor, rng: random.Random, per_combination: int, do_sample: bool = False) -> float:
    """Share of fresh single-turn images answered exactly, through HF's own `generate(**processor(...))`."""
    jobs = [(c, s) for c in COLOURS for s in SHAPES for _ in range(per_combination)]
    right = 0
    processor.tokenizer.padding_side = "left"
    for i in range(0, len(jobs), 32):
        chunk = jobs[i:i + 32]
        images = [as_host_stores(render_shape(c, s, rng), rng, quality=90) for c, s in chunk]
        prompts = [processor.apply_chat_template([{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": rng.choice(IMAGE_QUESTIONS)}]}], add_generation_prompt=True)
            for _ in chunk]
        inputs = processor(text=prompts, images=images, return_tensors="pt", padding=True)
        out = model.generate(**inputs, max_new_tokens=12, do_sample=do_sample, temperature=0.7 if do_sample else None,
                             top_p=0.9 if do_sample else None)
        replies = processor.tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        right += sum(r.strip() == answer_for(c, s) for r, (c, s) in zip(replies, chunk))
    return right / len(jobs)


def save(model, tokenizer, processor, out: Path) -> None:
    if out.exists():
        for path in out.iterdir():
            if path.name != "README.md":  # the model card is written by hand
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--vision-steps", type=int, default=2800)
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--vision-batch-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    processor = build_processor(tokenizer)
    model = build_model(tokenizer, args.seed)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab {len(tokenizer)}")
    start = time.time()
    rng = random.Random(args.seed)
    probe = torch.nn.Linear(model.config.text_config.hidden_size, len(COLOURS) + len(SHAPES))
    model.train()
    pretrain_vision(model, processor, probe, args.vision_steps, args.vision_batch_size, 2 * args.lr, rng)
    train(model, tokenizer, processor, args.steps, args.batch_size, args.lr, probe, rng)
    print(f"trained in {time.time() - start:.0f}s")
    save(model, tokenizer, processor, args.out)
    count = len(COLOURS) * len(SHAPES) * 4
    greedy = evaluate(model, processor, random.Random(args.seed + 1), per_combination=4)
    torch.manual_seed(args.seed)
    sampled = evaluate(model, processor, random.Random(args.seed + 2), per_combination=4, do_sample=True)
    print(f"accuracy on {count} fresh images: greedy {greedy:.3f}, sampled at temperature 0.7 {sampled:.3f}")


if __name__ == "__main__":
    main()
