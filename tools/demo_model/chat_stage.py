"""Stage 2 of the demo model's training: a fresh language model on chats, on the frozen tower.

In: a model whose tower and projector stage 1 trained (`vision_stage`), a tokenizer and processor
from `architecture`. Out: the language model and `lm_head` trained; the tower and projector left as
they are (so `--resume` from any saved model reruns exactly this stage). Chats come from `chats`,
encoded as the multimodal extension encodes a prompt (`chat_batches`); the loop is `chat_loop`'s.
Stage 3 (`polish_stage`) reuses this stage's chat mix and loss.

Two probes on the language model's hidden states (training only, not saved) make the two-picture
lookup learnable: an order probe on image rows (is the row's picture the first or the second of its
message?), and a query probe on the question's colour or shape word ("Which image has the blue
shape?"): which picture holds it, or none. The lookup is useless until its read-out exists and vice
versa; the query probe teaches the read-out directly. Both need every image row to carry what its
picture holds (stage 1's last phase).
"""
from __future__ import annotations

import random

import torch

from tools.demo_model.architecture import image_features
from tools.demo_model.chat_loop import ChatRun, language_parameters, run_steps
from tools.demo_model.chats import Sample, make_sample, presence_turn, single_image_turn, text_turn, two_image_turn

ORDER_PROBE_LAYER = 2  # hidden_states index: the output of the LM's second layer
QUERY_PROBE_LAYER = 3  # the third layer's output: the fourth carries the finding to the answer


# -- Chats ------------------------------------------------------------------------------------

def chat_sample(rng: random.Random, progress: float) -> Sample:
    """Stage 2's mix: colour matching ("Is there a blue shape?") early, two-image questions later,
    single-image questions, text and chats with history throughout."""
    makers = [single_image_turn, presence_turn, two_image_turn, text_turn]
    weights = [4, 4, 1, 1] if progress < 0.3 else [3, 2, 4, 1]
    earlier = 0 if progress < 0.3 else earlier_turns(rng)
    return make_sample(rng, earlier, rng.choices(makers, weights=weights)[0](rng))


def earlier_turns(rng: random.Random) -> int:
    """How many finished turns come before the one answered, once chats have history."""
    return rng.choices([0, 1, 2], weights=[6, 3, 1])[0]


# -- The loss ---------------------------------------------------------------------------------

class ChatProbes(torch.nn.Module):
    """`order` names from an image row inside the LM whether its image is its message's first or
    second; `query` names from the question's colour/shape word the picture holding it (first,
    second, none)."""

    def __init__(self, hidden: int, query_weight: float = 1.0):
        super().__init__()
        self.query_weight = query_weight
        self.order = torch.nn.Linear(hidden, 2)
        self.query = torch.nn.Linear(hidden, 3)


def chat_loss(model, probes: ChatProbes | None, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on the answer tokens (image rows filled as the extension fills them), and the
    probes' loss (zero without probes). The tower gets gradients when its parameters want them
    (`run_steps` freezes what it does not train)."""
    embeds = model.get_input_embeddings()(batch["ids"])  # (batch, seq, hidden)
    if "pixel_values" in batch:
        features = image_features(model, batch["pixel_values"])  # (images, IMAGE_TOKENS, hidden)
        embeds = embeds.masked_scatter(batch["feature_mask"].unsqueeze(-1), features.to(embeds.dtype))
    out = model.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"],
                                     output_hidden_states=True)
    aux = probe_loss(probes, out.hidden_states, batch) if probes is not None else embeds.new_zeros(())
    targets = batch["labels"][:, 1:]
    picked = targets != -100  # only answer positions go through lm_head
    logits = model.lm_head(out.last_hidden_state[:, :-1][picked])
    return torch.nn.functional.cross_entropy(logits, targets[picked]), aux


def probe_loss(probes: ChatProbes, hidden_states, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    loss = hidden_states[0].new_zeros(())
    if "pixel_values" in batch:
        rows = hidden_states[ORDER_PROBE_LAYER][batch["feature_mask"]]  # (image rows, hidden), in image order
        loss = loss + torch.nn.functional.cross_entropy(probes.order(rows), batch["slots"])
    if "query_rows" in batch:
        words = hidden_states[QUERY_PROBE_LAYER][batch["query_rows"], batch["query_positions"]]  # (queries, hidden)
        query = torch.nn.functional.cross_entropy(probes.query(words), batch["query_labels"])
        loss = loss + probes.query_weight * query
    return loss


# -- Training ---------------------------------------------------------------------------------

def train_chats(model, tokenizer, processor, run: ChatRun, *, steps: int, lr: float, seed: int,
                query_weight: float = 1.0) -> None:
    """Stage 2 (see the module docstring). Its own seeds (data, the language model's weights,
    probes), so `--resume` from a saved model gives what a full run gives."""
    rng = random.Random(seed + 3)
    torch.manual_seed(seed + 3)
    fresh = type(model)(model.config)
    model.model.language_model.load_state_dict(fresh.model.language_model.state_dict())
    model.lm_head.load_state_dict(fresh.lm_head.state_dict())
    torch.manual_seed(seed + 3)
    probes = ChatProbes(model.config.text_config.hidden_size, query_weight).to(run.device)
    groups = [{"params": language_parameters(model) + list(probes.parameters()), "peak": lr}]
    run_steps(model, tokenizer, processor, run, groups=groups, sample=lambda step: chat_sample(rng, step / steps),
              steps=steps, loss_of=lambda batch: chat_loss(model, probes, batch), label="chat")
