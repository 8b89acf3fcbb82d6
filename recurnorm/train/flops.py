"""Model FLOP utilization: FLOPs of a training step, counted, against a measured matmul peak.

``step_flops`` counts the FLOPs of one forward + backward pass with
``torch.utils.flop_counter.FlopCounterMode`` (matmuls and attention, as
PyTorch attributes them), so every scheme is priced by what it really
computes. ``matmul_peak`` measures what this machine reaches on a large square
matmul in the training dtype: MFU against that is achievable utilization, not
the datasheet's.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def step_flops(model: nn.Module, batch_BxT1: torch.Tensor, *, bf16: bool = False) -> int:
    """FLOPs of one training step (forward + backward, no optimizer) on this batch."""
    dev = batch_BxT1.device
    # A meta-device model is counted without computing (sizing a preset on any machine).
    autocast = (
        torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16)
        if (dev.type != "meta")
        else contextlib.nullcontext()
    )
    with FlopCounterMode(display=False) as counter:
        with autocast:
            logits = model(batch_BxT1[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch_BxT1[:, 1:].flatten())
        loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def matmul_peak(
    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, n: int | None = None, seconds: float = 1.0
) -> float:
    """Measured FLOP/s of an n x n matmul (best of repeated timings)."""
    dev = torch.device(device)
    n = n or (8192 if dev.type == "cuda" else 1024)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(3):
        a @ b
    sync()
    best, spent = 0.0, 0.0
    while spent < seconds:
        t0 = time.perf_counter()
        reps = 10
        for _ in range(reps):
            a @ b
        sync()
        dt = time.perf_counter() - t0
        spent += dt
        best = max(best, reps * 2 * n**3 / dt)
    return best
