"""Stream codecs: one small registered class each; the packer keeps the smallest.

A codec turns one ndarray (a QTensor's codes, scales or zeros) into bytes plus
JSON params, and back. `StreamContext` carries what both sides know for free:
the stream's dtype and shape, the tensor's shape, and (for codes) the decoded
scales, which the rans scale-bucket context uses as side information.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import zstandard

from ..errors import ArtifactError
from . import rans

# numpy dtypes a stream may hold; all are stored little-endian.
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
        "float16", "float32", "float64",
    )
}
ZSTD_LEVEL = 19
ZSTD_PREFILTER = 1.0  # big streams: run the slow zstd level only if zstd-3 already wins
ZSTD_PROBE = 1 << 16  # bytes per probe slice
ZSTD_PROBE_MARGIN = 1.1  # skip zstd when the probe extrapolates 10% above the best so far


def _zstd_probe(raw: bytes) -> float:
    """zstd-3 size of raw extrapolated from three evenly spread slices."""
    n = len(raw)
    starts = (0, (n - ZSTD_PROBE) // 2, n - ZSTD_PROBE)
    got = sum(len(zstandard.ZstdCompressor(level=3).compress(raw[s : s + ZSTD_PROBE])) for s in starts)
    return got * n / (3 * ZSTD_PROBE)


@dataclass
class StreamContext:
    """What encoder and decoder both know about a stream before its bytes."""

    kind: str  # "codes" | "scales" | "zeros"
    dtype: str
    shape: tuple[int, ...]
    tensor_shape: tuple[int, ...] = ()
    scales: np.ndarray | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype].itemsize


class Codec:
    """Base class: subclasses register themselves by name."""

    name: ClassVar[str]
    registry: ClassVar[dict[str, type[Codec]]] = {}

    def __init_subclass__(cls, name: str, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.name = name
        Codec.registry[name] = cls

    def candidates(self, arr: np.ndarray, ctx: StreamContext, best: int) -> list[tuple[bytes, dict]]:
        """Encodings worth trying (best = smallest size found so far)."""
        return [self.encode(arr, ctx)]

    def encode(self, arr: np.ndarray, ctx: StreamContext) -> tuple[bytes, dict]:
        """Bytes and params of arr."""
        raise NotImplementedError

    def decode(self, data: bytes, params: dict, ctx: StreamContext) -> np.ndarray:
        """The array of ctx.dtype and ctx.shape stored in data."""
        raise NotImplementedError


def available() -> list[str]:
    """Registered codec names."""
    return sorted(Codec.registry)


def get(name: str) -> Codec:
    """A codec instance by name."""
    if name not in Codec.registry:
        raise ArtifactError(f"unknown codec {name!r} (known: {', '.join(available())})")
    return Codec.registry[name]()


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
        return from_le_bytes(data, ctx)


# ----------------------------------------------------------------- zstd layouts


def _pack_bits(sym: np.ndarray, per: int, bits: int) -> bytes:
    """`per` symbols of `bits` bits each into one little-endian word of per*bits bits."""
    n = len(sym)
    padded = np.zeros(-(-n // per) * per, dtype=np.uint32)
    padded[:n] = sym
    words = np.zeros(len(padded) // per, dtype=np.uint32)
    for j in range(per):
        words |= padded[j::per] << np.uint32(bits * j)
    nbyte = per * bits // 8
    return words.astype("<u4").view(np.uint8).reshape(-1, 4)[:, :nbyte].tobytes()


def _unpack_bits(data: bytes, n: int, per: int, bits: int) -> np.ndarray:
    nbyte = per * bits // 8
    b = np.frombuffer(data, dtype=np.uint8).reshape(-1, nbyte)
    w = np.zeros((len(b), 4), dtype=np.uint8)
    w[:, :nbyte] = b
    words = w.view("<u4").ravel().astype(np.uint32)
    out = np.empty((len(words), per), dtype=np.int64)
    for j in range(per):
        out[:, j] = (words >> np.uint32(bits * j)) & np.uint32((1 << bits) - 1)
    return out.ravel()[:n]


def _pack_trits(sym: np.ndarray) -> bytes:
    n = len(sym)
    padded = np.zeros(-(-n // 5) * 5, dtype=np.uint8)
    padded[:n] = sym
    p = padded.reshape(-1, 5).astype(np.uint16)
    return (p @ np.array([1, 3, 9, 27, 81], dtype=np.uint16)).astype(np.uint8).tobytes()


def _unpack_trits(data: bytes, n: int) -> np.ndarray:
    b = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    if b.size and b.max() >= 243:
        raise ArtifactError("trit byte out of range")
    out = np.stack([(b // d) % 3 for d in (1, 3, 9, 27, 81)], axis=1)
    return out.ravel()[:n]


# name -> (alphabet size it holds, packed byte count for n symbols)
PACKED_LAYOUTS = {
    "trit5": (3, lambda n: -(-n // 5)),
    "bits2": (4, lambda n: -(-n // 4)),
    "nib4": (16, lambda n: -(-n // 2)),
    "pack6": (64, lambda n: -(-n // 4) * 3),
    "byte": (256, lambda n: n),
}


def layout_bytes(arr: np.ndarray, dtype: str, layout: str, offset: int = 0) -> bytes:
    """The bytes of one layout: plain, shuffle (byte-grouped) or a packed code layout."""
    if layout == "plain":
        return to_le_bytes(arr, dtype)
    if layout == "shuffle":
        size = DTYPES[dtype].itemsize
        b = np.frombuffer(to_le_bytes(arr, dtype), dtype=np.uint8).reshape(-1, size)
        # High bytes first: exponent/sign bytes are the compressible part.
        return b[:, ::-1].T.tobytes()
    sym = (np.asarray(arr).ravel().astype(np.int64) - offset)
    if layout == "trit5":
        return _pack_trits(sym)
    if layout == "bits2":
        return _pack_bits(sym, 4, 2)
    if layout == "nib4":
        return _pack_bits(sym, 2, 4)
    if layout == "pack6":
        return _pack_bits(sym, 4, 6)
    if layout == "byte":
        return sym.astype(np.uint8).tobytes()
    raise ArtifactError(f"unknown zstd layout {layout!r}")


def layouts_for(arr: np.ndarray, dtype: str) -> list[tuple[str, int]]:
    """(layout, offset) pairs that can hold arr: plain, shuffle, and the tightest packing."""
    out = [("plain", 0)]
    if DTYPES[dtype].itemsize > 1:
        out.append(("shuffle", 0))
    rng = _int_range(arr)
    if rng is not None:
        span = rng[1] - rng[0] + 1
        for name, (cap, _) in PACKED_LAYOUTS.items():
            if name == "byte" and DTYPES[dtype].itemsize == 1:
                break  # same bytes as plain up to a relabelling
            if span <= cap:
                out.append((name, rng[0]))
                break
    return out


class Zstd(Codec, name="zstd"):
    """zstd over the best of a few byte layouts (plain, byte-grouped, bit-packed)."""

    level: int = ZSTD_LEVEL

    def candidates(self, arr, ctx, best):
        out, slow = [], []
        for layout, offset in layouts_for(arr, ctx.dtype):
            raw = layout_bytes(arr, ctx.dtype, layout, offset)
            if len(raw) > 4 * ZSTD_PROBE and _zstd_probe(raw) > best * ZSTD_PROBE_MARGIN:
                continue  # a slice at the fast level already loses clearly: skip the full runs
            # zstd-19 is slow; skip it when the fast level shows no chance of winning.
            quick = zstandard.ZstdCompressor(level=3).compress(raw)
            if len(quick) > best * ZSTD_PREFILTER and len(raw) > 65536:
                continue
            out.append((quick, {"layout": layout, "offset": offset}))
            slow.append((len(quick), len(slow), raw, layout, offset))
        # Big streams: the slow level runs on the best fast layout only (it seldom reorders).
        if slow and len(slow[0][2]) > 65536:
            slow = [min(slow, key=lambda c: (c[0], c[1]))]
        for _, _, raw, layout, offset in slow:
            data = zstandard.ZstdCompressor(level=self.level).compress(raw)
            out.append((data, {"layout": layout, "offset": offset}))
        return out

    def encode(self, arr, ctx):
        return min(self.candidates(arr, ctx, best=1 << 62), key=lambda c: len(c[0]))

    def decode(self, data, params, ctx):
        layout = params.get("layout")
        offset = params.get("offset", 0)
        if not isinstance(offset, int) or isinstance(offset, bool) or abs(offset) > 1 << 64:
            raise ArtifactError("zstd offset must be an integer")
        n = ctx.numel
        if layout in ("plain", "shuffle"):
            expect = ctx.nbytes
        elif layout in PACKED_LAYOUTS:
            expect = PACKED_LAYOUTS[layout][1](n)
        else:
            raise ArtifactError(f"unknown zstd layout {layout!r}")
        try:
            raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=max(expect, 1))
        except zstandard.ZstdError as exc:
            raise ArtifactError(f"{ctx.kind} stream: zstd: {exc}") from None
        if len(raw) != expect:
            raise ArtifactError(f"{ctx.kind} stream: zstd gave {len(raw)} bytes, expected {expect}")
        if layout == "plain":
            return from_le_bytes(raw, ctx)
        if layout == "shuffle":
            size = DTYPES[ctx.dtype].itemsize
            b = np.frombuffer(raw, dtype=np.uint8).reshape(size, -1).T[:, ::-1]
            return from_le_bytes(np.ascontiguousarray(b).tobytes(), ctx)
        if layout == "trit5":
            sym = _unpack_trits(raw, n)
        elif layout == "byte":
            sym = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
        else:
            bits = {"bits2": (4, 2), "nib4": (2, 4), "pack6": (4, 6)}[layout]
            sym = _unpack_bits(raw, n, *bits)
        return _symbols_to_array(sym, offset, ctx)


def _symbols_to_array(sym: np.ndarray, offset: int, ctx: StreamContext) -> np.ndarray:
    """Codes = symbols + offset, checked to fit the stream dtype."""
    dt = np.dtype(ctx.dtype)
    if sym.size:
        lo, hi = int(sym.min()) + offset, int(sym.max()) + offset
        info = np.iinfo(dt) if dt != np.bool_ else None
        if (info and (lo < info.min or hi > info.max)) or (info is None and (lo < 0 or hi > 1)):
            raise ArtifactError(f"{ctx.kind} stream: decoded codes do not fit {ctx.dtype}")
    if dt.kind == "u" and dt.itemsize == 8:
        out = (sym.astype(np.uint64) + np.uint64(offset)) if offset >= 0 else None
        if out is None:
            raise ArtifactError("negative offset for an unsigned stream")
        return out.astype(dt).reshape(ctx.shape)
    return (sym.astype(np.int64) + offset).astype(dt).reshape(ctx.shape)


# ----------------------------------------------------------------- rans


def _view_2d(tensor_shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) of a tensor seen as a matrix: dim 0 by the rest."""
    if len(tensor_shape) < 2:
        return 1, math.prod(tensor_shape)
    return tensor_shape[0], math.prod(tensor_shape[1:])


def _tuple_size(nsym: int, n: int) -> int:
    """Symbols per coded unit: big small-alphabet streams code joint tuples (fewer steps)."""
    if n < rans.BIG_SYMBOLS or nsym < 2:
        return 1
    t = 1
    while t < 8 and nsym ** (t + 1) <= 256:
        t += 1
    return t


def _to_tuples(sym: np.ndarray, nsym: int, t: int) -> np.ndarray:
    """Base-nsym numbers of t consecutive symbols (first one least significant), zero-padded."""
    if t == 1:
        return sym
    padded = np.zeros(-(-sym.size // t) * t, dtype=np.int64)
    padded[: sym.size] = sym
    cols = padded.reshape(-1, t)
    out = cols[:, t - 1].copy()
    for i in range(t - 2, -1, -1):  # Horner: exact int64, no integer matmul
        out *= nsym
        out += cols[:, i]
    return out


def _from_tuples(tsym: np.ndarray, nsym: int, t: int, n: int) -> np.ndarray:
    """Inverse of _to_tuples for n symbols."""
    if t == 1:
        return tsym.astype(np.int64)
    nt = nsym ** t
    # Digit table per tuple value: one gather instead of t divisions per tuple.
    lut = (np.arange(nt, dtype=np.int64)[:, None] // (nsym ** np.arange(t, dtype=np.int64)) % nsym)
    return lut.astype(np.uint8 if nsym <= 256 else np.int64)[tsym].ravel()[:n]


def _stride_for(numel: int) -> int:
    """Sampling stride that keeps the context search near SEARCH_SAMPLE positions."""
    return max(1, numel // Rans.SEARCH_SAMPLE)


class Rans(Codec, name="rans"):
    """Order-0 rANS with optional contexts: scale buckets or row/column classes.

    Big streams use the interleaved coder (params lanes, prec) and, for alphabets
    of at most 16 symbols, code tuples of `tuple` symbols as one joint symbol.
    """

    KS = (2, 4, 8, 16)
    BIG_KS = (4, 16)  # big streams: fewer trials; tables are cheap there, so more classes win
    PRECS = (8, 10, 12, 14, 16)
    SEARCH_SAMPLE = 1 << 20  # the context search looks at about this many positions
    LEADERS = 3  # variants that get the full table-precision search
    TUPLES_ONLY_SYMBOLS = 1 << 20  # from here on tuples always win (their table is negligible)

    def _symbols(self, arr: np.ndarray) -> tuple[np.ndarray, int, int] | None:
        rng = _int_range(arr)
        if rng is None or rng[1] - rng[0] + 1 > rans.MAX_ALPHABET:
            return None
        flat = np.asarray(arr).ravel()
        if flat.dtype == np.uint64:
            sym = (flat - np.uint64(rng[0])).astype(np.int64)
        else:
            sym = flat.astype(np.int64) - rng[0]
        return sym, rng[0], rng[1] - rng[0] + 1

    def variants(self, sym: np.ndarray, nsym: int, ctx: StreamContext, t: int = 1,
                 tsym: np.ndarray | None = None):
        """(variant, k, ids, counts [k, nsym**t] of coded units) for each context worth trying.

        Counts may come from a strided sample (scaled up): they only rank the variants.
        """
        tsym = _to_tuples(sym, nsym, t) if tsym is None else tsym
        nt = nsym ** t
        total = np.bincount(tsym, minlength=nt)[None, :]
        out: list[tuple[str, int, np.ndarray | None, np.ndarray]] = [("none", 1, None, total)]
        if sym.size < 4096 or nsym < 2:
            return out

        us = max(1, tsym.size // (self.SEARCH_SAMPLE // 2))  # every us-th unit: estimates only

        def unit_counts(variant: str, k: int, ids) -> np.ndarray:
            cvec = self._ctx_vector(variant, k, ids, ctx, sym.size, t * us)
            counts = np.bincount(cvec * nt + tsym[::us], minlength=k * nt).reshape(k, nt)
            return counts * (tsym.size / len(cvec))

        ks = self.BIG_KS if sym.size >= rans.BIG_SYMBOLS else self.KS
        G = ctx.shape[0] if len(ctx.shape) == 2 else 1
        if ctx.scales is not None and G >= 4 and len(ctx.scales) == G and G * nsym <= rans.CLUSTER_MAX_CELLS:
            L = sym.size // G
            ls = _stride_for(sym.size) if t == 1 else 1
            ghist = None
            if t == 1:
                part = sym.reshape(G, L)[:, ::ls]
                ghist = rans.item_histograms(part.ravel(), np.arange(part.size) // part.shape[1], G, nsym)
                ghist *= L / part.shape[1]
            for k in ks:
                if k < G:
                    if t == 1:
                        b = rans.scale_buckets(ctx.scales, k)
                        out.append(("scale", k, None, rans.class_sums(ghist, b, k)))
                    else:
                        out.append(("scale", k, None, unit_counts("scale", k, None)))
        rows, cols = _view_2d(ctx.tensor_shape)
        numel = rows * cols
        if numel == 0 or numel > sym.size or len(ctx.tensor_shape) < 2:
            return out
        head = sym[:numel].reshape(rows, cols)
        stride = _stride_for(numel)
        for variant, n_items in (("row", rows), ("col", cols)):
            if n_items < 4 or n_items * nsym > rans.CLUSTER_MAX_CELLS or n_items > 255 * 4096:
                continue
            # Sample the other axis: every item keeps a share of its own positions.
            part = head[:, ::stride] if variant == "row" else head[::stride]
            pr, pc = part.shape
            pos = np.arange(part.size, dtype=np.int64)
            item = pos // pc if variant == "row" else pos % pc
            hist = rans.item_histograms(part.ravel(), item, n_items, nsym)
            scale = numel / part.size
            for k in ks:
                if k < n_items:
                    ids = rans.cluster_items(hist, k)
                    if t == 1:
                        counts = rans.class_sums(hist, ids, k) * scale
                        # padding codes sit in context 0
                        counts[0] = np.maximum(counts[0] + total[0] - counts.sum(axis=0), 0)
                    else:
                        counts = unit_counts(variant, k, ids)
                    out.append((variant, k, ids, counts))
        return out

    def _estimate(self, counts: np.ndarray, ids, units: int, precs=PRECS) -> tuple[float, int, int]:
        """(estimated bytes, table precision, lanes): coarse tables pay off on small streams."""
        big = units >= rans.BIG_SYMBOLS
        id_bytes = 0
        if ids is not None:  # big streams: a proxy; small ones: measure (they decide close calls)
            id_bytes = (len(ids) * np.log2(counts.shape[0]) / 8 if big
                        else len(rans._pack_compact(ids.astype(np.uint8).tobytes())[0]))
        icounts = np.rint(counts).astype(np.int64)
        used = int((icounts > 0).sum(axis=1).max())
        best = None
        for prec in precs:
            if used > 1 << prec:
                continue
            tables = rans.normalize_table(icounts, prec)
            payload = rans._cross_bits(counts, tables) / 8
            varints = rans.varint_encode(tables.ravel())
            # Small streams: tables matter, so measure them; big ones: a cheap proxy.
            table_bytes = 0.75 * len(varints) if big else len(rans._pack_compact(varints)[0])
            lanes = rans.choose_lanes(units, payload)
            cost = payload + table_bytes + id_bytes + 4 * lanes + 8
            if best is None or cost < best[0]:
                best = (cost, prec, lanes)
        return best

    def _ctx_vector(self, variant, k, ids, ctx: StreamContext, n: int, step: int = 1,
                    dtype=np.int64) -> np.ndarray:
        rows, cols = _view_2d(ctx.tensor_shape)
        L = ctx.shape[1] if len(ctx.shape) == 2 else n
        return rans.context_vector(variant, k, n, rows, cols, L, ctx.scales, ids, step, dtype)

    def candidates(self, arr, ctx, best):
        got = self._symbols(arr)
        if got is None:
            return []
        sym, offset, nsym = got
        tmax = _tuple_size(nsym, sym.size)
        # Tuples cost a bigger table; below TUPLES_ONLY_SYMBOLS single symbols compete.
        ts = (tmax, 1) if 1 < tmax and sym.size < self.TUPLES_ONLY_SYMBOLS else (tmax,)
        scored, found, tuples = [], [], {}
        for t in ts:
            units = -(-sym.size // t)
            tuples[t] = _to_tuples(sym, nsym, t)
            for variant, k, ids, counts in self.variants(sym, nsym, ctx, t, tuples[t]):
                found.append((variant, k, ids, counts, t, units))
                # First pass at one precision; the precision search runs on the leaders only.
                scored.append((*self._estimate(counts, ids, units, (12,)), len(scored)))
        leaders = sorted(scored, key=lambda s: (s[0], s[3]))[: self.LEADERS]
        final = []
        for *_, i in leaders:
            variant, k, ids, counts, t, units = found[i]
            final.append((*self._estimate(counts, ids, units), i, variant, k, ids, t))
        _, prec, lanes, _, variant, k, ids, t = min(final, key=lambda s: (s[0], s[3]))
        cvec = self._ctx_vector(variant, k, ids, ctx, sym.size, t)
        tsym, nt = tuples[t], nsym ** t
        counts = np.bincount(cvec * nt + tsym, minlength=k * nt).reshape(k, nt)
        tables = rans.normalize_table(counts, prec)
        body = rans.encode(tsym, cvec, k, nt, ids, tables, lanes, prec)
        # Defaults stay out of the manifest: every byte of it counts against the cap.
        params = {"offset": offset, "nsym": nsym, "prec": prec}
        if variant != "none":
            params.update(context=variant, k=k)
        if t > 1:
            params["tuple"] = t
        if lanes:
            params["lanes"] = lanes
        return [(body, params)]

    def encode(self, arr, ctx):
        cands = self.candidates(arr, ctx, 1 << 62)
        if not cands:
            raise ValueError("rans needs integer codes with at most 4096 distinct values")
        return cands[0]

    def decode(self, data, params, ctx):
        offset, nsym = params.get("offset"), params.get("nsym")
        variant, k = params.get("context", "none"), params.get("k", 1)
        t, lanes, prec = params.get("tuple", 1), params.get("lanes", 0), params.get("prec", 0)
        for key, v, lo, hi in (("offset", offset, -(1 << 64), 1 << 64),
                               ("nsym", nsym, 1, rans.MAX_ALPHABET),
                               ("k", k, 1, rans.MAX_CONTEXTS),
                               ("tuple", t, 1, 8),
                               ("lanes", lanes, 0, rans.MAX_LANES),
                               ("prec", prec, 1 if lanes else 0, rans.MAX_PREC)):
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ArtifactError(f"rans param {key}={v!r} out of range")
        if lanes & (lanes - 1):
            raise ArtifactError(f"rans lanes={lanes} is not a power of two")
        nt = nsym ** t
        if nt > rans.MAX_ALPHABET:
            raise ArtifactError("rans tuple alphabet too large")
        if variant not in ("none", "scale", "row", "col"):
            raise ArtifactError(f"unknown rans context {variant!r}")
        rows, cols = _view_2d(ctx.tensor_shape)
        n = ctx.numel
        n_ids = {"row": rows, "col": cols}.get(variant, 0)
        if variant in ("row", "col") and (rows * cols > n or len(ctx.tensor_shape) < 2):
            raise ArtifactError("rans class context does not fit the tensor shape")
        if variant == "scale" and (len(ctx.shape) != 2 or ctx.scales is None):
            raise ArtifactError("rans scale context needs scales")
        if variant == "none" and k != 1:
            raise ArtifactError("rans context none has one table")
        tables, ids, words = rans.split_body(data, k, nt, n_ids, 2 if lanes else 4, compact=prec > 0)
        cvec = self._ctx_vector(variant, k, ids, ctx, n, t, np.uint8)
        try:
            if lanes:
                used = np.bincount(cvec, minlength=k) > 0
                if np.any(tables.sum(axis=1)[used] != 1 << prec):
                    raise ArtifactError("rans table does not sum to 2**prec")
                tsym = rans.ilv_decode(words, cvec, tables, prec, lanes, len(cvec))
            else:
                if prec and np.any(tables.sum(axis=1)[np.bincount(cvec, minlength=k) > 0] != 1 << prec):
                    raise ArtifactError("rans table does not sum to 2**prec")
                tsym = rans.decode(tables, cvec, words, nt)
        except ArtifactError:
            raise
        except Exception as exc:  # constriction reports bad input as ValueError/RuntimeError
            raise ArtifactError(f"{ctx.kind} stream: rans: {exc}") from None
        return _symbols_to_array(_from_tuples(tsym, nsym, t, n), offset, ctx)


# ----------------------------------------------------------------- selection

DEFAULT_CODECS = ("rans", "zstd", "raw")


def encode_best(arr: np.ndarray, ctx: StreamContext, names=None) -> tuple[str, dict, bytes]:
    """Try each codec and keep the smallest encoding: (codec name, params, bytes)."""
    names = list(names or DEFAULT_CODECS)
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
    return best
