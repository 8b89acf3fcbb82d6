"""Stream codecs: one small registered class each; the packer keeps the smallest.

A codec turns one ndarray (a QTensor's codes, scales or zeros) into bytes plus
JSON params, and back. `StreamContext` carries what both sides know for free:
the stream's dtype and shape, the tensor's shape, and (for codes) the decoded
scales, which the rans scale-bucket context uses as side information.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import zstandard

from ..errors import ArtifactError
from ..quant.grid import rows_layout
from ..registry import Registry
from . import compress, rans, search

# numpy dtypes a stream may hold; all are stored little-endian.
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "float32",
        "float64",
    )
}
ZSTD_LEVEL = compress.ZSTD_LEVEL
ZSTD_QUICK_LEVEL = 3
# The slow level (~0.25 us a byte on small-alphabet layouts) runs on the best quick
# layout only, and only where zstd is in the race: its quick size within 2% of the best
# so far. A dense byte layout (8-bit codes) where the quick level found no repetition
# (it sits at its bytes' order-0 bound) gains nothing from it either (measured).
ZSTD_SLOW_RACE = 1.02
ZSTD_REPEATS = 0.97  # quick size under this share of the order-0 bound: repetition found
ZSTD_DENSE = 0.75  # order-0 bound over this share of the bytes: a dense layout
ZSTD_PROBE = 1 << 16  # bytes per probe slice
ZSTD_PROBE_MARGIN = 1.1  # skip zstd when the probe extrapolates 10% above the best so far


def _probe(raw: bytes, quick) -> float:
    """Size of raw under a quick compressor: all of a small stream; a big one's extrapolated
    from three evenly spread slices."""
    n = len(raw)
    if n <= 4 * ZSTD_PROBE:
        return len(quick(raw))
    starts = (0, (n - ZSTD_PROBE) // 2, n - ZSTD_PROBE)
    got = sum(len(quick(raw[s : s + ZSTD_PROBE])) for s in starts)
    return got * n / (3 * ZSTD_PROBE)


class LaidOut:
    """One layout's bytes of a stream, and what the quick gates learn of them (each once:
    deflate, lzma and zstd ask the same questions of the same bytes)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    @cached_property
    def counts(self) -> np.ndarray:
        """How often each byte value occurs."""
        return np.bincount(np.frombuffer(self.raw, dtype=np.uint8), minlength=256)

    @cached_property
    def order0(self) -> float:
        """The order-0 bound of the bytes, in bytes."""
        return rans.entropy_bits(self.counts) / 8

    @cached_property
    def zstd1(self) -> float:
        """The bytes' size under zstd-1 (extrapolated from slices on big streams)."""
        return _probe(self.raw, _zstd1().compress)

    @cached_property
    def repeats(self) -> bool:
        """Whether a zstd-1 pass finds repetition (it lands under ZSTD_REPEATS x order-0)."""
        return self.zstd1 < ZSTD_REPEATS * self.order0

    @cached_property
    def literals_size(self) -> int:
        """Bytes of `literals`, exactly, from the counts alone."""
        return compress.deflate_literals_size(self.counts)

    @cached_property
    def literals(self) -> bytes:
        """The bytes deflated as Huffman-coded literals alone (compress.deflate_literals)."""
        return compress.deflate_literals(self.raw, self.counts)

    @cached_property
    def literal_context(self) -> float:
        """The entropy of each byte given the top 3 bits of the one before (lzma's literal
        context at its default lc=3), in bytes."""
        b = np.frombuffer(self.raw, dtype=np.uint8)
        pairs = rans.context_counts(b[1:], b[:-1] >> 5, 8, 256)
        return sum(rans.entropy_bits(row) for row in pairs) / 8


def _deflate1(raw: bytes) -> bytes:
    return compress.deflate(raw, 1)


FLOAT_PROBE = 1 << 12  # bytes per slice (16 slices, evenly spread)


def _float_probe(arr: np.ndarray, ctx: StreamContext) -> float:
    """deflate-1 size of float words byte-grouped, from 16 slices of a big stream. On
    all-MiniLM-L6-v2's 65K+ tensors: 1.21-1.23x the fields bytes in bf16, 1.09-1.27x in fp32,
    where deflate-9 of all the shuffled words lands at 1.06-1.09x and 1.03-1.05x; racing
    deflate and lzma on them was most of a float model's packing time."""
    w = np.ascontiguousarray(arr).reshape(-1)
    k = FLOAT_PROBE // w.itemsize
    parts = [w] if w.size <= 32 * k else [w[s : s + k] for s in np.linspace(0, w.size - k, 16).astype(int)]
    got = sum(len(_deflate1(Shuffle().pack(p, ctx.dtype, 0))) for p in parts)
    return got * w.size / sum(p.size for p in parts)


_local = threading.local()


def _zstd1() -> zstandard.ZstdCompressor:
    """A zstd-1 compressor, one per thread (making one costs more than probing 16 KB)."""
    if not hasattr(_local, "zstd1"):
        _local.zstd1 = zstandard.ZstdCompressor(level=1)
    return _local.zstd1


def _zstd_probe(raw: bytes) -> float:
    """zstd-3 size of raw extrapolated from three slices."""
    return _probe(raw, zstandard.ZstdCompressor(level=3).compress)


DEFLATE_PROBE_MARGIN = 1.1  # deflate-1 slices run a few % above deflate-9 on codes
# deflate-9 and lzma-9e land at >= this share of the bytes' order-0 bound where they find no
# repetition (measured on int8/int4/ternary codes and fp16 scales of every benchmark case:
# 0.985-1.03); below it only LZ matches take them.
NOREP_FLOOR = 0.985
# Below this many bytes deflate races both ways (level 9 and literals alone, each in tens of
# microseconds): a zstd-1 pass misjudges repetition there (its frame costs ~10 bytes, more
# than a constant stream's matches do under deflate).
LITERALS_PROBE_MIN = 1 << 12
QUICK_MIN = 1 << 15  # below this many bytes a full deflate-9 costs under a millisecond: no probe
# ... but quantized codes with repetition, whose zstd-1 pass (made for the literals' gate) lands
# far above the best so far, are not deflated: deflate-9 landed at 0.94-1.10 of zstd-1 on the
# three codes streams of benchmarks/pack.py's cases it ran on (the tiny models' int4 and ternary
# embeddings, where rans leads by 25-30% and deflate-9 cost 0.2-0.3 ms, and MiniLM's ternary one).
ZSTD1_FLOOR = 0.75
# On codes where deflate found no repetition, lzma lands within 0.5% of deflate or above
# it, except where deflate's Huffman codes a skewed alphabet badly (int4 nibbles,
# heavy-tailed int8: lzma 1-5% under deflate) or lzma's rep-matches find 2-D structure
# (a position embedding's int4 codes: 2.7% under), and there rans led both by 4% or more
# (measured: every codes stream of benchmarks/pack.py's cases). lzma on codes never won
# there, yet racing it was a third of packing all-MiniLM-L6-v2 int8.
LZMA_NOREP_GAIN = 0.995
# ... and where the previous byte's top 3 bits (lzma's literal context) say no more than 0.5%
# about the next byte, its adaptive literals land 1-2% above the order-0 bound on int8
# codes (measured: trained int8 MLP codes, Gaussian and golf-shaped int8), above deflate's.
LZMA_CONTEXT_GAIN = 0.995
NO_RACE = 1 << 62  # best= of a codec's own encode(): nothing to beat, so no gate skips it


@dataclass
class StreamContext:
    """What encoder and decoder both know about a stream before its bytes."""

    kind: str  # "codes" | "scales" | "zeros"
    dtype: str
    shape: tuple[int, ...]
    tensor_shape: tuple[int, ...] = ()
    scales: np.ndarray | None = None
    effort: str = "normal"  # encoder only: how hard codecs search ("normal" or "max")
    version: int = 2  # decoder only: the artifact's format version
    plans: dict[str, Any] = field(default_factory=dict)  # encoder only: each codec's prepare() result
    laid: dict[tuple[str, int], LaidOut] = field(default_factory=dict)  # encoder only: see laid_out
    racing: tuple[str, ...] = ()  # encoder only: the codecs encode_best races on this stream
    mant: int = 0  # encoder only: mantissa bits of the float words it holds (0: not floats)

    def laid_out(self, arr: np.ndarray, layout: str, offset: int) -> LaidOut:
        """arr's bytes in one layout, made once for every codec that races on them."""
        if (layout, offset) not in self.laid:
            self.laid[layout, offset] = LaidOut(layout_bytes(arr, self.dtype, layout, offset))
        return self.laid[layout, offset]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype].itemsize


class Codec:
    """Base class: subclasses register themselves by name."""

    name: ClassVar[str]

    def __init_subclass__(cls, name: str | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if name is not None:  # a base class of several codecs registers nothing
            _REGISTRY.register(name, cls)
            cls.name = name

    def prepare(self, items: list[tuple[np.ndarray, StreamContext]]) -> None:
        """Work out, for many streams at once, what candidates() needs (kept in ctx.plans[name])."""

    def candidates(self, arr: np.ndarray, ctx: StreamContext, best: int) -> list[tuple[bytes, dict]]:
        """Encodings worth trying (best = smallest size found so far)."""
        return [self.encode(arr, ctx)]

    def encode(self, arr: np.ndarray, ctx: StreamContext) -> tuple[bytes, dict]:
        """Bytes and params of arr."""
        raise NotImplementedError

    def decode(self, data: bytes, params: dict, ctx: StreamContext) -> np.ndarray:
        """The array of ctx.dtype and ctx.shape stored in data."""
        raise NotImplementedError


_REGISTRY: Registry[Codec] = Registry("codec", ArtifactError)


def available() -> list[str]:
    """Registered codec names."""
    return _REGISTRY.names()


def get(name: str) -> Codec:
    """A codec instance by name; ArtifactError listing the known ones."""
    return _REGISTRY.get(name)


def to_le_bytes(arr: np.ndarray, dtype: str) -> bytes:
    """C-order little-endian bytes of arr in the named dtype."""
    return np.ascontiguousarray(arr, dtype=DTYPES[dtype]).tobytes()


def from_le_bytes(data: bytes, ctx: StreamContext) -> np.ndarray:
    """Array of ctx's dtype/shape from exactly ctx.nbytes bytes."""
    if len(data) != ctx.nbytes:
        raise ArtifactError(f"{ctx.kind} stream holds {len(data)} bytes, expected {ctx.nbytes}")
    arr = np.frombuffer(data, dtype=DTYPES[ctx.dtype]).reshape(ctx.shape)
    return arr.astype(np.dtype(ctx.dtype), copy=True)


def _int_range(arr: np.ndarray) -> tuple[int, int] | None:
    """(min, max) of an integer/bool array, or None for floats or empty arrays."""
    if arr.size == 0 or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
        return None
    return int(arr.min()), int(arr.max())


# ----------------------------------------------------------------- raw


class Raw(Codec, name="raw"):
    """Little-endian bytes as they are."""

    def encode(self, arr, ctx):
        return to_le_bytes(arr, ctx.dtype), {}

    def decode(self, data, params, ctx):
        if params:  # a stray layout would mean one thing here and another to a lenient reader
            raise ArtifactError(f"{ctx.kind} stream: raw takes no params")
        return from_le_bytes(data, ctx)


# ----------------------------------------------------------------- byte layouts


class Layout:
    """One way to lay a stream out as bytes for a whole-stream compressor, with its inverse.

    `capacity` is the alphabet a packed layout holds (symbols = codes - offset in
    [0, capacity)); 0 for the layouts of any value of the dtype (plain, shuffle).
    """

    capacity: ClassVar[int] = 0

    def size(self, n: int, itemsize: int) -> int:
        """Bytes of n values."""
        raise NotImplementedError

    def pack(self, arr: np.ndarray, dtype: str, offset: int) -> bytes:
        raise NotImplementedError

    def unpack(self, raw: bytes, offset: int, ctx: StreamContext) -> np.ndarray:
        """The array of ctx's dtype and shape; raw holds exactly size(ctx.numel) bytes."""
        raise NotImplementedError


class Plain(Layout):
    """Little-endian words as they are."""

    def size(self, n, itemsize):
        return n * itemsize

    def pack(self, arr, dtype, offset):
        return to_le_bytes(arr, dtype)

    def unpack(self, raw, offset, ctx):
        return from_le_bytes(raw, ctx)


class Shuffle(Plain):
    """Byte-grouped words, high bytes first: exponent and sign bytes are the compressible part."""

    def pack(self, arr, dtype, offset):
        size = DTYPES[dtype].itemsize
        return np.frombuffer(to_le_bytes(arr, dtype), dtype=np.uint8).reshape(-1, size)[:, ::-1].T.tobytes()

    def unpack(self, raw, offset, ctx):
        b = np.frombuffer(raw, dtype=np.uint8).reshape(DTYPES[ctx.dtype].itemsize, -1).T[:, ::-1]
        return from_le_bytes(np.ascontiguousarray(b).tobytes(), ctx)


class Packed(Layout):
    """Integer codes as symbols (code - offset) packed tighter than a byte each."""

    def pack(self, arr, dtype, offset):
        # Symbols lie in [0, capacity <= 256): byte arithmetic, which wraps modulo 256, gives
        # them exactly, with no int64 copy of the stream.
        sym = np.asarray(arr).ravel().astype(np.uint8)
        sym -= np.uint8(offset % 256)
        return self.pack_symbols(sym)

    def unpack(self, raw, offset, ctx):
        sym = self.unpack_symbols(raw)
        # The last group's padding symbols are 0 (as written): another value would be a
        # second spelling of the same codes, past the stream's hash.
        if sym[ctx.numel :].any():
            raise ArtifactError(f"{ctx.kind} stream: packed layout padding is not zero")
        return _symbols_to_array(sym[: ctx.numel], offset, ctx)

    def pack_symbols(self, sym: np.ndarray) -> bytes:
        raise NotImplementedError

    def unpack_symbols(self, raw: bytes) -> np.ndarray:
        """Every symbol raw holds, the last group's padding included."""
        raise NotImplementedError


class Trits(Packed):
    """Five base-3 symbols per byte (3^5 = 243 <= 256)."""

    capacity = 3

    def size(self, n, itemsize):
        return -(-n // 5)

    def pack_symbols(self, sym):
        padded = np.zeros(-(-len(sym) // 5) * 5, dtype=np.uint8)
        padded[: len(sym)] = sym
        p = padded.reshape(-1, 5)
        out = p[:, 4] * np.uint8(81)  # at most 242: byte arithmetic holds it
        for j in (3, 2, 1, 0):
            out += p[:, j] * np.uint8(3**j)
        return out.tobytes()

    def unpack_symbols(self, raw):
        b = np.frombuffer(raw, dtype=np.uint8)
        if b.size and b.max() >= 243:
            raise ArtifactError("trit byte out of range")
        return np.stack([(b // d) % 3 for d in (1, 3, 9, 27, 81)], axis=1).ravel()


class Bits(Packed):
    """`per` symbols of `bits` bits each in one little-endian word of per*bits bits."""

    def __init__(self, per: int, bits: int) -> None:
        self.per, self.bits = per, bits
        self.capacity = 1 << bits

    def size(self, n, itemsize):
        return -(-n // self.per) * (self.per * self.bits // 8)

    def pack_symbols(self, sym):
        per, bits = self.per, self.bits
        wide = np.uint8 if per * bits == 8 else np.uint32  # a byte holds nib4's and bits2's words
        padded = np.zeros(-(-len(sym) // per) * per, dtype=wide)
        padded[: len(sym)] = sym
        words = padded[::per].copy()
        for j in range(1, per):
            words |= padded[j::per] << wide(bits * j)
        if wide is np.uint8:
            return words.tobytes()
        return words.astype("<u4").view(np.uint8).reshape(-1, 4)[:, : per * bits // 8].tobytes()

    def unpack_symbols(self, raw):
        per, bits = self.per, self.bits
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, per * bits // 8)
        w = np.zeros((len(b), 4), dtype=np.uint8)
        w[:, : b.shape[1]] = b
        words = w.view("<u4").ravel().astype(np.uint32)
        out = np.empty((len(words), per), dtype=np.uint8)  # symbols < 64
        for j in range(per):
            out[:, j] = (words >> np.uint32(bits * j)) & np.uint32((1 << bits) - 1)
        return out.ravel()


class Byte(Packed):
    """One symbol per byte (codes wider than a byte whose span fits in one)."""

    capacity = 256

    def size(self, n, itemsize):
        return n

    def pack_symbols(self, sym):
        return sym.astype(np.uint8).tobytes()

    def unpack_symbols(self, raw):
        return np.frombuffer(raw, dtype=np.uint8)


# Every layout, by the name the manifest stores; the packed ones tightest first.
LAYOUTS: dict[str, Layout] = {
    "plain": Plain(),
    "shuffle": Shuffle(),
    "trit5": Trits(),
    "bits2": Bits(4, 2),
    "nib4": Bits(2, 4),
    "pack6": Bits(4, 6),
    "byte": Byte(),
}


def layout_bytes(arr: np.ndarray, dtype: str, layout: str, offset: int = 0) -> bytes:
    """The bytes of one layout: plain, shuffle (byte-grouped) or a packed code layout."""
    if layout not in LAYOUTS:
        raise ArtifactError(f"unknown layout {layout!r}")
    return LAYOUTS[layout].pack(arr, dtype, offset)


def layouts_for(arr: np.ndarray, dtype: str) -> list[tuple[str, int]]:
    """(layout, offset) pairs that can hold arr: plain, shuffle, and the tightest packing."""
    out = [("plain", 0)]
    if DTYPES[dtype].itemsize > 1:
        out.append(("shuffle", 0))
    rng = _int_range(arr)
    if rng is not None:
        span = rng[1] - rng[0] + 1
        for name, lay in LAYOUTS.items():
            if not lay.capacity:
                continue
            if name == "byte" and DTYPES[dtype].itemsize == 1:
                break  # same bytes as plain up to a relabelling
            if span <= lay.capacity:
                out.append((name, rng[0]))
                break
    return out


class Compressed(Codec):
    """A general-purpose compressor over the best of a few byte layouts (plain,
    byte-grouped, bit-packed); subclasses name the compressor (compress.py)."""

    compressor: ClassVar[int]  # a compress.py id
    LZMA_RACE = 1.02  # lzma (slow) runs only where deflate came within 2% of the best so far
    # ... and on streams over 256 KiB (lzma-9e: ~0.3 s a MB) only where deflate itself leads:
    # on big integer codes lzma lands 0.2-0.5% above deflate (measured: int8/int4 codes of
    # all-MiniLM-L6-v2, Gaussian 4M int8/ternary), so it cannot beat a rans stream that
    # deflate does not beat, and racing it anyway cost most of the packing time.
    LZMA_RACE_BIG, BIG_RAW = 1.0, 1 << 18

    def candidates(self, arr, ctx, best):
        if ctx.mant and ctx.effort != "max" and ctx.nbytes > QUICK_MIN and _float_probe(arr, ctx) > best:
            ctx.plans[self.name] = []  # float words a quick deflate of shuffled slices finds no better
            return []
        tries = [(layout, offset, ctx.laid_out(arr, layout, offset)) for layout, offset in self._layouts(arr, ctx)]
        quick: dict[str, float] = {}
        if ctx.effort != "max":
            big = [i for i, (_, _, laid) in enumerate(tries) if len(laid.raw) > QUICK_MIN]
            quick = {tries[i][0]: _probe(tries[i][2].raw, _deflate1) for i in big} if len(big) > 1 else {}
            if quick:  # several layouts (floats): the slow run on the one deflate-1 favours only
                keep = min(big, key=lambda i: quick[tries[i][0]])
                tries = [t for i, t in enumerate(tries) if i == keep or i not in big]
        sized = []
        for layout, offset, laid in tries:
            params = {"layout": layout, "offset": offset}
            sized += [(size, data, params) for size, data in self._tries(laid, ctx, best, quick.get(layout))]
        # Sizes kept for the lzma race (it runs next and must not deflate the same bytes again).
        ctx.plans[self.name] = [(size, params) for size, _, params in sized]
        return [(data, params) for _, data, params in sized if data is not None]

    def _tries(
        self, laid: LaidOut, ctx: StreamContext, best: int, quick: float | None
    ) -> list[tuple[int, bytes | None]]:
        """(size, bytes) of the compressed forms of one layout's bytes worth racing: none where
        quick passes say the slow run cannot win. A form whose size is known without making
        it, and cannot beat `best`, comes without its bytes (None)."""
        if ctx.effort != "max" and len(laid.raw) > QUICK_MIN and self._loses(laid, best, quick):
            return []
        if (  # small codes: the zstd-1 pass the literals' gate made says enough
            ctx.effort != "max"
            and ctx.scales is not None
            and LITERALS_PROBE_MIN <= len(laid.raw) <= QUICK_MIN
            and laid.zstd1 * ZSTD1_FLOOR >= best
        ):
            return []
        data = compress.compress(self.compressor, laid.raw)
        return [(len(data), data)]

    @staticmethod
    def _loses(laid: LaidOut, best: int, quick: float | None = None) -> bool:
        """Whether quick passes say the slow run cannot win: a zstd-1 pass finds no
        repetition (only LZ matches take a compressor under its bytes' order-0 floor) and
        that floor is no better than the best so far; or, on big streams, quick deflate
        slices (`quick`, when the caller has them) land clearly above the best so far or
        find no repetition where the order-0 bound already loses.

        zstd-1 is 15-20x quicker than deflate-1 on codes (where deflate-9's lazy matching
        crawls): one pass over a small stream, slices of a big one."""
        order0 = laid.order0
        big = len(laid.raw) > 4 * ZSTD_PROBE
        if order0 * (1.0 if big else NOREP_FLOOR) >= best and not laid.repeats:
            return True
        if not big:
            return False
        if quick is None:
            quick = _probe(laid.raw, _deflate1)
        return quick > best * DEFLATE_PROBE_MARGIN or (quick >= ZSTD_REPEATS * order0 and order0 >= best)

    @staticmethod
    def _layouts(arr, ctx) -> list[tuple[str, int]]:
        layouts = layouts_for(arr, ctx.dtype)
        if ctx.effort != "max" and LAYOUTS[layouts[-1][0]].capacity:
            # Codes that pack: only the packed layout (measured on trained int4/ternary codes:
            # plain is 7-36% larger than packed at zstd's quick level).
            layouts = layouts[-1:]
        return layouts

    def encode(self, arr, ctx):
        return min(self.candidates(arr, ctx, best=NO_RACE), key=lambda c: len(c[0]))

    def decode(self, data, params, ctx):
        layout = params.get("layout")
        offset = params.get("offset", 0)
        if not isinstance(offset, int) or isinstance(offset, bool) or abs(offset) > 1 << 64:
            raise ArtifactError(f"{self.name} offset must be an integer")
        if not isinstance(layout, str):
            raise ArtifactError(f"{ctx.kind} stream: {self.name} layout must be a string")
        if layout not in LAYOUTS:
            raise ArtifactError(f"unknown {self.name} layout {layout!r}")
        lay = LAYOUTS[layout]
        if not lay.capacity and offset:
            raise ArtifactError(f"{ctx.kind} stream: layout {layout} takes no offset")
        if lay.capacity and DTYPES[ctx.dtype].kind not in "iub":
            raise ArtifactError(f"{ctx.kind} stream: packed layout {layout} needs integer codes")
        expect = lay.size(ctx.numel, DTYPES[ctx.dtype].itemsize)
        raw = compress.decompress(self.compressor, data, expect, f"{ctx.kind} stream")
        if len(raw) != expect:
            raise ArtifactError(f"{ctx.kind} stream: {self.name} gave {len(raw)} bytes, expected {expect}")
        return lay.unpack(raw, offset, ctx)


class Deflate(Compressed, name="deflate"):
    """Raw deflate (zlib, level 9): portable, quick; wins on small streams.

    Quantized codes where a zstd-1 pass finds no repetition are coded as Huffman literals
    only (compress.deflate_literals): level 9's matches there cost more than they save
    (0.2-7% larger on every such codes stream of benchmarks/pack.py's cases) and its match
    search is most of deflate's time. The literals' size follows from the byte counts, so
    they are made only where they beat the best so far; where the order-0 bound of those
    bytes already loses to it, they cannot (they land at 1.0035-1.02 of it, measured), and
    lzma is not raced either."""

    compressor = compress.DEFLATE

    @staticmethod
    def races_literals(laid: LaidOut, ctx: StreamContext) -> bool:
        """Whether deflate races these bytes' Huffman literals (and so lands at or under them
        where they could win): quantized codes, at max effort or below LITERALS_PROBE_MIN
        always, else where the zstd-1 pass finds no repetition. Float words and codes with
        repetition get level 9's matches instead."""
        return ctx.scales is not None and (
            ctx.effort == "max" or len(laid.raw) < LITERALS_PROBE_MIN or not laid.repeats
        )

    def _tries(self, laid, ctx, best, quick):
        if not self.races_literals(laid, ctx):
            return super()._tries(laid, ctx, best, quick)
        size = laid.literals_size
        literals = (size, laid.literals if size < best else None)
        if ctx.effort == "max" or len(laid.raw) < LITERALS_PROBE_MIN:
            matched = compress.deflate(laid.raw)
            return [(len(matched), matched), literals]
        return [] if laid.order0 >= best else [literals]


class Lzma(Compressed, name="lzma"):
    """Raw LZMA2 (9e): portable; 1-10% under deflate on scales and float words, slower,
    so it runs on deflate's best layout only, and only where deflate is in the race."""

    compressor = compress.LZMA

    def candidates(self, arr, ctx, best):
        if ctx.effort == "max":  # every layout
            return super().candidates(arr, ctx, best)
        raced = Deflate.name in ctx.plans  # (its result is then among the candidates)
        if not raced:  # deflate was not in the race: try it here
            Deflate().candidates(arr, ctx, best)
        tries = ctx.plans[Deflate.name]
        if not tries:  # deflate's probe already lost clearly: lzma lands near it on such bytes
            return []
        size, params = min(tries, key=lambda c: c[0])
        laid = ctx.laid_out(arr, params["layout"], params["offset"])
        if len(laid.raw) < compress.LZMA_MIN_BYTES:
            return []
        if size > best * (self.LZMA_RACE_BIG if len(laid.raw) > self.BIG_RAW else self.LZMA_RACE):
            return []
        # Quantized codes (they have scales) with no repetition for lzma to find, and deflate
        # either leads the race (lzma then lands above it: 1% on 16K int8 codes) or trails the
        # best by under LZMA_NOREP_GAIN, or the bytes hold no sequential structure for lzma's
        # literal contexts (the previous byte's top bits) to use. Not float words: there lzma
        # finds 2-9% under deflate (bf16 and fp32 passthrough tensors of a trained model),
        # repetition or not.
        if (
            ctx.scales is not None
            and best < NO_RACE
            and size >= ZSTD_REPEATS * laid.order0
            and (
                (raced and size <= best)
                or size * LZMA_NOREP_GAIN >= best
                or laid.literal_context >= LZMA_CONTEXT_GAIN * laid.order0
            )
        ):
            return []
        return [(compress.compress(self.compressor, laid.raw), params)]


class Zstd(Compressed, name="zstd"):
    """zstd (level 19) over the best layout. Not portable (the standard library has no
    zstd): read always, written only when asked for (`codecs=` naming it)."""

    compressor = compress.ZSTD

    def candidates(self, arr, ctx, best):
        quick = []
        for layout, offset in self._layouts(arr, ctx):
            laid = ctx.laid_out(arr, layout, offset)
            if len(laid.raw) > 4 * ZSTD_PROBE and _zstd_probe(laid.raw) > best * ZSTD_PROBE_MARGIN:
                continue  # a slice at the fast level already loses clearly: skip the full runs
            data = zstandard.ZstdCompressor(level=ZSTD_QUICK_LEVEL).compress(laid.raw)
            quick.append((data, {"layout": layout, "offset": offset}, laid))
        out = [(data, params) for data, params, _ in quick]
        if ctx.effort == "max":  # every layout at the slow level
            return out + [(compress.compress(self.compressor, laid.raw), params) for _, params, laid in quick]
        if not quick:
            return out
        data, params, laid = min(quick, key=lambda q: len(q[0]))  # first layout on ties
        if len(data) > best * ZSTD_SLOW_RACE:
            return out
        if len(data) < ZSTD_REPEATS * laid.order0 or laid.order0 < ZSTD_DENSE * len(laid.raw):
            out.append((compress.compress(self.compressor, laid.raw), params))
        return out


def _symbols_to_array(sym: np.ndarray, offset: int, ctx: StreamContext) -> np.ndarray:
    """Codes = symbols + offset, checked to fit the stream dtype.

    Added in the unsigned type of the stream's width: the sum wraps exactly as the
    checked result needs, and no int64 copy of the stream is made."""
    dt = np.dtype(ctx.dtype)
    if dt.kind not in "iub":
        raise ArtifactError(f"{ctx.kind} stream: symbols cannot decode to {ctx.dtype}")
    if sym.size:
        lo, hi = int(sym.min()) + offset, int(sym.max()) + offset
        info = np.iinfo(dt) if dt != np.bool_ else None
        if (info and (lo < info.min or hi > info.max)) or (info is None and (lo < 0 or hi > 1)):
            raise ArtifactError(f"{ctx.kind} stream: decoded codes do not fit {ctx.dtype}")
    udt = np.dtype(f"u{dt.itemsize}")
    # The decoder's own array is reused when it already has the width: one copy fewer.
    out = sym.view(udt) if sym.dtype.itemsize == dt.itemsize and sym.flags.writeable else sym.astype(udt)
    out += udt.type(offset % (1 << (8 * dt.itemsize)))
    return out.view(dt).reshape(ctx.shape)


# ----------------------------------------------------------------- rans


def geometry(ctx: StreamContext) -> search.Geometry:
    """Where each code position of a codes stream sits, for rans contexts."""
    rows, cols = rows_layout(ctx.tensor_shape)
    n = ctx.numel
    G, L = (ctx.shape[0], ctx.shape[1]) if len(ctx.shape) == 2 else (1, n)
    return search.Geometry(n, G, L, rows, cols, len(ctx.tensor_shape) >= 2, ctx.scales)


class Rans(Codec, name="rans"):
    """rANS over the codes with stored integer tables, one per context.

    Contexts: none, the code row's scale bucket, stored row or column classes, or
    both (grid: row class x column class);
    big streams of alphabets of at most 16 symbols code tuples of `tuple`
    symbols as one joint symbol. `search.choose` picks all of it by estimated size.
    """

    def symbols(self, arr: np.ndarray) -> tuple[np.ndarray, int, int] | None:
        """(symbols = codes - lowest, lowest, alphabet size), or None where rans cannot code arr
        (floats, or an alphabet over MAX_ALPHABET)."""
        rng = _int_range(arr)
        if rng is None or rng[1] - rng[0] + 1 > rans.MAX_ALPHABET:
            return None
        flat = np.asarray(arr).ravel()
        if flat.dtype == np.uint64:
            sym = (flat - np.uint64(rng[0])).astype(np.int64)
        else:
            sym = flat.astype(np.int64) - rng[0]
        return sym, rng[0], rng[1] - rng[0] + 1

    def prepare(self, items):
        """One search for all codes streams (search.plan): small tensors share its calls."""
        jobs, ctxs, syms = [], [], []
        for arr, ctx in items:
            got = self.symbols(arr) if ctx.kind == "codes" else None
            if got is not None:
                jobs.append((got[0], got[2], geometry(ctx)))
                ctxs.append(ctx)
                syms.append(got)
        for effort in sorted({c.effort for c in ctxs}):
            picked = [i for i, c in enumerate(ctxs) if c.effort == effort]
            for i, choice in zip(picked, search.plan([jobs[i] for i in picked], effort), strict=True):
                ctxs[i].plans[self.name] = (syms[i], jobs[i][2], choice)

    def candidates(self, arr, ctx, best):
        if self.name in ctx.plans:  # prepare() already has the symbols, geometry and choice
            (sym, offset, nsym), geo, c = ctx.plans[self.name]
        else:
            got = self.symbols(arr)
            if got is None:
                return []
            sym, offset, nsym = got
            geo = geometry(ctx)
            c = search.choose(sym, nsym, geo, ctx.effort)
        if self._loses_to_literals(arr, ctx, c):
            return []
        # uint8 ids and uint16 units: what the kernel reads (no int64 copies of the stream)
        cvec = geo.context_vector(c.variant, c.k, c.ids, c.t, np.uint8, kc=c.kc)
        nt = nsym**c.t
        tsym = rans.to_tuples(sym, nsym, c.t, np.uint16).astype(np.uint16, copy=False)
        if c.side is not None:  # the search counted this stream exactly and made its side data
            body = rans.encode(tsym, cvec, c.k, nt, c.ids, c.side.tables, c.lanes, c.prec, c.side.blobs())
        else:
            counts = rans.context_counts(tsym, cvec, c.k, nt)
            tables = rans.normalize_table(counts, c.prec)
            body = rans.encode(tsym, cvec, c.k, nt, c.ids, tables, c.lanes, c.prec)
        # Defaults stay out of the manifest: every byte of it counts against the cap.
        params = {"offset": offset, "nsym": nsym, "prec": c.prec, "lanes": c.lanes}
        if c.variant != "none":
            params.update(context=c.variant, k=c.k)
        if c.variant == "grid":
            params["kc"] = c.kc
        if c.t > 1:
            params["tuple"] = c.t
        return [(body, params)]

    # Side data packs to at least this share of the search's estimate of it (measured: 0.79-1.0
    # over every side blob of benchmarks/pack.py's cases, all-MiniLM-L6-v2 included).
    SIDE_FLOOR = 0.75

    def _loses_to_literals(self, arr, ctx, c: search.Choice) -> bool:
        """Whether deflate, racing next, beats this plan with Huffman literals even were its
        side data SIDE_FLOOR of the estimate and its header and flush free: small streams of wide alphabets without
        repetition, where a table costs more than Huffman's redundancy (16K int8 codes). The
        encode and the side data's compression, most of what such a stream costs, are skipped."""
        if ctx.effort == "max" or c.side is None or Deflate.name not in ctx.racing:
            return False
        laid = ctx.laid_out(arr, *Deflate._layouts(arr, ctx)[-1])
        # The estimate's header and flush bytes are upper bounds (a small stream's header is a
        # few bytes; the last states carry some of the payload): the floor takes them off.
        floor = c.cost - search.HEADER_BYTES - 4 * c.lanes - (1 - self.SIDE_FLOOR) * c.side.nbytes
        return (
            floor > laid.order0  # (literals land above the bytes' order-0 bound)
            and Deflate.races_literals(laid, ctx)
            and floor > laid.literals_size
        )

    def encode(self, arr, ctx):
        cands = self.candidates(arr, ctx, 1 << 62)
        if not cands:
            raise ValueError("rans needs integer codes with at most 4096 distinct values")
        return cands[0]

    def decode(self, data, params, ctx):
        offset, nsym = params.get("offset"), params.get("nsym")
        variant, k, kc = params.get("context", "none"), params.get("k", 1), params.get("kc", 1)
        t, lanes, prec = params.get("tuple", 1), params.get("lanes"), params.get("prec")
        for key, v, lo, hi in (
            ("offset", offset, -(1 << 64), 1 << 64),
            ("nsym", nsym, 1, rans.MAX_ALPHABET),
            ("k", k, 1, rans.MAX_CONTEXTS),
            ("kc", kc, 1, rans.MAX_CONTEXTS),
            ("tuple", t, 1, 8),
            ("lanes", lanes, 1, rans.MAX_LANES),
            ("prec", prec, 1, rans.MAX_PREC),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ArtifactError(f"rans param {key}={v!r} out of range")
        if lanes & (lanes - 1):
            raise ArtifactError(f"rans lanes={lanes} is not a power of two")
        nt = nsym**t
        if nt > rans.MAX_ALPHABET:
            raise ArtifactError("rans tuple alphabet too large")
        if not isinstance(variant, str) or variant not in ("none", "scale", "row", "col", "grid"):
            raise ArtifactError(f"unknown rans context {variant!r}")
        if (variant == "grid") != ("kc" in params) or (variant == "grid" and (k % kc or k // kc < 2 or kc < 2)):
            raise ArtifactError(f"rans grid context: k={k} must be (row classes >= 2) x (kc={kc} >= 2)")
        rows, cols = rows_layout(ctx.tensor_shape)
        n = ctx.numel
        n_ids = {"row": rows, "col": cols, "grid": rows + cols}.get(variant, 0)
        # Class ids are stored per row/column: an empty tensor has none to give, and their
        # count is bounded by the codes' (a zero dimension must not declare 2**39 rows).
        if variant in ("row", "col", "grid") and (
            rows * cols > n or len(ctx.tensor_shape) < 2 or rows * cols == 0 or n_ids > 2 * n
        ):
            raise ArtifactError("rans class context does not fit the tensor shape")
        if variant == "scale" and (len(ctx.shape) != 2 or ctx.scales is None):
            raise ArtifactError("rans scale context needs scales")
        if variant == "none" and k != 1:
            raise ArtifactError("rans context none has one table")
        tables, ids, words = rans.split_body(data, k, nt, n_ids, ctx.version)
        if variant == "grid" and (ids[:rows].max() >= k // kc or ids[rows:].max() >= kc):
            raise ArtifactError("rans grid class ids do not match the declared classes")
        cvec = geometry(ctx).context_vector(variant, k, ids, t, np.uint8, kc)
        tsym = rans.ilv_decode(words, cvec, tables, prec, lanes, len(cvec))
        return _symbols_to_array(rans.from_tuples(tsym, nsym, t, n), offset, ctx)


# ----------------------------------------------------------------- fields

MANT = {"fp32": 23, "fp16": 10, "bf16": 7}  # mantissa bits of each float format's words
HI_MAX = 4  # top mantissa bits a head symbol may carry (exponent 8 + 4 bits: 4096 symbols)


class Fields(Codec, name="fields"):
    """Float words as fields: rans over a head symbol, the exponent above the `hi` top
    mantissa bits, so that the exponent is their context and the head gets rans's row/column
    classes; the low mantissa bits and the sign, near uniform, stored as they are (deflated
    where a quick probe finds repetition: rows cast from a narrower type)."""

    def split(self, arr: np.ndarray, ctx: StreamContext):
        """(head symbols, tail bytes, params) of float words (ctx.mant bits of mantissa)."""
        w, m = np.ascontiguousarray(arr).view(f"<u{arr.dtype.itemsize}").ravel(), ctx.mant
        ebits = 8 * w.itemsize - 1 - m
        top = ((w >> w.dtype.type(m - HI_MAX)) & w.dtype.type((1 << ebits + HI_MAX) - 1)).astype(np.uint16)
        counts = rans.context_counts(top, None, 1, 1 << ebits + HI_MAX)[0]
        used = np.flatnonzero(counts) >> HI_MAX  # the exponents that occur
        # The head's width: order-0 bits of the head plus raw tail bits, with a table's cost, and
        # no wider than lets the search cluster rows and columns (they pay more), nor past 256
        # heads (the standalone loader then holds them a byte each). Exponent 0 (zeros and
        # denormals) widens the heads' span: all-MiniLM-L6-v2's bf16 embedding then takes h = 1.
        g = geometry(ctx)
        cost, items = [], max(g.rows, g.cols)
        for h in range(HI_MAX + 1):
            c = counts.reshape(-1, 1 << HI_MAX - h).sum(1)
            span = int(used[-1] - used[0] + 1) << h
            wide = h and (items * span > search.CLUSTER_MAX_CELLS or span > 256)
            cost.append(rans.entropy_bits(c) / 8 + w.size * (m - h + 1) / 8 + 2 * np.count_nonzero(c) + wide * 1e30)
        h = int(np.argmin(cost))
        head, tail = split_words(w, m, h)
        return head.reshape(1, -1), tail, {"mant": m, "hi": h}

    def prepare(self, items):
        """Every float stream's head, and one rans search for all of them (as Rans.prepare)."""
        jobs, heads = [], []
        for arr, ctx in items:
            if ctx.mant and arr.size and arr.dtype.itemsize == (4 if ctx.mant > 16 else 2):  # (their words)
                head, tail, params = self.split(arr, ctx)
                hctx = StreamContext(ctx.kind, "uint16", ctx.shape, ctx.tensor_shape, ctx.scales, ctx.effort)
                lo = int(head.min())
                jobs.append((head.ravel() - np.uint16(lo), int(head.max()) - lo + 1, geometry(hctx)))
                heads.append((ctx, hctx, lo, tail, params))
        for effort in sorted({c.effort for c, *_ in heads}):
            picked = [i for i, h in enumerate(heads) if h[0].effort == effort]
            for i, choice in zip(picked, search.plan([jobs[i] for i in picked], effort), strict=True):
                ctx, hctx, lo, tail, params = heads[i]
                hctx.plans[Rans.name] = ((jobs[i][0], lo, jobs[i][1]), jobs[i][2], choice)
                ctx.plans[self.name] = (hctx, tail, params)

    def candidates(self, arr, ctx, best):
        if self.name not in ctx.plans:
            self.prepare([(arr, ctx)])
            if self.name not in ctx.plans:
                return []
        hctx, tail, params = ctx.plans[self.name]
        body, hparams = Rans().candidates(None, hctx, NO_RACE)[0]
        z = compress.RAW
        if len(tail) < QUICK_MIN or LaidOut(tail).zstd1 < ZSTD_REPEATS * len(tail):
            # (level 1 on big tails: 0.03% over level 9 on MiniLM's fp32 embedding, in 60% of the time)
            packed = compress.deflate(tail, 9 if len(tail) < QUICK_MIN else 1)
            tail, z = (packed, compress.DEFLATE) if len(packed) < len(tail) else (tail, z)
        hparams["lo"] = hparams.pop("offset")  # (the heads' least value: no offset of the words)
        return [(tail + body, {**hparams, **params, "tail": len(tail), "tz": z})]

    def encode(self, arr, ctx):
        cands = self.candidates(arr, ctx, NO_RACE)
        if not cands:
            raise ValueError("fields needs float words")
        return cands[0]

    def decode(self, data, params, ctx):
        dt = DTYPES[ctx.dtype]
        width, (m, h, tlen, z) = 8 * dt.itemsize, (params.get(k) for k in ("mant", "hi", "tail", "tz"))
        if (
            not all(isinstance(v, int) and not isinstance(v, bool) for v in (m, h, tlen, z))
            or not (width > 8 and 0 <= h <= min(m, HI_MAX) and 1 <= m <= width - 2 and 0 <= tlen <= len(data))
            or z not in compress.NAMES
            or "offset" in params
        ):
            raise ArtifactError(f"{ctx.kind} stream: fields params out of range")
        n, (q, r), c = ctx.numel, divmod(m - h, 8), -(-ctx.numel // 8)
        size = q * n + (r + 1) * c
        tail = compress.decompress(z, data[:tlen], size, f"{ctx.kind} fields tail")
        if len(tail) != size:
            raise ArtifactError(f"{ctx.kind} stream: fields tail of {len(tail)} bytes, expected {size}")
        hctx = StreamContext(ctx.kind, "uint16", ctx.shape, ctx.tensor_shape, ctx.scales, version=ctx.version)
        head = Rans().decode(data[tlen:], {**params, "offset": params.get("lo")}, hctx).ravel()
        try:
            return join_words(head, tail, m, h, dt.itemsize).view(dt).reshape(ctx.shape)
        except ValueError as exc:
            raise ArtifactError(f"{ctx.kind} stream: {exc}") from None


def split_words(w: np.ndarray, m: int, h: int) -> tuple[np.ndarray, bytes]:
    """Float words (uint16/uint32, m mantissa bits) as (head, tail): the head is the exponent
    above the h top mantissa bits; the tail the low m - h bits as q byte planes, then r bit
    planes (np.packbits), then the sign's plane. The compiled kernel where built; this numpy
    spelling is its reference (tests check both write the same bytes)."""
    n, (q, r) = w.size, divmod(m - h, 8)
    if rans.has_kernel():
        head, tail = np.empty(n, np.uint16), np.empty(q * n + (r + 1) * -(-n // 8), np.uint8)
        rans._ransc.fields_split(w, w.itemsize, m, h, head, tail)
        return head, tail.tobytes()
    u, top = w.dtype.type, 8 * w.itemsize - 1
    head = ((w >> u(m - h)) & u((1 << top - m + h) - 1)).astype(np.uint16)
    planes = [w.view(np.uint8).reshape(-1, w.itemsize)[:, j] for j in range(q)]
    x = ((w >> u(8 * q)) & u((1 << r) - 1)).astype(np.uint8)
    planes += [np.packbits((x >> np.uint8(j)) & np.uint8(1)) for j in range(r)]
    planes.append(np.packbits((w >> u(top)).astype(np.uint8)))
    return head, b"".join(p.tobytes() for p in planes)


def join_words(head: np.ndarray, tail: bytes, m: int, h: int, itemsize: int) -> np.ndarray:
    """split_words inverted; ValueError where a head reaches the sign or a bit plane's
    padding is not zero."""
    n, (q, r), width = head.size, divmod(m - h, 8), 8 * itemsize
    w = np.empty(n, f"<u{itemsize}")
    if rans.has_kernel():
        rans._ransc.fields_join(w, itemsize, m, h, np.ascontiguousarray(head, np.uint16), tail)
        return w
    if n and int(head.max()) >> h >= 1 << width - 1 - m:
        raise ValueError("fields exponent out of range")
    w[:] = head.astype(w.dtype) << np.uint8(m - h)
    c = -(-n // 8)
    for j in range(q + r + 1):  # byte plane j (bits 8j..), bit plane j - q (bit j + 7q), the sign
        v = np.frombuffer(tail, np.uint8, n if j < q else c, min(j, q) * n + max(j - q, 0) * c)
        bit = 8 * j if j < q else width - 1 if j == q + r else j + 7 * q
        if j >= q:
            v = np.unpackbits(v)
            if v[n:].any():
                raise ValueError("fields bit plane padding is not zero")
            v = v[:n] << np.uint8(bit % 8)
        w.view(np.uint8).reshape(n, itemsize)[:, bit // 8] |= v
    return w


# ----------------------------------------------------------------- selection

# Portable: what the standard library and numpy decode (the standalone loader reads these).
DEFAULT_CODECS = ("rans", "fields", "deflate", "lzma", "raw")


def encode_all(items: list[tuple[np.ndarray, StreamContext]], names=None) -> list[tuple[str, dict, bytes]]:
    """encode_best of every (array, context), after each codec has prepared for all of them."""
    names = list(names or DEFAULT_CODECS)
    for name in names:
        get(name).prepare(items)
    return [encode_best(arr, ctx, names) for arr, ctx in items]


def encode_best(arr: np.ndarray, ctx: StreamContext, names=None) -> tuple[str, dict, bytes]:
    """Try each codec and keep the smallest encoding: (codec name, params, bytes)."""
    names = list(names or DEFAULT_CODECS)
    ctx.racing = tuple(names)
    best: tuple[str, dict, bytes] | None = None
    # raw is the fallback that always works; the others are compared against it.
    for name in sorted(names, key=lambda n: n != "raw"):
        codec = get(name)
        limit = len(best[2]) if best else ctx.nbytes
        for data, params in codec.candidates(arr, ctx, limit):
            if best is None or len(data) < len(best[2]):
                best = (name, params, data)
    if best is None:
        best = ("raw", {}, Raw().encode(arr, ctx)[0])
    # The stream's laid-out bytes and plans (a copy of its symbols) served this race only:
    # freed now, so that a model's streams are not all held at once.
    ctx.laid.clear()
    ctx.plans.clear()
    return best
