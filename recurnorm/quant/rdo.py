"""Rate-aware rounding: round each weight to the code that minimizes squared error + λ·(its code length).

Nearest rounding spends bits on precision wherever a weight lands; under entropy coding
a code's cost is ``−log2 p(code)``, so moving a weight that sits near a rounding boundary
to the more probable neighbour saves bits for a small error. Per element, among the two
grid points around ``x / s``:

    J(q) = (x / s − q)² + λ · bits(q),   bits(q) = −log2 p(q)

with p the tensor's own code histogram (order 0, what the packer's tables start from),
re-estimated from the chosen codes and applied again (``passes``). λ is in squared steps
per bit: at λ = 2·ln2/12 ≈ 0.116 a bit is priced at the slope a uniform quantizer's step
trades distortion for rate (D = Δ²/12 per element, −6 dB per bit), so rounding and step
size buy bytes at the same exchange rate.

Not a training-time penalty: the codes the packer sees change, the grid and the
dequantization do not, and which λ (if any) pays is measured with the packer's bytes and
the model's loss (`pack --fit` candidates), never assumed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SLOPE = 2 * math.log(2) / 12  # squared steps per bit a uniform quantizer's step size trades at


def code_lengths(codes: Tensor, lo: int, hi: int) -> Tensor:
    """−log2 p per code value lo..hi from the codes' histogram (+½ per value: unseen codes cost, finitely)."""
    counts = torch.bincount((codes.reshape(-1).long() - lo), minlength=hi - lo + 1).double() + 0.5
    return -(counts / counts.sum()).log2()


def rate_aware(y: Tensor, lo: int, hi: int, lam: float, passes: int = 2, lengths: Tensor | None = None) -> Tensor:
    """Codes of y (values in steps, any shape) in [lo, hi]: nearest, then `passes` rounds of
    argmin over {floor, ceil} of (y − q)² + lam·bits(q). lengths: a fixed code-length table
    (else estimated from the codes themselves)."""
    q = torch.round(y).clamp(lo, hi)
    if lam <= 0:
        return q
    f = torch.floor(y).clamp(lo, hi)
    c = (f + 1).clamp(lo, hi)
    for _ in range(passes):
        bits = code_lengths(q, lo, hi) if lengths is None else lengths
        jf = (y - f).square() + lam * bits[(f - lo).long()].to(y.dtype)
        jc = (y - c).square() + lam * bits[(c - lo).long()].to(y.dtype)
        q = torch.where(jc < jf, c, f)
        if lengths is not None:
            break
    return q
