"""Passthrough formats: float bits stored as unsigned integers, and raw integer tensors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import QuantError
from ..lazy import torch
from .qtensor import QTensor
from .registry import Quantizer, dtype_name, known_dtype, range_problem, torch_dtype

if TYPE_CHECKING:
    from torch import Tensor

# The float passthrough formats, defined once (export, evaluate and the packer read them here):
# name -> (the dtype its words hold, by name; mantissa bits).
FLOAT_FORMATS = {"fp32": ("float32", 23), "fp16": ("float16", 10), "bf16": ("bfloat16", 7)}


# Words of a float dtype as numpy holds them (it has no bfloat16: its words as uint16).
WORD_DTYPES = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16, "float64": np.uint64}


def float_words(words: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Finite float words of dtype src as dst's, through float32 as torch converts them (exactly
    where dst is as wide; else rounded to nearest, ties to even), with numpy alone: pack and
    unpack of float formats need no torch. src is float32, float16 or bfloat16."""
    if src == dst:
        return words
    if src == "bfloat16":
        x = (words.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        x = words.view(np.dtype(src)).astype(np.float32, copy=False)
    if dst != "bfloat16":
        with np.errstate(over="ignore"):  # (past dst's range: Inf, as torch gives, which the checks refuse)
            return x.astype(dst).view(WORD_DTYPES[dst])
    bits = x.view(np.uint32)  # (finite: the carry of a tie never reaches past the exponent)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def words(qt: QTensor) -> np.ndarray:
    """The words (flat) of a passthrough QTensor without LQER factors, in its original dtype (a
    bool's as uint8): what dequantize(qt, original_dtype=True) holds, made with numpy alone."""
    flat = np.ascontiguousarray(qt.codes).reshape(-1)[: qt.numel]
    if qt.format == "raw":
        return flat.astype(np.uint8 if qt.dtype == "bool" else qt.dtype, copy=False)
    return float_words(flat, FLOAT_FORMATS[qt.format][0], qt.dtype)


class _Passthrough(Quantizer):
    """A format that stores the words themselves: unpack writes them whole (`words`)."""

    def word_blocks(self, qt: QTensor) -> Iterator[np.ndarray]:
        yield words(self._checked(qt))


class _FloatBits(_Passthrough):
    """Floats kept as floats in that precision: fp32 keeps every bit of fp32, bf16 and fp16 tensors.

    The tensor cast to `store`, stored as raw bits: codes [1, N] of an unsigned view.
    """

    defaults: ClassVar[dict[str, Any]] = {}
    option_help: ClassVar[dict[str, str]] = {}
    view_uint: ClassVar[type] = np.uint32  # (numpy has no bfloat16: its words as unsigned ints)

    @property
    def store(self) -> torch.dtype:
        """The torch dtype its words hold."""
        return torch_dtype(FLOAT_FORMATS[self.name][0])

    def code_bits(self) -> float:
        return 8.0 * np.dtype(self.view_uint).itemsize

    def check_streams(self, dtypes: dict[str, str]) -> str | None:
        dt = np.dtype(dtypes["codes"])
        if dt.kind not in "iu" or dt.itemsize != np.dtype(self.view_uint).itemsize:
            return f"{self.name} codes are {np.dtype(self.view_uint).name} bit patterns, not {dt.name}"
        return super().check_streams(dtypes)

    def check_values(self, qt: QTensor) -> str | None:
        bits = np.ascontiguousarray(qt.codes).view(self.view_uint)
        mant = FLOAT_FORMATS[self.name][1]
        if not bits.size:
            return None
        # The largest magnitude is the largest bit pattern without the sign: the largest signed
        # pattern of the positives, the largest unsigned one less the sign of the negatives (two
        # passes, no temporary: masking every word cost 4x). NaN or Inf where its exponent is all
        # ones (quantize() refuses them: such a value is forged); else one value to convert,
        # which a narrower output dtype may not hold (fp32 1e10 as float16).
        sign = 1 << (8 * bits.itemsize - 1)
        top = max(int(bits.view(f"i{bits.itemsize}").max()), int(bits.max()) - sign, 0)
        if top >> mant >= (1 << (8 * bits.itemsize - 1 - mant)) - 1:
            return f"{self.name} values hold NaN or Inf"
        if self.name == "bf16":
            peak = np.array([top << 16], np.uint32).view(np.float32)
        else:
            peak = np.array([top], self.view_uint).view(np.float16 if self.name == "fp16" else np.float32)
        return range_problem(peak.astype(np.float64), qt.dtype)

    def _quantize(self, t: Tensor, name: str) -> QTensor:
        signed = torch_dtype(f"int{8 * np.dtype(self.view_uint).itemsize}")  # (a view numpy can take)
        bits = t.to(self.store).reshape(1, -1).view(signed).numpy().view(self.view_uint)
        return QTensor(self.name, tuple(t.shape), dtype_name(t.dtype), bits.copy(), params={})

    @classmethod
    def makes_words(cls, dtype: str) -> bool:
        return dtype in WORD_DTYPES  # (a float dtype)

    def _dequantize(self, qt: QTensor) -> Tensor:
        return self._words(qt).to(torch.float32)

    def dequantize_to(self, qt: QTensor, dtype: torch.dtype) -> Tensor:
        # In its own dtype, the words as they are: bf16 through float32 and back cost unpack 3
        # passes over 6 bytes a weight (fresh memory each) for the same bits.
        return self._words(self._checked(qt)) if dtype == self.store else super().dequantize_to(qt, dtype)

    def _words(self, qt: QTensor) -> Tensor:
        signed = np.ascontiguousarray(qt.codes).view(np.dtype(f"int{self.view_uint().itemsize * 8}"))
        values = torch.from_numpy(signed.copy()).view(self.store)
        return values.reshape(-1)[: qt.numel].reshape(qt.shape)


class FP32(_FloatBits, name="fp32"):
    """Lossless float32."""


class FP16(_FloatBits, name="fp16"):
    view_uint = np.uint16


class BF16(_FloatBits, name="bf16"):
    view_uint = np.uint16


class Raw(_Passthrough, name="raw"):
    """Integer and bool tensors, exactly: codes are the values themselves ([1, N]; bool as uint8).

    Its `dequantize` returns the original integer dtype, not float32.
    """

    defaults: ClassVar[dict[str, Any]] = {}
    option_help: ClassVar[dict[str, str]] = {}
    float_only = False

    def code_bits(self) -> float:
        return 8.0  # nominal: the packer sees the actual integer width

    def check_streams(self, dtypes: dict[str, str]) -> str | None:
        if dtypes["codes"] == "bool":
            return super().check_streams({**dtypes, "codes": "uint8"})
        return super().check_streams(dtypes)

    def check_values(self, qt: QTensor) -> str | None:
        # Values must survive the cast to the original dtype unchanged.
        if qt.codes.size == 0 or known_dtype(qt.dtype).startswith(("float", "bfloat")):
            return None
        lo, hi = (0, 1) if qt.dtype == "bool" else (np.iinfo(qt.dtype).min, np.iinfo(qt.dtype).max)
        cmin, cmax = int(qt.codes.min()), int(qt.codes.max())
        if cmin < lo or cmax > hi:
            return f"raw codes span [{cmin}, {cmax}], outside {qt.dtype}"
        return None

    def _quantize(self, t: Tensor, name: str) -> QTensor:
        if t.is_floating_point() or t.is_complex():
            raise QuantError(
                f"tensor {name} has dtype {dtype_name(t.dtype)}; 'raw' takes integer and bool "
                "tensors (use fp32/fp16/bf16 for floats)"
            )
        dt = dtype_name(t.dtype)
        torch_dtype(dt)  # QuantError for dtypes the artifact cannot name
        src = t.to(torch.uint8) if t.dtype == torch.bool else t
        return QTensor(self.name, tuple(t.shape), dt, src.reshape(1, -1).numpy().copy(), params={})

    @classmethod
    def makes_words(cls, dtype: str) -> bool:
        return dtype not in WORD_DTYPES  # (integers and bools)

    def _dequantize(self, qt: QTensor) -> Tensor:
        values = torch.from_numpy(np.ascontiguousarray(qt.codes).copy()).reshape(-1)[: qt.numel]
        return values.to(torch_dtype(qt.dtype)).reshape(qt.shape)
