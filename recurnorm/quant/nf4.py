"""NF4 through bitsandbytes: 4-bit indices into the NormalFloat table times a per-block absmax.

Quantization calls ``bitsandbytes.functional.quantize_4bit`` on CPU; the
packed bytes are unpacked to one index per element (bnb puts the *first*
element of each pair in the high nibble). Dequantization is the exact
table lookup bnb performs (``NF4_TABLE[idx] * absmax`` in float32), so an
artifact decodes without bitsandbytes; `dequantize_with_bnb` checks it.

bitsandbytes 0.50.2's CPU ``dequantize_4bit`` can return wrong values when
the blocksize exceeds the tensor's row length (our own measurement: relative error
0.25–0.33 instead of ~0.10). We always hand
bnb a ``[G, blocksize]`` view of the zero-padded flattened tensor, so the row
length equals the blocksize and that case never arises.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import QuantError
from ..lazy import torch
from .blockwise import BLOCK, Blockwise
from .qtensor import QTensor
from .registry import dtype_name, range_problem

if TYPE_CHECKING:
    from torch import Tensor

# bitsandbytes.functional.get_4bit_type("nf4"), copied so that decoding needs no bnb.
NF4_TABLE = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    dtype=np.float32,
)
BNB_BLOCKSIZES = tuple(2**k for k in range(5, 13))  # 32 … 4096, what bnb's 4-bit accepts


def _bnb_functional():
    try:
        import bitsandbytes.functional as bnbf
    except ImportError as e:
        raise QuantError(f"format 'nf4' needs bitsandbytes ({e}); install it: pip install bitsandbytes") from None
    return bnbf


def effective_blocksize(group: int, numel: int) -> int:
    """The requested blocksize, shrunk for small tensors (less padding), never below 32."""
    bs = group
    while bs > BNB_BLOCKSIZES[0] and bs // 2 >= numel:
        bs //= 2
    return bs


class NF4(Blockwise, name="nf4"):
    """QLoRA NormalFloat4 with a float32 absmax per block of `group` elements."""

    defaults: ClassVar[dict[str, Any]] = {"group": 64}
    option_help: ClassVar[dict[str, str]] = {"group": "block size of one absmax: 32, 64, 128, ..., 4096"}
    side_streams: ClassVar[dict[str, bool]] = {"scales": True}

    def check_options(self) -> None:
        g = self.params["group"]
        if g not in BNB_BLOCKSIZES:
            raise QuantError(f"nf4: option group must be one of {list(BNB_BLOCKSIZES)}, got {g!r}")

    def code_bits(self) -> float:
        return 4.0

    def code_range(self) -> tuple[int, int]:
        return (0, len(NF4_TABLE) - 1)  # indices into the 16-entry table

    def range_problem(self, qt: QTensor) -> str | None:
        # |table value| <= 1 times the float32 absmax: absmax itself bounds a block.
        with np.errstate(over="ignore"):
            return range_problem(np.abs(qt.scales.astype(np.float32).astype(np.float64)), qt.dtype)

    def _quantize(self, t: Tensor, name: str) -> QTensor:
        bnbf = _bnb_functional()
        numel = t.numel()
        B = effective_blocksize(self.params["group"], numel)
        G = -(-numel // B)
        flat = t.reshape(-1).to(torch.float32)
        flat = torch.cat([flat, flat.new_zeros(G * B - numel)])
        if G:
            packed, state = bnbf.quantize_4bit(flat.reshape(G, B), blocksize=B, quant_type="nf4")
            p = packed.reshape(-1).to(torch.int64)
            codes = torch.stack([p >> 4, p & 0xF], dim=1).reshape(-1)  # high nibble first
            absmax = state.absmax.to(torch.float32).reshape(-1)
        else:
            codes, absmax = torch.zeros(0, dtype=torch.int64), torch.zeros(0)
        codes[numel:] = 0  # trailing padding is zeros by contract
        return QTensor(
            format=self.name,
            shape=tuple(int(s) for s in t.shape),
            dtype=dtype_name(t.dtype),
            codes=codes.numpy().astype(np.uint8).reshape(G, B),
            scales=absmax.numpy().astype(np.float32),
            zeros=None,
            params=dict(self.params),
        )

    def _float32_pieces(self, qt: QTensor) -> Iterator[np.ndarray]:
        absmax = qt.scales.astype(np.float32)[:, None]
        for r, c in qt.blocks(BLOCK):
            yield NF4_TABLE[qt.codes[r, c]] * absmax[r]


def dequantize_with_bnb(qt: QTensor) -> Tensor:
    """Dequantize an nf4 QTensor through bitsandbytes itself (packed bytes + QuantState)."""
    bnbf = _bnb_functional()
    G, B = qt.codes.shape
    if G == 0:
        return torch.zeros(qt.shape)
    idx = torch.from_numpy(qt.codes.astype(np.uint8)).reshape(-1, 2)
    packed = ((idx[:, 0] << 4) | idx[:, 1]).to(torch.uint8).reshape(-1, 1)
    state = bnbf.QuantState(
        absmax=torch.from_numpy(qt.scales.astype(np.float32)),
        shape=torch.Size([G, B]),
        code=bnbf.get_4bit_type("nf4", device="cpu"),
        blocksize=B,
        quant_type="nf4",
        dtype=torch.float32,
    )
    values = bnbf.dequantize_4bit(packed, state)
    return values.reshape(-1)[: math.prod(qt.shape)].reshape(qt.shape)
