"""The codec race: which encodings of a stream are tried, in what order, and which are skipped.

Codecs (codecs.py) only encode, decode and size. This module alone runs them on each stream, in
RACE's order, and keeps the smallest (raw first: the fallback that always works); the quick
probes, the encoder's scratch (LaidOut) and every shortcut (GATES) live here. Effort "max" takes
none.
"""

from __future__ import annotations

import threading
from functools import cached_property

import numpy as np
import zstandard

from . import codecs, compress, rans, search
from .codecs import LAYOUTS, StreamContext, get

# Portable: what the standard library and numpy decode (the standalone loader reads these).
DEFAULT_CODECS = ("rans", "fields", "deflate", "lzma", "raw")

QUICK_MIN = 1 << 15  # below this many bytes a full deflate-9 costs under a millisecond: no probe
REPEATS = 0.97  # a zstd-1 pass under this share of the order-0 bound has found repetition
PROBE = 1 << 16  # bytes per probe slice (three on streams over 4 slices)
# Below this many bytes a zstd-1 pass misjudges repetition (its frame costs ~10 bytes, more than
# a constant stream's matches do under deflate): deflate races level 9 and literals both.
LITERALS_MIN = 1 << 12
# Every shortcut of the race, with the measurement that justifies it. A row set to None is off:
# that path then runs as the full race (effort "max") runs it.
GATES: dict[str, float | None] = {
    # Codes that pack: only the packed layout (trained int4/ternary: plain 7-36% larger at zstd-3).
    "packed_only": 1,
    # Float words: no deflate/lzma where deflate-1 of 16 byte-grouped slices (4 KiB each) is over
    # the best. all-MiniLM-L6-v2: 1.21-1.23x fields in bf16, 1.09-1.27x in fp32, while deflate-9
    # lands at 1.06-1.09x and 1.03-1.05x; racing them was most of a float model's packing time.
    "float_probe": 1 << 12,
    # Several layouts over QUICK_MIN (float words): the slow run on the one deflate-1 favours.
    "layout_probe": 1,
    # deflate-9 and lzma-9e land at >= this share of the order-0 bound where zstd-1 finds no
    # repetition (int8/int4/ternary codes and fp16 scales of every benchmark case: 0.985-1.03).
    "norep_floor": 0.985,
    # Streams over 4 probe slices: no deflate-9 where deflate-1 slices land this far over the best
    # (they run a few % above deflate-9 on codes).
    "deflate_probe": 1.1,
    # Codes with repetition of 4-32 KiB: no deflate-9 where zstd-1 x this is over the best
    # (deflate-9 at 0.94-1.10 of zstd-1 on the benchmark codes streams it ran on).
    "zstd1_floor": 0.75,
    # Codes from LITERALS_MIN bytes on: Huffman literals where zstd-1 finds no repetition (level
    # 9's matches there cost 0.2-7% more), level 9 where it does.
    "literals_only": 1,
    # No rans encode where deflate's literals beat its estimate with side data at this share
    # (side data packs to 0.79-1.0 of the estimate on every benchmark side blob).
    "rans_vs_literals": 0.75,
    # lzma only on deflate's best layout, within 2% of the best (over 256 KiB: deflate leads; on
    # big codes lzma lands 0.2-0.5% above deflate: MiniLM int8/int4, Gaussian 4M int8/ternary).
    "lzma_race": 1.02,
    # Codes without repetition: no lzma where deflate leads or trails the best by under 0.5% (rans
    # led both by 4%+ where lzma beat deflate; racing lzma was a third of packing MiniLM int8).
    "lzma_norep": 0.995,
    # ... nor where the previous byte's top 3 bits (lzma's lc=3) say under 0.5% about the next
    # (its literals then land 1-2% above order-0 on int8 codes: above deflate's).
    "lzma_context": 0.995,
    # No zstd where zstd-3 of three slices extrapolates 10% over the best.
    "zstd_probe": 1.1,
    # zstd-19 (~0.25 us a byte) on the best zstd-3 layout only, within 2% of the best, and only
    # where zstd-3 found repetition or the layout is not dense (order-0 under 0.75 of its bytes).
    "zstd_slow_race": 1.02,
    "zstd_dense": 0.75,
    # Fields' tail (low mantissa bits, signs) over QUICK_MIN: deflate-1 where zstd-1 finds
    # repetition, else stored (MiniLM fp32 embedding: level 1 is 0.03% over 9, in 60% of the time).
    "fields_tail": 1,
}
NO_RACE = 1 << 62  # a best with nothing to beat
_local = threading.local()


def _zstd1() -> zstandard.ZstdCompressor:
    """A zstd-1 compressor, one per thread (making one costs more than probing 16 KB)."""
    if not hasattr(_local, "zstd1"):
        _local.zstd1 = zstandard.ZstdCompressor(level=1)
    return _local.zstd1


def _deflate1(raw: bytes) -> bytes:
    return compress.deflate(raw, 1)


def _zstd3(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(raw)


def probe(raw: bytes, quick) -> float:
    """Size of raw under a quick compressor: all of a small stream; a big one's extrapolated
    from three evenly spread slices."""
    n = len(raw)
    if n <= 4 * PROBE:
        return len(quick(raw))
    starts = (0, (n - PROBE) // 2, n - PROBE)
    return sum(len(quick(raw[s : s + PROBE])) for s in starts) * n / (3 * PROBE)


class LaidOut:
    """One layout's bytes of a stream, and what the quick gates learn of them (each once:
    deflate, lzma and zstd ask the same questions of the same bytes)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    @cached_property
    def counts(self) -> np.ndarray:
        return np.bincount(np.frombuffer(self.raw, dtype=np.uint8), minlength=256)

    @cached_property
    def order0(self) -> float:
        """The order-0 bound of the bytes, in bytes."""
        return rans.entropy_bits(self.counts) / 8

    @cached_property
    def zstd1(self) -> float:
        return probe(self.raw, _zstd1().compress)

    @cached_property
    def repeats(self) -> bool:
        """Whether a zstd-1 pass finds repetition."""
        return self.zstd1 < REPEATS * self.order0

    @cached_property
    def literals_size(self) -> int:
        return compress.deflate_literals_size(self.counts)

    @cached_property
    def literals(self) -> bytes:
        return compress.deflate_literals(self.raw, self.counts)

    @cached_property
    def literal_context(self) -> float:
        """The entropy of each byte given the top 3 bits of the one before (lzma's literal
        context at its default lc=3), in bytes."""
        b = np.frombuffer(self.raw, dtype=np.uint8)
        return sum(rans.entropy_bits(row) for row in rans.context_counts(b[1:], b[:-1] >> 5, 8, 256)) / 8


class Stream:
    """One stream in the race: its array and context, the codecs racing, and the encoder's
    scratch (laid-out bytes, deflate's sizes for lzma); dropped after its race."""

    def __init__(self, arr: np.ndarray, ctx: StreamContext, names=DEFAULT_CODECS) -> None:
        self.arr, self.ctx, self.names = arr, ctx, tuple(names)
        self.laid: dict[tuple[str, int], LaidOut] = {}
        self.deflate: list[tuple[int, dict]] | None = None

    def on(self, gate: str) -> bool:
        return self.ctx.effort != "max" and GATES[gate] is not None

    def laid_out(self, layout: str, offset: int) -> LaidOut:
        if (layout, offset) not in self.laid:
            self.laid[layout, offset] = LaidOut(codecs.layout_bytes(self.arr, self.ctx.dtype, layout, offset))
        return self.laid[layout, offset]

    def layouts(self) -> list[tuple[str, int]]:
        layouts = codecs.layouts_for(self.arr, self.ctx.dtype)
        if self.on("packed_only") and LAYOUTS[layouts[-1][0]].capacity:
            layouts = layouts[-1:]
        return layouts

    def races_literals(self, laid: LaidOut) -> bool:
        """Whether deflate races these bytes' Huffman literals: quantized codes (they have
        scales), where zstd-1 finds no repetition or literals_only is off for them."""
        return self.ctx.scales is not None and (
            not self.on("literals_only") or len(laid.raw) < LITERALS_MIN or not laid.repeats
        )


def encode_all(items: list[tuple[np.ndarray, StreamContext]], names=None) -> list[tuple[str, dict, bytes]]:
    """The race on every (array, context): rans and fields plan all streams in one search first."""
    names = tuple(names or DEFAULT_CODECS)
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
    s, plans = Stream(arr, ctx, names or DEFAULT_CODECS), plans or {}
    best = ("raw", {}, codecs.to_le_bytes(arr, ctx.dtype))
    for name in (n for n in RACE if n in s.names):
        for data, params in RACE[name](s, len(best[2]), plans.get(name)):
            if len(data) < len(best[2]):
                best = (name, params, data)
    return best


def _rans(s: Stream, best: int, plan) -> list[tuple[bytes, dict]]:
    codec = get("rans")
    if plan is None:  # (not a codes stream: planned alone)
        plan = codec.prepare([(s.arr, s.ctx)])[0]
    if plan is None or (s.on("rans_vs_literals") and _rans_loses_to_literals(s, plan[2])):
        return []
    return [codec.encode(s.arr, s.ctx, plan)]


def _rans_loses_to_literals(s: Stream, c: search.Choice) -> bool:
    """Whether deflate, racing next, beats this rans plan with Huffman literals even were its
    side data GATES["rans_vs_literals"] of the estimate and its header and flush free: small
    streams of wide alphabets without repetition (16K int8 codes)."""
    if c.side is None or "deflate" not in s.names:
        return False
    laid = s.laid_out(*s.layouts()[-1])
    floor = c.cost - search.HEADER_BYTES - 4 * c.lanes - (1 - GATES["rans_vs_literals"]) * c.side.nbytes
    return floor > laid.order0 and s.races_literals(laid) and floor > laid.literals_size


def _fields(s: Stream, best: int, plan) -> list[tuple[bytes, dict]]:
    codec = get("fields")
    if plan is None:
        plan = codec.prepare([(s.arr, s.ctx)])[0]
    if plan is None:
        return []
    tail = plan[1]
    level = 9 if len(tail) < QUICK_MIN else 1
    if len(tail) >= QUICK_MIN and s.on("fields_tail") and not LaidOut(tail).zstd1 < REPEATS * len(tail):
        level = 0
    return [codec.encode(s.arr, s.ctx, plan, tail_level=level)]


def _float_probe(s: Stream) -> float:
    """deflate-1 size of float words byte-grouped, from 16 slices of a big stream."""
    w = np.ascontiguousarray(s.arr).reshape(-1)
    k = GATES["float_probe"] // w.itemsize
    parts = [w] if w.size <= 32 * k else [w[i : i + k] for i in np.linspace(0, w.size - k, 16).astype(int)]
    got = sum(len(_deflate1(LAYOUTS["shuffle"].pack(p, s.ctx.dtype, 0))) for p in parts)
    return got * w.size / sum(p.size for p in parts)


def _deflate(s: Stream, best: int, plan=None) -> list[tuple[bytes, dict]]:
    """deflate's candidates; their sizes (also of those not made, as they cannot win) are kept
    for lzma, which runs next on the same layouts."""
    s.deflate = []
    if s.on("float_probe") and s.ctx.mant and s.ctx.nbytes > QUICK_MIN and _float_probe(s) > best:
        return []
    tries = [(layout, offset, s.laid_out(layout, offset)) for layout, offset in s.layouts()]
    big = [i for i, (_, _, laid) in enumerate(tries) if len(laid.raw) > QUICK_MIN]
    quick = {}
    if s.on("layout_probe") and len(big) > 1:
        quick = {tries[i][0]: probe(tries[i][2].raw, _deflate1) for i in big}
        keep = min(big, key=lambda i: quick[tries[i][0]])
        tries = [t for i, t in enumerate(tries) if i == keep or i not in big]
    out = []
    for layout, offset, laid in tries:
        params = {"layout": layout, "offset": offset}
        for size, data in _deflate_tries(s, laid, best, quick.get(layout)):
            s.deflate.append((size, params))
            out += [(data, params)] if data is not None else []
    return out


def _deflate_tries(s: Stream, laid: LaidOut, best: int, quick: float | None) -> list[tuple[int, bytes | None]]:
    """(size, bytes) of level 9 and of Huffman literals where worth racing; literals whose exact
    size cannot beat best come without their bytes."""
    n = len(laid.raw)
    if s.races_literals(laid):
        literals = (laid.literals_size, laid.literals if laid.literals_size < best else None)
        if not s.on("literals_only") or n < LITERALS_MIN:
            matched = compress.deflate(laid.raw)
            return [(len(matched), matched), literals]
        return [] if laid.order0 >= best else [literals]  # (literals land above the order-0 bound)
    if n > QUICK_MIN and _deflate_loses(s, laid, best, quick):
        return []
    if s.on("zstd1_floor") and s.ctx.scales is not None and LITERALS_MIN <= n <= QUICK_MIN:
        if laid.zstd1 * GATES["zstd1_floor"] >= best:
            return []
    data = compress.deflate(laid.raw)
    return [(len(data), data)]


def _deflate_loses(s: Stream, laid: LaidOut, best: int, quick: float | None) -> bool:
    """Whether quick passes say deflate-9 cannot win: zstd-1 finds no repetition (only LZ
    matches take a compressor under the order-0 floor) and that floor is no better than best;
    or, over 4 probe slices, deflate-1 slices land clearly above best or find no repetition
    where the order-0 bound already loses."""
    big = len(laid.raw) > 4 * PROBE
    if s.on("norep_floor") and laid.order0 * (1.0 if big else GATES["norep_floor"]) >= best and not laid.repeats:
        return True
    if not big or not s.on("deflate_probe"):
        return False
    quick = probe(laid.raw, _deflate1) if quick is None else quick
    return quick > best * GATES["deflate_probe"] or (quick >= REPEATS * laid.order0 and laid.order0 >= best)


def _lzma(s: Stream, best: int, plan=None) -> list[tuple[bytes, dict]]:
    if not s.on("lzma_race"):  # every layout
        tries = [(s.laid_out(*lo), {"layout": lo[0], "offset": lo[1]}) for lo in s.layouts()]
        return [(compress.compress(compress.LZMA, laid.raw), params) for laid, params in tries]
    raced = s.deflate is not None  # (deflate's candidates are then in the race)
    if not raced:  # deflate was not in the race: its sizes are needed all the same
        _deflate(s, best)
    if not s.deflate:  # deflate's probe already lost clearly: lzma lands near it on such bytes
        return []
    size, params = min(s.deflate, key=lambda c: c[0])
    laid = s.laid_out(params["layout"], params["offset"])
    if len(laid.raw) < compress.LZMA_MIN_BYTES:
        return []
    if size > best * (1.0 if len(laid.raw) > 1 << 18 else GATES["lzma_race"]):
        return []
    # Quantized codes (they have scales) with no repetition for lzma to find. Not float words:
    # there lzma finds 2-9% under deflate (bf16 and fp32 passthrough tensors), repetition or not.
    if s.ctx.scales is not None and size >= REPEATS * laid.order0:
        if s.on("lzma_norep") and ((raced and size <= best) or size * GATES["lzma_norep"] >= best):
            return []
        if s.on("lzma_context") and laid.literal_context >= GATES["lzma_context"] * laid.order0:
            return []
    return [(compress.compress(compress.LZMA, laid.raw), params)]


def _zstd(s: Stream, best: int, plan=None) -> list[tuple[bytes, dict]]:
    quick = []
    for layout, offset in s.layouts():
        laid = s.laid_out(layout, offset)
        if s.on("zstd_probe") and len(laid.raw) > 4 * PROBE and probe(laid.raw, _zstd3) > best * GATES["zstd_probe"]:
            continue  # a slice at the fast level already loses clearly: skip the full runs
        quick.append((_zstd3(laid.raw), {"layout": layout, "offset": offset}, laid))
    out = [(data, params) for data, params, _ in quick]
    slow = quick
    if s.on("zstd_slow_race") and quick:
        data, params, laid = min(quick, key=lambda q: len(q[0]))  # first layout on ties
        slow = [] if len(data) > best * GATES["zstd_slow_race"] else [(data, params, laid)]
        if s.on("zstd_dense") and len(data) >= REPEATS * laid.order0:
            slow = [q for q in slow if laid.order0 < GATES["zstd_dense"] * len(laid.raw)]
    return out + [(compress.compress(compress.ZSTD, laid.raw), params) for _, params, laid in slow]


# The order of the race (after raw): rans's plan may step aside for deflate's literals, and lzma
# reuses deflate's sizes.
RACE = {"rans": _rans, "fields": _fields, "deflate": _deflate, "lzma": _lzma, "zstd": _zstd}
