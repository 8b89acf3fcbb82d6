"""Pack a .safetensors checkpoint (or the shards of one) tensor by tensor, in memory bounded by its largest tensors.

Each tensor is read from the file when its turn comes, quantized and coded, and its streams
are written to the output, in order, before the next is read (with --jobs N, N tensors at a
time; one that is done before its turn waits in memory, parallel.HOLD_BYTES). The header and
manifest, which hold the payload's length and hash, are written last: the manifest after the
payload, the header into the room left before it. The artifact
is the one `pack_state` makes of the whole state dict, byte for byte: the same plan, tensor
order and coding (a safetensors file holds no tied tensors).
What needs every tensor at once (--fit, --gptq, a recipe's LQER on its worst tensors, effort
max's two passes, a PyTorch .pt) takes that path instead.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..budget.safetensors_out import CODES
from ..errors import QuantError
from ..io import WriteBehind, write_at
from ..lazy import torch
from ..quant import extras
from ..quant.passthrough import FLOAT_FORMATS, WORD_DTYPES, float_words
from ..quant.qtensor import QTensor
from ..quant.registry import ITEMSIZE, itemsize, torch_dtype
from .policy import ExportPolicy

DTYPES = {code: name for name, code in CODES.items()}  # safetensors' codes -> dtype names
WORD_FLOATS = ("float32", "float16", "bfloat16")  # read as words (float_words); float64 by torch
FLOATS = ("float64", *WORD_FLOATS)


@dataclass(frozen=True)
class TensorMeta:
    """A tensor's dtype name and shape, from its file's header: what the export policy plans from
    (it asks what it would ask a tensor), with no data read and no torch imported."""

    dtype: str
    shape: tuple[int, ...]

    def numel(self) -> int:
        return math.prod(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def is_floating_point(self) -> bool:
        return self.dtype in FLOATS

    def element_size(self) -> int:
        return itemsize(self.dtype)


class SafetensorsFiles:
    """A checkpoint's .safetensors files (one, or the shards of a folder's index): every tensor's
    dtype, shape and place (the library checks each file's header first), and each tensor read
    when asked for."""

    def __init__(self) -> None:
        self.header: dict[str, dict] = {}  # name -> its file's header entry
        self.at: dict[str, tuple[Path, int]] = {}  # name -> (file, where its data starts)

    @classmethod
    def open(cls, files: dict[Path, set[str] | None]) -> SafetensorsFiles | None:
        """The files (load.checkpoint_files), or None when a dtype is one only the library's
        reader names (its error then)."""
        from safetensors import safe_open

        from ..errors import CheckpointError
        from .load import _check_safetensors_header, check_shard

        src = cls()
        for path, names in files.items():
            _check_safetensors_header(path)
            try:
                with safe_open(str(path), "np"):  # offsets, sizes and the header's JSON: checked here
                    pass
                with open(path, "rb") as f:
                    (n,) = struct.unpack("<Q", f.read(8))
                    header = json.loads(f.read(n))
            except Exception as exc:
                raise CheckpointError(f"{path}: cannot read safetensors: {exc}") from None
            header.pop("__metadata__", None)
            if any(h["dtype"] not in DTYPES for h in header.values()):
                return None
            check_shard(path, header, names, src.header)
            src.header.update(header)
            src.at.update(dict.fromkeys(header, (path, 8 + n)))
        return src

    def meta(self) -> dict[str, TensorMeta]:
        """Every tensor's name, dtype and shape, without data (what the export policy plans from)."""
        return {n: TensorMeta(DTYPES[h["dtype"]], tuple(h["shape"])) for n, h in self.header.items()}

    def words(self, name: str, dtype) -> np.ndarray:
        """One tensor's data as a flat array of dtype (of its itemsize: its words as they are)."""
        out = np.empty(math.prod(self.header[name]["shape"]), dtype)
        self._read_into(name, out)
        return out

    def tensor(self, name: str) -> torch.Tensor:
        """One tensor (torch)."""
        h = self.header[name]
        t = torch.empty(h["shape"], dtype=torch_dtype(DTYPES[h["dtype"]]))
        self._read_into(name, t.reshape(-1).view(torch.uint8).numpy())
        return t

    def _read_into(self, name: str, out: np.ndarray) -> None:
        """A tensor's bytes, read from its file into out, memory of its own (no mapping: it goes
        when dropped)."""
        if not out.size:
            return
        h, (path, start) = self.header[name], self.at[name]
        with open(path, "rb") as f:
            f.seek(start + h["data_offsets"][0])
            f.readinto(memoryview(out).cast("B"))


class Quantized(Mapping):
    """The QTensors of a streamed checkpoint: each read and quantized when asked for."""

    def __init__(self, src: SafetensorsFiles, names: dict[str, str], plan: dict) -> None:
        self.src, self.names, self.plan = src, names, plan
        if not all(self._as_words(n) for n in plan):
            import torch  # noqa: F401  (here, before jobs fork: else each would import it again)

    def _as_words(self, name: str) -> bool:
        """Whether a tensor's QTensor is made of its words with numpy (passthrough.float_words):
        a float32, float16 or bfloat16 tensor in a float format, integers kept raw. A checkpoint
        packed so needs no torch, whose import took ~0.9 s of every pack (and ~0.3 s of its exit)."""
        fmt, options, _ = self.plan[name]
        dtype = DTYPES[self.src.header[self.names[name]]["dtype"]]
        if fmt == "raw":
            return not options and dtype not in FLOATS and dtype in ITEMSIZE
        return not options and fmt in FLOAT_FORMATS and dtype in WORD_FLOATS

    def __getitem__(self, name: str):
        fmt, options, _ = self.plan[name]
        if self._as_words(name):
            return self._words(name, fmt)
        return extras.quantize(self.src.tensor(self.names[name]), fmt, options, name)

    def _words(self, name: str, fmt: str) -> QTensor:
        """The QTensor extras.quantize makes of a tensor _as_words takes, made with numpy."""
        h = self.src.header[self.names[name]]
        dtype, shape = DTYPES[h["dtype"]], tuple(h["shape"])
        if fmt == "raw":
            words = self.src.words(self.names[name], np.uint8 if dtype == "bool" else dtype)
            return QTensor(fmt, shape, dtype, words.reshape(1, -1), params={})
        words = self.src.words(self.names[name], WORD_DTYPES[dtype])
        check_finite_words(words, dtype, shape, name)
        words = float_words(words, dtype, FLOAT_FORMATS[fmt][0])
        return QTensor(fmt, shape, dtype, words.reshape(1, -1), params={})

    def numel(self, name: str) -> int:
        """Weights of a tensor, from the header (what --jobs schedules by, before reading it)."""
        return math.prod(self.src.header[self.names[name]]["shape"])

    def __iter__(self):
        return iter(self.plan)

    def __len__(self) -> int:
        return len(self.plan)


def check_finite_words(words: np.ndarray, dtype: str, shape: tuple, name: str) -> None:
    """registry.check_finite of a float tensor read as words: QuantError naming its first NaN or Inf."""
    if not words.size:
        return
    bits = 8 * words.itemsize
    sign, mantissa = 1 << (bits - 1), dict(FLOAT_FORMATS.values())[dtype]
    ones = sign - (1 << mantissa)  # the exponent's bits all set: NaN or Inf from there up, either sign
    # The largest magnitude in two passes with no temporary (as check_values does): the largest
    # pattern of the positives, and of the negatives less the sign.
    if max(int(words.view(f"i{words.itemsize}").max()), int(words.max()) - sign) < ones:
        return
    flat = int(np.flatnonzero(words & (sign - 1) >= ones)[0])
    what = "NaN" if int(words[flat]) & ((1 << mantissa) - 1) else "Inf"
    index = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
    raise QuantError(f"tensor {name} has {what} at index {index}")


def open_streamed(ckpt: str | Path):
    """(files, {plain name: name in the files}, meta state, config, notes) of a checkpoint that
    can be streamed (a .safetensors file, or a folder's model.safetensors or shards of it), else None."""
    from .load import check_checkpoint, checkpoint_files
    from .pack import strip_wrapper_note
    from .policy import strip_wrapper_prefixes

    files = checkpoint_files(ckpt)
    if any(f.suffix != ".safetensors" or not f.is_file() for f in files):
        return None  # (the whole-state path reads it, or says why not)
    src = SafetensorsFiles.open(files)
    if src is None:
        return None
    meta = src.meta()
    original = {id(t): n for n, t in meta.items()}
    state, stripped = strip_wrapper_prefixes(meta)
    config = check_checkpoint(ckpt, files, state)
    return src, {n: original[id(t)] for n, t in state.items()}, state, config, strip_wrapper_note(stripped)


def pack_streamed(streamed, policy: ExportPolicy, metadata: dict, out, *, check, jobs: int = 1):
    """Write the artifact of a streamed checkpoint to out, a binary file opened for reading and
    writing, from its position (see the module); (a read-only map of the artifact, check(map) of
    it: pack's self-check). Every byte is written once, in place: the payload past the header's
    room, then the manifest after it, then the header (both known last: they hold the payload's
    length and hash). (Format 2 put the manifest first: its payload, written past the room the
    largest manifest could take, was then moved back, 2.1-4.2 s for a 1.1B-weight bf16 model.)"""
    from ..budget.api import pack_qtensors
    from ..budget.spec import HEADER_SIZE
    from .pack import export_metadata

    src, names, state, _, _ = streamed
    plan = policy.plan(state)
    meta = {**metadata, "export": export_metadata(policy, plan)}
    start = out.tell()
    out.seek(start + HEADER_SIZE)
    behind = WriteBehind(out)
    try:
        head = pack_qtensors(Quantized(src, names, plan), meta, jobs=jobs, payload=behind)
    finally:  # (its writer thread done, an error or not, before the file closes)
        behind.flush()
    out.write(head[HEADER_SIZE:])  # the manifest, after the payload
    out.flush()
    size = out.tell()  # (before write_at: without pwrite, it seeks)
    write_at(out, start, head[:HEADER_SIZE])
    data = mmap.mmap(out.fileno(), size, access=mmap.ACCESS_READ)
    return data, check(data)


def streams(policy: ExportPolicy) -> bool:
    """Whether a policy decides each tensor alone (no step that needs them all)."""
    return type(policy).finish is ExportPolicy.finish
