"""Rows or columns of a tensor grouped into k classes by their symbol histograms.

k-means on code length (the bits an item's symbols cost under its class's distribution),
started from classes ranked by spread around the mode, over a few coarse symbol bins. The
compiled kernel (kernel.kmeans, kernel.class_sums) runs each problem step for step as the
numpy here does, 2-4x quicker; without it, many problems run as one padded numpy batch (on
small tensors the number of numpy calls is what clustering spends). Every matrix product
multiplies integer-valued arrays whose sums are exact: the same classes on every machine.
"""

from __future__ import annotations

import numpy as np

from . import kernel, rans

KMEANS_ITEMS = 128  # cluster on at most this many items, then assign all
KMEANS_BINS = 16  # k-means compares items over at most this many symbol bins
LENGTH_BITS = 10  # code lengths in 1/1024 bits (integers: exact sums)
_LOG_PRIOR = 0.5  # add-half prior when estimating class costs


def axis_histograms(part: np.ndarray, axis: int, nsym: int) -> np.ndarray:
    """[items, nsym] symbol counts of each row (axis 0) or column (axis 1) of a 2-D array."""
    n_items = part.shape[axis]
    base = np.arange(n_items, dtype=np.int64) * nsym
    idx = part + (base[:, None] if axis == 0 else base[None, :])
    hist = np.bincount(idx.ravel(), minlength=n_items * nsym)
    return hist.reshape(n_items, nsym).astype(np.float32)


def class_sums_all(hist: np.ndarray, ids_list, ks) -> list[np.ndarray]:
    """[k, nsym] sums of the item histograms in each class, for several clusterings at once: one
    0/1 membership matrix product of integer counts (below 2**24), exact in any order (the kernel
    declines, returning None, where its float32 sums would round)."""
    if kernel.on() and hist.size and (got := kernel.class_sums(hist, ids_list, ks)) is not None:
        return got
    n_items = hist.shape[0]
    first = np.cumsum([0] + list(ks))
    keys = np.concatenate([np.asarray(ids, dtype=np.int64) + a for ids, a in zip(ids_list, first, strict=False)])
    member = np.zeros((first[-1], n_items), dtype=hist.dtype)
    member[keys, np.tile(np.arange(n_items), len(ks))] = 1
    return np.split(member @ hist, first[1:-1])


def spread_order(hist: np.ndarray) -> np.ndarray:
    """Items ordered by their spread around the global mode (a cheap 1-D summary of a histogram)."""
    nsym = hist.shape[1]
    mode = int(hist.sum(axis=0).argmax())
    tot = np.maximum(hist.sum(axis=1), 1.0)
    spread = (hist @ np.abs(np.arange(nsym) - mode).astype(hist.dtype)) / tot
    return np.argsort(spread, kind="stable")


def ranked_class_sums(hist: np.ndarray, order: np.ndarray, ks) -> list[np.ndarray]:
    """class_sums_all of rans.rank_buckets(order, k) for every k at once: runs are contiguous in order."""
    got = kernel.class_sums(hist, rans.rank_buckets(order, list(ks)), ks) if kernel.on() and hist.size else None
    if got is not None:  # (the same sums, from each k's ranked classes)
        return got
    n = len(order)
    bounds = [-(-np.arange(k + 1) * n // k) for k in ks]  # first rank of each run: ceil(j * n / k)
    cuts = np.unique(np.concatenate(bounds))  # every k's runs are unions of these (non-empty) runs
    fine = np.add.reduceat(hist[order], cuts[:-1], axis=0)
    return [np.add.reduceat(fine, np.searchsorted(cuts, b[:-1]), axis=0) for b in bounds]


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


def _code_lengths(sums: np.ndarray, bins: np.ndarray) -> np.ndarray:
    """Integer-valued -log2 p * 2**LENGTH_BITS of each class's bins (0 on padding bins).

    Integers, so that the cost products below are exact in float64 whatever order a
    BLAS sums them in: k-means gives the same classes on every machine.
    """
    cls = sums + _LOG_PRIOR * bins
    with np.errstate(divide="ignore", invalid="ignore"):
        bits = -np.log2(cls / cls.sum(axis=-1, keepdims=True))
    return np.where(bins > 0, np.rint(bits * (1 << LENGTH_BITS)), 0.0)


def _relabel(ids: np.ndarray, kmax: int) -> np.ndarray:
    """Class ids [S, items] renumbered by first appearance (equal clusterings, equal bytes)."""
    seen = ids[:, :, None] == np.arange(kmax)
    first = np.where(seen.any(axis=1), seen.argmax(axis=1), ids.shape[1])  # [S, kmax]
    rank = np.argsort(np.argsort(first, axis=1, kind="stable"), axis=1, kind="stable")
    return np.take_along_axis(rank, ids, axis=1)


def _kmeans(hists: list[np.ndarray], slots, iters: int, items: int = KMEANS_ITEMS) -> list[np.ndarray]:
    """[S, items] classes of every problem for every k in slots: one padded batch. Costs are exact
    integers (_code_lengths); each centroid's index in its block is folded into the low bits of its
    cost, so a block's minimum is its argmin (lowest index on ties)."""
    P, B = len(hists), KMEANS_BINS
    ks = np.asarray(slots)
    first = np.cumsum([0, *slots])
    block = np.repeat(np.arange(len(slots)), slots)  # the k slot of each centroid
    local = (np.arange(first[-1]) - first[block])[:, None].astype(np.float64)
    fold = float(1 << int(slots[-1]).bit_length())
    coarse = [coarse_bins(h) for h in hists]
    samples = [np.arange(0, len(h), max(1, len(h) // items)) for h in hists]
    imax = max(len(smp) for smp in samples)
    X = np.zeros((P, imax, B))  # sampled coarse histograms, zero-padded (items and bins)
    bins = np.zeros((P, 1, B))
    ids = np.zeros((P, len(slots), imax), dtype=np.int64)
    starts = []
    for p, (h, c, smp) in enumerate(zip(hists, coarse, samples, strict=True)):
        X[p, : len(smp), : c.shape[1]] = c[smp]
        bins[p, 0, : c.shape[1]] = 1
        starts.append(rans.rank_buckets(spread_order(h), ks))  # [S, items] spread-ranked classes
        ids[p, :, : len(smp)] = starts[-1][:, smp]

    def lengths(cur: np.ndarray) -> np.ndarray:  # [P, C, B]: code lengths of each class
        member = (cur[:, block, :] == local[None]).astype(np.float64)  # [P, C, items]
        return _code_lengths(np.matmul(member, X), bins)

    def assign(h: np.ndarray, ln: np.ndarray) -> np.ndarray:  # [.., items, B], [.., C, B] -> [.., S, items]
        cost = np.matmul(ln, np.swapaxes(h, -1, -2)) * fold + local  # [.., C, items]
        low = np.stack(
            [cost[..., a:b, :].min(axis=-2) for a, b in zip(first[:-1], first[1:], strict=True)], axis=-2
        )  # (a min across rows is fast; minimum.reduceat is not)
        return (low % fold).astype(np.int64)

    ln = None
    for _ in range(iters):
        ln = lengths(ids)
        new = assign(X, ln)
        if np.array_equal(new, ids):
            break
        ids = new
    out = []
    for p, (c, smp) in enumerate(zip(coarse, samples, strict=True)):
        if len(smp) == len(c):
            got = ids[p, :, : len(smp)]
        elif ln is None:  # no iterations: the ranked start
            got = starts[p]
        else:  # iterated on a strided sample: now assign every item once
            full = np.zeros((len(c), B))
            full[:, : c.shape[1]] = c
            got = assign(full, ln[p])
        out.append(_relabel(got, slots[-1]))
    return out


def cluster_many(hists: list[np.ndarray], kss: list, iters: int = 4, items: int = KMEANS_ITEMS) -> list[list]:
    """Group each problem's items into k classes by their symbol histograms, for every k.

    hists[p]: [items, nsym] histograms of problem p (a stream's rows or columns); kss[p]:
    the class counts it wants. Problems that want the same ks run as one padded batch. k-means
    fits its classes on about `items` items of each problem, then assigns every item.
    """
    out: list[list[np.ndarray]] = [[] for _ in hists]
    batches: dict[tuple[int, ...], list[int]] = {}
    for p, ks in enumerate(kss):
        if len(ks):
            batches.setdefault(tuple(sorted(set(ks))), []).append(p)
    for slots, members in batches.items():
        done = {p: got for p in members if (got := _kmeans_compiled(hists[p], slots, iters, items)) is not None}
        rest = [p for p in members if p not in done]
        done.update(zip(rest, _kmeans([hists[p] for p in rest], slots, iters, items) if rest else [], strict=True))
        for p in members:
            out[p] = [done[p][slots.index(k)] for k in kss[p]]
    return out


def _kmeans_compiled(hist: np.ndarray, slots, iters: int, items: int) -> np.ndarray | None:
    """_kmeans of one problem in the compiled kernel (the same classes; problems are
    independent of their batch), or None where the numpy reference must run: no kernel, or
    counts past float32's exact integers."""
    if not kernel.on() or not hist.size:
        return None
    return kernel.kmeans(hist, slots, iters, items, KMEANS_BINS, float(1 << LENGTH_BITS), _LOG_PRIOR)
