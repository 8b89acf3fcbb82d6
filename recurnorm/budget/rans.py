"""Context-modelled rANS over integer code symbols (constriction's Rust core).

We hand constriction our own stored integer frequency tables, so the decoder
rebuilds exactly the model the encoder used; constriction is pinned (0.5.0)
because its table-to-fixed-point step is part of the bit stream.

A stream is split by a per-position context id (none, the row's scale bucket,
or a row/column class of the tensor's 2-D view); each context has its own table.
"""

from __future__ import annotations

import struct

import constriction
import numpy as np
import zstandard

from ..errors import ArtifactError

MAX_ALPHABET = 1 << 12  # larger alphabets go to zstd/raw
MAX_CONTEXTS = 64
TABLE_TOTAL = 1 << 16  # tables are rescaled to about this many counts to stay small
CLUSTER_MAX_CELLS = 1 << 23  # items x alphabet for the histogram matrix
_LOG_PRIOR = 0.5  # add-half prior when estimating class costs


# ----------------------------------------------------------------- varints


def varint_encode(values: np.ndarray) -> bytes:
    """LEB128 varints of non-negative integers (vectorized)."""
    v = np.asarray(values, dtype=np.uint64).ravel()
    nbytes = np.ones(len(v), dtype=np.int64)
    rest = v >> np.uint64(7)
    while rest.any():
        nbytes += rest > 0
        rest = rest >> np.uint64(7)
    width = int(nbytes.max()) if len(v) else 1
    shifts = (np.arange(width, dtype=np.uint64) * np.uint64(7))[None, :]
    groups = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    col = np.arange(width)[None, :]
    groups |= ((col < nbytes[:, None] - 1).astype(np.uint8) << 7)
    return groups[col < nbytes[:, None]].tobytes()


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


def quantize_counts(counts: np.ndarray, target: int = TABLE_TOTAL) -> np.ndarray:
    """Rescale a histogram to about `target` counts, keeping every used symbol > 0."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total <= target:
        return counts
    q = np.rint(counts * (target / total)).astype(np.int64)
    q[(counts > 0) & (q == 0)] = 1
    return q


def _entropy_bits(counts: np.ndarray) -> float:
    """Order-0 code length in bits of symbols with these counts (ideal model)."""
    c = counts[counts > 0].astype(np.float64)
    if c.size == 0:
        return 0.0
    return float(-(c * np.log2(c / c.sum())).sum())


def _cross_bits(counts: np.ndarray, table: np.ndarray) -> float:
    """Code length in bits of `counts` symbols under `table` (rows: contexts)."""
    t = table.astype(np.float64)
    tot = t.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        logp = np.log2(np.where(t > 0, t, 1.0) / np.maximum(tot, 1))
    return float(-(counts * np.where(t > 0, logp, -30.0)).sum())


def order0_bits(symbols: np.ndarray) -> float:
    """The order-0 entropy bound in bits of an integer array."""
    s = np.asarray(symbols).ravel()
    if s.size == 0:
        return 0.0
    _, counts = np.unique(s, return_counts=True)
    return _entropy_bits(counts)


# ----------------------------------------------------------------- contexts


def scale_buckets(scales: np.ndarray, k: int) -> np.ndarray:
    """Bucket id per group: the rank of |log scale| cut into k equal-count bins."""
    a = np.abs(np.asarray(scales, dtype=np.float64).ravel())
    a = np.where(np.isfinite(a), a, 0.0)
    order = np.argsort(a, kind="stable")
    rank = np.empty(len(a), dtype=np.int64)
    rank[order] = np.arange(len(a))
    return (rank * k // max(len(a), 1)).astype(np.int64)


def context_vector(
    variant: str, k: int, n: int, rows: int, cols: int, L: int,
    scales: np.ndarray | None, ids: np.ndarray | None,
) -> np.ndarray:
    """Context id of each of the n (= G*L) code positions."""
    if variant == "none" or k == 1:
        return np.zeros(n, dtype=np.int64)
    if variant == "scale":
        if scales is None or len(scales) * L != n:
            raise ArtifactError("scale context needs one scale per code row")
        return np.repeat(scale_buckets(scales, k), L)
    numel = rows * cols
    ctx = np.zeros(n, dtype=np.int64)
    pos = np.arange(numel, dtype=np.int64)
    if variant == "row":
        ctx[:numel] = ids[pos // cols]
    elif variant == "col":
        ctx[:numel] = ids[pos % cols]
    else:
        raise ArtifactError(f"unknown rans context {variant!r}")
    return ctx


def item_histograms(sym: np.ndarray, item: np.ndarray, n_items: int, nsym: int) -> np.ndarray:
    """[n_items, nsym] symbol counts of each item (row or column)."""
    hist = np.bincount(item * nsym + sym, minlength=n_items * nsym)
    return hist.reshape(n_items, nsym).astype(np.float64)


def cluster_items(hist: np.ndarray, k: int) -> np.ndarray:
    """Group items into k classes by their symbol histograms (k-means on code length)."""
    n_items, nsym = hist.shape
    tot = np.maximum(hist.sum(axis=1), 1.0)
    # Deterministic start: order items by spread around the global mode.
    mode = int(hist.sum(axis=0).argmax())
    spread = (hist * np.abs(np.arange(nsym) - mode)).sum(axis=1) / tot
    order = np.argsort(spread, kind="stable")
    ids = np.empty(n_items, dtype=np.int64)
    ids[order] = np.arange(n_items) * k // n_items
    eye = np.eye(k)
    # einsum, not @: tiny products where BLAS thread start-up dominates on busy machines.
    for _ in range(8):
        cls = np.einsum("ik,is->ks", eye[ids], hist) + _LOG_PRIOR
        logp = np.log2(cls / cls.sum(axis=1, keepdims=True))
        new = np.einsum("is,ks->ik", hist, -logp).argmin(axis=1)
        if np.array_equal(new, ids):
            break
        ids = new
    # Relabel by first appearance so equal clusterings give equal bytes.
    _, first = np.unique(ids, return_index=True)
    remap = np.zeros(k, dtype=np.int64)
    remap[ids[np.sort(first)]] = np.arange(len(first))
    return remap[ids]


# ----------------------------------------------------------------- coding


def _pack_blob(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=19).compress(raw) if raw else b""


def _unpack_blob(blob: bytes, limit: int) -> bytes:
    if not blob:
        return b""
    try:
        return zstandard.ZstdDecompressor().decompress(blob, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise ArtifactError(f"rans side data: {exc}") from None


def _context_order(ctx: np.ndarray, k: int) -> np.ndarray:
    """Positions grouped by context, in order within each (radix sort on uint8)."""
    if k == 1:
        return np.arange(len(ctx))
    return np.argsort(ctx.astype(np.uint8), kind="stable")


def encode(sym: np.ndarray, ctx: np.ndarray, k: int, nsym: int, ids: np.ndarray | None,
           target: int = TABLE_TOTAL) -> bytes:
    """Encode symbols in [0, nsym) with one table per context id in [0, k)."""
    counts = np.bincount(ctx * nsym + sym, minlength=k * nsym).reshape(k, nsym)
    tables = np.stack([quantize_counts(c, target) for c in counts])
    table_blob = _pack_blob(varint_encode(tables.ravel()))
    ids_blob = _pack_blob(ids.astype(np.uint8).tobytes()) if ids is not None else b""
    coder = constriction.stream.stack.AnsCoder()
    order = _context_order(ctx, k)
    bounds = np.concatenate([[0], np.cumsum(counts.sum(axis=1))])
    sorted_sym = sym[order].astype(np.int32)
    # Stack coder: encode the last context first so decoding runs in context order.
    for c in range(k - 1, -1, -1):
        part = sorted_sym[bounds[c] : bounds[c + 1]]
        if part.size and nsym > 1:  # a one-symbol alphabet costs no bits
            model = constriction.stream.model.Categorical(tables[c].astype(np.float64), perfect=False)
            coder.encode_reverse(part, model)
    words = coder.get_compressed().astype("<u4").tobytes()
    return struct.pack("<II", len(table_blob), len(ids_blob)) + table_blob + ids_blob + words


def split_body(body: bytes, k: int, nsym: int, n_ids: int) -> tuple[np.ndarray, np.ndarray | None, bytes]:
    """Parse a rans stream body into (tables [k, nsym], ids or None, words)."""
    if len(body) < 8:
        raise ArtifactError("rans stream shorter than its header")
    tlen, ilen = struct.unpack_from("<II", body, 0)
    if 8 + tlen + ilen > len(body) or (len(body) - 8 - tlen - ilen) % 4:
        raise ArtifactError("rans stream lengths disagree with the stream size")
    tables = varint_decode(_unpack_blob(body[8 : 8 + tlen], 5 * k * nsym), k * nsym).reshape(k, nsym)
    ids = None
    if n_ids:
        raw = _unpack_blob(body[8 + tlen : 8 + tlen + ilen], n_ids)
        ids = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
        if len(ids) != n_ids or (ids.size and ids.max() >= k):
            raise ArtifactError("rans class ids do not match the declared classes")
    elif ilen:
        raise ArtifactError("rans stream has class ids it does not declare")
    return tables, ids, body[8 + tlen + ilen :]


def decode(tables: np.ndarray, ctx: np.ndarray, words: bytes, nsym: int) -> np.ndarray:
    """Decode len(ctx) symbols given each position's context id."""
    k = tables.shape[0]
    counts = np.bincount(ctx, minlength=k)
    out_sorted = np.empty(len(ctx), dtype=np.int32)
    coder = constriction.stream.stack.AnsCoder(np.frombuffer(words, dtype="<u4").astype(np.uint32))
    start = 0
    for c in range(k):
        n = int(counts[c])
        if not n:
            continue
        if nsym == 1:
            out_sorted[start : start + n] = 0
            start += n
            continue
        if tables[c].sum() <= 0:
            raise ArtifactError("rans table is empty for a context that has symbols")
        model = constriction.stream.model.Categorical(tables[c].astype(np.float64), perfect=False)
        out_sorted[start : start + n] = coder.decode(model, n)
        start += n
    out = np.empty_like(out_sorted)
    out[_context_order(ctx, k)] = out_sorted
    return out
