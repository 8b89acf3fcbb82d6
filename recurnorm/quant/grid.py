"""Scale-and-round formats: the shared layout (rows, groups, padding) and GPTQ hooks.

A grid format maps a tensor to groups ``x_GxL`` (per row, per group of the
flattened tensor, or the whole tensor), fits one scale (and zero) per group,
and encodes each element to an integer code. `GPTQ` reuses `fit_groups`, `encode_grid`
and `decode_grid` so that its codes lie on the very grid `dequantize` expands.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import QuantError
from ..lazy import torch
from .blockwise import BLOCK, Blockwise
from .qtensor import QTensor, rows_layout
from .registry import dtype_name, range_problem

if TYPE_CHECKING:
    from torch import Tensor

FP16_MAX = 65504.0


def to_fp16_grid(x: Tensor) -> Tensor:
    """Round float32 values to the nearest fp16 (clamped), kept as float32."""
    return x.clamp(-FP16_MAX, FP16_MAX).to(torch.float16).to(torch.float32)


# Values quantized at once (a block of whole groups; at least one group).
QUANTIZE_BLOCK = 1 << 22


def _groups(flat: Tensor, a: int, b: int, L: int) -> Tensor:
    """Groups a..b of a flattened tensor as float32 [b - a, L], zero-padded past its end."""
    x = flat[a * L : b * L].to(torch.float32)
    pad = (b - a) * L - x.numel()
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.reshape(b - a, L)


# Codes are laid out [groups, group]: a group larger than the tensor pads it to the group's
# size (2^24 float32s: a 64 MB temporary), and a group past memory is a mistake.
MAX_GROUP = 1 << 24


def check_group(name: str, group: Any, allow_none: bool = True) -> None:
    """QuantError unless group is None (if allowed) or a positive int up to MAX_GROUP."""
    if group is None and allow_none:
        return
    if not isinstance(group, int) or isinstance(group, bool) or not 0 < group <= MAX_GROUP:
        shown = repr(group) if len(repr(group)) <= 40 else f"{repr(group)[:20]}... ({len(repr(group))} digits)"
        raise QuantError(f"{name}: option group must be a positive int up to {MAX_GROUP:,} or None, got {shown}")


class GridQuantizer(Blockwise):
    """Codes on a per-group grid: subclasses define `fit_groups`, `encode_grid`, `decode_grid`."""

    code_dtype: ClassVar[type] = np.int8
    scale_dtype: ClassVar[type] = np.float16
    per_tensor_default: ClassVar[bool] = False  # group=None: whole tensor (else per row)
    side_streams: ClassVar[dict[str, bool]] = {"scales": True}

    # -- layout ------------------------------------------------------------

    def group_size(self) -> int | None:
        """Elements per group of the flattened tensor, or None (per row / per tensor)."""
        return self.params.get("group")

    def layout(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """(G, L) of the codes for a tensor of this shape."""
        numel = math.prod(shape)
        g = self.group_size()
        if g is not None:
            return -(-numel // g), g
        if self.per_tensor_default:
            return 1, numel
        return rows_layout(shape)

    def to_groups(self, t: Tensor) -> Tensor:
        """The float32 tensor as groups [G, L], zero-padded at the end."""
        G, L = self.layout(tuple(t.shape))
        return _groups(t.reshape(-1), 0, G, L)

    # -- the grid ------------------------------------------------------------

    def fit_groups(self, x_GxL: Tensor) -> tuple[Tensor, Tensor | None]:
        """Per-group scales (and zeros) as float32 values already on the storage grid."""
        raise NotImplementedError

    def encode_grid(self, x: Tensor, scales: Tensor, zeros: Tensor | None) -> Tensor:
        """Integer codes (as float32) of x under broadcastable scales/zeros."""
        raise NotImplementedError

    def decode_grid(self, codes: Tensor, scales: Tensor, zeros: Tensor | None) -> Tensor:
        """float32 values of codes under broadcastable scales/zeros: torch tensors or numpy
        arrays, elementwise (dequantize computes with numpy, GPTQ with torch)."""
        raise NotImplementedError

    def fit_tensor(self, t: Tensor) -> tuple[Tensor, Tensor | None]:
        """Per-group scales (and zeros) of a whole tensor, in `layout` order."""
        return self.fit_groups(self.to_groups(t))

    def _quantize_groups(self, x_GxL: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """(codes, scales, zeros) of the groups; formats with a two-pass rule override it."""
        s, z = self.fit_groups(x_GxL)
        return self.encode_grid(x_GxL, s[:, None], None if z is None else z[:, None]), s, z

    def range_problem(self, qt: QTensor) -> str | None:
        # The largest |value| _dequantize computes: per group, |code - zero| in float32 (at the
        # group's lowest or highest code: rounding is monotone) times |scale| in float32, the
        # product exact in float64. Finite scales can still overflow (a float64 scale of 1e300
        # is Inf in float32; a float32 3e38 times 127 is too).
        with np.errstate(over="ignore", invalid="ignore"):
            # First a bound that settles what quantizers make in two passes: the largest |code|
            # times the largest |scale| (int4 group-64 per-group minima: 30 ms of a 1 s pack of
            # all-MiniLM-L6-v2). Past the limit (or NaN), the exact peak below says by how much.
            if qt.zeros is None and qt.codes.size:
                mag = np.abs(np.array([qt.codes.min(), qt.codes.max()]).astype(np.float32)).max().astype(np.float64)
                top = np.abs(qt.scales.astype(np.float32)).max(initial=0).astype(np.float64)
                if range_problem(mag * top, qt.dtype) is None:
                    return None
            lo, hi = (qt.codes.min(axis=1).astype(np.float32), qt.codes.max(axis=1).astype(np.float32))
            if qt.zeros is not None:
                z = qt.zeros.astype(np.float32)
                lo, hi = lo - z, hi - z
            mag = np.maximum(np.abs(lo), np.abs(hi)).astype(np.float64)
            peak = mag * np.abs(qt.scales.astype(np.float32).astype(np.float64))
        return range_problem(np.where(np.isnan(peak), np.inf, peak), qt.dtype)

    # -- QTensor plumbing ---------------------------------------------------

    def pack(
        self, codes_GxL: Tensor, scales: Tensor, zeros: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype
    ) -> QTensor:
        """A QTensor from codes [G, L] and per-group scales; padding codes are set to 0."""
        return self._qtensor(self._code_array(codes_GxL), scales, zeros, shape, dtype)

    def _code_array(self, codes: Tensor) -> np.ndarray:
        """Grid codes (float or int) as the format's numpy code dtype."""
        # int32 holds every grid's codes (int64 and a clone took 16 bytes a weight at once)
        return codes.to(torch.int32).numpy().astype(self.code_dtype)

    def _qtensor(
        self, codes: np.ndarray, scales: Tensor, zeros: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype
    ) -> QTensor:
        codes.reshape(-1)[math.prod(shape) :] = 0  # trailing padding is zeros by contract
        return QTensor(
            format=self.name,
            shape=tuple(int(s) for s in shape),
            dtype=dtype_name(dtype),
            codes=codes,
            scales=scales.numpy().astype(self.scale_dtype),
            zeros=None if zeros is None else zeros.numpy().astype(self.scale_dtype),
            params=dict(self.params),
        )

    def _quantize(self, t: Tensor, name: str) -> QTensor:
        # Groups are fitted and encoded on their own, so a block of groups at a time: whole, a
        # 32000x2048 embedding's float32 copies (groups, quotients, codes) took 1.0 GB beside
        # its 65 MB of codes; by blocks, one block's.
        G, L = self.layout(tuple(t.shape))
        flat, step = t.reshape(-1), max(1, QUANTIZE_BLOCK // max(L, 1))
        codes, scales, zeros = np.empty((G, L), self.code_dtype), [], []
        for a in range(0, max(G, 1), step):  # (no groups: one empty block, as whole)
            b = min(G, a + step)
            c, s, z = self._quantize_groups(_groups(flat, a, b, L))
            codes[a:b] = self._code_array(c)
            scales.append(s)
            zeros.append(z)
        z = None if zeros[0] is None else torch.cat(zeros)
        return self._qtensor(codes, torch.cat(scales), z, tuple(t.shape), t.dtype)

    def _float32_pieces(self, qt: QTensor) -> Iterator[np.ndarray]:
        s = qt.scales.astype(np.float32)[:, None]
        z = None if qt.zeros is None else qt.zeros.astype(np.float32)[:, None]
        for r, c in qt.blocks(BLOCK):  # elementwise, so piece by piece gives the same values
            yield self.decode_grid(qt.codes[r, c].astype(np.float32), s[r], None if z is None else z[r])
