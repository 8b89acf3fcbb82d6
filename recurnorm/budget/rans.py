"""Context-modelled rANS over integer code symbols, with stored integer tables: a stream is
split by a per-position context id (spec.CONTEXTS); each context has its own table.

The packer writes our own interleaved rANS (`ilv_encode`/`ilv_decode`): `lanes` independent
32-bit states with 16-bit renormalization, whose only overhead is 4 bytes of final state a
lane. The compiled kernel (kernel.py) codes it at hundreds of MB/s; the numpy functions here
are its specification and fallback (one Python step per `lanes` units: slow, the same bytes).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import ArtifactError
from . import compress, kernel, spec

_FALLBACK_NOTE_UNITS = 1 << 20  # say once why coding is slow, past this many units


def _note_fallback(units: int) -> None:
    """Warn once per process that the numpy reference is coding a big stream."""
    global _FALLBACK_NOTE_UNITS
    if units >= _FALLBACK_NOTE_UNITS:
        _FALLBACK_NOTE_UNITS = 1 << 62
        warnings.warn(
            "recurnorm: the compiled rANS kernel is not built, so the numpy reference "
            "codes (the same bytes, at 0.1-1 MB/s); install a C compiler and Python's headers "
            "(python3-dev), then reinstall recurnorm",
            RuntimeWarning,
            stacklevel=3,
        )


# What the packer writes: at most 2**14 steps a stream. The standalone numpy loader decodes
# all of an artifact's streams in one lock-step loop of that many steps (~20 numpy calls a
# step); the extra lanes cost 4 bytes each, ~0.03% on big tensors (measured: benchmarks/ship.py).
WRITE_STEPS = 1 << 14
ILP_LANES = 4  # the compiled coder's sweet spot: independent states keep the CPU busy
FLUSH_SHARE = 2000  # extra lanes only while their 4 flush bytes stay under payload / FLUSH_SHARE


# ----------------------------------------------------------------- varints


def varint_lengths(v: np.ndarray) -> np.ndarray:
    """LEB128 length in bytes of each non-negative value (< 2**35)."""
    return 1 + (v >= 1 << 7) + (v >= 1 << 14) + (v >= 1 << 21) + (v >= 1 << 28)


def varint_encode(values: np.ndarray) -> bytes:
    """LEB128 varints of non-negative integers."""
    v = np.asarray(values).ravel().astype(np.uint64)
    nbytes = varint_lengths(v).astype(np.int64)
    ends = np.cumsum(nbytes)
    out = np.empty(int(nbytes.sum()), dtype=np.uint8)
    pos = ends - nbytes  # where each value's first byte goes
    for j in range(int(nbytes.max(initial=0))):  # byte j of every value that has one
        has = nbytes > j
        out[pos[has] + j] = ((v[has] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8) | (
            (nbytes[has] - 1 > j).astype(np.uint8) << 7
        )
    return out.tobytes()


def varint_decode(data: bytes, count: int) -> np.ndarray:
    """Decode exactly `count` LEB128 varints (each < 2**35) filling `data`."""
    b = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(b < 0x80)
    if len(ends) != count or (count and ends[-1] != len(b) - 1) or (count == 0 and len(b)):
        raise ArtifactError("frequency table: wrong number of varints")
    starts = np.concatenate([[0], ends[:-1] + 1]) if count else np.zeros(0, np.int64)
    lengths = ends - starts + 1
    if count and lengths.max() > 5:
        raise ArtifactError("frequency table: count too large")
    vals = np.zeros(count, dtype=np.int64)
    for j in range(5):
        has = lengths > j
        vals[has] |= (b[starts[has] + j].astype(np.int64) & 0x7F) << (7 * j)
    return vals


# ----------------------------------------------------------------- tables


def normalize_table(counts: np.ndarray, prec) -> np.ndarray:
    """Rows of counts rescaled to sum exactly 2**prec (empty rows stay 0), used symbols >= 1.

    prec: one precision, or one per row (the search scores several at once). Only
    compression depends on how the rounding error is spread: decoders read tables.
    """
    counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
    m = np.left_shift(1, np.broadcast_to(np.asarray(prec, dtype=np.int64), (len(counts),)))
    if np.any((counts > 0).sum(axis=1) > m):
        raise ValueError("more used symbols than table slots")
    tot = counts.sum(axis=1, keepdims=True)
    f = (counts * m[:, None]) // np.maximum(tot, 1)
    f[(counts > 0) & (f == 0)] = 1
    full = tot[:, 0] > 0
    r = np.arange(len(f))
    while True:
        # The largest count absorbs the difference when it can (nearly always in one step).
        diff = np.where(full, m - f.sum(axis=1), 0)
        j = f.argmax(axis=1)
        easy = (f[r, j] + diff >= 1) | ~full
        f[r[easy], j[easy]] += diff[easy]
        if easy.all():
            return f
        # Too many symbols bumped to 1: take the excess from every count above 1, in
        # proportion to what it can spare, then let the largest absorb the rest.
        hard = np.flatnonzero(~easy)
        spare = np.where(f[hard] > 1, f[hard] - 1, 0)
        excess = -diff[hard, None]
        take = (spare * excess) // np.maximum(spare.sum(axis=1, keepdims=True), 1)
        # What rounding left over: one more from each of the counts with most to spare.
        left = excess[:, 0] - take.sum(axis=1)
        rank = np.argsort(np.argsort(-(spare - take), axis=1, kind="stable"), axis=1)
        take += (rank < left[:, None]) & (spare - take > 0)
        f[hard] -= take


def entropy_bits(counts: np.ndarray) -> float:
    """Order-0 code length in bits of symbols with these counts (ideal model)."""
    c = counts[counts > 0].astype(np.float64)
    if c.size == 0:
        return 0.0
    return float(-(c * np.log2(c / c.sum())).sum())


def bincount(values: np.ndarray, minlength: int = 0) -> np.ndarray:
    """np.bincount of non-negative integers, in chunks: np.bincount makes an intp copy of
    its input, 8 bytes per value, which on a 2**28-code stream is 2 GB."""
    v = np.asarray(values).ravel()
    step = 1 << 20
    if v.size <= step:
        return np.bincount(v, minlength=minlength)
    out = np.zeros(max(minlength, int(v.max()) + 1), dtype=np.int64)
    for i in range(0, v.size, step):
        c = np.bincount(v[i : i + step])
        out[: len(c)] += c
    return out


def context_counts(sym: np.ndarray, ctx: np.ndarray | None, k: int, nsym: int) -> np.ndarray:
    """[k, nsym] counts of each symbol under each context id (ctx None: all in context 0).

    The compiled kernel counts uint16 symbols under uint8 ids in one pass; numpy bincounts
    an int64 index of ctx * nsym + sym (the same counts)."""
    if kernel.on() and nsym <= spec.MAX_ALPHABET and k <= spec.MAX_CONTEXTS:
        out = np.zeros(k * nsym, dtype=np.int64)
        c = np.ascontiguousarray(ctx, dtype=np.uint8) if k > 1 and ctx is not None else None
        kernel.c.counts(np.ascontiguousarray(sym, dtype=np.uint16), c, nsym, k, out)
        return out.reshape(k, nsym)
    idx = sym if k == 1 or ctx is None else np.asarray(ctx).astype(np.int64) * nsym + sym
    return np.bincount(idx, minlength=k * nsym).reshape(k, nsym)


def order0_bits(symbols: np.ndarray) -> float:
    """The order-0 entropy bound in bits of an integer array."""
    s = np.asarray(symbols).ravel()
    if s.size == 0:
        return 0.0
    if s.dtype.kind in "iub" and s.dtype.itemsize <= 2:
        u = np.ascontiguousarray(s).view(f"u{s.dtype.itemsize}")  # (by bit pattern: no sort, no copy; the same entropy)
        if not kernel.on() or u.size >= 1 << 32:
            return entropy_bits(bincount(u))
        w = u if u.itemsize == 2 else u[: u.size // 2 * 2].view("<u2")  # bytes in pairs (bincount: 4x as long)
        kernel.c.top_counts(w, 2, 0, counts := np.zeros(1 << 16, np.int64))
        if u.itemsize == 1:  # [second byte, first byte], and an odd last byte
            pairs = counts.reshape(256, 256)
            counts = pairs.sum(0) + pairs.sum(1) + np.bincount(u[2 * w.size :], minlength=256)
        return entropy_bits(counts)
    _, counts = np.unique(s, return_counts=True)
    return entropy_bits(counts)


# ----------------------------------------------------------------- contexts


def rank_buckets(order: np.ndarray, k) -> np.ndarray:
    """Bucket id per item: its rank in `order` cut into k equal-count runs (rank * k // n);
    for a sequence of ks, one row of ids per k."""
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank * np.asarray(k, dtype=np.int64)[..., None] // max(len(order), 1)  # (a scalar k broadcasts to [n])


@dataclass(frozen=True)
class Geometry:
    """Where a code position sits: the codes' [G, L] layout, the tensor's 2-D view, scales."""

    n: int  # code positions, G * L
    code_rows: int  # G
    row_len: int  # L
    rows: int  # the tensor viewed as [rows, cols] (dim 0 by the rest)
    cols: int
    matrix: bool  # the tensor has >= 2 dims (row/col classes apply)
    scales: np.ndarray | None = None  # one per code row (scale buckets)

    def context_vector(self, variant: str, k: int, ids, step: int = 1, dtype=np.int64, kc: int = 1) -> np.ndarray:
        """Context id of code positions 0, step, 2*step, ... < n.

        scale: the code row's bucket of k by |scale| rank (no ids: decoders rank the scales).
        row / col: the class id of the position's row / column (ids: one per row / column).
        grid: row class * kc + column class (ids: the rows' classes, then the columns').
        block: the id of the position's block of kc rows and its column (ids: [ceil(rows / kc), cols]).
        map: map[row class, column] (ids: the rows' classes, then map [row classes, cols]).
        Decoders ask for uint8 (k <= spec.MAX_CONTEXTS = 256): one byte per declared position, not eight.
        """
        m, n, L = -(-self.n // step), self.n, self.row_len
        if variant == "none" or k == 1:
            return np.zeros(m, dtype=dtype)
        if variant == "scale":
            if self.scales is None or len(self.scales) * L != n:
                raise ArtifactError("scale context needs one scale per code row")
            buckets = rank_buckets(self.scale_order, k).astype(dtype)
            if L % step == 0:
                return np.repeat(buckets, L // step)
            return buckets[np.arange(0, n, step, dtype=np.int64) // L]
        if variant not in spec.CONTEXTS:
            raise ArtifactError(f"unknown rans context {variant!r}")
        return _class_vector(variant, self.rows, self.cols, ids, step, np.zeros(m, dtype=dtype), kc)

    @cached_property
    def scale_order(self) -> np.ndarray:
        """Code rows ordered by |scale| (stable; non-finite counts as 0), once for every k the search tries."""
        a = np.abs(np.asarray(self.scales, dtype=np.float64).ravel())
        return np.argsort(np.where(np.isfinite(a), a, 0.0), kind="stable")


def _class_vector(variant: str, rows: int, cols: int, ids, step: int, ctx: np.ndarray, kc: int) -> np.ndarray:
    """Geometry.context_vector of the class contexts, written into ctx (zeros)."""
    dtype = ctx.dtype.type
    inside = -(-rows * cols // step)  # positions below numel; padding positions stay in context 0
    if variant in ("block", "map"):  # a row's (or block's) row of ids [., cols]
        ids = np.asarray(ids)
        at = ids[:rows] if variant == "map" else np.arange(rows) // kc
        ctx[:inside] = ids[rows * (variant == "map") :].reshape(-1, cols)[at].ravel()[::step]
        return ctx
    ids = np.asarray(ids).astype(dtype)
    if variant == "grid":
        row_part, col_part = ids[:rows] * dtype(kc), ids[rows:]
    else:
        row_part, col_part = (ids, None) if variant == "row" else (None, ids)
    if cols % step == 0:  # broadcast into the [rows, cols / step] view: no per-position division
        view = ctx[:inside].reshape(rows, cols // step)
        if row_part is None:
            view[:] = col_part[None, ::step]
        elif col_part is None:
            view[:] = row_part[:, None]
        else:
            np.add(row_part[:, None], col_part[None, ::step], out=view)
        return ctx
    pos = np.arange(0, inside * step, step, dtype=np.int64)
    if row_part is not None:
        ctx[:inside] = row_part[pos // cols]
    if col_part is not None:
        ctx[:inside] += col_part[pos % cols]
    return ctx


# ----------------------------------------------------------------- tuples


def to_tuples(sym: np.ndarray, nsym: int, t: int) -> np.ndarray:
    """Base-nsym numbers of t consecutive symbols (first one least significant), zero-padded;
    uint16 where t > 1 (tuple alphabets are at most 4096: a quarter of int64's memory traffic)."""
    if t == 1:
        return sym
    padded = np.zeros(-(-sym.size // t) * t, dtype=np.uint16)
    padded[: sym.size] = sym
    cols = padded.reshape(-1, t)
    out = cols[:, t - 1].copy()
    for i in range(t - 2, -1, -1):  # Horner: exact integers, no integer matmul
        out *= nsym
        out += cols[:, i]
    return out


def from_tuples(tsym: np.ndarray, nsym: int, t: int, n: int) -> np.ndarray:
    """Inverse of to_tuples for n symbols."""
    if t == 1:
        return tsym  # already the decoder's narrow type: no int64 copy of the stream
    nt = nsym**t
    # Digit table per tuple value: one gather instead of t divisions per tuple.
    lut = np.arange(nt, dtype=np.int64)[:, None] // (nsym ** np.arange(t, dtype=np.int64)) % nsym
    if nsym > 256:
        return lut[tsym].ravel()[:n]
    # Byte digits as words of t bytes, in pieces: 32M int4 pairs 0.06 s, 0.35 s as rows (lut[tsym]).
    words = lut.astype(np.uint8).view(f"V{t}").ravel()
    out = np.empty(tsym.size, words.dtype)
    for i in range(0, tsym.size, 1 << 20):
        np.take(words, tsym[i : i + (1 << 20)], out=out[i : i + (1 << 20)])
    return out.view(np.uint8)[:n]


# ----------------------------------------------------------------- coding


def encode(sym, ctx, tables: np.ndarray, prec: int, lanes: int, side) -> bytes:
    """Encode symbols with the stored table [k, nsym] (rows summing to 2**prec) of each context
    id: the stream header, the side data ((table blob, compress id), (ids blob, compress id):
    search.SideData.blobs), then ilv_encode's bytes."""
    (tblob, tz), (iblob, iz) = side
    head = varint_encode(np.array([4 * len(tblob) + tz, 4 * len(iblob) + iz])) + tblob + iblob
    return head + ilv_encode(sym, ctx if len(tables) > 1 else None, tables, prec, lanes)


def side_header(body: bytes, version: int) -> tuple[tuple[int, int], tuple[int, int], int]:
    """((table length, compress id), (ids length, compress id), where they start) of a stream.

    Format version 1 stored each side blob's form in one bit (raw or magicless zstd);
    version 2 in two (a compress id)."""
    b = np.frombuffer(body[:10], np.uint8)  # two varints of at most 5 bytes each
    ends = np.flatnonzero(b < 0x80)
    if len(ends) < 2:
        raise ArtifactError("rans stream header is not two valid varints")
    pos = int(ends[1]) + 1
    th, ih = varint_decode(b[:pos], 2).tolist()
    if version == 1:
        t, i = ((h >> 1, spec.ZSTD if h & 1 else spec.RAW) for h in (th, ih))
    else:
        t, i = ((h >> 2, h & 3) for h in (th, ih))
    return t, i, pos


def split_body(
    body: bytes, k: int, nsym: int, n_ids: int, version: int = 2
) -> tuple[np.ndarray, np.ndarray | None, bytes]:
    """Parse a rans stream body into (tables [k, nsym], ids or None, the coder's bytes)."""
    (tlen, tz), (ilen, iz), pos = side_header(body, version)
    if pos + tlen + ilen > len(body) or (len(body) - pos - tlen - ilen) % 2:
        raise ArtifactError("rans stream lengths disagree with the stream size")
    tblob, iblob = body[pos : pos + tlen], body[pos + tlen : pos + tlen + ilen]
    raw = compress.decompress(tz, tblob, 5 * k * nsym, "rans tables", magicless=True)
    tables = varint_decode(raw, k * nsym).reshape(k, nsym)
    ids = None
    if n_ids:
        raw = compress.decompress(iz, iblob, n_ids, "rans class ids", magicless=True)
        ids = np.frombuffer(raw, dtype=np.uint8)
        if len(ids) != n_ids or (ids.size and ids.max() >= k):
            raise ArtifactError("rans class ids do not match the declared classes")
    elif ilen:
        raise ArtifactError("rans stream has class ids it does not declare")
    return tables, ids, body[pos + tlen + ilen :]


# ----------------------------------------------------------------- interleaved rANS

_L = 1 << 16  # state lower bound; states live in [2**16, 2**32)


def lanes_for(n, payload_bytes) -> np.ndarray:
    """Lane counts for n units (arrays broadcast): as few as WRITE_STEPS allows (past spec.MAX_LANES: up to spec.MAX_STEPS;
    each lane costs 4 flush bytes), up to ILP_LANES while those bytes stay under payload / FLUSH_SHARE."""
    n = np.asarray(n, dtype=np.int64)
    budget = np.asarray(payload_bytes, dtype=np.float64) / FLUSH_SHARE
    lanes = np.ones(np.broadcast(n, budget).shape, dtype=np.int64)
    while np.any(grow := (lanes < ILP_LANES) & (8 * lanes <= budget)):
        lanes = np.where(grow, 2 * lanes, lanes)
    while np.any(grow := (-(-n // lanes) > WRITE_STEPS) & (lanes < spec.MAX_LANES)):
        lanes = np.where(grow, 2 * lanes, lanes)
    if np.any(-(-n // lanes) > spec.MAX_STEPS):
        raise ValueError(f"{int(n.max())} units exceed the interleaved coder's {spec.MAX_UNITS}")
    return lanes


def _slot_tables(freq: np.ndarray, prec: int):
    """Per-slot decode tables over all contexts: symbol, frequency, slot - cumulative."""
    k, nsym = freq.shape
    m = 1 << prec
    filled = freq.sum(axis=1) == m
    f = np.where(filled[:, None], freq, 0)
    f[~filled, 0] = m  # unused contexts: any valid table; positions never select them
    flat = f.ravel()
    sym = np.repeat(np.tile(np.arange(nsym, dtype=np.int64), k), flat)
    cum = np.cumsum(flat) - flat  # over the flattened rows: row starts are multiples of m
    owner = np.repeat(np.arange(k * nsym), flat)
    slot = np.arange(k * m, dtype=np.int64)
    bias = slot - cum[owner]
    dt = np.uint8 if nsym <= 256 else np.uint16
    return sym.astype(dt), flat[owner].astype(np.uint32), bias.astype(np.uint32)


def ilv_encode(sym: np.ndarray, ctx: np.ndarray | None, freq: np.ndarray, prec: int, lanes: int) -> bytes:
    """Interleaved rANS: symbol i goes to lane i % lanes; final states then u16 words (the kernel or
    its numpy reference: the same bytes)."""
    if not kernel.on():
        _note_fallback(len(sym))
        return ilv_encode_numpy(sym, ctx, freq, prec, lanes)
    k, nsym = freq.shape
    c = np.ascontiguousarray(ctx, dtype=np.uint8) if k > 1 and ctx is not None else None
    sym16, f = np.ascontiguousarray(sym, dtype=np.uint16), np.ascontiguousarray(freq, dtype=np.uint32).ravel()
    try:
        return kernel.c.encode(sym16, c, f, nsym, prec, lanes)
    except ValueError as exc:  # our own tables: a bug, not bad input
        raise ValueError(f"rans encode: {exc}") from None


def ilv_decode(data: bytes, ctx: np.ndarray | None, freq: np.ndarray, prec: int, lanes: int, n: int) -> np.ndarray:
    """Inverse of ilv_encode for n symbols; ArtifactError on any inconsistency."""
    steps = -(-n // lanes)
    if steps > spec.MAX_STEPS or len(data) < 4 * lanes or len(data) % 2:
        raise ArtifactError("interleaved rans stream does not fit its lanes")
    k, nsym = freq.shape
    if not kernel.on():  # (the kernel checks the tables of the contexts it meets as it goes)
        # One context: its (all-zero) vector is never read, so never touched into memory.
        used = bincount(ctx, minlength=k) > 0 if k > 1 else np.array([n > 0])
        if np.any(freq.sum(axis=1)[used] != 1 << prec):
            raise ArtifactError("rans table does not sum to 2**prec")
        _note_fallback(n)
        return ilv_decode_numpy(data, ctx, freq, prec, lanes, n)
    # Entries above 2**prec can only come from a hostile table: its row cannot sum to
    # 2**prec either way, and the clip keeps the uint32 cast from wrapping it into one.
    f = np.minimum(np.asarray(freq, dtype=np.int64), (1 << prec) + 1).astype(np.uint32).ravel()
    c = np.ascontiguousarray(ctx, dtype=np.uint8) if k > 1 and ctx is not None else None
    out = np.empty(n, dtype=np.uint16)
    try:
        kernel.c.decode(data, c, f, nsym, prec, lanes, out)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None
    return out  # (uint16: callers narrow it to their codes' type in the same copy that adds the offset)


def ilv_encode_numpy(sym: np.ndarray, ctx: np.ndarray | None, freq: np.ndarray, prec: int, lanes: int) -> bytes:
    """The numpy reference of ilv_encode: lanes vectorized, one Python step per `lanes` units."""
    n = len(sym)
    k, nsym = freq.shape
    # (int64 first: ids come as uint8, where ctx * nsym would wrap)
    idx = np.asarray(ctx).astype(np.int64) * nsym + sym if k > 1 else sym
    flat = freq.ravel().astype(np.int64)
    cum = (np.cumsum(flat) - flat) % (1 << prec)  # cumulative within each context row
    f = flat[idx].astype(np.uint32)
    c = cum[idx].astype(np.uint32)
    g = np.uint32(1 << prec) - f  # f <= 2**prec
    x = np.full(lanes, _L, dtype=np.uint32)
    steps = -(-n // lanes)
    chunks: list[np.ndarray] = []
    sh, low, top = np.uint32(16), np.uint32(0xFFFF), np.uint32(32 - prec)
    q = np.empty(lanes, dtype=np.uint32)
    hi = np.empty(lanes, dtype=np.uint32)
    em = np.empty(lanes, dtype=bool)
    for t in range(steps - 1, -1, -1):  # reverse order: the decoder runs forward
        lo = t * lanes
        a = min(lanes, n - lo)
        xa, fa, qa = x[:a], f[lo : lo + a], q[:a]
        # Emit a word first when x >= f * 2**(32-prec), so x stays < 2**32 after coding.
        np.right_shift(xa, top, out=hi[:a])
        np.greater_equal(hi[:a], fa, out=em[:a])
        out = np.flatnonzero(em[:a])
        if out.size:
            chunks.append(xa[out])  # low 16 bits kept at the end: one cast, not one per step
            xa[out] >>= sh
        # x' = (x div f) * 2**prec + x mod f + cum = x + (x div f) * (2**prec - f) + cum
        np.floor_divide(xa, fa, out=qa)
        np.multiply(qa, g[lo : lo + a], out=qa)
        xa += qa
        xa += c[lo : lo + a]
    chunks.reverse()
    words = (np.concatenate(chunks) & low).astype("<u2").tobytes() if chunks else b""
    return x.astype("<u4").tobytes() + words


def ilv_decode_numpy(
    data: bytes, ctx: np.ndarray | None, freq: np.ndarray, prec: int, lanes: int, n: int
) -> np.ndarray:
    """The numpy reference of ilv_decode (sizes already checked by ilv_decode)."""
    steps = -(-n // lanes)
    k = freq.shape[0]
    sym_lut, f_lut, b_lut = _slot_tables(freq, prec)
    x = np.frombuffer(data, dtype="<u4", count=lanes).astype(np.uint32)
    words = np.frombuffer(data, dtype="<u2", offset=4 * lanes).astype(np.uint32)
    nwords = len(words)
    out = np.empty(n, dtype=sym_lut.dtype)
    off = (ctx.astype(np.uint32) << np.uint32(prec)) if k > 1 and ctx is not None else None
    mask, p, sh, bound = np.uint32((1 << prec) - 1), np.uint32(prec), np.uint32(16), np.uint32(_L)
    s_ = np.empty(lanes, dtype=np.uint32)
    tmp = np.empty(lanes, dtype=np.uint32)
    need = np.empty(lanes, dtype=bool)
    pos = 0
    with np.errstate(over="ignore"):  # hostile states may wrap; the final checks catch them
        for t in range(steps):
            lo = t * lanes
            a = min(lanes, n - lo)
            xa, sa, ta = x[:a], s_[:a], tmp[:a]
            np.bitwise_and(xa, mask, out=sa)
            if off is not None:
                sa += off[lo : lo + a]
            np.take(sym_lut, sa, out=out[lo : lo + a], mode="clip")
            np.right_shift(xa, p, out=xa)
            np.take(f_lut, sa, out=ta, mode="clip")
            xa *= ta
            np.take(b_lut, sa, out=ta, mode="clip")
            xa += ta
            np.less(xa, bound, out=need[:a])
            idx = np.flatnonzero(need[:a])
            if idx.size:
                if pos + idx.size > nwords:
                    raise ArtifactError("interleaved rans stream ends early")
                xa[idx] = (xa[idx] << sh) | words[pos : pos + idx.size]
                pos += idx.size
    if pos != nwords or not np.all(x == _L):
        raise ArtifactError("interleaved rans stream does not end where it should")
    return out
