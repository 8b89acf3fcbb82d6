"""Write a state dict in the safetensors format straight from the tensors' memory.

`safetensors.torch.save` copies every tensor to bytes and then the whole file into one
buffer: unpacking 1 GiB of weights took 3.3 GB. The format is simple (a u64 header length, a
JSON header of dtype / shape / byte offsets padded to 8 bytes, then the data), so each tensor
is written at its places (tied names: twice, no clone) from its own memory, or piece by piece.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from typing import BinaryIO

import numpy as np

from ..io import write_at
from ..lazy import torch
from ..quant.registry import dtype_name, itemsize

# Each dtype's name (torch's without "torch.", as QTensor.dtype holds it) -> its safetensors code.
CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "bool": "BOOL"}
CODES |= {f"{kind}{bits}": f"{kind[0].upper()}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)}


class Layout:
    """Where each tensor of specs {name: (torch dtype, shape)} goes in the file: `head` (the
    length and JSON header), `size` (the whole file's bytes), and positions() of a tensor."""

    def __init__(self, specs: dict) -> None:
        if sys.byteorder != "little":  # pragma: no cover - the format is little-endian
            raise NotImplementedError("writing safetensors needs a little-endian machine")
        self.header, offset = {}, 0
        for name in sorted(specs):
            dtype, shape = specs[name]
            n = math.prod(shape) * itemsize(dtype)
            code = CODES[dtype_name(dtype)]
            self.header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
        head = json.dumps(self.header, separators=(",", ":")).encode("utf-8")
        head += b" " * (-len(head) % 8)
        self.head = struct.pack("<Q", len(head)) + head
        self.size = len(self.head) + offset

    def positions(self, names: list[str], dtype: str, nbytes: int) -> list[int]:
        """Where a tensor (dtype's name, nbytes) begins at each of its names' places, as declared."""
        out = []
        for name in names:
            (a, b), declared = self.header[name]["data_offsets"], self.header[name]["dtype"]
            if declared != CODES[dtype] or b - a != nbytes:
                raise ValueError(f"tensor {name!r}: {dtype} of {nbytes} bytes, not as declared")
            out.append(len(self.head) + a)
        return out


def raw_bytes(t) -> np.ndarray:
    """A torch tensor's bytes, flat (bool and bfloat16 too)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def write_each(f: BinaryIO, specs: dict, tensors) -> None:
    """specs {name: (torch dtype, shape)} make the header, then each (names, tensor) of `tensors`
    is written at its names' places (f must be seekable; places never written are zeros)."""
    layout = Layout(specs)
    f.write(layout.head)
    f.flush()
    for names, t in tensors:
        data = raw_bytes(t)
        for pos in layout.positions(names, dtype_name(t.dtype), data.size):
            write_at(f, pos, data)
    f.truncate(layout.size)
    f.seek(layout.size)
