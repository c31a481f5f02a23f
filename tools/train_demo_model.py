"""Train the shipped demo model `models/tiny-llava-shapes/` from scratch on CPU.

    python tools/train_demo_model.py                  # the shipped weights: about 85 minutes on 2 cores
    python tools/train_demo_model.py --vision-steps 3 --picture-steps 1 --steps 3 --out /tmp/quick

In: nothing but fixed seeds (the same seeds and thread count give the same bytes). Out: a Hugging
Face folder (`LlavaForConditionalGeneration` with a CLIP vision tower, a 2-layer GELU projector and a
small Llama; a `LlavaProcessor` with the Pillow `CLIPImageProcessor`, a byte-level BPE tokenizer and
a chat template), loadable with `AutoModelForImageTextToText` / `AutoProcessor`. Pictures and chats
come from `tools/demo_pictures.py` and `tools/demo_chats.py`; `tools/eval_demo_model.py` measures the
result through the host, on these pictures and on another renderer's.

What made it work, and why (plain end-to-end training from scratch learned colours but not shapes,
and answered every two-image question the same way):
0. The processor squashes the whole picture to 128 x 128 (16-px patches: 64 image rows) and crops
   nothing, and the pictures put shapes anywhere on the whole picture: a centre crop threw away the
   edges of non-square pictures, and with them the answer to "Where is the shape?".
1. Stage 1, the vision tower and projector alone (no language model: cheap), with linear probes
   that are dropped afterwards:
   - patch heads name, for every image row, the colour and shape covering its patch and that
     shape's grid cell. Shapes are then readable from any patch of the shape, two shapes stay apart,
     and each shape's rows say where it is. Shapes are learned late and suddenly: under half of the
     shape patches named for about 2000 steps, then over 90% by step 4000.
   - picture heads (the last --picture-steps) make every row of an image name the picture's shapes
     in reading order and which colours and shapes it holds, so the language model answers "Which
     image has the red shape?" by reading any row of each picture. Without them the two-picture
     lookup stayed at chance for 2400 chat steps. With them from the start, shape was never
     learned (at chance after 6600 steps): their loss drowns the patch heads' shape signal.
2. Stage 2, a language model on the frozen tower, on chats: colour-matching questions ("Is there a
   blue shape?") from its first steps, then two-image questions and chats with 0-2 earlier turns,
   with a probe on the question's colour or shape word that must say which picture holds it, or
   none, and an order probe on image rows (first or second picture of its message?). Without the
   query probe, two-image answers stayed at chance: the lookup is useless until its read-out exists
   and vice versa.
Stage 1's pictures are drawn by a DataLoader worker from per-step seeds while the tower trains (0.26
s/step on 2 cores rather than 0.37); stage 2 ran at 0.6-1.1 s/step.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    GenerationConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.demo_chats import (
    CHAT_TEMPLATE,
    IMAGE_MARK,
    IMAGE_TOKENS,
    Sample,
    encode_sample,
    make_sample,
    presence_turn,
    single_image_turn,
    text_turn,
    tokenizer_corpus,
    two_image_turn,
)
from tools.demo_pictures import COLOURS, SCENE_SLOTS, SHAPES, patch_labels, picture, random_scene, scene_labels

DEFAULT_OUT = ROOT / "models" / "tiny-llava-shapes"
IMAGE_SIZE, PATCH_SIZE = 128, 16
GRID = IMAGE_SIZE // PATCH_SIZE
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", IMAGE_MARK]
VISION = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
              image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, projection_dim=128)
TEXT = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False)
assert GRID * GRID == IMAGE_TOKENS
ORDER_PROBE_LAYER = 2  # hidden_states index: the output of the LM's second layer
QUERY_PROBE_LAYER = 3  # the third layer's output: the fourth carries the finding to the answer


# -- Tokenizer, model, processor --------------------------------------------------------------

def build_tokenizer(vocab_size: int = 640) -> PreTrainedTokenizerFast:
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
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                              **TEXT)
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
    # The whole picture squashed to a square, nothing cropped: a position means the picture's cell,
    # as the user sees it, whatever its aspect ratio.
    image_processor = CLIPImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_center_crop=False,
                                         crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    # num_additional_image_tokens=1 counts CLS, which 'default' then drops: 64 rows per image.
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=CHAT_TEMPLATE)


# -- The vision probe -------------------------------------------------------------------------

class PatchProbe(torch.nn.Module):
    """Names, from each image row the LM receives, the colour and shape covering that patch and the
    grid cell of that shape (one extra class each for "no shape"), and, from every row alike, the
    whole picture: each shape's colour, shape and cell in reading order, and which colours and shapes
    it holds. Training only; not saved.
    The patch heads keep shapes apart and put each shape's position into its own rows; the picture
    heads make every row of an image say what the image holds, so the language model answers by
    reading any of its rows ("Is there a red shape?", "Which image has the circle?") instead of
    searching 64 rows for the few a shape covers."""

    def __init__(self, hidden: int):
        super().__init__()
        kinds = (len(COLOURS), len(SHAPES), 9)
        self.heads = torch.nn.ModuleList(torch.nn.Linear(hidden, n + 1) for n in kinds)
        self.scene_heads = torch.nn.ModuleList(torch.nn.Linear(hidden, n + 1) for _ in range(SCENE_SLOTS) for n in kinds)
        self.present = torch.nn.Linear(hidden, len(COLOURS) + len(SHAPES))

    def loss(self, features: torch.Tensor, patches: tuple[torch.Tensor, ...], scenes: torch.Tensor,
             whole_picture: bool = True) -> torch.Tensor:
        # features (images, IMAGE_TOKENS, hidden); patches: 3 x (images, IMAGE_TOKENS); scenes
        # (images, 3 * SCENE_SLOTS); -1 = no shape
        rows = features.reshape(-1, features.shape[-1])
        total = sum(self.head_loss(head, rows, label.reshape(-1)) for head, label in zip(self.heads, patches, strict=True))
        if not whole_picture:
            return total
        every_row = scenes.repeat_interleave(features.shape[1], dim=0)  # (rows, 3 * SCENE_SLOTS)
        for head, label in zip(self.scene_heads, every_row.unbind(-1), strict=True):
            total = total + self.head_loss(head, rows, label)
        return total + torch.nn.functional.binary_cross_entropy_with_logits(self.present(rows), presence(every_row))

    @staticmethod
    def head_loss(head: torch.nn.Linear, rows: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(head(rows), torch.where(label < 0, head.out_features - 1, label))


def presence(scenes: torch.Tensor) -> torch.Tensor:
    """(n, 3 * SCENE_SLOTS) scene labels -> (n, colours + shapes) multi-hot: what the picture holds."""
    hot = scenes.new_zeros((scenes.shape[0], len(COLOURS) + len(SHAPES)), dtype=torch.float32)
    for slot in range(SCENE_SLOTS):
        colour, shape = scenes[:, 3 * slot], scenes[:, 3 * slot + 1]
        filled = colour >= 0
        hot[filled, colour[filled]] = 1
        hot[filled, len(COLOURS) + shape[filled]] = 1
    return hot


def probe_targets(scenes, device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """((colours, shapes, cells), each (images, IMAGE_TOKENS)), and (images, 3 * SCENE_SLOTS)."""
    labels = [patch_labels(scene, GRID) for scene in scenes]
    patches = tuple(torch.from_numpy(np.stack(column)).to(device) for column in zip(*labels))
    return patches, torch.from_numpy(np.stack([scene_labels(scene) for scene in scenes])).to(device)


def image_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    features = model.model.get_image_features(pixel_values=pixel_values, vision_feature_layer=-2,
                                              vision_feature_select_strategy="default").pooler_output
    return torch.stack(list(features))  # (images, IMAGE_TOKENS, hidden)


# -- Batches ----------------------------------------------------------------------------------

def collate(samples: list[Sample], tokenizer, processor, device) -> dict[str, torch.Tensor]:
    """Right-padded ids/labels, the real images' pixels, where their rows go, and probe labels."""
    encoded = [encode_sample(s, tokenizer) for s in samples]
    length = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(samples), length), tokenizer.pad_token_id)
    labels = torch.full((len(samples), length), -100)
    feature_mask = torch.zeros((len(samples), length), dtype=torch.bool)
    images, scenes, slots = [], [], []
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_MARK)
    for row, (sample, (seq, lab)) in enumerate(zip(samples, encoded)):
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, :len(lab)] = torch.tensor(lab)
        starts = image_starts(seq, image_id)
        for start, image in zip(starts, sample.images, strict=True):
            if image is not None:
                feature_mask[row, start:start + IMAGE_TOKENS] = True
                images.append(image)
        scenes += sample.scenes
        slots += sample.slots
    batch = {"ids": ids, "labels": labels, "attention_mask": ids != tokenizer.pad_token_id,
             "feature_mask": feature_mask}
    queries = []
    for row, (sample, (seq, _)) in enumerate(zip(samples, encoded)):
        if sample.query is not None:
            position = last_index(seq, tokenizer.encode(" " + sample.query[0], add_special_tokens=False)[0])
            if position > last_index(seq, image_id):  # a word before the pictures cannot see them
                queries.append((row, position, sample.query[1]))
    if queries:
        batch["query_rows"], batch["query_positions"], batch["query_labels"] = map(torch.tensor, zip(*queries))
    batch = {k: v.to(device) for k, v in batch.items()}
    if images:
        batch["pixel_values"] = processor.image_processor(images, return_tensors="pt")["pixel_values"].to(device)
        batch["patch_targets"], batch["scene_targets"] = probe_targets(scenes, device)
        batch["slots"] = torch.tensor(slots, device=device).repeat_interleave(IMAGE_TOKENS)
    return batch


def last_index(seq: list[int], token: int) -> int:
    """The question's word: the last one in the chat (the answers to such questions never repeat it)."""
    return len(seq) - 1 - seq[::-1].index(token)


def image_starts(seq: list[int], image_id: int) -> list[int]:
    """Where each image's rows begin; adjacent images make one run, a new image every IMAGE_TOKENS ids."""
    starts, run = [], 0
    for i, token in enumerate(seq):
        if token != image_id:
            run = 0
            continue
        if run % IMAGE_TOKENS == 0:
            starts.append(i)
        run += 1
    return starts


def chat_loss(model, probes: Probes, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on the answer tokens (image rows filled as the extension fills them), and the
    probes' losses: each image row's patch content (vision), whether its image is the first or the
    second of its message (the LM, at ORDER_PROBE_LAYER), and, when a question names a colour or
    shape to find, which picture holds it or none (the LM at that word, QUERY_PROBE_LAYER)."""
    embeds = model.get_input_embeddings()(batch["ids"])  # (batch, seq, hidden)
    aux = embeds.new_zeros(())
    if "pixel_values" in batch:
        features = image_features(model, batch["pixel_values"])
        embeds = embeds.masked_scatter(batch["feature_mask"].unsqueeze(-1), features.to(embeds.dtype))
        aux = probes.patch.loss(features, batch["patch_targets"], batch["scene_targets"])
    out = model.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"],
                                     output_hidden_states=True)
    if "pixel_values" in batch:
        rows = out.hidden_states[ORDER_PROBE_LAYER][batch["feature_mask"]]  # (image rows, hidden), in image order
        aux = aux + torch.nn.functional.cross_entropy(probes.order(rows), batch["slots"])
    if "query_rows" in batch and probes.query is not None:
        words = out.hidden_states[QUERY_PROBE_LAYER][batch["query_rows"], batch["query_positions"]]  # (queries, hidden)
        aux = aux + probes.query_weight * torch.nn.functional.cross_entropy(probes.query(words), batch["query_labels"])
    targets = batch["labels"][:, 1:]
    picked = targets != -100  # only answer positions go through lm_head
    logits = model.lm_head(out.last_hidden_state[:, :-1][picked])
    return torch.nn.functional.cross_entropy(logits, targets[picked]), aux


class Probes(torch.nn.Module):
    """Training-only heads, dropped afterwards: `patch` (see PatchProbe); `order`, which names from
    an image row inside the LM whether its image is its message's first or second; `query` (stage 2),
    which names from the question's colour/shape word the picture holding it (first, second, none)."""

    def __init__(self, hidden: int, query: bool = False, query_weight: float = 1.0):
        super().__init__()
        self.query_weight = query_weight
        self.patch = PatchProbe(hidden)
        self.order = torch.nn.Linear(hidden, 2)
        self.query = torch.nn.Linear(hidden, 3) if query else None


# -- Training ---------------------------------------------------------------------------------

def learning_rate(step: int, steps: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(optimizer, step: int, steps: int) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, steps, group["peak"])


class VisionBatches(torch.utils.data.Dataset):
    """Stage 1's batches: step N's pictures come from its own seed, so a worker process can draw
    the next batch while this one trains (Pillow's drawing is about half of a step) and the run
    stays the same bytes."""

    def __init__(self, processor, steps: int, batch_size: int, seed: int):
        self.processor, self.steps, self.batch_size, self.seed = processor, steps, batch_size, seed

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int):
        rng = random.Random(f"vision {self.seed} {step}")
        scenes = [random_scene(rng) for _ in range(self.batch_size)]
        images = [picture(scene, rng) for scene in scenes]
        return self.processor.image_processor(images, return_tensors="pt")["pixel_values"], probe_targets(scenes, "cpu")


def pretrain_vision(model, processor, probes: Probes, steps: int, picture_steps: int, batch_size: int, lr: float,
                    seed: int, device) -> None:
    """Stage 1: tower + projector + probe name each patch's colour and shape (no LM: cheap); the
    last `picture_steps` add the picture heads (why so late: the module docstring, 1.)."""
    params = vision_parameters(model) + list(probes.patch.parameters())
    optimizer = torch.optim.AdamW([{"params": params, "peak": lr}], weight_decay=0.01)
    start, threads = time.time(), torch.get_num_threads()
    batches = torch.utils.data.DataLoader(VisionBatches(processor, steps, batch_size, seed), batch_size=None,
                                          num_workers=1 if steps > 1 else 0)
    torch.set_num_threads(max(1, threads - 1))  # one core draws: 0.26 s/step on 2 cores, not 0.37
    for step, (pixel_values, targets) in enumerate(batches):
        features = image_features(model, pixel_values.to(device))
        targets = tuple(t.to(device) for t in targets[0]), targets[1].to(device)
        loss = probes.patch.loss(features, *targets, whole_picture=step >= steps - picture_steps)
        set_lr(optimizer, step, steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            shapes = targets[0][1] >= 0  # patches a shape covers: is its shape named right?
            named = probes.patch.heads[1](features.detach()[shapes]).argmax(-1) == targets[0][1][shapes]
            # the first shape's name read from each row of its picture
            first = probes.patch.scene_heads[1](features.detach()).argmax(-1) == targets[1][:, 1:2]
            print(f"vision step {step:5d}  probe loss {loss.item():.4f}  shape patches named "
                  f"{named.float().mean().item():.3f}  first shape from any row {first.float().mean().item():.3f}"
                  f"  {time.time() - start:6.0f}s", flush=True)
    torch.set_num_threads(threads)


def vision_parameters(model) -> list[torch.nn.Parameter]:
    inner = model.model
    return [*inner.vision_tower.parameters(), *inner.multi_modal_projector.parameters()]


def run_chat_steps(model, processor, probes: Probes, optimizer, params: list, make_batch, steps: int, device,
                   checkpoint=None, every: int = 300, check_n: int = 32) -> None:
    """Stage 2's loop: `make_batch(progress)` -> answer loss + half the probe loss; a quick check and
    `checkpoint()` every `every` steps."""
    model.train()
    start = time.time()
    for step in range(steps):
        batch = make_batch(step / steps)
        set_lr(optimizer, step, steps)
        loss, aux = chat_loss(model, probes, batch)
        optimizer.zero_grad(set_to_none=True)
        (loss + 0.5 * aux).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"chat step {step:5d}  loss {loss.item():.4f}  probe {aux.item():.4f}  {time.time() - start:6.0f}s",
                  flush=True)
        if checkpoint is not None and (step + 1) % every == 0 and step + 1 < steps:
            print(f"chat step {step + 1:5d}  quick check {quick_check(model, processor, device, check_n)}", flush=True)
            checkpoint()
            model.train()
    model.eval()


def chat_sample(rng: random.Random, progress: float) -> Sample:
    """Stage 2's mix: colour matching ("Is there a blue shape?") early, two-image questions later,
    single-image questions, text and chats with history throughout."""
    makers = [single_image_turn, presence_turn, two_image_turn, text_turn]
    weights = [4, 4, 1, 1] if progress < 0.3 else [3, 2, 4, 1]
    earlier = 0 if progress < 0.3 else rng.choices([0, 1, 2], weights=[6, 3, 1])[0]
    return make_sample(rng, earlier, rng.choices(makers, weights=weights)[0](rng))


def train_chats(model, tokenizer, processor, steps: int, batch_size: int, lr: float, seed: int, device,
                checkpoint=None, every: int = 300, check_n: int = 32, query_weight: float = 1.0) -> None:
    """Stage 2: the language model on chats (`chat_sample`), on the frozen vision tower and projector.

    The language model meets colour matching from its first steps, and the query probe (see
    `chat_loss`) supervises the lookup at the question's word, where it happens: without it two-image
    answers stayed at chance (every two-image question answered from the newest picture). Own seeds
    (data, the language model's weights, probes), so `--resume` from the stage-1 checkpoint matches a
    full run."""
    rng = random.Random(seed + 3)
    torch.manual_seed(seed + 3)
    fresh = type(model)(model.config)
    model.model.language_model.load_state_dict(fresh.model.language_model.state_dict())
    model.lm_head.load_state_dict(fresh.lm_head.state_dict())
    torch.manual_seed(seed + 3)
    probes = Probes(model.config.text_config.hidden_size, query=True, query_weight=query_weight).to(device)
    tower = vision_parameters(model)
    for param in tower:
        param.requires_grad_(False)
    tower_ids = {id(p) for p in tower}
    params = [p for p in model.parameters() if id(p) not in tower_ids] + list(probes.parameters())
    optimizer = torch.optim.AdamW([{"params": params, "peak": lr}], weight_decay=0.01, betas=(0.9, 0.98))
    run_chat_steps(model, processor, probes, optimizer, params,
                   lambda progress: collate([chat_sample(rng, progress) for _ in range(batch_size)],
                                            tokenizer, processor, device),
                   steps, device, checkpoint, every, check_n)
    for param in tower:
        param.requires_grad_(True)


@torch.inference_mode()
def quick_check(model, processor, device, n: int = 32) -> dict[str, float]:
    """Exact-answer share on n fresh single-turn questions per kind, through HF's own
    `generate(**processor(...))` (cheap; tools/eval_demo_model.py measures through the host)."""
    model.eval()
    rng = random.Random(999)
    makers = {"shape": lambda: single_image_turn(rng, "shape"), "colour": lambda: single_image_turn(rng, "colour"),
              "count": lambda: single_image_turn(rng, "count"), "position": lambda: single_image_turn(rng, "position"),
              "describe": lambda: single_image_turn(rng, "describe"), "order": lambda: two_image_turn(rng, "order"),
              "presence": lambda: presence_turn(rng),
              "text": lambda: text_turn(rng)}
    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"
    scores = {}
    for kind, make in makers.items():
        turns = [make() for _ in range(n)]
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t.user}], tokenize=False,
                                                 add_generation_prompt=True) for t in turns]
        images = [image for t in turns for image in t.images] or None
        inputs = processor(text=prompts, images=images, return_tensors="pt", padding=True).to(device)
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
        replies = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        scores[kind] = round(sum(r.strip() == t.answer for r, t in zip(replies, turns)) / n, 3)
    return scores


def save(model, processor, out: Path) -> None:
    if out.exists():
        for path in out.iterdir():
            if path.is_file() and path.name != "README.md":  # the model card is written by hand
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)


def main(argv: list[str] | None = None) -> LlavaForConditionalGeneration:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--vision-steps", type=int, default=8000, help="stage-1 steps")
    parser.add_argument("--picture-steps", type=int, default=2500, help="stage 1's last steps, with the picture heads")
    parser.add_argument("--vision-lr", type=float, default=2e-3, help="stage 1's peak learning rate")
    parser.add_argument("--vision-batch-size", type=int, default=48)
    parser.add_argument("--steps", type=int, default=2400, help="stage-2 (chat) steps")
    parser.add_argument("--resume", type=Path,
                        help="a saved model: keep its tower (stage 2 never changes it) and run stage 2 only")
    parser.add_argument("--query-weight", type=float, default=1.0, help="stage 2's query-probe loss weight")
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (the shipped weights) or cuda (quick experiments)")
    parser.add_argument("--check-every", type=int, default=300, help="quick check and checkpoint every N chat steps")
    parser.add_argument("--check-n", type=int, default=32, help="questions per kind in each quick check")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    processor = build_processor(tokenizer)
    model = build_model(tokenizer, args.seed).to(args.device)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab {len(tokenizer)}")
    start = time.time()
    checkpoint = lambda: save(model, processor, args.out)
    if args.resume is None:
        probes = Probes(model.config.text_config.hidden_size).to(args.device)
        model.train()
        pretrain_vision(model, processor, probes, args.vision_steps, args.picture_steps, args.vision_batch_size,
                        args.vision_lr, args.seed, args.device)
        checkpoint()  # the trained tower: `--resume` runs stage 2 from it
    else:
        model = LlavaForConditionalGeneration.from_pretrained(args.resume, dtype=torch.float32).to(args.device)
    train_chats(model, tokenizer, processor, args.steps, args.batch_size, args.lr, args.seed, args.device,
                checkpoint, args.check_every, args.check_n, args.query_weight)
    print(f"trained in {time.time() - start:.0f}s")
    save(model.to("cpu"), processor, args.out)
    print(f"final quick check {quick_check(model, processor, 'cpu', args.check_n)}")
    print(f"saved to {args.out}; measure it with: python tools/eval_demo_model.py --model {args.out}")
    return model


if __name__ == "__main__":
    main()
