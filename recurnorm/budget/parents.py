"""A tensor's rows of int8 codes predicted from earlier rows: the codes stream then holds each
row minus its prediction (wrapping in int8) and a `parents` stream says where each came from.

Row i's parent is an earlier row i - d with a multiplier k: its prediction is
(k * codes[i - d] + 16) >> 5, in integers, so that every reader computes the same codes.
Two ways to pick them:
- `previous` (every pack): smooth rows, each predicted by the row above (d = 1, k = 32: a
  position embedding's random walk), where sampled row pairs say it pays.
- `find` (`--effort max`): the earlier row whose least-squares multiple leaves the least, for
  every row that gains more than its parent costs. A token embedding's rows are not
  independent (related tokens, related vectors), and context mixing cannot see a row
  thousands of rows back. The search tries every earlier row up to WINDOW back (seconds on
  all-MiniLM-L6-v2's 30,522-row embedding).
Both only propose: the packer (api._pack) races the codes as they are against the residuals
and their parents, and keeps the smaller.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArtifactError
from .rans import order0_bits

STEP, SHIFT = 32, 5  # multipliers are k / STEP, |k| <= 2 * STEP
ROW_BITS = 24  # what a predicted row pays for its parent and multiplier, about (stored: ~19 bits)
# A row's parent is among the rows this far before it (time: rows x WINDOW). all-MiniLM-L6-v2's
# int6 embedding: 7,668,251 B in 6.3 s at 16,384; 7,696,585 B in 3.6 s at 8,192; 7,660,257 B
# in 8.9 s searching all 30,522 rows (codes and parents streams, one thread).
WINDOW = 16384
CHUNK = 1024  # rows searched per product (memory: CHUNK x WINDOW)
# `previous` proposes where row pairs' order-0 bits are under this share of the codes'. A gate: every
# proposal is raced (a second encoding); without it every int8 matrix would be. Saves 66% of pack
# time on MiniLM int8 and int4, 48% on golf-shaped int8, same bytes (benchmarks/gates.py --gate SMOOTH).
SMOOTH = 0.97
SAMPLE = 1 << 16  # codes of row pairs `previous` samples


def previous(codes: np.ndarray) -> np.ndarray | None:
    """Parents of smooth rows (each from the one above) where a sample of row pairs says their
    differences' order-0 bound is under SMOOTH of the codes' (all-MiniLM-L6-v2's position
    embedding, int8: 0.88); else None."""
    rows = len(codes)
    step = max(1, codes.size // SAMPLE)
    below = codes[1::step]
    if rows < 2 or order0_bits(below - codes[: rows - 1 : step]) > SMOOTH * order0_bits(below):
        return None
    out = np.zeros((rows, 2), np.int32)
    out[1:] = (1, STEP)
    return out


def find(codes: np.ndarray) -> np.ndarray | None:
    """int32 [rows, 2]: each row's distance back to its parent (0: none) and multiplier k; None
    where no row gains more than its parent costs."""
    x, cols = codes.astype(np.float32), codes.shape[1]
    norm, out = np.einsum("ij,ij->i", x, x), np.zeros((len(x), 2), np.int32)
    for a in range(1, len(x), CHUNK):
        q, lo = np.arange(a, min(a + CHUNK, len(x))), max(0, a - WINDOW)
        g = x[q] @ x[lo : q[-1]].T  # (each row against the WINDOW rows before it)
        j = np.argmax(np.tril(g * g / np.maximum(norm[lo : q[-1]], 1), a - lo - 1), 1)
        par, dot = lo + j, g[np.arange(len(q)), j]
        k = np.clip(np.rint(STEP * dot / np.maximum(norm[par], 1)), -2 * STEP, 2 * STEP).astype(np.int32)
        res = codes[q] - ((k[:, None] * codes[par] + STEP // 2) >> SHIFT)
        # bits saved, as by Gaussians of the row's and the residual's energy
        left = np.einsum("ij,ij->i", res, res, dtype=np.float64)
        gain = 0.5 * cols * np.log2((norm[q] + cols) / (left + cols))
        use = gain > ROW_BITS  # (the mask above keeps every parent before its row)
        out[q[use]] = np.stack([q[use] - par[use], k[use]], 1)
    return out if out[:, 0].any() else None


def residuals(codes: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """codes minus each row's prediction, wrapping in int8."""
    rows = np.flatnonzero(parents[:, 0])
    pred = (parents[rows, 1:] * codes[rows - parents[rows, 0]].astype(np.int32) + STEP // 2) >> SHIFT
    out = codes.copy()
    out[rows] = (codes[rows] - pred).astype(np.int8)
    return out


def restore(res: np.ndarray, parents: np.ndarray, where: str) -> np.ndarray:
    """residuals inverted, row by row (a parent is restored before its children)."""
    if (parents[:, 0] < 0).any() or (parents[:, 0] > np.arange(len(res))).any():
        raise ArtifactError(f"{where} parents: each must reach back to an earlier row")
    if (parents[:, 1] < -2 * STEP).any() or (parents[:, 1] > 2 * STEP).any():
        raise ArtifactError(f"{where} parents: multipliers must lie in [-{2 * STEP}, {2 * STEP}]")
    out = res.copy()
    for i, (d, k) in enumerate(parents.tolist()):  # (Python ints: a tenth quicker a row)
        if d:
            out[i] += ((k * out[i - d].astype(np.int32) + STEP // 2) >> SHIFT).astype(np.int8)
    return out
