"""LQER: a low-rank correction of the quantization error, stored as two small quantized factors.

A tensor W, viewed as ``[rows, cols]``, is quantized to Ŵ; its error ``E = W − Ŵ`` is
approximated by a rank-r product ``Lᵀ R`` (``L [r, rows]``, ``R [r, cols]``) from the
truncated SVD, and L and R are quantized with ordinary formats (``r · (rows + cols)``
values: 4 · 960 for a 192 × 768 matrix, 2.6% of its weights). Readers add
``Σ_k L̂[k]ᵀ R̂[k]`` to Ŵ, one rank at a time in float32 (`lowrank.apply`): elementwise products
and sums are exactly rounded, so numpy (the standalone loader) and torch give the same bits.

Options, beside the tensor's format (``-q int6:lqer=4:lqer_l=int8``):
``lqer`` the rank (0: none), ``lqer_l`` / ``lqer_r`` the factors' formats (registry
defaults: int2-int4 in groups of 64, int5-int8 one scale per rank). Matrices (and
tensors of more dimensions, as ``[shape[0], rest]``) get it; vectors take the format alone.

What differs from the Parameter Golf record that uses it (openai/parameter-golf,
2026-04-27 ...LQER..._1.0611, ``gptq_mixed_quantize``: rank 4 on the 3 tensors of largest
``‖E‖``, A int2 with one scale, B int4 in groups of 64, both from one SVD):
- the SVD can weight the error's columns by the input's RMS (√ of the Hessian diagonal of
  the calibration batches, LQER's L²QER), so the rank goes where the layer's outputs
  feel the error;
- R is refit by least squares to E given the *quantized* L̂, so R absorbs L's rounding;
- factors are stored as [r, n] rows (one rank per row), so a group or a row scale never
  mixes the large first singular direction with the small last one;
- which tensors, which rank and which factor formats are `pack --fit`'s choice, priced
  by the packer's measured bytes, not a fixed top-3.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import QuantError
from ..lazy import torch
from .lowrank import apply, matrix_view  # noqa: F401  (the reader's half, re-exported)
from .qtensor import QTensor, rows_layout
from .registry import dequantize, get

if TYPE_CHECKING:
    from torch import Tensor

LQER_KEYS = ("lqer", "lqer_l", "lqer_r")
FACTOR_FORMATS = ("int2", "int3", "int4", "int5", "int6", "int8", "fp16")
DEFAULT_FACTOR = "int4"
MAX_RANK = 256


@dataclass(frozen=True)
class LowRank:
    """Rank and factor formats of an LQER correction."""

    rank: int
    left: str = DEFAULT_FACTOR
    right: str = DEFAULT_FACTOR


def split_options(options: dict[str, Any], where: str = "format") -> tuple[dict[str, Any], LowRank | None]:
    """(the format's own options, the LQER request or None); QuantError on a bad LQER value."""
    rest = {k: v for k, v in options.items() if k not in LQER_KEYS}
    if not any(k in options for k in LQER_KEYS):
        return rest, None
    rank = options.get("lqer", 0)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= MAX_RANK:
        raise QuantError(f"{where}: option lqer (the correction's rank) must be an int in 0..{MAX_RANK}, got {rank!r}")
    sides = {}
    for key in ("lqer_l", "lqer_r"):
        value = options.get(key, DEFAULT_FACTOR)
        if value not in FACTOR_FORMATS:
            raise QuantError(f"{where}: option {key} must be one of {', '.join(FACTOR_FORMATS)}, got {value!r}")
        sides[key] = value
    if not rank:
        if "lqer_l" in options or "lqer_r" in options:
            raise QuantError(f"{where}: lqer_l/lqer_r need lqer=RANK > 0")
        return rest, None
    return rest, LowRank(rank, sides["lqer_l"], sides["lqer_r"])


def factors(E: Tensor, rank: int, col_scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(L [r, rows], R [r, cols]) with Lᵀ R the best rank-r approximation of E [rows, cols]
    (weighted by col_scale per column when given); √σ on each side."""
    X = E.double()
    if col_scale is not None:
        X = X * col_scale.double()[None, :]
    U, S, Vh = torch.linalg.svd(X, full_matrices=False)
    r = min(rank, S.numel())
    sq = S[:r].sqrt()
    L = (U[:, :r] * sq).T
    R = sq[:, None] * Vh[:r]
    if col_scale is not None:
        R = R / col_scale.double()[None, :]
    return L.float().contiguous(), R.float().contiguous()


def column_scale(H: Tensor | None) -> Tensor | None:
    """√ of a Hessian's diagonal (Σ x_j² per input column), floored so no column is ignored."""
    if H is None:
        return None
    d = torch.diagonal(H).double().clamp_min(0).sqrt()
    floor = float(d.mean()) * 1e-3 if d.numel() else 0.0
    return d.clamp_min(max(floor, 1e-12))


def correct(W: Tensor, qt: QTensor, spec: LowRank, H: Tensor | None = None, name: str = "tensor") -> QTensor:
    """qt with an LQER correction of its error to W (the matrix view of W); a vector or scalar
    has no low-rank structure and comes back as it is."""
    if len(qt.shape) < 2 or 0 in qt.shape:
        return qt
    rows, cols = rows_layout(tuple(qt.shape))
    W2 = W.detach().float().reshape(rows, cols)
    E = W2 - dequantize(qt).reshape(rows, cols)
    L, _ = factors(E, spec.rank, column_scale(H) if H is not None and H.shape == (cols, cols) else None)
    qL = get(spec.left).quantize(L, name=f"{name} lqer L")
    Lh = dequantize(qL).double()
    # R given the L the reader will see: per column, least squares ‖E[:, j] − L̂ᵀ r‖ (a column
    # weight does not change a per-column solution). lstsq copes with an L̂ that rounded to 0.
    R = torch.linalg.lstsq(Lh.T, E.double()).solution.float().contiguous()
    qR = get(spec.right).quantize(R, name=f"{name} lqer R")
    return replace(qt, lowrank=(qL, qR))


def error_norm(W: Tensor, qt: QTensor) -> float:
    """‖W − dequantize(qt)‖_F (the correction included): what LQER reduces."""
    return float((W.detach().float() - dequantize(qt)).norm())
