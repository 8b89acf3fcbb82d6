"""BitNet b1.58 ternary (Ma et al. 2024, arXiv:2402.17764): codes in {−1, 0, 1} × absmean scale."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import QuantError
from ..lazy import torch
from .grid import GridQuantizer, check_group, to_fp16_grid
from .qtensor import QTensor

if TYPE_CHECKING:
    from torch import Tensor

EPS = 1e-8  # the ε in W / (s + ε): only keeps all-zero groups finite


class Ternary(GridQuantizer, name="ternary"):
    """s = mean|W| per tensor (group=None) or per group; Q = clip(round(W/(s+ε)), −1, 1)."""

    per_tensor_default = True
    defaults: ClassVar[dict[str, Any]] = {
        "group": None,
        "lsq_rescale": False,  # store s = <W,Q>/<Q,Q> instead of mean|W| (removes the zeros' bias)
    }
    option_help: ClassVar[dict[str, str]] = {
        "group": "none: one scale for the tensor; N: one scale per N elements",
        "lsq_rescale": "true: store s = <W,Q>/<Q,Q> (least squares) instead of mean|W|",
    }

    def check_options(self) -> None:
        check_group(self.name, self.params["group"])
        if not isinstance(self.params["lsq_rescale"], bool):
            raise QuantError(f"ternary: option lsq_rescale must be a bool, got {self.params['lsq_rescale']!r}")

    def code_bits(self) -> float:
        return math.log2(3)  # 5 trits per byte packing reaches 1.6

    def code_range(self) -> tuple[int, int]:
        return (-1, 1)

    def _counts(self, numel: int, G: int, L: int) -> Tensor:
        """Real elements per group: padding zeros must not dilute the last group's mean."""
        counts = torch.full((G,), float(max(L, 1)))
        if G and L:
            counts[-1] = float(max(numel - (G - 1) * L, 1))
        return counts

    def _ternary(self, x_GxL: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        """(codes, stored scales): absmean scale, BitNet rounding, optional LSQ rescale."""
        s = to_fp16_grid(x_GxL.abs().sum(1) / counts)
        q = self.encode_grid(x_GxL, s[:, None], None)
        if self.params["lsq_rescale"]:
            qq = q.square().sum(1)
            s = to_fp16_grid(torch.where(qq > 0, (x_GxL * q).sum(1) / qq.clamp(min=1.0), 0.0))
        return q, s

    def _quantize(self, t: Tensor, name: str) -> QTensor:
        x_GxL = self.to_groups(t)
        q, s = self._ternary(x_GxL, self._counts(t.numel(), *x_GxL.shape))
        return self.pack(q, s, None, tuple(t.shape), t.dtype)

    def fit_tensor(self, t: Tensor) -> tuple[Tensor, Tensor | None]:
        x_GxL = self.to_groups(t)
        return self._ternary(x_GxL, self._counts(t.numel(), *x_GxL.shape))[1], None

    def fit_groups(self, x_GxL: Tensor) -> tuple[Tensor, Tensor | None]:
        return self._ternary(x_GxL, self._counts(x_GxL.numel(), *x_GxL.shape))[1], None

    def encode_grid(self, x: Tensor, scales: Tensor, zeros: Tensor | None) -> Tensor:
        return torch.round(x / (scales + EPS)).clamp(-1, 1)

    def decode_grid(self, codes: Tensor, scales: Tensor, zeros: Tensor | None) -> Tensor:
        return codes * scales
