"""QTensor: the one type that crosses from quant/ to budget/."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def rows_layout(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, row length): dim 0 against the rest; 0-D and 1-D tensors are one row."""
    if len(shape) >= 2:
        return shape[0], math.prod(shape[1:])
    return 1, math.prod(shape)


@dataclass
class QTensor:
    """A quantized tensor: integer codes plus what is needed to dequantize them.

    Layout contract (budget/ relies on it):
    - ``codes`` is a 2-D integer ndarray ``[G, L]``; row ``g`` was quantized with
      ``scales[g]`` (and ``zeros[g]``). Per-row formats have ``G = rows``;
      group-wise formats have ``G = n_groups``; per-tensor formats ``G = 1``.
      ``G * L >= numel``; trailing padding (zeros) is allowed and dropped on
      dequantize.
    - Passthrough formats (fp32/fp16/bf16/raw) store the raw bits as an
      unsigned (or the original integer) view with ``G = 1`` and no scales.
    - ``scales`` / ``zeros``: 1-D float ndarray of length ``G``, or None.
    - ``params``: JSON-serializable options the format needs to dequantize
      (bits, group size, ...). ``format`` is the registry name.
    - ``lowrank``: None, or a low-rank correction of the quantization error (LQER,
      ``quant/lqer.py``): two QTensors ``L [r, rows]`` and ``R [r, cols]`` of the tensor
      viewed as ``[rows, cols]``, added to the dequantized values
      ``Σ_k L[k]ᵀ R[k]`` (``lowrank.apply``, the one order every reader sums in).
    """

    format: str
    shape: tuple[int, ...]
    dtype: str
    codes: np.ndarray
    scales: np.ndarray | None = None
    zeros: np.ndarray | None = None
    params: dict[str, Any] = field(default_factory=dict)
    lowrank: tuple[QTensor, QTensor] | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def blocks(self, elements: int = 1 << 22):
        """(rows, cols) slices covering codes [G, L] in pieces of about `elements` codes:
        dequantizing piece by piece keeps float temporaries small (an int64 or float32 copy
        of 2**28 codes is 1-2 GB)."""
        G, L = self.codes.shape
        rows = max(1, elements // max(L, 1))
        cols = L if rows > 1 or L <= elements else elements
        for i in range(0, G, rows):
            for j in range(0, max(L, 1), max(cols, 1)):
                yield slice(i, i + rows), slice(j, j + cols)

    def equal(self, other: QTensor) -> bool:
        """Bit-exact equality of everything that is stored."""

        def same(a, b):
            if a is None or b is None:
                return a is None and b is None
            return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)

        return (
            self.format == other.format
            and tuple(self.shape) == tuple(other.shape)
            and self.dtype == other.dtype
            and self.params == other.params
            and same(self.codes, other.codes)
            and same(self.scales, other.scales)
            and same(self.zeros, other.zeros)
            and (self.lowrank is None) == (other.lowrank is None)
            and (self.lowrank is None or all(a.equal(b) for a, b in zip(self.lowrank, other.lowrank, strict=True)))
        )
