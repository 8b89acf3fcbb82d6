"""Fake quantization for QAT: the export path's exact values forward, identity gradient (STE)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .registry import Quantizer


def quantize_dequantize(w: Tensor, quantizer: Quantizer) -> Tensor:
    """q(w) = dequantize(quantize(w)) through the export code path, in w's dtype, no grad."""
    with torch.no_grad():
        q = quantizer.dequantize(quantizer.quantize(w.detach().cpu()))
    return q.to(device=w.device, dtype=w.dtype)


def ste_mix(w: Tensor, q: Tensor, lam: float = 1.0) -> Tensor:
    """w + lam·(q − w) forward, gradient identity in w (straight-through estimator).

    At lam = 1 the forward value is q bit for bit (so a QAT-trained weight
    exports to exactly what training saw); ``w − w.detach()`` adds an exact
    zero that carries the identity gradient.
    """
    base = w.detach()
    mixed = q if lam == 1.0 else base + lam * (q - base)
    return mixed + (w - base)


def fake_quant(w: Tensor, quantizer: Quantizer, lam: float = 1.0) -> Tensor:
    """``ste_mix`` of w and q(w): the export quantizer's values forward, identity gradient."""
    return ste_mix(w, quantize_dequantize(w, quantizer), lam)


def fake_quant_transform(quantizer: Quantizer, lam: float | Callable[[], float] = 1.0) -> Callable[[Tensor], Tensor]:
    """A `Linear.weight_transform`: fake_quant with a fixed lam or a schedule callable."""

    def transform(w: Tensor) -> Tensor:
        return fake_quant(w, quantizer, lam() if callable(lam) else lam)

    return transform


def absmax_act_quant(x: Tensor, bits: int = 8) -> Tensor:
    """Per-token absmax activation fake quant (BitNet): round(x·127/max|x|)·max|x|/127, STE."""
    qmax = 2 ** (bits - 1) - 1
    with torch.no_grad():
        scale = qmax / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
        y = (x * scale).round().clamp(-qmax - 1, qmax) / scale
    return y + (x - x.detach())
