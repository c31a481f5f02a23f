"""The learning-rate schedule both training stages of the demo model use: linear warm-up, then a
cosine down to 5% of the peak. Each optimizer param group carries its own "peak"."""
from __future__ import annotations

import math


def learning_rate(step: int, steps: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(optimizer, step: int, steps: int) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, steps, group["peak"])
