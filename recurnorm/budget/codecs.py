"""Stream codecs: one small registered class each; the race (race.py) keeps the smallest.

A codec turns one ndarray (a QTensor's codes, scales or zeros) into bytes plus JSON params,
and back. `StreamContext` carries what both sides know for free: the stream's dtype and
shape, the tensor's shape, and (for codes) the decoded scales, which the rans scale-bucket
context uses as side information.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import ArtifactError
from ..quant.grid import rows_layout
from ..quant.passthrough import FLOAT_FORMATS
from ..registry import Registry
from . import compress, kernel, rans, search, spec
from .options import PackOptions

EXTRA = {name: c.extra for name, c in spec.CONTEXTS.items() if c.extra}  # the one more param of a context (Choice.kc)

# numpy dtypes a stream may hold; all are stored little-endian.
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in "bool uint8 int8 uint16 int16 uint32 int32 uint64 int64 float16 float32 float64".split()
}


@dataclass
class StreamContext:
    """What encoder and decoder both know about a stream before its bytes, and what the encoder
    is asked (options, mant). The encoder's scratch lives in race.py."""

    kind: str  # "codes" | "scales" | "zeros"
    dtype: str
    shape: tuple[int, ...]
    tensor_shape: tuple[int, ...] = ()  # the tensor's, or its entry's view: what row/column contexts see
    scales: np.ndarray | None = None
    options: PackOptions = PackOptions()  # encoder only: how hard codecs search (the pack's)
    version: int = spec.VERSION  # decoder only: the artifact's format version
    mant: int = 0  # encoder only: mantissa bits of the float words it holds (0: not floats)

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

    def encode(self, arr: np.ndarray, ctx: StreamContext, plan: Any = None) -> tuple[bytes, dict]:
        """Bytes and params of arr (plan: what the codec's prepare, where it has one, made for it
        in a search of many streams at once)."""
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


# ----------------------------------------------------------------- raw


class Raw(Codec, name="raw"):
    """Little-endian bytes as they are."""

    def encode(self, arr, ctx, plan=None):
        return to_le_bytes(arr, ctx.dtype), {}

    def decode(self, data, params, ctx):
        if params:  # a stray layout would mean one thing here and another to a lenient reader
            raise ArtifactError(f"{ctx.kind} stream: raw takes no params")
        return from_le_bytes(data, ctx)


# ----------------------------------------------------------------- byte layouts


def shuffled(arr: np.ndarray, dtype: str) -> bytes:
    """Byte-grouped words, high bytes first: exponent and sign bytes are the compressible part."""
    size = DTYPES[dtype].itemsize
    return np.frombuffer(to_le_bytes(arr, dtype), dtype=np.uint8).reshape(-1, size)[:, ::-1].T.tobytes()


def layout_bytes(arr: np.ndarray, dtype: str, layout: str) -> bytes:
    """The bytes of one layout: plain (little-endian words as they are) or shuffle."""
    return shuffled(arr, dtype) if layout == "shuffle" else to_le_bytes(arr, dtype)


def layouts_for(dtype: str) -> list[str]:
    """The layouts a stream of this dtype may take: plain, and shuffle for words of 2+ bytes.
    (Packing small alphabets tighter than a byte gained nothing measurable once rans coded
    every integer stream: benchmarks' tiny trained and golf-shaped models, same bytes.)"""
    return ["plain", "shuffle"] if DTYPES[dtype].itemsize > 1 else ["plain"]


class Compressed(Codec):
    """A general-purpose compressor over a byte layout of the stream (plain or byte-grouped);
    subclasses name the compressor (compress.py). race.py picks the layouts."""

    compressor: ClassVar[int]  # a compress.py id

    def encode(self, arr, ctx, plan=None):
        """The smallest over every layout (plan: the layouts to try)."""
        tries = [
            (compress.compress(self.compressor, layout_bytes(arr, ctx.dtype, lay)), {"layout": lay})
            for lay in plan or layouts_for(ctx.dtype)
        ]
        return min(tries, key=lambda t: len(t[0]))

    def decode(self, data, params, ctx):
        layout = params.get("layout")
        if set(params) != {"layout"} or layout not in layouts_for(ctx.dtype):
            raise ArtifactError(f"{ctx.kind} stream: {self.name} takes a layout of {layouts_for(ctx.dtype)} alone")
        size = DTYPES[ctx.dtype].itemsize
        raw = compress.decompress(self.compressor, data, ctx.numel * size, f"{ctx.kind} stream")
        if len(raw) != ctx.numel * size:
            raise ArtifactError(f"{ctx.kind} stream: {self.name} gave {len(raw)} bytes, expected {ctx.numel * size}")
        if layout == "shuffle":
            raw = np.ascontiguousarray(np.frombuffer(raw, np.uint8).reshape(size, -1).T[:, ::-1]).tobytes()
        return from_le_bytes(raw, ctx)


class Deflate(Compressed, name="deflate"):
    """Raw deflate (zlib, level 9): portable, quick; wins on small streams."""

    compressor = spec.DEFLATE


class Lzma(Compressed, name="lzma"):
    """Raw LZMA2 (9e): portable; 1-10% under deflate on scales and float words, slower."""

    compressor = spec.LZMA


class Zstd(Compressed, name="zstd"):
    """zstd (level 19). Not portable (the standard library has no zstd): read always, written
    only when asked for (`codecs=` naming it)."""

    compressor = spec.ZSTD


def _symbols_to_array(sym: np.ndarray, off: int, ctx: StreamContext, nsym: int) -> np.ndarray:
    """Codes = symbols (< nsym) + off, checked to fit the stream dtype (added in the unsigned
    type of its width: the sum wraps as the checked result needs, with no int64 copy)."""
    dt = np.dtype(ctx.dtype)
    if dt.kind not in "iub":
        raise ArtifactError(f"{ctx.kind} stream: symbols cannot decode to {ctx.dtype}")
    if sym.size:  # the declared range where it fits (no pass over the symbols), else the one decoded
        a, b = (0, 1) if dt == np.bool_ else (int(np.iinfo(dt).min), int(np.iinfo(dt).max))
        if not a <= off <= off + nsym - 1 <= b and not a <= int(sym.min()) + off <= int(sym.max()) + off <= b:
            raise ArtifactError(f"{ctx.kind} stream: decoded codes do not fit {ctx.dtype}")
    udt = np.dtype(f"u{dt.itemsize}")
    # The decoder's own array is reused when it already has the width: one copy fewer.
    out = sym.view(udt) if sym.dtype.itemsize == dt.itemsize and sym.flags.writeable else sym.astype(udt)
    out += udt.type(off % (1 << (8 * dt.itemsize)))
    return out.view(dt).reshape(ctx.shape)


# ----------------------------------------------------------------- rans


def geometry(ctx: StreamContext) -> rans.Geometry:
    """Where each code position of a codes stream sits, for rans contexts."""
    rows, cols = rows_layout(ctx.tensor_shape)
    n = ctx.numel
    G, L = (ctx.shape[0], ctx.shape[1]) if len(ctx.shape) == 2 else (1, n)
    return rans.Geometry(n, G, L, rows, cols, len(ctx.tensor_shape) >= 2, ctx.scales)


class Rans(Codec, name="rans"):
    """rANS over the codes with stored integer tables, one per context (docs/FORMAT.md), and tuples
    of symbols as one on big streams of small alphabets. `search.plan` picks all of it by estimated
    size; block and map plans race beside its choice."""

    def symbols(self, arr: np.ndarray) -> tuple[np.ndarray, int, int] | None:
        """(symbols = codes - lowest, lowest, alphabet size), or None where rans cannot code arr
        (floats, an alphabet over spec.MAX_ALPHABET, or more than its coder's spec.MAX_UNITS)."""
        if not 0 < arr.size <= spec.MAX_UNITS or arr.dtype.kind not in "iub":
            return None
        lo, hi = int(arr.min()), int(arr.max())
        if hi - lo >= spec.MAX_ALPHABET:
            return None
        # uint16 (the kernel's input): arithmetic modulo 2**16 leaves every symbol < spec.MAX_ALPHABET exact
        sym = np.asarray(arr).ravel().astype(np.uint16)
        sym -= np.uint16(lo & 0xFFFF)
        return sym, lo, hi - lo + 1

    def prepare(self, items):
        """One search for all integer streams (search.plan): small tensors share its calls.
        Each item's plans: a list of ((symbols, offset, alphabet), geometry, choice), the
        search's first, then block and map plans that may win (or None)."""
        jobs, ctxs, syms, out = [], [], [], [None] * len(items)
        for j, (arr, ctx) in enumerate(items):
            got = self.symbols(arr)
            if got is not None:
                jobs.append((got[0], got[2], geometry(ctx)))
                ctxs.append(ctx)
                syms.append((j, got))
        for how in dict.fromkeys(c.options.search for c in ctxs):  # (one pack: one search width)
            picked = [i for i, c in enumerate(ctxs) if c.options.search == how]
            for i, choice in zip(picked, search.plan([jobs[i] for i in picked], how), strict=True):
                (j, g), geo = syms[i], jobs[i][2]
                # Stored block or map statistics may code smaller: plans within BLOCK_MARGIN of the least race
                more = (search.block_choice(g[0], g[2], geo, choice), search.map_choice(g[0], g[2], geo, choice))
                plans = [choice, *(c for c in more if c is not None)]
                out[j] = [(g, geo, c) for c in plans if min(p.cost for p in plans) >= self.BLOCK_MARGIN * c.cost]
        return out

    # Block and map plans' estimates count their streams exactly (tables and ids measured): on
    # all-MiniLM-L6-v2's embedding 0.1% off the coded size, where they win by 0.6-1%.
    BLOCK_MARGIN = 0.995

    def encode(self, arr, ctx, plan=None, kinds=spec.PORTABLE):
        """kinds: the compressors the tables and class ids may take (the smallest is kept)."""
        plan = plan or (self.prepare([(arr, ctx)])[0] or [None])[0]
        if plan is None:
            raise ValueError("rans needs integer codes with at most 4096 distinct values")
        (sym, offset, nsym), geo, c = plan
        # uint8 ids and uint16 units: what the kernel reads (no int64 copies of the stream)
        cvec = geo.context_vector(c.variant, c.k, c.ids, c.t, np.uint8, kc=c.kc)
        nt, lanes = nsym**c.t, c.lanes
        tsym = rans.to_tuples(sym, nsym, c.t)
        while ctx.kind != "codes" and -(-len(tsym) // lanes) > rans.WRITE_STEPS // 8 and lanes < spec.MAX_LANES:
            lanes *= 2  # (the loader decodes scales in a lock-step round of their own, before the codes)
        side = c.side  # (where the search counted this stream exactly, it made its side data)
        if side is None:
            side = search.SideData.of(rans.normalize_table(rans.context_counts(tsym, cvec, c.k, nt), c.prec), c.ids)
        body = rans.encode(tsym, cvec, side.tables, c.prec, lanes, side.blobs(kinds))
        # Defaults stay out of the manifest: every byte of it counts against the cap.
        params = {"offset": offset, "nsym": nsym, "prec": c.prec, "lanes": lanes}
        if c.variant != "none":
            params.update(context=c.variant, k=c.k)
        if c.variant in EXTRA:
            params[EXTRA[c.variant]] = c.kc
        if c.t > 1:
            params["tuple"] = c.t
        return body, params

    def decode(self, data, params, ctx):
        variant, k, t = params.get("context", "none"), params.get("k", 1), params.get("tuple", 1)
        context = spec.CONTEXTS.get(variant) if isinstance(variant, str) else None
        if context is None:
            raise ArtifactError(f"unknown rans context {variant!r}")
        kc, lanes, prec = params.get(context.extra, 1), params.get("lanes"), params.get("prec")
        for key, v, lo, hi in (
            ("offset", params.get("offset"), -(1 << 64), 1 << 64),
            ("nsym", nsym := params.get("nsym"), 1, spec.MAX_ALPHABET),
            ("k", k, 1, spec.MAX_CONTEXTS),
            (context.extra, kc, 1, context.extra_max),
            ("tuple", t, 1, spec.MAX_TUPLE),
            ("lanes", lanes, 1, spec.MAX_LANES),
            ("prec", prec, 1, spec.MAX_PREC),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ArtifactError(f"rans param {key}={v!r} out of range")
        if lanes & (lanes - 1):
            raise ArtifactError(f"rans lanes={lanes} is not a power of two")
        if nsym**t > spec.MAX_ALPHABET:
            raise ArtifactError("rans tuple alphabet too large")
        if set(params) & set(EXTRA.values()) != ({context.extra} - {None}):
            raise ArtifactError(
                f"rans {variant} context: {context.extra or 'no kc, rb or kr'} comes with it, and no other"
            )
        if variant == "grid" and (k % kc or k // kc < 2 or kc < 2):
            raise ArtifactError(f"rans grid context: k={k} must be (row classes >= 2) x (kc={kc} >= 2)")
        # The params hold: now the class ids against the tensor, then the codes.
        (rows, cols), n = rows_layout(ctx.tensor_shape), ctx.numel
        n_ids = context.ids(rows, cols, kc) if context.ids else 0
        # Class ids are stored per row/column: an empty tensor has none to give, and their
        # count is bounded by the codes' (a zero dimension must not declare 2**39 rows).
        if context.ids and (rows * cols > n or len(ctx.tensor_shape) < 2 or rows * cols == 0 or n_ids > 2 * n):
            raise ArtifactError("rans class context does not fit the tensor shape")
        if variant == "scale" and (len(ctx.shape) != 2 or ctx.scales is None):
            raise ArtifactError("rans scale context needs scales")
        if variant == "none" and k != 1:
            raise ArtifactError("rans context none has one table")
        tables, ids, words = rans.split_body(data, k, nsym**t, n_ids, ctx.version)
        top = context.row_classes(k, kc) if context.row_classes else None
        if top and (ids[:rows].max() >= top or variant == "grid" and ids[rows:].max() >= kc):
            raise ArtifactError(f"rans {variant} class ids do not match the declared classes")
        cvec = geometry(ctx).context_vector(variant, k, ids, t, np.uint8, kc)
        units = rans.ilv_decode(words, cvec, tables, prec, lanes, len(cvec))
        return _symbols_to_array(rans.from_tuples(units, nsym, t, n), params["offset"], ctx, nsym)


# ----------------------------------------------------------------- fields

# mantissa bits of each float format's words, and of a float stream's dtype (a quantizer's scales)
MANT = {k: m for name, (dtype, m) in FLOAT_FORMATS.items() for k in (name, dtype)}
HI_MAX = 4  # top mantissa bits a head symbol may carry (exponent 8 + 4 bits: 4096 symbols)


class Fields(Codec, name="fields"):
    """Float words as fields: rans over a head symbol, the exponent above the `hi` top
    mantissa bits, so that the exponent is their context and the head gets rans's row/column
    classes; the low mantissa bits and the sign, near uniform, stored as they are (deflated
    in the chunks where a probe finds repetition: rows cast from a narrower type)."""

    def split(self, arr: np.ndarray, ctx: StreamContext):
        """(heads less the least, their alphabet, the least, tail, params, heads' counts) of float words."""
        w, m = np.ascontiguousarray(arr).view(f"<u{arr.dtype.itemsize}").ravel(), ctx.mant
        g, ebits, s = geometry(ctx), 8 * w.itemsize - 1 - m, w.itemsize // 2
        counts = np.zeros(1 << ebits + HI_MAX, np.int64)  # of the exponents and HI_MAX top mantissa bits
        if kernel.on():  # (one pass, no shifted copy of the words)
            kernel.c.top_counts(w, w.itemsize, m - HI_MAX, counts)
        else:
            top = (w.view("<u2")[s - 1 :: s] >> np.uint16(m - HI_MAX + 16 - 16 * s)) & np.uint16(len(counts) - 1)
            counts += rans.context_counts(top, None, 1, len(counts))[0]
        nz = np.flatnonzero(counts)  # the exponents (and top mantissa bits) that occur
        e0, e1 = int(nz[0]) >> HI_MAX, int(nz[-1]) >> HI_MAX
        # The head's width (all at once: numpy calls are what a model's small tensors cost): order-0
        # bits of the head plus raw tail bits, with a table's cost, and no wider than lets the search
        # cluster rows and columns (they pay more), nor past 256 heads (the standalone loader holds
        # them a byte each). Exponent 0 (zeros, denormals) widens the span: MiniLM's bf16 embedding h = 1.
        top = counts[e0 << HI_MAX : e1 + 1 << HI_MAX].reshape(e1 - e0 + 1, -1)  # (exponents that occur)
        sums = [top.reshape(e1 - e0 + 1, 1 << h, -1).sum(2).ravel() for h in range(HI_MAX + 1)]
        c, starts, hs = np.concatenate(sums), np.cumsum([0] + [len(a) for a in sums[:-1]]), np.arange(HI_MAX + 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            bits = -np.add.reduceat(np.where(c > 0, c * np.log2(c / w.size), 0), starts)
        span, items = (e1 - e0 + 1) << hs, max(g.rows, g.cols)
        wide = (hs > 0) & ((items * span > search.CLUSTER_MAX_CELLS) | (span > 256))
        h = int(np.argmin(bits / 8 + w.size * (m - hs + 1) / 8 + 2 * np.add.reduceat(c > 0, starts) + wide * 1e30))
        (head, tail), lo, last = split_words(w, m, h), int(nz[0]) >> HI_MAX - h, int(nz[-1]) >> HI_MAX - h
        head -= np.uint16(lo)  # (its own array: no copy)
        return head, last - lo + 1, lo, tail, {"mant": m, "hi": h}, sums[h][lo - (e0 << h) : last + 1 - (e0 << h)]

    def prepare(self, items):
        """Every float stream's head, and one rans search for all of them (as Rans.prepare).
        Each plan: (head's context, tail, params, the head's rans plan)."""
        jobs, heads, out = [], [], [None] * len(items)
        for j, (arr, ctx) in enumerate(items):
            if ctx.mant and 0 < arr.size <= spec.MAX_UNITS and arr.dtype.itemsize == (4 if ctx.mant > 16 else 2):
                head, nsym, lo, tail, params, counts = self.split(arr, ctx)
                hctx = StreamContext(ctx.kind, "uint16", ctx.shape, ctx.tensor_shape, ctx.scales, ctx.options)
                jobs.append((head, nsym, geometry(hctx), counts))
                heads.append((j, ctx, hctx, lo, tail, params))
        for how in dict.fromkeys(h[1].options.fields_search for h in heads):  # (one pack: one search width)
            picked = [i for i, h in enumerate(heads) if h[1].options.fields_search == how]
            for i, choice in zip(picked, search.plan([jobs[i] for i in picked], how), strict=True):
                j, ctx, hctx, lo, tail, params = heads[i]
                out[j] = (hctx, tail, params, ((jobs[i][0], lo, jobs[i][1]), jobs[i][2], choice))
        return out

    def encode(self, arr, ctx, plan=None, tail_level=9):
        """tail_level: deflate's level for the tail (or one per compress.CHUNK bytes); 0: stored."""
        plan = plan or self.prepare([(arr, ctx)])[0]
        if plan is None:
            raise ValueError("fields needs float words")
        hctx, tail, params, head_plan = plan
        body, hparams = Rans().encode(None, hctx, head_plan, ctx.options.fields_side_compressors)
        packed = compress.deflate(tail, tail_level) if np.any(tail_level) else tail
        tail, z = (packed, spec.DEFLATE) if len(packed) < len(tail) else (tail, spec.RAW)
        hparams["lo"] = hparams.pop("offset")  # (the heads' least value: no offset of the words)
        return b"".join((tail, body)), {**hparams, **params, "tail": len(tail), "tz": z}

    def decode(self, data, params, ctx):
        dt = DTYPES[ctx.dtype]
        width, (m, h, tlen, z) = 8 * dt.itemsize, (params.get(k) for k in ("mant", "hi", "tail", "tz"))
        if (
            not all(isinstance(v, int) and not isinstance(v, bool) for v in (m, h, tlen, z))
            or not (width > 8 and 0 <= h <= min(m, HI_MAX) and 1 <= m <= width - 2 and 0 <= tlen <= len(data))
            or z not in spec.NAMES
            or "offset" in params
        ):
            raise ArtifactError(f"{ctx.kind} stream: fields params out of range")
        n, (q, r), c = ctx.numel, divmod(m - h, 8), -(-ctx.numel // 8)
        size = q * n + (r + 1) * c
        tail = compress.decompress(z, data[:tlen], size, f"{ctx.kind} fields tail") if z else memoryview(data)[:tlen]
        if len(tail) != size:
            raise ArtifactError(f"{ctx.kind} stream: fields tail of {len(tail)} bytes, expected {size}")
        hctx = StreamContext(ctx.kind, "uint16", ctx.shape, ctx.tensor_shape, ctx.scales, version=ctx.version)
        head = Rans().decode(memoryview(data)[tlen:], {**params, "offset": params.get("lo")}, hctx).ravel()
        try:
            return join_words(head, tail, m, h, dt.itemsize).view(dt).reshape(ctx.shape)
        except ValueError as exc:
            raise ArtifactError(f"{ctx.kind} stream: {exc}") from None


def split_words(w: np.ndarray, m: int, h: int) -> tuple[np.ndarray, bytes | np.ndarray]:
    """Float words (uint16/uint32, m mantissa bits) as (head, tail bytes): the head is the exponent
    above the h top mantissa bits; the tail the low m - h bits as q byte planes, then r bit
    planes (np.packbits), then the sign's plane. The compiled kernel where built; this numpy
    spelling is its reference (tests check both write the same bytes)."""
    n, (q, r) = w.size, divmod(m - h, 8)
    if kernel.on():
        head, tail = np.empty(n, np.uint16), np.empty(q * n + (r + 1) * -(-n // 8), np.uint8)
        kernel.c.fields_split(w, w.itemsize, m, h, head, tail)
        return head, tail
    u, top = w.dtype.type, 8 * w.itemsize - 1
    head = ((w >> u(m - h)) & u((1 << top - m + h) - 1)).astype(np.uint16)
    planes = [w.view(np.uint8).reshape(-1, w.itemsize)[:, j] for j in range(q)]
    x = ((w >> u(8 * q)) & u((1 << r) - 1)).astype(np.uint8)
    planes += [np.packbits((x >> np.uint8(j)) & np.uint8(1)) for j in range(r)]
    planes.append(np.packbits((w >> u(top)).astype(np.uint8)))
    return head, b"".join(p.tobytes() for p in planes)


def join_words(head: np.ndarray, tail: bytes, m: int, h: int, itemsize: int) -> np.ndarray:
    """split_words inverted; ValueError where a head reaches the sign or a bit plane's padding is not zero."""
    n, (q, r), width = head.size, divmod(m - h, 8), 8 * itemsize
    w = np.empty(n, f"<u{itemsize}")
    if kernel.on():
        kernel.c.fields_join(w, itemsize, m, h, np.ascontiguousarray(head, np.uint16), tail)
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
