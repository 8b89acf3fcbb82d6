"""The reader's half of LQER (quant/lqer.py): the matrix a correction is laid on and the one
order every reader sums it in. Below the registry, whose ``dequantize`` adds corrections, so
the writer's half (lqer.py) can use ``dequantize`` without a circle."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..errors import QuantError
from .qtensor import QTensor, rows_layout

if TYPE_CHECKING:
    from torch import Tensor


def apply(W: Tensor, L: Tensor, R: Tensor) -> Tensor:
    """W [rows, cols] + Σ_k L[k]ᵀ R[k] in float32, rank by rank: the order every reader sums in."""
    out = W.float()
    for a, b in zip(L.float(), R.float(), strict=True):
        out = out + a[:, None] * b[None, :]
    return out


def matrix_view(shape: tuple[int, ...], left_cols: int | None = None) -> tuple[int, int]:
    """(rows, cols) a correction of a tensor of this shape is laid on: ``[shape[0], rest]``, or
    for a stack of matrices (>= 3 dims, export/banks.py) ``[rest, shape[-1]]`` when its left
    factor says so (its length is the rows)."""
    rows, cols = rows_layout(shape)
    if len(shape) > 2 and left_cols is not None and left_cols != rows:
        return math.prod(shape[:-1]), shape[-1]
    return rows, cols


def add_to(t: Tensor, qt: QTensor, L: Tensor, R: Tensor) -> Tensor:
    """The dequantized tensor t (float32, qt's shape) with the correction of its dequantized
    factors L and R added."""
    rows, cols = matrix_view(tuple(qt.shape), L.shape[-1])
    if L.shape != (L.shape[0], rows) or R.shape != (L.shape[0], cols):
        raise QuantError(f"lqer factors {list(L.shape)} and {list(R.shape)} do not fit a [{rows}, {cols}] matrix")
    return apply(t.reshape(rows, cols), L, R).reshape(t.shape)
