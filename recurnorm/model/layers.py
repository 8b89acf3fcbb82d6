"""Building blocks: RMSNorm, hookable Linear, rotary attention, MLP, Block.

A Block's forward takes `mods`, the dict a scheme returns for the current step
(see `schemes.Scheme.for_step`). Keys it understands:
  "attn_in", "mlp_in"    gain that replaces the input RMSNorm's own gain [D]
  "attn_out", "mlp_out"  multiplier of the branch output before the residual add
  "<proj>.gate"          multiplier of projection <proj>'s input [D_in]
  "<proj>.delta"         additive weight term of projection <proj> [D_out, D_in]
with <proj> one of q, k, v, o, up, down. A missing key means "no change".
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

PROJECTIONS = ("q", "k", "v", "o", "up", "down")


def projection_shapes(d_model: int, d_mlp: int) -> dict[str, tuple[int, int]]:
    """(d_out, d_in) of each projection of one block."""
    d, h = d_model, d_mlp
    return {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "up": (h, d), "down": (d, h)}


class RMSNorm(nn.Module):
    """x / rms(x) * gain; `affine=False` leaves the gain to the caller (a scheme)."""

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: Tensor, gain: Tensor | None = None) -> Tensor:
        return F.rms_norm(x, (self.dim,), self.weight if gain is None else gain, self.eps)


class Linear(nn.Linear):
    """Bias-free linear layer with two hooks used by quantization.

    `weight_transform` (a plain callable attribute, e.g. fake quantization) is
    applied to the weight on every forward; `input_norm` is the extra RMSNorm
    on the projection's input. A scheme may pass a per-step `gate` on the input
    (after input_norm) and an additive weight `delta` (LoRA); both act after
    the transform, so only the shared weight is quantized.
    """

    def __init__(self, d_in: int, d_out: int, extra_norm: bool = False):
        super().__init__(d_in, d_out, bias=False)
        self.weight_transform: Callable[[Tensor], Tensor] | None = None
        self.input_norm = RMSNorm(d_in) if extra_norm else None

    def forward(self, x: Tensor, gate: Tensor | None = None, delta: Tensor | None = None) -> Tensor:
        if self.input_norm is not None:
            x = self.input_norm(x)
        w = self.weight if self.weight_transform is None else self.weight_transform(self.weight)
        if delta is not None:
            w = w + delta
        if gate is not None:
            # (x ⊙ g) Wᵀ = x (W diag g)ᵀ: scaling the weight's columns costs
            # d_out·d_in, far less than B·T·d_in for the activations.
            w = w * gate
        return F.linear(x, w)


def rope_tables(seq_len: int, d_head: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin tables [T, d_head/2] for rotary positions."""
    inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
    angles_TxK = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles_TxK.cos(), angles_TxK.sin()


def apply_rope(x_BxHxTxK: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the two halves of each head dim as (real, imaginary) pairs."""
    x1, x2 = x_BxHxTxK.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _proj(lin: Linear, name: str, x: Tensor, mods: dict[str, Tensor]) -> Tensor:
    if not mods:  # the common, fast path (shared, unique)
        return lin(x)
    return lin(x, mods.get(name + ".gate"), mods.get(name + ".delta"))


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, extra_norm: bool):
        super().__init__()
        self.n_heads = n_heads
        self.q = Linear(d_model, d_model, extra_norm)
        self.k = Linear(d_model, d_model, extra_norm)
        self.v = Linear(d_model, d_model, extra_norm)
        self.o = Linear(d_model, d_model, extra_norm)

    def forward(self, x_BxTxD: Tensor, cos: Tensor, sin: Tensor, mods: dict) -> Tensor:
        B, T, D = x_BxTxD.shape
        H = self.n_heads

        def heads(name: str) -> Tensor:
            y = _proj(getattr(self, name), name, x_BxTxD, mods)
            return y.view(B, T, H, D // H).transpose(1, 2)

        q, k, v = heads("q"), heads("k"), heads("v")
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y_BxHxTxK = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y_BxTxD = y_BxHxTxK.transpose(1, 2).reshape(B, T, D)
        return _proj(self.o, "o", y_BxTxD, mods)


class MLP(nn.Module):
    """up -> relu² -> down (relu² as in the Parameter Golf baseline)."""

    def __init__(self, d_model: int, d_mlp: int, extra_norm: bool):
        super().__init__()
        self.up = Linear(d_model, d_mlp, extra_norm)
        self.down = Linear(d_mlp, d_model, extra_norm)

    def forward(self, x_BxTxD: Tensor, mods: dict) -> Tensor:
        h = F.relu(_proj(self.up, "up", x_BxTxD, mods)).square()
        return _proj(self.down, "down", h, mods)


class Block(nn.Module):
    """Attention + MLP, each a residual branch; pre-norm or peri-norm."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_mlp: int,
        norm: str,
        extra_norm: bool,
        input_gains: bool = True,
    ):
        super().__init__()
        # A scheme that supplies per-step input gains owns them; the block then
        # keeps no gain of its own (no dead parameters in the checkpoint).
        self.norm_attn = RMSNorm(d_model, affine=input_gains)
        self.attn = Attention(d_model, n_heads, extra_norm)
        self.norm_mlp = RMSNorm(d_model, affine=input_gains)
        self.mlp = MLP(d_model, d_mlp, extra_norm)
        peri = norm == "peri"
        self.norm_attn_out = RMSNorm(d_model) if peri else None
        self.norm_mlp_out = RMSNorm(d_model) if peri else None

    def forward(self, x_BxTxD: Tensor, cos: Tensor, sin: Tensor, mods: dict) -> Tensor:
        h = self.attn(self.norm_attn(x_BxTxD, mods.get("attn_in")), cos, sin, mods)
        x_BxTxD = x_BxTxD + self._out(h, self.norm_attn_out, mods.get("attn_out"))
        h = self.mlp(self.norm_mlp(x_BxTxD, mods.get("mlp_in")), mods)
        return x_BxTxD + self._out(h, self.norm_mlp_out, mods.get("mlp_out"))

    @staticmethod
    def _out(h: Tensor, norm_out: RMSNorm | None, scale: Tensor | None) -> Tensor:
        if norm_out is not None:
            h = norm_out(h)
        return h if scale is None else h * scale
