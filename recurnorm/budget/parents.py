"""A tensor's rows of int8 codes predicted from earlier rows: the codes stream then holds each
row minus its prediction (wrapping in int8) and a `parents` stream says where each came from.

Row i's parent is an earlier row i - d with a multiplier k: its prediction is
(k * codes[i - d] + 16) >> 5, in integers, so that every reader computes the same codes.
Two ways to pick them:
- `previous`: smooth rows, each predicted by the row above (d = 1, k = 32: a position
  embedding's random walk), where sampled row pairs say it pays.
- `find` (tall tensors; every tensor at `--effort max`: PackOptions): the earlier row whose
  least-squares multiple leaves the least, for every row that gains more than its parent costs. A token embedding's rows are not independent (related tokens, related vectors), and
  context mixing cannot see a row thousands of rows back. The search narrows the rows by a
  sketch and clusters first (a fraction of a second on all-MiniLM-L6-v2's 30,522-row embedding).
Both only propose: the packer (api._pack) races the codes as they are against the residuals
and their parents, and keeps the smaller.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArtifactError
from . import kernel, rans

STEP, SHIFT = 32, 5  # multipliers are k / STEP, |k| <= 2 * STEP
ROW_BITS = 24  # what a predicted row pays for its parent and multiplier, about (stored: ~19 bits)
# The search compares rows first in a sketch: their coordinates on the SKETCH leading directions
# of the rows (a prediction is a multiple of a row: uncentred). Rows fall into clusters of
# about CLUSTER rows by direction, and each looks for its parent in the PROBES clusters nearest
# it; the best sketched candidate in each is compared exactly. all-MiniLM-L6-v2's int8
# embedding (30,522 rows): 94% of the gain of trying all rows up to 16,384 back in 0.5 s (10 s);
# 4 x PROBES: 98% in 1.2 s. A sketch of 32 finds 87%, 48 finds 97% of what 64 finds.
SKETCH, CLUSTER, PROBES = 64, 128, 12
SAMPLE = 1 << 16  # codes of row pairs `previous` samples


def previous(codes: np.ndarray, smooth: float) -> np.ndarray | None:
    """Parents of smooth rows (each from the one above) where a sample of row pairs says their
    differences' order-0 bound is under `smooth` of the codes' (PackOptions.parents_smooth;
    all-MiniLM-L6-v2's position embedding, int8: 0.88); else None."""
    rows = len(codes)
    step = max(1, codes.size // SAMPLE)
    below = codes[1::step]
    if rows < 2 or rans.order0_bits(below - codes[: rows - 1 : step]) > smooth * rans.order0_bits(below):
        return None
    out = np.zeros((rows, 2), np.int32)
    out[1:] = (1, STEP)
    return out


def find(codes: np.ndarray, probes: int = PROBES) -> np.ndarray | None:
    """int32 [rows, 2]: each row's distance back to its parent (0: none) and multiplier k; None
    where no row gains more than its parent costs. probes: clusters searched (`--effort max`: 4 x PROBES)."""
    rows, cols = codes.shape
    # One column: every row a multiple of every other (all would be compared, for a code's worth of
    # gain). Three values or fewer: MiniLM's ternary embedding codes smaller as it is (0.5 s saved).
    if cols < 2 or int(codes.max()) - int(codes.min()) < 3:
        return None
    rng, codes = np.random.default_rng(0), np.ascontiguousarray(codes)  # (contiguous: the kernel's)
    norm, sketch = _sketch(codes, rng)
    unit = sketch / np.maximum(np.linalg.norm(sketch, axis=1), 1e-6)[:, None]
    n = max(1, rows // CLUSTER)
    home, probes = _probes(unit, _centres(unit, n, rng), min(probes, n))
    probed = np.searchsorted(probes[0], np.arange(n + 1))  # rows probing cluster c: probes[1, probed[c] : ...]
    members = np.argsort(home, kind="stable")
    bounds = np.searchsorted(home[members], np.arange(n + 1))
    sketch_per_norm = sketch / np.sqrt(norm)[:, None]  # (a parent's score: dot^2 / its energy)
    best = (np.zeros(rows, np.float32), np.zeros(rows, np.int64), np.zeros(rows, np.int32))  # score, parent, dot
    for c in range(n):
        member, q = members[bounds[c] : bounds[c + 1]], probes[1, probed[c] : probed[c + 1]]
        q = q[q > member[0]] if len(member) else q[:0]
        if len(q):  # each row's best sketched candidate in the cluster
            member = member[: np.searchsorted(member, q[-1])]
            _offer(codes, norm, best, q, member, sketch[q] @ sketch_per_norm[member].T)
    score, parent, dot = best
    # Related rows come in families: each row also tries its parent's parent and its last earlier
    # sibling (+1.2% of the gain for 0.02 s on MiniLM, as much as a third more probes)
    by_parent, sibling = np.argsort(parent, kind="stable"), np.zeros(rows, np.int64)
    sibling[by_parent[1:]] = by_parent[:-1]  # (the row before it in that order; a stranger costs nothing)
    _offer(codes, norm, best, np.arange(rows), parent[parent])
    _offer(codes, norm, best, np.arange(rows), sibling)
    # bits saved, as by Gaussians of the row's energy and what its parent leaves of it
    use = 0.5 * cols * np.log2((norm + cols) / (norm - score + cols)) > ROW_BITS
    k = np.clip(np.rint(STEP * dot / norm[parent]), -2 * STEP, 2 * STEP).astype(np.int32)
    out = np.zeros((rows, 2), np.int32)
    out[use] = np.stack([np.flatnonzero(use) - parent[use], k[use]], 1)
    return out if use.any() else None


def _sketch(codes: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
    """(each row's energy, at least 1; its coordinates on the SKETCH leading directions of the rows)."""
    rows, cols = codes.shape
    basis = None
    if cols > SKETCH:  # (a subspace iteration on some rows: near the leading directions, no cols x cols eigh)
        some, basis = codes[:: max(1, rows // 4096)].astype(np.float32), rng.standard_normal((cols, SKETCH), np.float32)
        for _ in range(2):
            basis = np.linalg.qr(some.T @ (some @ basis))[0]
    norm, sketch = np.zeros(rows, np.float32), np.zeros((rows, min(cols, SKETCH)), np.float32)
    # As floats a block of rows at a time: a whole float copy would be mapped, and faulted in, afresh.
    for i in range(0, rows, 4096):
        x = codes[i : i + 4096].astype(np.float32)
        norm[i : i + 4096], sketch[i : i + 4096] = np.einsum("ij,ij->i", x, x), x if basis is None else x @ basis
    return np.maximum(norm, 1), sketch


def _centres(unit: np.ndarray, n: int, rng) -> np.ndarray:
    """n clusters of directions, either sign (a parent's multiplier may be negative): a few k-means
    steps. Rows x clusters products go a block of rows at a time: whole, a 128K-row vocabulary's took 1.2 GB."""
    rows = len(unit)
    centres, sample = unit[rng.choice(rows, n, replace=False)], unit[rng.choice(rows, min(rows, 64 * n), replace=False)]
    for _ in range(2):
        moved, d = np.zeros_like(centres), centres.shape[1]
        for b in range(0, len(sample), 4096):
            cos = sample[b : b + 4096] @ centres.T
            near = np.argmax(np.abs(cos), 1)  # (a flat add.at below: 5x quicker, sums in the same order)
            some = sample[b : b + 4096] * np.sign(cos[np.arange(len(near)), near])[:, None]
            np.add.at(moved.reshape(-1), (near[:, None] * d + np.arange(d)).ravel(), some.ravel())
        centres = moved / np.maximum(np.linalg.norm(moved, axis=1), 1e-6)[:, None]
    return centres


def _probes(unit: np.ndarray, centres: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """(each row's cluster; (cluster, row) of its p nearest clusters, sorted by cluster)."""
    n, home, probes = len(centres), np.zeros(len(unit), np.int64), []
    for b in range(0, len(unit), 4096):
        cos = np.abs(unit[b : b + 4096] @ centres.T)
        home[b : b + 4096] = np.argmax(cos, 1)  # (np.argpartition: 10x slower; zero rows probe nothing)
        r, c = np.nonzero((cos >= np.partition(cos, n - p, 1)[:, n - p : n - p + 1]) & (cos > 0))
        probes.append(np.stack([c, r + b]))
    probes = np.concatenate(probes, 1)
    return home, probes[:, np.argsort(probes[0].astype(np.uint16) if n <= 1 << 16 else probes[0], kind="stable")]


def _offer(codes, norm, best, q: np.ndarray, cand: np.ndarray, sketched: np.ndarray | None = None) -> None:
    """Rows q take parents (sketched [q, cand]: each row's best earlier one) where they score better,
    exactly; best: (score, parent, dot) of every row, updated in place."""
    score, parent, dot = best
    if kernel.on():  # (the kernel: the same steps, without numpy's row copies)
        return kernel.c.offer(codes, q, cand, sketched, norm, score, parent, dot)
    if sketched is not None:  # (a parent comes before its row: member[0] does)
        cand = cand[np.argmax(np.abs(sketched) * (cand < q[:, None]), 1)]
    d = (codes[q].astype(np.int16) * codes[cand]).sum(1, dtype=np.int32)  # (gathering int8: 10x quicker)
    s = d.astype(np.float32) ** 2 / norm[cand]
    better = (s > score[q]) & (cand < q)
    score[q[better]], parent[q[better]], dot[q[better]] = s[better], cand[better], d[better]


def residuals(codes: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """codes minus each row's prediction, wrapping in int8."""
    rows = np.flatnonzero(parents[:, 0])
    pred = parents[rows, 1:].astype(np.int16) * codes[rows - parents[rows, 0]]  # (|k| <= 2 * STEP: int16 holds it)
    out = codes.copy()  # (then in place and in int16, not int32: 3x quicker; int8 wraps the same)
    out[rows] -= np.right_shift(np.add(pred, STEP // 2, out=pred), SHIFT, out=pred).astype(np.int8)
    return out


def restore(res: np.ndarray, parents: np.ndarray, where: str) -> np.ndarray:
    """residuals inverted, a generation at a time (rows whose parents are restored; MiniLM's
    embedding: ~60 generations, 10x quicker than row by row)."""
    if (parents[:, 0] < 0).any() or (parents[:, 0] > np.arange(len(res))).any():
        raise ArtifactError(f"{where} parents: each must reach back to an earlier row")
    if (parents[:, 1] < -2 * STEP).any() or (parents[:, 1] > 2 * STEP).any():
        raise ArtifactError(f"{where} parents: multipliers must lie in [-{2 * STEP}, {2 * STEP}]")
    level = [0] * len(res)
    for i, d in enumerate(parents[:, 0].tolist()):
        level[i] = level[i - d] + 1 if d else 0
    order = np.argsort(level, kind="stable")
    starts = np.searchsorted(np.asarray(level)[order], np.arange(max(level, default=0) + 2))
    out = res.copy()
    for a, b in zip(starts[1:-1], starts[2:], strict=True):
        rows = order[a:b]
        pred = parents[rows, 1:] * out[rows - parents[rows, 0]].astype(np.int32)
        out[rows] += ((pred + STEP // 2) >> SHIFT).astype(np.int8)
    return out
