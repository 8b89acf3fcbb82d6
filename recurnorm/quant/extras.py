"""Options beside a format that change how a tensor is exported, not how it is read.

``-q int6:clip=std:12:lqer=4:rdo=0.1`` names the format ``int6`` with its own option
``clip`` and two export options handled here, before the format's quantizer is built:

- ``lqer`` / ``lqer_l`` / ``lqer_r``: an LQER correction (`quant/lqer.py`), stored in the
  artifact as two small factor tensors;
- ``rdo``: rate-aware rounding with λ = rdo (`quant/rdo.py`) for the intN grids: the codes
  change, the format and its dequantization do not.

Neither is a quantizer parameter (a QTensor's params stay the format's own, so artifacts
written without them are byte for byte what they were).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import QuantError
from ..lazy import torch
from . import lqer
from .qtensor import QTensor
from .registry import Quantizer, get

if TYPE_CHECKING:
    from torch import Tensor

EXTRA_KEYS = (*lqer.LQER_KEYS, "rdo")


@dataclass(frozen=True)
class Extras:
    """The export options of one format spec."""

    lowrank: lqer.LowRank | None = None
    rdo: float = 0.0


def split(fmt: str, options: dict[str, Any]) -> tuple[Quantizer, Extras]:
    """(the format's quantizer, its export options); QuantError naming what is wrong."""
    where = f"format {fmt!r}"
    own = {k: v for k, v in options.items() if k not in EXTRA_KEYS}
    _, lowrank = lqer.split_options(options, where)
    rdo = options.get("rdo", 0.0)
    if isinstance(rdo, bool) or not isinstance(rdo, (int, float)) or not 0.0 <= rdo <= 16.0:
        raise QuantError(f"{where}: option rdo (λ, squared steps per bit) must be a number in [0, 16], got {rdo!r}")
    quantizer = get(fmt, **own)
    if rdo and (not fmt.startswith("int") or fmt == "int8_pg"):
        raise QuantError(f"{where}: rdo (rate-aware rounding) applies to the int2..int8 grids")
    return quantizer, Extras(lowrank, float(rdo))


def quantize(t: Tensor, fmt: str, options: dict[str, Any], name: str = "tensor", H: Tensor | None = None) -> QTensor:
    """t in a format spec, with its export options (H: the input Hessian, for LQER's weighting)."""
    quantizer, extras = split(fmt, options)
    qt = quantizer.quantize(t, name=name)
    if extras.rdo:
        qt = round_rate_aware(quantizer, t, qt, extras.rdo)
    if extras.lowrank is not None:
        qt = lqer.correct(t, qt, extras.lowrank, H, name)
    return qt


def round_rate_aware(quantizer, t: Tensor, qt: QTensor, lam: float) -> QTensor:
    """qt's codes re-rounded rate-aware on the same grid (scales and zeros kept)."""
    from .rdo import rate_aware

    x = quantizer.to_groups(t.detach())
    s = torch.from_numpy(qt.scales.astype(np.float32))[:, None]
    y = x / torch.where(s > 0, s, 1.0)
    if qt.zeros is not None:
        y = y + torch.from_numpy(qt.zeros.astype(np.float32))[:, None]
    lo, hi = quantizer.code_range()
    codes = rate_aware(y, lo, hi, lam)
    z = None if qt.zeros is None else torch.from_numpy(qt.zeros.astype(np.float32))
    return quantizer.pack(codes, s[:, 0], z, tuple(qt.shape), t.dtype)
