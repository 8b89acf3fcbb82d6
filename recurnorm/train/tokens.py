"""Several token files as one read-only 1-D token array, read on demand.

FineWeb training shards are 100M tokens each; concatenating them into one
int64 array costs 8 bytes a token on every rank (8 GB per billion tokens).
``TokenStream`` keeps each shard memory-mapped and answers exactly the reads
training makes: ``len``, a slice, or an integer index array (the windows of a
batch), each returned as int64. The operating system's page cache is shared
by the ranks, and each rank touches only the windows of its own slice.
"""

from __future__ import annotations

import numpy as np


class TokenStream:
    """Read-only concatenation of 1-D token arrays (typically np.memmap shards)."""

    ndim = 1
    dtype = np.dtype(np.int64)  # what reads return

    def __init__(self, parts: list[np.ndarray]):
        self.parts = [p for p in parts if len(p)]
        lens = np.array([len(p) for p in self.parts], dtype=np.int64)
        self.ends = np.cumsum(lens)
        self.starts = self.ends - lens
        self.size = int(self.ends[-1]) if len(lens) else 0
        self.shape = (self.size,)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx) -> np.ndarray:
        if isinstance(idx, slice):
            start, stop, step = idx.indices(self.size)
            if step != 1:
                return self[np.arange(start, stop, step)]
            out = []
            for k in range(len(self.parts)):
                lo, hi = max(start, int(self.starts[k])), min(stop, int(self.ends[k]))
                if lo < hi:
                    out.append(self.parts[k][lo - self.starts[k] : hi - self.starts[k]])
            return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)
        arr = np.asarray(idx)
        if arr.ndim == 0:
            return self[arr.reshape(1)][0]
        flat = arr.reshape(-1).astype(np.int64)
        flat = np.where(flat < 0, flat + self.size, flat)
        if flat.size and (flat.min() < 0 or flat.max() >= self.size):
            raise IndexError(f"token index out of range for a stream of {self.size} tokens")
        which = np.searchsorted(self.ends, flat, side="right")
        out = np.empty(flat.shape, dtype=np.int64)
        for k in np.unique(which):
            m = which == k
            out[m] = self.parts[k][flat[m] - self.starts[k]]
        return out.reshape(arr.shape)

    def max(self) -> int:
        return max(int(p.max()) for p in self.parts)

    def tolist(self) -> list[int]:
        return np.asarray(self).tolist()

    def astype(self, dtype) -> np.ndarray:
        return np.asarray(self).astype(dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The whole stream in memory (for callers that need a real array)."""
        out = self[0 : self.size]
        return out if dtype is None else out.astype(dtype)
