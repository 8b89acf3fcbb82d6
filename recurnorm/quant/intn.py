"""Integer formats: symmetric/asymmetric intN (N = 2..8), and the Parameter Golf int8 baseline."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import QuantError
from ..lazy import torch
from .grid import GridQuantizer, check_group, to_fp16_grid
from .qtensor import QTensor
from .registry import dtype_name

if TYPE_CHECKING:
    from torch import Tensor

# Parameter Golf's baseline constant (INT8_CLIP_PERCENTILE in its train_gpt.py,
# https://github.com/openai/parameter-golf): clip each row at this percentile of |w|.
PG_CLIP_PERCENTILE = 99.99984
# Clip ratios tried by clip_search, from no clipping down to half the range.
CLIP_RATIOS = tuple(1.0 - 0.02 * i for i in range(26))
_QUANTILE_MAX_NUMEL = 1 << 24  # torch.quantile refuses larger inputs


def row_quantile(x_GxL: Tensor, q: float) -> Tensor:
    """torch.quantile(x, q, dim=1), in row chunks so that large tensors work too."""
    G, L = x_GxL.shape
    if G == 0 or L == 0:
        return x_GxL.new_zeros(G)
    if L > _QUANTILE_MAX_NUMEL:  # one row too long for torch.quantile: same linear rule by hand
        srt = x_GxL.sort(dim=1).values
        pos = q * (L - 1)
        lo, frac = int(math.floor(pos)), pos - math.floor(pos)
        return torch.lerp(srt[:, lo], srt[:, min(lo + 1, L - 1)], frac)
    step = max(1, _QUANTILE_MAX_NUMEL // L)
    return torch.cat([torch.quantile(x_GxL[i : i + step], q, dim=1) for i in range(0, G, step)])


class IntN(GridQuantizer):
    """Uniform N-bit grid per group: symmetric codes ±(2^(N-1)−1) or asymmetric 0..2^N−1."""

    bits: ClassVar[int] = 8
    defaults: ClassVar[dict[str, Any]] = {
        "group": None,  # None: one scale per row (dim 0); int: groups of the flattened tensor
        "clip_search": False,  # grid over CLIP_RATIOS minimizing each group's MSE
        "asymmetric": False,  # scale + integer zero point
        "clip_percentile": None,  # clip each group at this percentile of |w| (None: absmax)
        # "sigma:K": clip each group at K standard deviations of its values (capped at its
        # absmax); "std:K": the Parameter Golf records' SDClip exactly, scale = K * std(row) / qmax
        # (torch's unbiased std, no cap: the grid may reach past the row's largest value, which
        # entropy coding does not pay for). Either replaces clip_percentile when set.
        "clip": None,
    }
    nullable: ClassVar[frozenset[str]] = frozenset({"group", "clip_percentile"})  # None: per row / absmax
    option_help: ClassVar[dict[str, str]] = {
        "group": "none: one scale per row; N: one scale per N elements of the flattened tensor",
        "clip_search": "true: try clip ratios 1.00..0.50 per group, keep the least squared error",
        "asymmetric": "true: codes 0..2^N-1 with an integer zero point per group",
        "clip_percentile": "P in (50, 100]: clip each group at the P-th percentile of |w|",
        "clip": "std:K: the Parameter Golf records' SDClip exactly, scale K*std(row)/qmax; "
        "sigma:K: recurnorm's clip at K standard deviations of each group, capped at its absmax",
    }

    def check_options(self) -> None:
        p = self.params
        check_group(self.name, p["group"])
        for key in ("clip_search", "asymmetric"):
            if not isinstance(p[key], bool):
                raise QuantError(f"{self.name}: option {key} must be a bool, got {p[key]!r}")
        cp = p["clip_percentile"]
        if cp is not None and not (isinstance(cp, (int, float)) and 50.0 < cp <= 100.0):
            raise QuantError(f"{self.name}: clip_percentile must be in (50, 100] or None, got {cp!r}")
        if p["clip"] is not None and self.clip_sigmas() is None:
            raise QuantError(f"{self.name}: clip must be 'sigma:K' or 'std:K' with K > 0, or None; got {p['clip']!r}")

    def clip_sigmas(self) -> float | None:
        """K of a "sigma:K" or "std:K" clip, or None."""
        kind, _, k = str(self.params["clip"]).partition(":")
        try:
            value = float(k)
        except ValueError:
            return None
        return value if kind in ("sigma", "std") and value > 0 and math.isfinite(value) else None

    @property
    def qmax(self) -> int:
        """Largest code: 2^(N-1)−1 symmetric, 2^N−1 asymmetric."""
        return 2**self.bits - 1 if self.params["asymmetric"] else 2 ** (self.bits - 1) - 1

    @property
    def code_dtype(self) -> type:  # type: ignore[override]
        return np.uint8 if self.params["asymmetric"] else np.int8

    side_streams: ClassVar[dict[str, bool]] = {"scales": True, "zeros": False}

    def code_bits(self) -> float:
        return float(self.bits)

    def code_range(self) -> tuple[int, int]:
        return (0, self.qmax) if self.params["asymmetric"] else (-self.qmax, self.qmax)

    # -- the grid ------------------------------------------------------------

    def _range(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(lo, hi) per group before any clip search; lo = -hi when symmetric."""
        G, L = x.shape
        if L == 0:
            return x.new_zeros(G), x.new_zeros(G)
        cp = self.params["clip_percentile"]
        k = self.clip_sigmas()
        if k is not None and str(self.params["clip"]).startswith("std:"):
            hi = k * x.std(1) if L > 1 else x.abs().amax(1)  # (one value has no unbiased std)
            return -hi, hi  # symmetric about 0, asymmetric grids too
        if k is not None:
            mu, sd = x.mean(1), x.std(1, correction=0)
            lo, hi = torch.maximum(x.amin(1), mu - k * sd), torch.minimum(x.amax(1), mu + k * sd)
            if self.params["asymmetric"]:
                return lo.clamp(max=0.0), hi.clamp(min=0.0)
            hi = torch.minimum(x.abs().amax(1), k * sd)
            return -hi, hi
        if self.params["asymmetric"]:
            if cp is None:
                lo, hi = x.amin(1), x.amax(1)
            else:
                lo, hi = row_quantile(x, 1.0 - cp / 100.0), row_quantile(x, cp / 100.0)
            # The range must hold 0 so that the integer zero point exists and 0 stays exact.
            return lo.clamp(max=0.0), hi.clamp(min=0.0)
        a = x.abs()
        hi = a.amax(1) if cp is None else row_quantile(a, cp / 100.0)
        return -hi, hi

    def _grid(self, lo: Tensor, hi: Tensor, ratio: float) -> tuple[Tensor, Tensor | None]:
        if self.params["asymmetric"]:
            s = to_fp16_grid(ratio * (hi - lo) / self.qmax)
            z = torch.round(-ratio * lo / torch.where(s > 0, s, 1.0)).clamp(0, self.qmax)
            return s, z
        return to_fp16_grid(ratio * hi / self.qmax), None

    def fit_groups(self, x_GxL: Tensor) -> tuple[Tensor, Tensor | None]:
        lo, hi = self._range(x_GxL)
        s, z = self._grid(lo, hi, 1.0)
        if not self.params["clip_search"] or x_GxL.shape[1] == 0:
            return s, z
        best = self._mse(x_GxL, s, z)
        for ratio in CLIP_RATIOS[1:]:
            s_r, z_r = self._grid(lo, hi, ratio)
            err = self._mse(x_GxL, s_r, z_r)
            better = err < best  # strict: ties keep the larger (unclipped) range
            best = torch.where(better, err, best)
            s = torch.where(better, s_r, s)
            if z is not None:
                z = torch.where(better, z_r, z)
        return s, z

    def _mse(self, x: Tensor, s: Tensor, z: Tensor | None) -> Tensor:
        zz = None if z is None else z[:, None]
        return (self.decode_grid(self.encode_grid(x, s[:, None], zz), s[:, None], zz) - x).square().sum(1)

    def encode_grid(self, x: Tensor, scales: Tensor, zeros: Tensor | None) -> Tensor:
        safe = torch.where(scales > 0, scales, 1.0)  # all-zero group: codes 0, no NaN
        if zeros is None:
            return torch.round(x / safe).clamp(-self.qmax, self.qmax)
        return (torch.round(x / safe) + zeros).clamp(0, self.qmax)

    def decode_grid(self, codes: Tensor, scales: Tensor, zeros: Tensor | None) -> Tensor:
        return codes * scales if zeros is None else (codes - zeros) * scales


# One class per bit width; ≤ 4 bits default to groups of 64 (a per-row scale is too coarse there).
class Int2(IntN, name="int2"):
    bits = 2
    defaults = {**IntN.defaults, "group": 64}


class Int3(IntN, name="int3"):
    bits = 3
    defaults = {**IntN.defaults, "group": 64}


class Int4(IntN, name="int4"):
    bits = 4
    defaults = {**IntN.defaults, "group": 64}


class Int5(IntN, name="int5"):
    bits = 5


class Int6(IntN, name="int6"):
    bits = 6


class Int7(IntN, name="int7"):
    bits = 7


class Int8(IntN, name="int8"):
    """Per-row int8 with the baseline's percentile clip and no scale floor."""

    bits = 8
    defaults = {**IntN.defaults, "clip_percentile": PG_CLIP_PERCENTILE}


class Int8PG(GridQuantizer, name="int8_pg"):
    """The Parameter Golf baseline's int8, bit for bit, including its 1/127 scale floor.

    2-D: per row, clip at torch.quantile(|w|, 0.9999984, dim=1),
    ``scale = max(clip/127, 1/127)``; codes are computed with the float32
    scale, the scale is stored as fp16. Other shapes: one float32 scale
    ``clip/127`` (1.0 when clip is 0), no floor.
    """

    defaults: ClassVar[dict[str, Any]] = {}
    option_help: ClassVar[dict[str, str]] = {}

    def code_bits(self) -> float:
        return 8.0

    def code_range(self) -> tuple[int, int]:
        return (-127, 127)

    def decode_grid(self, codes: Tensor, scales: Tensor, zeros: Tensor | None) -> Tensor:
        return codes * scales

    def _quantize(self, t: Tensor, name: str) -> QTensor:
        t32 = t.float()
        q_clip = PG_CLIP_PERCENTILE / 100.0
        if t32.ndim == 2:
            clip_abs = row_quantile(t32.abs(), q_clip)
            clipped = torch.maximum(torch.minimum(t32, clip_abs[:, None]), -clip_abs[:, None])
            scale = (clip_abs / 127.0).clamp_min(1.0 / 127.0)
            q = torch.clamp(torch.round(clipped / scale[:, None]), -127, 127)
            scales = scale.to(torch.float16).numpy()
            codes = q
        else:
            flat = t32.reshape(1, -1)
            clip_abs = float(row_quantile(flat.abs(), q_clip)[0]) if t32.numel() else 0.0
            scale = torch.tensor(clip_abs / 127.0 if clip_abs > 0 else 1.0, dtype=torch.float32)
            codes = torch.clamp(torch.round(torch.clamp(flat, -clip_abs, clip_abs) / scale), -127, 127)
            scales = scale.reshape(1).numpy()
        return QTensor(
            format=self.name,
            shape=tuple(int(s) for s in t.shape),
            dtype=dtype_name(t.dtype),
            codes=codes.numpy().astype(np.int8),
            scales=scales,
            zeros=None,
            params={},
        )
