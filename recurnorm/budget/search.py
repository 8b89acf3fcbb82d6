"""How a rans stream is coded: its context, classes, tuple size and table precision.

`choose(sym, nsym, geometry)` scores every candidate by an estimate of its
bytes: order-0; the code row's scale bucket; row or column classes of the
tensor's 2-D view (k-means on code length), each for several class counts k.
Candidates are built and scored together, vectorized across k and across
table precisions, because on small tensors numpy's per-call overhead, not
arithmetic, is what a search spends. Only the leaders are scored at every
precision, and only the finalists get their side data (tables, class ids)
compacted for real. `EFFORTS` sets how wide it looks.

Counts of big streams come from a strided sample (scaled up): they only rank
the candidates; the encoder counts the chosen one exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import rans

PRECS = (8, 10, 12, 14, 16)
FIRST_PREC = 12  # the first pass scores every candidate at this one precision
FIT_SLOTS = 2  # a table needs this many slots per used symbol (but the finest is always tried)
MIN_CONTEXT_SYMBOLS = 4096  # below this, contexts never pay for their tables
MID_SYMBOLS = 1 << 15  # from here on Effort.ks are tried (below: Effort.small_ks)
BIG_SYMBOLS = 1 << 17  # from here on: fewer k trials, side data by proxy (tables are cheap)
SEARCH_SAMPLE = 1 << 20  # the context search looks at about this many positions
TUPLE_SYMBOLS = 1 << 20  # from here on small alphabets code joint tuples
CLUSTER_MAX_CELLS = 1 << 23  # items x alphabet for the histogram matrix
KMEANS_ITEMS = 256  # cluster on at most this many items, then assign all
KMEANS_BINS = 16  # k-means compares items over at most this many symbol bins
HEADER_BYTES = 8  # the compact header's two varints, about
_LOG_PRIOR = 0.5  # add-half prior when estimating class costs


@dataclass(frozen=True)
class Effort:
    """How hard the search looks: class counts tried, candidates kept, k-means iterations."""

    small_ks: tuple[int, ...]  # streams below MID_SYMBOLS
    ks: tuple[int, ...]
    big_ks: tuple[int, ...]  # streams from BIG_SYMBOLS on
    leaders: int  # candidates scored at every precision
    finalists: int  # (candidate, precision) pairs whose side data is compacted for real
    kmeans_iters: int


EFFORTS = {
    # Measured on trained checkpoints: below 32K codes a second table is all a context
    # can pay for; big streams have cheap tables, so more classes win there; 4 k-means
    # iterations find the classes 8 do.
    "normal": Effort(small_ks=(2,), ks=(2, 4, 8, 16), big_ks=(4, 16), leaders=3, finalists=3,
                     kmeans_iters=4),
    # The last bytes under a hard cap: every k everywhere, every candidate scored fully.
    "max": Effort(small_ks=(2, 4, 8, 16), ks=(2, 4, 8, 16), big_ks=(2, 4, 8, 16), leaders=64,
                  finalists=8, kmeans_iters=8),
}


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

    def context_vector(self, variant: str, k: int, ids, step: int = 1, dtype=np.int64) -> np.ndarray:
        """Context id of positions 0, step, 2*step, ..."""
        return rans.context_vector(variant, k, self.n, self.rows, self.cols, self.row_len,
                                   self.scales, ids, step, dtype)


@dataclass(frozen=True)
class Candidate:
    """One way to split a stream into contexts, with its (maybe sampled) unit counts."""

    variant: str  # none | scale | row | col
    k: int
    t: int  # symbols per coded unit
    counts: np.ndarray  # [k, nsym**t]
    ids: np.ndarray | None = None  # class of each row / column


@dataclass(frozen=True)
class Choice:
    """What the encoder does: the context, its classes, the unit size and table precision."""

    variant: str
    k: int
    t: int
    ids: np.ndarray | None
    prec: int
    lanes: int
    cost: float  # estimated bytes


# ----------------------------------------------------------------- clustering


def axis_histograms(part: np.ndarray, axis: int, nsym: int) -> np.ndarray:
    """[items, nsym] symbol counts of each row (axis 0) or column (axis 1) of a 2-D array."""
    n_items = part.shape[axis]
    base = np.arange(n_items, dtype=np.int64) * nsym
    idx = part + (base[:, None] if axis == 0 else base[None, :])
    hist = np.bincount(idx.ravel(), minlength=n_items * nsym)
    return hist.reshape(n_items, nsym).astype(np.float32)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b via einsum: BLAS thread start-up thrashes busy machines, and einsum's bits never vary."""
    return np.einsum("ij,jk->ik", a, b)


def class_sums(hist: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """[k, nsym] sums of the item histograms in each class."""
    # Sort + reduceat: no BLAS (thread start-up thrashes busy machines), no slow ufunc.at.
    order = np.argsort(ids, kind="stable")
    sizes = np.bincount(ids, minlength=k)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    out = np.zeros((k, hist.shape[1]), dtype=hist.dtype)
    full = sizes > 0
    if full.any():
        out[full] = np.add.reduceat(hist[order], starts[full], axis=0)
    return out


def spread_order(hist: np.ndarray) -> np.ndarray:
    """Items ordered by their spread around the global mode (a cheap 1-D summary of a histogram)."""
    nsym = hist.shape[1]
    mode = int(hist.sum(axis=0).argmax())
    tot = np.maximum(hist.sum(axis=1), 1.0)
    spread = (hist @ np.abs(np.arange(nsym) - mode).astype(hist.dtype)) / tot
    return np.argsort(spread, kind="stable")


def ranked_class_sums(hist: np.ndarray, order: np.ndarray, ks) -> list[np.ndarray]:
    """class_sums of rans.rank_buckets(order, k) for every k at once: runs are contiguous in order."""
    n = len(order)
    run = np.zeros((n + 1, hist.shape[1]))
    np.cumsum(hist[order], axis=0, out=run[1:])
    out = []
    for k in ks:
        bounds = -(-np.arange(k + 1) * n // k)  # first rank of each run: ceil(j * n / k)
        out.append(np.diff(run[bounds], axis=0))
    return out


def coarse_bins(hist: np.ndarray, bins: int | None = None) -> np.ndarray:
    """Histograms over at most `bins` runs of adjacent symbols of about equal total mass.

    Clustering compares code lengths; the rare tail symbols of a wide alphabet carry
    little of them, so merging those costs little and makes k-means `nsym / bins` faster.
    """
    nsym, bins = hist.shape[1], bins or KMEANS_BINS
    if nsym <= bins:
        return hist
    mass = np.cumsum(hist.sum(axis=0))
    cuts = np.searchsorted(mass, mass[-1] * np.arange(1, bins) / bins, side="right")
    edges = np.unique(np.concatenate([[0], cuts]))
    return np.add.reduceat(hist, edges[edges < nsym], axis=1)


def cluster_items(hist: np.ndarray, ks, iters: int = 4) -> list[np.ndarray]:
    """Group items into k classes by their symbol histograms, for every k in ks.

    k-means on code length, started from spread-ranked classes (deterministic), over
    coarse symbol bins; all ks share one assignment product per iteration, since on
    small tensors the number of numpy calls, not their size, is what costs.
    """
    n_items = hist.shape[0]
    ks = list(ks)
    K, C = len(ks), sum(ks)
    order = spread_order(hist)
    ids = np.stack([rans.rank_buckets(order, k) for k in ks])  # [K, n_items]
    coarse = coarse_bins(hist)
    first = np.cumsum([0] + ks[:-1])[:, None]  # first centroid of each k
    # Many items: iterate on an evenly strided sample, then assign every item once.
    sample = np.arange(0, n_items, max(1, n_items // KMEANS_ITEMS))
    sub, sid = coarse[sample], ids[:, sample]
    stacked = np.tile(sub, (K, 1))

    def assign(h: np.ndarray, logp: np.ndarray) -> np.ndarray:
        cost = _matmul(h, -logp.T)
        return np.stack([cost[:, a : a + k].argmin(axis=1) for a, k in zip(first[:, 0], ks, strict=True)])

    logp = None
    for _ in range(iters):
        cls = class_sums(stacked, (sid + first).ravel(), C) + _LOG_PRIOR
        logp = np.log2(cls / cls.sum(axis=1, keepdims=True))
        new = assign(sub, logp)
        if np.array_equal(new, sid):
            break
        sid = new
    if len(sample) == n_items:
        ids = sid
    elif logp is not None:
        ids = assign(coarse, logp)
    out = []
    for k, row in zip(ks, ids, strict=True):  # relabel by first appearance so equal clusterings give equal bytes
        _, at = np.unique(row, return_index=True)
        remap = np.zeros(k, dtype=np.int64)
        remap[row[np.sort(at)]] = np.arange(len(at))
        out.append(remap[row])
    return out


# ----------------------------------------------------------------- candidates


def _stride_for(numel: int) -> int:
    """Sampling stride that keeps the context search near SEARCH_SAMPLE positions."""
    return max(1, numel // SEARCH_SAMPLE)


class _Stream:
    """One stream's symbols, and what its candidates share: unit views, totals, histograms."""

    def __init__(self, sym: np.ndarray, nsym: int, geo: Geometry):
        self.sym, self.nsym, self.geo = sym, nsym, geo
        self._units: dict[int, np.ndarray] = {}
        self._totals: dict[int, np.ndarray] = {}
        self._hists: dict[str, tuple[np.ndarray, float]] = {}

    def tuples(self, t: int) -> np.ndarray:
        if t not in self._units:
            self._units[t] = rans.to_tuples(self.sym, self.nsym, t)
        return self._units[t]

    def total(self, t: int) -> np.ndarray:
        """Exact counts of the units of t symbols."""
        if t not in self._totals:
            self._totals[t] = np.bincount(self.tuples(t), minlength=self.nsym ** t)
        return self._totals[t]

    def histograms(self, family: str) -> tuple[np.ndarray, float]:
        """(item histograms, sample -> whole factor): code rows ("scale"), tensor rows or columns.

        The other axis is sampled down to about SEARCH_SAMPLE positions; every item keeps a
        share of its own positions. Code rows that are the tensor's rows are counted once.
        """
        geo = self.geo
        if family == "scale":
            view, axis = (geo.code_rows, geo.row_len), 0
            if view == (geo.rows, geo.cols) and geo.matrix:
                family = "row"
        else:
            view, axis = (geo.rows, geo.cols), 0 if family == "row" else 1
        if family not in self._hists:
            numel = view[0] * view[1]
            stride = _stride_for(numel)
            mat = self.sym[:numel].reshape(view)
            part = mat[:, ::stride] if axis == 0 else mat[::stride]
            self._hists[family] = (axis_histograms(part, axis, self.nsym), numel / part.size)
        return self._hists[family]

    def unit_counts(self, t: int, variant: str, k: int, ids) -> np.ndarray:
        """[k, nsym**t] counts of coded units per context, from every us-th unit (scaled)."""
        tsym, nt = self.tuples(t), self.nsym ** t
        us = max(1, tsym.size // (SEARCH_SAMPLE // 2))
        cvec = self.geo.context_vector(variant, k, ids, t * us)
        counts = np.bincount(cvec * nt + tsym[::us], minlength=k * nt).reshape(k, nt)
        return counts * (tsym.size / len(cvec))

    def class_counts(self, sums: np.ndarray, scale: float) -> np.ndarray:
        """Row/col class counts (scaled up from the sample) plus the padding codes, which sit
        in context 0 (positions past numel)."""
        counts = sums * scale
        counts[0] = np.maximum(counts[0] + self.total(1) - counts.sum(axis=0), 0)
        return counts


def candidates(stream: _Stream, t: int, effort: Effort = EFFORTS["normal"]) -> list[Candidate]:
    """Every context worth scoring for units of t symbols."""
    sym, nsym, geo = stream.sym, stream.nsym, stream.geo
    out = [Candidate("none", 1, t, stream.total(t)[None, :].astype(np.float64))]
    if sym.size < MIN_CONTEXT_SYMBOLS or nsym < 2:
        return out
    ks = (effort.big_ks if sym.size >= BIG_SYMBOLS else effort.small_ks if sym.size < MID_SYMBOLS
          else effort.ks)
    G, scales = geo.code_rows, geo.scales
    if scales is not None and G >= 4 and len(scales) == G and G * nsym <= CLUSTER_MAX_CELLS:
        kk = [k for k in ks if k < G]
        if t == 1:
            ghist, scale = stream.histograms("scale")
            sums = ranked_class_sums(ghist, rans.scale_order(scales), kk)
            out += [Candidate("scale", k, t, c * scale) for k, c in zip(kk, sums, strict=True)]
        else:
            out += [Candidate("scale", k, t, stream.unit_counts(t, "scale", k, None)) for k in kk]
    numel = geo.rows * geo.cols
    if numel == 0 or numel > sym.size or not geo.matrix:
        return out
    for variant, n_items in (("row", geo.rows), ("col", geo.cols)):
        if n_items < 4 or n_items * nsym > CLUSTER_MAX_CELLS or n_items > 255 * 4096:
            continue
        hist, scale = stream.histograms(variant)
        kk = [k for k in ks if k < n_items]
        for k, ids in zip(kk, cluster_items(hist, kk, effort.kmeans_iters), strict=True):
            counts = (stream.class_counts(class_sums(hist, ids, k), scale) if t == 1
                      else stream.unit_counts(t, variant, k, ids))
            out.append(Candidate(variant, k, t, counts, ids))
    return out


# ----------------------------------------------------------------- scoring


def _varint_bytes(v: np.ndarray) -> np.ndarray:
    """LEB128 length of each non-negative value (< 2**35)."""
    return 1 + (v >= 1 << 7) + (v >= 1 << 14) + (v >= 1 << 21) + (v >= 1 << 28)


@dataclass(frozen=True)
class Scores:
    """Estimated bytes of candidates [C] at table precisions [P], by part."""

    payload: np.ndarray  # [P, C] coded units under the normalized tables
    side: np.ndarray  # [P, C] proxy: raw varint tables (0.75 x on big streams), log2(k) bits per id
    lanes: np.ndarray  # [P, C]
    fits: np.ndarray  # [P, C] every used symbol has a table slot

    def total(self) -> np.ndarray:
        return np.where(self.fits, self.payload + self.side + 4 * self.lanes + HEADER_BYTES, np.inf)


def score(cands: list[Candidate], units: int, precs, big: bool) -> Scores:
    """All candidates' rows at every precision in one vectorized pass."""
    counts = np.concatenate([c.counts for c in cands])
    starts = np.cumsum([0] + [c.counts.shape[0] for c in cands[:-1]])
    icounts = np.rint(counts).astype(np.int64)
    used_rows = (icounts > 0).sum(axis=1)
    P, R = len(precs), len(counts)
    prec_rows = np.repeat(np.asarray(precs, dtype=np.int64), R)
    m = np.left_shift(1, prec_rows)
    tiled = np.tile(icounts, (P, 1))
    # Tables under 2 slots per used symbol squeeze the tails and lose (and cost the most to
    # normalize): left empty here, and their candidate is marked unfit below.
    finest = prec_rows == precs[-1]
    tiled[(np.tile(used_rows, P) * np.where(finest, 1, FIT_SLOTS)) > m] = 0
    tables = rans.normalize_table(tiled, prec_rows)
    with np.errstate(divide="ignore"):
        logp = np.log2(np.where(tables > 0, tables, 1) / m[:, None])
    bits = -(np.tile(counts, (P, 1)) * np.where(tables > 0, logp, -30.0)).sum(axis=1)
    offsets = (np.arange(P)[:, None] * R + starts[None, :]).ravel()
    payload = np.add.reduceat(bits, offsets).reshape(P, -1) / 8
    tbytes = np.add.reduceat(_varint_bytes(tables).sum(axis=1), offsets).reshape(P, -1)
    id_bytes = np.array([0.0 if c.ids is None else len(c.ids) * np.log2(c.k) / 8 for c in cands])
    side = tbytes * (0.75 if big else 1.0) + id_bytes[None, :]
    lanes = np.array([[rans.choose_lanes(units, p) for p in row] for row in payload], dtype=np.int64)
    used = np.maximum.reduceat(used_rows, starts)
    fits = used[None, :] * FIT_SLOTS <= np.left_shift(1, np.asarray(precs, dtype=np.int64))[:, None]
    fits[-1] |= used <= 1 << precs[-1]  # the finest table is always allowed
    return Scores(payload, side, lanes, fits)


def side_bytes(c: Candidate, prec: int) -> int:
    """Measured side data: the compacted table and class ids, as the encoder writes them."""
    tables = rans.normalize_table(np.rint(c.counts).astype(np.int64), prec)
    n = len(rans._pack_compact(rans.varint_encode(tables.ravel()))[0])
    if c.ids is not None:
        n += len(rans._pack_compact(c.ids.astype(np.uint8).tobytes())[0])
    return n


def tuple_size(nsym: int, n: int) -> int:
    """Symbols per coded unit: huge small-alphabet streams code joint tuples (fewer steps).

    Tuples model no dependence the contexts miss, and their tables cost more; they pay
    only where the table is negligible, and they make the numpy fallback usable there.
    """
    if n < TUPLE_SYMBOLS or nsym < 2:
        return 1
    t = 1
    while t < 8 and nsym ** (t + 1) <= 256:
        t += 1
    return t


def choose(sym: np.ndarray, nsym: int, geo: Geometry, effort: str = "normal") -> Choice:
    """The cheapest coding found for symbols in [0, nsym) laid out as `geo` says."""
    how = EFFORTS[effort]
    stream = _Stream(sym, nsym, geo)
    t = tuple_size(nsym, sym.size)
    units = -(-sym.size // t)
    big = units >= BIG_SYMBOLS
    cands = candidates(stream, t, how)
    # First pass at one precision; every precision for the leaders only.
    leaders = cands
    if len(cands) > how.leaders:
        first = score(cands, units, (FIRST_PREC,), big).total()[0]
        leaders = [cands[i] for i in np.argsort(first, kind="stable")[: how.leaders]]
    s = score(leaders, units, PRECS, big)
    total = s.total()
    pairs = sorted((float(total[j, i]), i, j) for i in range(len(leaders)) for j in range(len(PRECS))
                   if np.isfinite(total[j, i]))
    best = None
    for cost, i, j in pairs[: how.finalists] if not big else pairs[:1]:
        fixed = float(s.payload[j, i]) + 4 * int(s.lanes[j, i]) + HEADER_BYTES
        if not big:  # small streams: side data decides close calls, so measure it
            if best is not None and fixed >= best[0]:
                continue  # loses even with free side data
            cost = fixed + side_bytes(leaders[i], PRECS[j])
        if best is None or (cost, i, j) < best[:3]:
            best = (cost, i, j)
    cost, i, j = best
    c = leaders[i]
    return Choice(c.variant, c.k, c.t, c.ids, PRECS[j], int(s.lanes[j, i]), cost)
