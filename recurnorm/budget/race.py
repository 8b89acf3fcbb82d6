"""The codec race: which encodings of a stream are tried, in what order, and which are skipped.

Codecs (codecs.py) only encode, decode and size. This module runs them on each stream in RACE's
order and keeps the smallest (raw first); the probes, the encoder's scratch and every shortcut
live here (each gated by the pack's options.Gates).
"""

from __future__ import annotations

import threading
from functools import cached_property

import numpy as np
import zstandard

from . import codecs, compress, rans, spec
from .codecs import StreamContext, get
from .spec import PORTABLE_CODECS

QUICK_MIN = 1 << 15  # below this many bytes a full deflate-9 costs under a millisecond: no probe
REPEATS = 0.97  # a zstd-1 pass under this share of a bound has found repetition
PROBE = 1 << 16  # bytes per zstd-1 probe slice (three on streams over 4 slices)
SAMPLE_ROWS = 64  # rows per block of parents_pay's sample (every 8th)
_local = threading.local()


def _zstd1() -> zstandard.ZstdCompressor:
    """A zstd-1 compressor, one per thread (making one costs more than probing 16 KB)."""
    if not hasattr(_local, "zstd1"):
        _local.zstd1 = zstandard.ZstdCompressor(level=1)
    return _local.zstd1


class LaidOut:
    """One layout's bytes of a stream, and what the gates learn of them (each once)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    @cached_property
    def order0(self) -> float:
        """The order-0 bound of the bytes, in bytes."""
        return rans.order0_bits(np.frombuffer(self.raw, np.uint8)) / 8

    @cached_property
    def zstd1(self) -> float:
        """The bytes' size under zstd-1: of all of a small stream; of a big one, three evenly
        spread slices' size times the order-0 bound of the whole over theirs (a stream's
        entropy drifts: a vocabulary's first rows may be unused tokens, alike)."""
        n, z = len(self.raw), _zstd1()
        if n <= 4 * PROBE:
            return len(z.compress(self.raw))
        some = [self.raw[i : i + PROBE] for i in (0, (n - PROBE) // 2, n - PROBE)]
        return sum(len(z.compress(b)) for b in some) * self.order0 / LaidOut(b"".join(some)).order0


class Stream:
    """One stream in the race and the encoder's scratch: its laid-out bytes, deflate's sizes
    for lzma. Dropped after its race."""

    def __init__(self, arr: np.ndarray, ctx: StreamContext, names=PORTABLE_CODECS) -> None:
        self.arr, self.ctx, self.names, self.gates = arr, ctx, names, ctx.options.gates  # (the pack's shortcuts)
        self.laid: dict[str, LaidOut] = {}
        self.deflate: list[tuple[int, dict]] | None = None

    def on(self, gate: str) -> bool:
        return getattr(self.gates, gate) is not None

    def laid_out(self, layout: str) -> LaidOut:
        if layout not in self.laid:
            self.laid[layout] = LaidOut(codecs.layout_bytes(self.arr, self.ctx.dtype, layout))
        return self.laid[layout]

    def lzma_parents(self) -> bool:
        """A parents stream over QUICK_MIN bytes, where lzma races."""
        ctx = self.ctx
        return self.on("parents_lzma") and "lzma" in self.names and ctx.kind == "parents" and ctx.nbytes > QUICK_MIN

    def norep_codes(self, laid: LaidOut, best: int) -> bool:
        """Quantized codes (they have scales) in which zstd-1 finds no repetition that takes it
        under their order-0 bound and the best so far (rows predicted exactly leave zero rows)."""
        big = self.ctx.scales is not None and len(laid.raw) >= self.gates.codes_norep
        return big and laid.zstd1 >= REPEATS * min(laid.order0, best)


def parents_pay(plain: np.ndarray, res: np.ndarray, parents: np.ndarray, scales, options) -> bool | None:
    """Whether a tensor's residuals [rows, cols] and their parents code smaller than its codes as
    they are, by rans on a sample of rows; None where the full race must tell (options: the pack's)."""
    rows, margin, scales = len(plain), options.gates.parents_sample, None if scales is None else np.asarray(scales)
    if margin is None or rows < 8 * SAMPLE_ROWS or (scales is not None and scales.size % rows):
        return None
    some = np.arange(rows) // SAMPLE_ROWS % 8 == 0
    shape = (int(some.sum()), plain.shape[1])
    sampled = None if scales is None else np.ascontiguousarray(scales.reshape(rows, -1)[some]).reshape(-1)
    ctx = StreamContext("codes", "int8", shape, shape, sampled, options)
    size = [len(encode_best(np.ascontiguousarray(m[some]), ctx, ("rans",))[2]) for m in (plain, res)]
    size[1] += np.count_nonzero(parents[some, 0]) * 19 / 8  # (what a parent costs, about)
    return None if abs(size[0] - size[1]) < margin * size[0] else size[1] < size[0]


def encode_all(items: list[tuple[np.ndarray, StreamContext]], names=None) -> list[tuple[str, dict, bytes]]:
    """The race on every (array, context): rans and fields plan all streams in one search first."""
    names = tuple(names or PORTABLE_CODECS)
    for name in names:
        get(name)  # (an unknown name fails before any work)
    codes = [i for i, (_, ctx) in enumerate(items) if ctx.kind == "codes"]
    plans: list[dict] = [{} for _ in items]
    for name, picked in (("rans", codes), ("fields", range(len(items)))):
        if name in names:
            for i, plan in zip(picked, get(name).prepare([items[i] for i in picked]), strict=True):
                plans[i][name] = plan
    out = []
    for i, (arr, ctx) in enumerate(items):
        out.append(encode_best(arr, ctx, names, plans[i]))
        plans[i] = {}  # (a copy of its symbols: a model's streams are not all held to the end)
    return out


def encode_best(arr: np.ndarray, ctx: StreamContext, names=None, plans=None) -> tuple[str, dict, bytes]:
    """The smallest encoding of one stream among the codecs named: (codec name, params, bytes)."""
    names = names or PORTABLE_CODECS
    s, plans = Stream(arr, ctx, names), plans or {}
    best = ("raw", {}, s.laid_out("plain").raw)  # (the bytes deflate, lzma and zstd read: no second copy)
    for name in (n for n in RACE if n in names):
        for data, params in RACE[name](s, len(best[2]), plans.get(name, False)):  # (False: not planned)
            if len(data) < len(best[2]):
                best = (name, params, data)
    return best


def _rans(s: Stream, best: int, plan) -> list[tuple[bytes, dict]]:
    plans = get("rans").prepare([(s.arr, s.ctx)])[0] if plan is False else plan  # (not planned: alone)
    return [get("rans").encode(s.arr, s.ctx, p) for p in plans or []]


def _fields(s: Stream, best: int, plan) -> list[tuple[bytes, dict]]:
    plan = plan or get("fields").prepare([(s.arr, s.ctx)])[0]
    if plan is None:
        return []
    tail = plan[1]  # (the low mantissa bits and the signs, as bytes)
    level = 9 if len(tail) < QUICK_MIN else 1
    if len(tail) >= QUICK_MIN and s.on("fields_tail"):
        chunks = [tail[i : i + compress.CHUNK] for i in range(0, len(tail), compress.CHUNK)]
        level = [int(len(_zstd1().compress(c)) < s.gates.fields_tail * len(c)) for c in chunks]
    return [get("fields").encode(s.arr, s.ctx, plan, tail_level=level)]


def _float_probe(s: Stream) -> float:
    """About the deflate-1 size of float words byte-grouped, from 16 slices of a big stream."""
    w, k = np.ascontiguousarray(s.arr).reshape(-1), s.gates.float_probe // s.arr.itemsize
    some = w if w.size <= 32 * k else np.concatenate([w[i : i + k] for i in np.linspace(0, w.size - k, 16).astype(int)])
    return len(_zstd1().compress(codecs.shuffled(some, s.ctx.dtype))) * w.size / some.size


def _deflate(s: Stream, best: int, plan=None) -> list[tuple[bytes, dict]]:
    """Level 9 on each layout, where worth racing; the sizes are kept for lzma, which runs next."""
    s.deflate = []
    if s.lzma_parents():
        return []
    if s.on("float_probe") and s.ctx.mant and s.ctx.nbytes > QUICK_MIN and _float_probe(s) > best:
        return []
    out = []
    for layout in codecs.layouts_for(s.ctx.dtype):
        laid = s.laid_out(layout)
        if not (s.on("codes_norep") and s.norep_codes(laid, best)):
            out.append((compress.deflate(laid.raw), {"layout": layout}))
            s.deflate.append((len(out[-1][0]), out[-1][1]))
    return out


def _lzma(s: Stream, best: int, plan=None) -> list[tuple[bytes, dict]]:
    if s.lzma_parents():
        return [(compress.compress(spec.LZMA, s.laid_out("shuffle").raw), {"layout": "shuffle"})]
    if not s.on("lzma_race"):  # every layout
        layouts = codecs.layouts_for(s.ctx.dtype)
        return [(compress.compress(spec.LZMA, s.laid_out(lay).raw), {"layout": lay}) for lay in layouts]
    if s.deflate is None:  # deflate was not in the race: its sizes are needed all the same
        _deflate(s, best)
    if not s.deflate:  # deflate skipped these bytes (floats the probe judged, codes without repetition)
        return []
    size, params = min(s.deflate, key=lambda c: c[0])
    laid = s.laid_out(params["layout"])
    if size > best * (1.0 if len(laid.raw) > 1 << 18 else s.gates.lzma_race):
        return []
    return [(compress.compress(spec.LZMA, laid.raw), params)]


def _zstd(s: Stream, best: int, plan=None) -> list[tuple[bytes, dict]]:
    layouts = codecs.layouts_for(s.ctx.dtype)
    quick = [(zstandard.ZstdCompressor(level=3).compress(s.laid_out(lay).raw), lay) for lay in layouts]
    slow = layouts
    if s.on("zstd_slow_race"):
        data, lay = min(quick, key=lambda q: len(q[0]))  # first layout on ties
        slow = [lay] if len(data) <= best * s.gates.zstd_slow_race else []
    slow = [(compress.compress(spec.ZSTD, s.laid_out(lay).raw), lay) for lay in slow]
    return [(data, {"layout": lay}) for data, lay in quick + slow]


# The order of the race (after raw); lzma reuses deflate's sizes.
RACE = {"rans": _rans, "fields": _fields, "deflate": _deflate, "lzma": _lzma, "zstd": _zstd}
