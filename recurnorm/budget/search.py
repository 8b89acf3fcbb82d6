"""How a rans stream is coded: its context, classes, tuple size and table precision.

`plan(jobs)` scores every candidate of every stream by an estimate of its bytes: order-0,
the code row's scale bucket, row or column classes of the tensor's 2-D view (cluster.py) at
several class counts k, and grids of row x column classes where rows and columns each pay
(class contexts code single symbols: a tuple spans columns of different classes). A model's
streams are searched together, vectorized across streams, k and precisions: on small tensors
numpy's per-call overhead is what a search spends. A first pass ranks candidates by ideal code
lengths (a family's larger k only where its second k beat its first: `deeper`); the leaders
are scored at every precision, and the finalists' side data made for real, which the encoder
writes as is. `Effort` sets how wide it looks. Big matrices also get block and map
candidates (`block_choice`, `map_choice`) to race beside the plan. Counts of big streams'
units come from a strided sample (the same with or without the kernel): they only rank the
candidates; the encoder counts the chosen one exactly."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from . import compress, kernel, rans, spec
from .cluster import axis_histograms, class_sums_all, cluster_many, ranked_class_sums
from .rans import Geometry

PRECS = (8, 10, 12, 14, 16)
FIRST_PREC = 12  # the first pass prices every candidate's tables at this one precision
FIT_SLOTS = 2  # a table needs this many slots per used symbol (but the finest is always tried)
MIN_CONTEXT_SYMBOLS = 4096  # below this, contexts never pay for their tables
MID_SYMBOLS = 1 << 15  # from here on Effort.ks are tried (below: Effort.small_ks)
BIG_SYMBOLS = 1 << 17  # from here on: fewer k trials, side data by proxy (tables are cheap)
SEARCH_SAMPLE = 1 << 20  # the context search looks at about this many positions
TUPLE_SYMBOLS = 1 << 20  # from here on small alphabets code joint tuples
CLUSTER_MAX_CELLS = 1 << 23  # items x alphabet for the histogram matrix
HEADER_BYTES = 8  # the compact header's two varints, about
SWEEP_FIRST = 2  # class counts each context family tries before `deeper` looks at the trend


@dataclass(frozen=True)
class Effort:
    """How hard the search looks: class counts tried, candidates kept, k-means iterations. The
    defaults are effort normal's (options.py holds max's), measured on trained checkpoints: below
    32K codes a second table is all a context can pay for, and with fewer than 128 codes per symbol
    not even that (0 of 32 int8 tensors of 16K codes took one); big streams have cheap tables, so
    more classes win there; 4 k-means iterations find the classes 8 do. 32 classes on big streams:
    a real token embedding (all-MiniLM-L6-v2, 30522 x 384 ternary) wants 32 column classes (sign
    lean x density) under 8 row classes: 0.963 of its order-0 bound, ids and tables counted."""

    small_ks: tuple[int, ...] = (2,)  # streams below MID_SYMBOLS
    ks: tuple[int, ...] = (2, 4, 8, 16)
    big_ks: tuple[int, ...] = (4, 8, 16, 32)  # streams from BIG_SYMBOLS on
    leaders: int = 3  # candidates scored at every precision
    finalists: int = 3  # (candidate, precision) pairs whose side data is compacted for real
    kmeans_iters: int = 4
    per_symbol: int = 128  # contexts are tried on streams of at least this many codes per alphabet symbol
    all_grids: bool = False  # grid contexts from every row k x column k (else the `grids` most promising)
    sweep: bool = True  # each family's first SWEEP_FIRST ks, the rest only where more classes paid (else all)
    grids: int = 3


@dataclass(frozen=True)
class Candidate:
    """One way to split a stream into contexts, with its (maybe sampled) unit counts."""

    variant: str  # none | scale | row | col | grid
    k: int
    t: int  # symbols per coded unit
    counts: np.ndarray  # [k, nsym**t]
    ids: np.ndarray | None = None  # class of each row / column (grid: the rows', then the columns')
    kc: int = 1  # grid: column classes (k = row classes * kc)
    rows: int = 0  # grid: how many of ids are the rows'

    def id_bytes(self) -> float:
        """What storing the class ids costs at best (log2 of the class count each)."""
        if self.ids is None:
            return 0.0
        if self.variant == "grid":
            return (self.rows * np.log2(self.k // self.kc) + (len(self.ids) - self.rows) * np.log2(self.kc)) / 8
        return len(self.ids) * np.log2(self.k) / 8


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
    side: SideData | None = None  # measured side data, when the search counted exactly
    kc: int = 1  # grid: column classes; block: rows per block


# ----------------------------------------------------------------- candidates


class Stream:
    """One stream's symbols, and what its candidates share: unit views, totals, histograms."""

    def __init__(self, sym: np.ndarray, nsym: int, geo: Geometry, total: np.ndarray | None = None):
        self.sym, self.nsym, self.geo = sym, nsym, geo
        self.t = tuple_size(nsym, sym.size)
        self.units = -(-sym.size // self.t)
        self.big = self.units >= BIG_SYMBOLS
        # exact counts: the histograms count every position, and unit_counts samples none
        self.exact = not self.big or sym.size < SEARCH_SAMPLE
        self._units: dict[int, np.ndarray] = {}
        self._totals: dict[int, np.ndarray] = {} if total is None else {1: total}  # (the caller's exact counts)
        self._hists: dict[str, np.ndarray] = {}

    def tuples(self, t: int) -> np.ndarray:
        """The units of t symbols, as uint16 (unit alphabets are at most 4096)."""
        if t not in self._units:
            self._units[t] = self.sym16 if t == 1 else rans.to_tuples(self.sym, self.nsym, t)
        return self._units[t]

    def total(self, t: int) -> np.ndarray:
        """Exact counts of the units of t symbols."""
        if t not in self._totals:
            self._totals[t] = rans.context_counts(self.tuples(t), None, 1, self.nsym**t)[0]
        return self._totals[t]

    def histograms(self, family: str) -> np.ndarray:
        """Item histograms of code rows ("scale"), tensor rows or columns (code rows that are the
        tensor's rows are counted once)."""
        geo = self.geo
        if family == "scale":
            view, axis = (geo.code_rows, geo.row_len), 0
            if view == (geo.rows, geo.cols) and geo.matrix:
                family = "row"
        else:
            view, axis = (geo.rows, geo.cols), 0 if family == "row" else 1
        if family not in self._hists:  # every position counted, by the kernel or its reference alike:
            # sampled rows of a wide embedding keep too few positions each to tell their classes apart
            if kernel.on():  # (into float32 [items, nsym]; the 1: every position along the other axis)
                hist = np.zeros((view[axis], self.nsym), dtype=np.float32)
                kernel.c.histograms(self.sym16, *view, self.nsym, axis, 1, hist)
            else:
                hist = axis_histograms(self.sym[: view[0] * view[1]].reshape(view), axis, self.nsym)
            self._hists[family] = hist
        return self._hists[family]

    @cached_property
    def sym16(self) -> np.ndarray:
        """The symbols as uint16, the compiled kernel's input (alphabets are at most 4096)."""
        return np.ascontiguousarray(self.sym, dtype=np.uint16)

    def unit_counts(self, t: int, variant: str, k: int, ids, kc: int = 1) -> np.ndarray:
        """[k, nsym**t] counts of coded units per context, from every us-th unit (scaled;
        exact below SEARCH_SAMPLE // 2 units)."""
        tsym, nt = self.tuples(t), self.nsym**t
        us = max(1, tsym.size // (SEARCH_SAMPLE // 2))
        # uint8 ids (k <= 256) and uint16 units: one pass of the kernel, no int64 index
        cvec = self.geo.context_vector(variant, k, ids, t * us, np.uint8, kc=kc)
        counts = rans.context_counts(tsym[::us], cvec, k, nt)
        return counts * (tsym.size / len(cvec))

    def class_counts(self, sums: list[np.ndarray]) -> list[np.ndarray]:
        """Row/col class counts of several clusterings plus the padding codes, which sit in
        context 0 (positions past numel): a few array calls for all of them."""
        counts = np.concatenate(sums)
        firsts = np.cumsum([0] + [len(c) for c in sums[:-1]])
        counts[firsts] = np.maximum(counts[firsts] + self.total(1) - np.add.reduceat(counts, firsts, axis=0), 0)
        return np.split(counts, firsts[1:])


def _families(st: Stream, ks) -> dict[str, list[int]]:
    """The class counts k each context family (scale, row, col) can take on this stream."""
    geo, out = st.geo, {}
    G, scales = geo.code_rows, geo.scales
    if scales is not None and G >= 4 and len(scales) == G and G * st.nsym <= CLUSTER_MAX_CELLS:
        out["scale"] = [k for k in ks if k < G]
    numel = geo.rows * geo.cols
    if numel == 0 or numel > st.sym.size or not geo.matrix:
        return out
    for variant, n_items in (("row", geo.rows), ("col", geo.cols)):
        if n_items >= 4 and n_items * st.nsym <= CLUSTER_MAX_CELLS and n_items <= 255 * 4096:
            out[variant] = [k for k in ks if k < n_items]
    return {f: kk for f, kk in out.items() if kk}


def candidates_many(
    streams: list[Stream], effort: Effort = Effort()
) -> tuple[list[list[Candidate]], dict[tuple[int, str], list[int]]]:
    """Every stream's first candidates: order-0, and each context family (scale buckets,
    row/col classes) at its first class counts; with the class counts held back for
    `deeper` (every k at once where the effort does not sweep)."""
    out, first, later = [], {}, {}
    for j, st in enumerate(streams):
        out.append([Candidate("none", 1, st.t, st.total(st.t)[None, :].astype(np.float64))])
        if st.sym.size < max(MIN_CONTEXT_SYMBOLS, effort.per_symbol * st.nsym) or st.nsym < 2:
            continue
        size = st.sym.size
        ks = effort.big_ks if size >= BIG_SYMBOLS else effort.small_ks if size < MID_SYMBOLS else effort.ks
        for family, kk in _families(st, ks).items():
            cut = SWEEP_FIRST if effort.sweep else len(kk)
            first[j, family] = kk[:cut]
            if kk[cut:]:
                later[j, family] = kk[cut:]
    for j, cands in family_candidates(streams, first, effort).items():
        out[j] += cands
    return out, later


def deeper(
    pools: dict[int, list[Candidate]], rough: dict[int, np.ndarray], later: dict[tuple[int, str], list[int]]
) -> dict[tuple[int, str], list[int]]:
    """The held-back class counts of the families where more classes paid: their second k
    ranked under their first. Code length against table cost is near convex in k, so where
    doubling k already lost, more classes lose too (measured: no family of a benchmark case
    whose chosen k or grid axis lay past such a loss)."""

    def best(j: int, family: str, k: int) -> float:
        return min(r for c, r in zip(pools[j], rough[j], strict=True) if c.variant == family and c.k == k)

    out = {}
    for (j, family), kk in later.items():
        tried = sorted({c.k for c in pools.get(j, ()) if c.variant == family})
        if len(tried) >= 2 and best(j, family, tried[1]) < best(j, family, tried[0]):
            out[j, family] = kk
    return out


def family_candidates(
    streams: list[Stream], wanted: dict[tuple[int, str], list[int]], effort: Effort
) -> dict[int, list[Candidate]]:
    """Candidates of the (stream, family) pairs asked for, at the ks asked for. The row/col
    clusterings of all of them run as one batch (cluster_many)."""
    out: dict[int, list[Candidate]] = {j: [] for j, _ in wanted}
    problems = []
    for (j, family), kk in wanted.items():
        st = streams[j]
        if family != "scale":
            problems.append((j, family, st.histograms(family), kk))
        elif st.t == 1:
            sums = ranked_class_sums(st.histograms("scale"), st.geo.scale_order, kk)
            out[j] += [Candidate("scale", k, 1, c) for k, c in zip(kk, sums, strict=True)]
        else:
            out[j] += [Candidate("scale", k, st.t, st.unit_counts(st.t, "scale", k, None)) for k in kk]
    clusterings = cluster_many([p[2] for p in problems], [p[3] for p in problems], effort.kmeans_iters)
    for (j, variant, hist, kk), idsets in zip(problems, clusterings, strict=True):
        st = streams[j]
        # Single symbols always (tuples span several columns, so a column's class would
        # describe only a tuple's first symbol): from the histograms, no pass over the stream.
        counts = st.class_counts(class_sums_all(hist, idsets, kk))
        out[j] += [Candidate(variant, k, 1, c, ids) for k, c, ids in zip(kk, counts, idsets, strict=True)]
        if st.t > 1:
            counts = [st.unit_counts(st.t, variant, k, ids) for k, ids in zip(kk, idsets, strict=True)]
            out[j] += [Candidate(variant, k, st.t, c, ids) for k, c, ids in zip(kk, counts, idsets, strict=True)]
    return out


# ----------------------------------------------------------------- scoring


def _coder_bytes(payload, lanes):
    """Payload plus what the coder adds to it: 4 flush bytes a lane and the compact header."""
    return payload + 4 * lanes + HEADER_BYTES


@dataclass(frozen=True)
class Scores:
    """Estimated bytes of candidates [C] at table precisions [P], by part."""

    payload: np.ndarray  # [P, C] coded units under the normalized tables
    side: np.ndarray  # [P, C] proxy: raw varint tables (0.75 x on big streams), log2(k) bits per id
    lanes: np.ndarray  # [P, C]
    fits: np.ndarray  # [P, C] every used symbol has a table slot
    tables: np.ndarray  # the normalized tables of every candidate row at each fitting precision
    row_of: np.ndarray  # [P, C] where candidate c's rows at precision p start in tables (-1: none)

    def table(self, p: int, c: int, cand: Candidate) -> np.ndarray:
        """Candidate c's normalized [k, nsym**t] table at precision index p."""
        r = self.row_of[p, c]
        return self.tables[r : r + cand.counts.shape[0], : cand.counts.shape[1]]

    def fixed(self) -> np.ndarray:
        """The bytes that do not depend on how the side data compresses."""
        return _coder_bytes(self.payload, self.lanes)

    def total(self) -> np.ndarray:
        return np.where(self.fits, self.fixed() + self.side, np.inf)


def _stacked_counts(cands: list[Candidate]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(all candidates' count rows, zero-padded to one width; first row of each; row widths)."""
    rows = [c.counts.shape[0] for c in cands]
    starts = np.cumsum([0] + rows[:-1])
    width = max(c.counts.shape[1] for c in cands)
    counts = np.zeros((sum(rows), width))
    for c, a in zip(cands, starts, strict=True):
        counts[a : a + c.counts.shape[0], : c.counts.shape[1]] = c.counts
    widths = np.repeat([c.counts.shape[1] for c in cands], rows)
    return counts, starts, widths


def rough_total(cands: list[Candidate], units, big) -> np.ndarray:
    """Estimated bytes of each candidate for the first pass: ideal code lengths of its counts
    plus its tables' varints at FIRST_PREC (no table normalization: that is for the leaders)."""
    counts, starts, widths = _stacked_counts(cands)
    tot = counts.sum(axis=1)
    # sum c log2(T / c) = T log2 T - sum c log2 c (counts below 1, from scaled samples, count as 1)
    bits = tot * np.log2(np.maximum(tot, 1)) - (counts * np.log2(np.maximum(counts, 1))).sum(axis=1)
    # A slot count of at least 128 takes a second varint byte (FIRST_PREC < 14: never a third).
    two_byte = ((counts > 0) & (counts >= (127.5 / (1 << FIRST_PREC)) * tot[:, None])).sum(axis=1)
    tbytes = np.add.reduceat(widths + two_byte, starts)
    payload = np.add.reduceat(bits, starts) / 8
    id_bytes = np.array([c.id_bytes() for c in cands])
    lanes = rans.lanes_for(np.asarray(units, dtype=np.int64), payload)
    return _coder_bytes(payload, lanes) + tbytes * np.where(big, 0.75, 1.0) + id_bytes


def score(cands: list[Candidate], units, precs, big) -> Scores:
    """All candidates' rows at every precision in one vectorized pass.

    units, big: each candidate's stream size in coded units and whether it is big
    (one value for all, or one per candidate: candidates of many streams score together).
    """
    units = np.broadcast_to(np.asarray(units, dtype=np.int64), (len(cands),))
    big = np.broadcast_to(np.asarray(big, dtype=bool), (len(cands),))
    counts, starts, widths = _stacked_counts(cands)
    icounts = np.rint(counts).astype(np.int64)
    used_rows = (icounts > 0).sum(axis=1)
    used = np.maximum.reduceat(used_rows, starts)
    all_precs = np.asarray(precs, dtype=np.int64)
    fits = used[None, :] * FIT_SLOTS <= np.left_shift(1, all_precs)[:, None]
    fits[-1] |= used <= 1 << precs[-1]  # the finest table is always allowed
    live = np.flatnonzero(fits.any(axis=1))  # precisions no candidate fits are not computed
    precs = all_precs[live]
    P, R = len(precs), len(counts)
    prec_rows = np.repeat(precs, R)
    m = np.left_shift(1, prec_rows)
    tiled = np.tile(icounts, (P, 1))
    # Tables under 2 slots per used symbol squeeze the tails and lose (and cost the most to
    # normalize): left empty here, and their candidate is marked unfit.
    finest = prec_rows == all_precs[-1]
    tiled[(np.tile(used_rows, P) * np.where(finest, 1, FIT_SLOTS)) > m] = 0
    tables = rans.normalize_table(tiled, prec_rows)
    with np.errstate(divide="ignore"):
        logp = np.log2(np.where(tables > 0, tables, 1) / m[:, None])
    bits = -(np.tile(counts, (P, 1)) * np.where(tables > 0, logp, -30.0)).sum(axis=1)
    offsets = (np.arange(P)[:, None] * R + starts[None, :]).ravel()
    payload = np.full(fits.shape, np.inf)
    payload[live] = np.add.reduceat(bits, offsets).reshape(P, -1) / 8
    pad = tables.shape[1] - np.tile(widths, P)  # zeros past each row's width: a varint byte each, not stored
    tbytes = np.zeros(fits.shape)
    tbytes[live] = np.add.reduceat(rans.varint_lengths(tables).sum(axis=1) - pad, offsets).reshape(P, -1)
    id_bytes = np.array([c.id_bytes() for c in cands])
    side = tbytes * np.where(big, 0.75, 1.0)[None, :] + id_bytes[None, :]
    lanes = np.ones(fits.shape, dtype=np.int64)
    lanes[live] = rans.lanes_for(units[None, :], payload[live])
    row_of = np.full(fits.shape, -1, dtype=np.int64)
    row_of[live] = offsets.reshape(P, -1)
    return Scores(payload, side, lanes, fits, tables, row_of)


@dataclass(frozen=True)
class SideData:
    """A candidate's side data as the encoder writes it: normalized tables, their varints
    and the class ids (rans.encode compacts them), and about how many bytes they take."""

    tables: np.ndarray  # [k, nsym**t] normalized
    varints: bytes
    ids: bytes | None

    @cached_property
    def nbytes(self) -> int:
        """Measured with a quicker compressor than the encoder's (it only ranks finalists),
        the first time a finalist's turn comes."""
        return compress.estimate(self.varints) + (compress.estimate(self.ids) if self.ids is not None else 0)

    @classmethod
    def of(cls, tables: np.ndarray, ids: np.ndarray | None) -> SideData:
        """The side data of normalized tables and class ids."""
        return cls(tables, rans.varint_encode(tables.ravel()), None if ids is None else ids.astype(np.uint8).tobytes())

    def blobs(self, kinds=spec.PORTABLE) -> tuple[tuple[bytes, int], tuple[bytes, int]]:
        """rans.encode's side=: the compacted table and ids (each the smallest of `kinds`)."""
        ids = compress.smallest(self.ids, kinds) if self.ids is not None else (b"", 0)
        return compress.smallest(self.varints, kinds), ids


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


def _flat(streams, per_job: dict[int, list[Candidate]]):
    """Candidates of several streams in one list, with each one's stream size and job."""
    jobs = list(per_job)
    flat = [c for j in jobs for c in per_job[j]]
    units = [-(-streams[j].sym.size // c.t) for j in jobs for c in per_job[j]]
    big = [streams[j].big for j in jobs for _ in per_job[j]]
    bounds = np.cumsum([0] + [len(per_job[j]) for j in jobs])
    return jobs, flat, units, big, bounds


def _rough_by_job(streams: list[Stream], per_job: dict[int, list[Candidate]]) -> dict[int, np.ndarray]:
    """rough_total of several streams' candidates in one call, split back per stream."""
    if not per_job:
        return {}
    jobs, flat, units, big, bounds = _flat(streams, per_job)
    first = rough_total(flat, units, big)
    return {j: first[a:b] for j, a, b in zip(jobs, bounds, bounds[1:], strict=False)}


def _extend(streams, pools: dict[int, list[Candidate]], rough: dict[int, np.ndarray], extra) -> None:
    """Add more candidates to the streams' pools, with their first-pass scores (one call)."""
    for j, scores in _rough_by_job(streams, extra).items():
        pools[j], rough[j] = pools[j] + extra[j], np.concatenate([rough[j], scores])


def grid_candidates(stream: Stream, cands: list[Candidate], rough: np.ndarray, how: Effort) -> list[Candidate]:
    """Row class x column class contexts (single symbols), from the row and column
    clusterings already made.

    Tried only where rows and columns each pay on their own (their gains then add up:
    e.g. embeddings, whose columns lean to one sign and differ in density and whose rows
    differ in spread). Each pair (kr, kc) of the class counts tried is ranked by that sum
    of gains less the extra tables it needs; the `how.grids` best are counted (every pair
    at max effort), so the search never counts every pair at normal effort.
    """
    gain: dict[tuple[str, int], float] = {}  # best bytes saved over order-0, per (axis, k)
    ids = {}
    for c, r in zip(cands, rough, strict=True):
        if c.variant in ("row", "col") and r < rough[0]:
            gain[c.variant, c.k] = max(gain.get((c.variant, c.k), 0.0), float(rough[0] - r))
            ids[c.variant, c.k] = c.ids
    rks = sorted(k for v, k in gain if v == "row")
    cks = sorted(k for v, k in gain if v == "col")
    if not rks or not cks:
        return []
    # A grid's tables: kr * kc rows of about a varint byte per symbol, where the two axes
    # alone had kr + kc rows.
    ranked = sorted(
        (-(gain["row", kr] + gain["col", kc] - (kr * kc - kr - kc) * stream.nsym), kr, kc)
        for kr in rks
        for kc in cks
        if kr * kc <= spec.MAX_CONTEXTS
    )
    # The best k of each axis alone always (its pair often wins where tables are dear), then
    # the best-ranked others.
    best = (max(rks, key=lambda k: gain["row", k]), max(cks, key=lambda k: gain["col", k]))
    pairs = [best] if best[0] * best[1] <= spec.MAX_CONTEXTS else []
    pairs += [(kr, kc) for g, kr, kc in ranked if g < 0 and (kr, kc) != best]
    pairs = pairs[: None if how.all_grids else how.grids]
    rows = len(ids["row", rks[0]])
    out = []
    for kr, kc in pairs:
        both = np.concatenate([ids["row", kr], ids["col", kc]])
        counts = stream.unit_counts(1, "grid", kr * kc, both, kc)
        out.append(Candidate("grid", kr * kc, 1, counts, both, kc, rows))
    return out


def _choose_group(
    streams: list[Stream],
    cands: list[list[Candidate]],
    later: dict[tuple[int, str], list[int]],
    group: list[int],
    how: Effort,
) -> dict[int, Choice]:
    """Choices for streams whose unit alphabets are about as wide: scored together."""
    # First pass by ideal code lengths (it also says where more classes are worth trying,
    # and picks the grids to try); every precision for the leaders only.
    leaders = {j: cands[j] for j in group}
    pools = {j: cands[j] for j in group if len(cands[j]) > 1}
    rough = _rough_by_job(streams, pools)
    _extend(streams, pools, rough, family_candidates(streams, deeper(pools, rough, later), how))
    grids = {j: g for j in pools if (g := grid_candidates(streams[j], pools[j], rough[j], how))}
    _extend(streams, pools, rough, grids)
    for j, pool in pools.items():
        leaders[j] = [pool[i] for i in np.argsort(rough[j], kind="stable")[: how.leaders]]
    jobs, flat, units, big, bounds = _flat(streams, leaders)
    s = score(flat, units, PRECS, big)
    total = s.total()
    fixed = s.fixed()
    finalists = {}
    for j, a, b in zip(jobs, bounds, bounds[1:], strict=False):
        pairs = sorted(
            (float(total[q, i]), i - a, q) for i in range(a, b) for q in range(len(PRECS)) if np.isfinite(total[q, i])
        )
        # Distinct candidates first (each at its best precision), then their other precisions:
        # the side data the estimate misjudges most (tables of wide alphabets) differs most
        # between candidates, not between one candidate's precisions.
        seen: set[int] = set()
        firsts = [p for p in pairs if p[1] not in seen and not seen.add(p[1])]
        pairs = firsts + [p for p in pairs if p not in firsts]
        finalists[j] = pairs[:1] if streams[j].big else pairs[: how.finalists]
    # Small streams: side data decides close calls, so it is measured; round r measures every
    # stream's r-th finalist at once, unless even free side data could not beat its best so far.
    # Their counts are exact (no sampling below BIG_SYMBOLS), so the encoder reuses what the
    # winner's measurement made; so does it a big stream's one finalist where its counts are exact.
    small = [(j, a + i, q) for j, a in zip(jobs, bounds, strict=False) if streams[j].exact for _, i, q in finalists[j]]
    sides = {(j, i, q): SideData.of(s.table(q, i, flat[i]), flat[i].ids) for j, i, q in small}
    firsts = {j: (j, a + finalists[j][0][1], finalists[j][0][2]) for j, a in zip(jobs, bounds, strict=False)}
    best = {j: (*finalists[j][0], sides.get(firsts[j])) for j in jobs if streams[j].big}
    for r in range(max(len(f) for f in finalists.values())):
        for j, a in zip(jobs, bounds, strict=False):
            for _, i, q in finalists[j][r : r + 1] if not streams[j].big else ():
                if j in best and float(fixed[q, a + i]) >= best[j][0]:
                    continue  # even free side data could not beat its best so far
                side = sides[j, a + i, q]
                got = (float(fixed[q, a + i]) + side.nbytes, i, q, side)
                best[j] = min(best.get(j, got), got, key=lambda b: b[:3])
    out = {}
    for j, a in zip(jobs, bounds, strict=False):
        cost, i, q, side = best[j]
        c = leaders[j][i]
        out[j] = Choice(c.variant, c.k, c.t, c.ids, PRECS[q], int(s.lanes[q, a + i]), cost, side, c.kc)
    return out


def plan(jobs: list[tuple], how: Effort = Effort()) -> list[Choice]:
    """The cheapest coding found for each stream (symbols in [0, nsym), laid out as geo says;
    a job may add the symbols' exact counts), looking as wide as `how` says: all streams at once
    (the module docstring says why)."""
    streams = [Stream(*job) for job in jobs]
    cands, later = candidates_many(streams, how)
    groups: dict[int, list[int]] = {}
    for j, st in enumerate(streams):  # unit alphabets of about one width share a padded array
        groups.setdefault((st.nsym**st.t - 1).bit_length(), []).append(j)
    out: dict[int, Choice] = {}
    for group in groups.values():
        out.update(_choose_group(streams, cands, later, group, how))
    return [out[j] for j in range(len(streams))]


BLOCK_ROWS = (256, 512)  # rows per block tried (each twice the last): all-MiniLM-L6-v2's embedding takes 512
BLOCK_MEANS, BLOCK_SPREADS = 15, 5  # context = mean bucket x spread bucket (75 contexts)
# Map contexts: row classes (of 8 column classes each), EM passes (all-MiniLM-L6-v2's ternary
# embedding: 4 passes 0.2% more bytes, 8 0.1% fewer), alphabets up to (2 products a symbol a pass)
MAP_ROWS, MAP_PASSES, MAP_SYMBOLS = 32, 6, 3


def block_choice(sym: np.ndarray, nsym: int, geo: Geometry, best: Choice) -> Choice | None:
    """Block contexts (docs/FORMAT.md: a token embedding's columns lean by vocabulary region;
    all-MiniLM-L6-v2's int6 codes in 0.990 of the grid's bytes), or None unless their
    estimate beats `best`'s."""
    if not geo.matrix or geo.rows * geo.cols != geo.n or geo.rows < 4 * BLOCK_ROWS[0]:
        return None
    rows = sym.reshape(geo.rows, geo.cols)
    some = rows[:: max(1, geo.rows // 256)].astype(np.int16)  # (symbols < MAX_ALPHABET)
    centre = np.int16(np.rint(some.mean()))
    some -= centre
    sd, mag = float(some.std()) or 1.0, float(np.abs(some - some.mean()).mean()) or 1.0
    # Sums of the finest blocks (by reshape: np.add.reduceat casts each int16, 40x slower), then
    # pairs; centred int16 copies of a few blocks at a time (whole: 4 bytes a code at once)
    full, rb = geo.rows // BLOCK_ROWS[0] * BLOCK_ROWS[0], BLOCK_ROWS[0]
    step = max(1, (1 << 22) // (rb * geo.cols)) * rb
    sums, spreads = [], []
    for a in [*range(0, full, step), full]:  # (the last: the rows past whole blocks, one sum)
        x = (rows[a : min(a + step, full)] if a < full else rows[full:]).astype(np.int16)
        x -= centre
        sums.append(_column_sums(x, rb if a < full else 0))
        spreads.append(_column_sums(np.abs(x, out=x), rb if a < full else 0))
    sums, spreads = np.concatenate(sums), np.concatenate(spreads)
    counts = np.minimum(np.arange(len(sums)) * rb + rb, geo.rows) - np.arange(len(sums)) * rb
    if full == geo.rows:  # (no rows left: the last block is empty)
        sums, spreads, counts = sums[:-1], spreads[:-1], counts[:-1]
    found, s16 = None, np.ascontiguousarray(sym, dtype=np.uint16)  # (what the kernel counts)
    for rb in BLOCK_ROWS:
        if geo.rows < 4 * rb:
            break
        if rb > BLOCK_ROWS[0]:  # pairs of the previous blocks
            sums, spreads, counts = (np.add.reduceat(a, np.arange(0, len(a), 2)) for a in (sums, spreads, counts))
        half_m, half_s = BLOCK_MEANS // 2, BLOCK_SPREADS // 2
        m = np.clip(np.rint(sums * 4 / (sd * counts[:, None])), -half_m, half_m) + half_m
        v = np.log2(np.maximum(spreads / (mag * counts[:, None]), 1e-9))
        ids = (m * BLOCK_SPREADS + np.clip(np.rint(3 * v), -half_s, half_s) + half_s).astype(np.uint8)
        k = BLOCK_MEANS * BLOCK_SPREADS
        found = _measured(s16, nsym, geo, Choice("block", k, 1, ids.ravel(), 0, best.lanes, 0, None, rb), found or best)
    return found if found is not best else None


def _column_sums(x: np.ndarray, rb: int) -> np.ndarray:
    """int32 column sums of x's blocks of rb rows, [blocks, cols]; rb 0: of all its rows, [1, cols]."""
    return x.reshape(-1, rb, x.shape[1]).sum(1, dtype=np.int32) if rb else x.sum(0, np.int32)[None]


def _measured(s16: np.ndarray, nsym: int, geo: Geometry, c: Choice, best: Choice, precs=(12, 14)) -> Choice:
    """c at the precision that codes it in the fewest bytes (side data measured) if that beats best, else best."""
    hist = rans.context_counts(s16, geo.context_vector(c.variant, c.k, c.ids, 1, np.uint8, c.kc), c.k, nsym)
    for prec in precs:
        tables = rans.normalize_table(hist, prec)
        bits = -(hist * np.log2(np.maximum(tables, 1) / (1 << prec))).sum()
        side = SideData.of(tables, c.ids)
        cost = bits / 8 + side.nbytes + HEADER_BYTES + 4 * c.lanes
        if cost < best.cost:
            best = Choice(c.variant, c.k, 1, c.ids, prec, c.lanes, cost, side, c.kc)
    return best


def map_choice(sym: np.ndarray, nsym: int, geo: Geometry, best: Choice) -> Choice | None:
    """Map contexts (docs/FORMAT.md), or None unless their estimate beats `best`'s: rows put, pass
    after pass, in the class whose per-column tables code them in the fewest bits (hard EM from
    k-means classes; float32 products of 0/1 masks, every sum an integer under 2**24: exact).
    all-MiniLM-L6-v2's ternary token embedding: 0.970 of the grid's bytes."""
    rows, cols, kr = geo.rows, geo.cols, MAP_ROWS  # (1/16 bits: at most 400 a column, 2**15 columns)
    fits = geo.matrix and rows * cols == geo.n and 1024 <= rows < 1 << 24 and cols <= 1 << 15
    if not (fits and 1 < nsym <= MAP_SYMBOLS):
        return None
    x = np.ascontiguousarray(sym, dtype=np.uint16).reshape(rows, cols)
    masks = [(x == v).astype(np.float32) for v in range(1, nsym)]
    sums = [m.sum(1) for m in masks]  # [rows] of each symbol but the first
    rid = cluster_many([np.stack([cols - sum(sums), *sums], 1)], [[kr]], 32, rows)[0][0]
    for p in range(MAP_PASSES + 1):
        member = np.zeros((rows, kr), np.float32)
        member[np.arange(rows), rid] = 1
        tot = member.sum(0)
        counts = [m.T @ member for m in masks]  # [cols, kr] of each symbol but the first
        if p == MAP_PASSES:
            break
        b0, *bits = [np.rint(-16 * np.log2((c + 0.5) / (tot + nsym / 2))) for c in (tot - sum(counts), *counts)]
        rid = (b0.sum(0) + sum(m @ (b - b0).astype(np.float32) for m, b in zip(masks, bits, strict=True))).argmin(1)
    per = spec.MAX_CONTEXTS // kr
    cmap = cluster_many(list(np.stack([tot - sum(counts), *counts], 2).transpose(1, 0, 2)), [[per]] * kr, 32, cols)
    ids = np.concatenate([rid, (np.stack(cmap) + per * np.arange(kr)[:, None, None]).ravel()]).astype(np.uint8)
    found = _measured(x.ravel(), nsym, geo, Choice("map", per * kr, 1, ids, 0, best.lanes, 0, None, kr), best, (8, 12))
    return found if found is not best else None
