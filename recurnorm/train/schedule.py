"""Learning-rate schedule: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, warmup: int, steps: int, min_lr_frac: float = 0.1) -> float:
    """Learning rate for 0-based step: linear warm-up to lr, cosine down to lr * min_lr_frac."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, steps - warmup)
    progress = min(1.0, max(0.0, (step - warmup) / span))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (min_lr_frac + (1.0 - min_lr_frac) * cosine)
