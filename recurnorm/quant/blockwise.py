"""Formats whose values numpy computes piece by piece: torch's dequantize and unpack's words
(numpy alone: no torch to import) come from the same float32 pieces.

An int8 unpack of a 1.1B-weight bf16 model dequantized each tensor whole in float32 with torch
(262 MB for its embedding), then cast it whole: 5.4 s of its 17 s with one job, beside 0.9 s
to import torch and 0.3 s for its teardown. Pieces of BLOCK codes stay in the core's cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..lazy import torch
from .passthrough import WORD_DTYPES, float_words
from .qtensor import QTensor
from .registry import Quantizer

if TYPE_CHECKING:
    from torch import Tensor

# Codes a piece: 65.5M int8 codes to bf16 words took 0.13 s in pieces of 2**18, 0.15 s in
# pieces of 2**20 and 0.19 s in pieces of 2**22 (numpy, one core); whole, with torch, 0.30 s.
BLOCK = 1 << 18


class Blockwise(Quantizer):
    """A format that defines `_float32_pieces`: its float32 values, piece by piece in order."""

    @classmethod
    def makes_words(cls, dtype: str) -> bool:
        return dtype in WORD_DTYPES  # (a float dtype: what dequantize restores, from float32)

    def _float32_pieces(self, qt: QTensor) -> Iterator[np.ndarray]:
        """The float32 values of codes[r, c] for each (r, c) of qt.blocks(BLOCK), in that order
        (the codes' flat order, padding included), made with numpy."""
        raise NotImplementedError

    def _dequantize(self, qt: QTensor) -> Tensor:
        out, at = np.empty(qt.codes.size, np.float32), 0
        for piece in self._float32_pieces(qt):
            out[at : at + piece.size] = piece.reshape(-1)
            at += piece.size
        return torch.from_numpy(out[: qt.numel]).reshape(qt.shape)

    def word_blocks(self, qt: QTensor) -> Iterator[np.ndarray]:
        left = qt.numel
        for piece in self._float32_pieces(self._checked(qt)):
            values = piece.reshape(-1)[:left]  # (the padding after the last value: not the tensor's)
            left -= values.size
            yield float_words(values.view(np.uint32), "float32", qt.dtype)
