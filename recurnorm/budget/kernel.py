"""The compiled kernel (`_ransc.c`, built by setup.py where a C compiler is) behind one switch.

`c` is the kernel, or None where it is not built or RECURNORM_KERNEL=0 is set (tests run both
backends through `use`); where it is None its callers run the numpy references, which are its
specification: an artifact has the same bytes either way, only slower without it.

    entry point              numpy reference
    c.encode, c.decode       rans.ilv_encode_numpy, rans.ilv_decode_numpy
    c.counts                 rans.context_counts's np.bincount
    c.top_counts             codecs.Fields.split's numpy branch, rans.order0_bits's bincount
    c.fields_split, _join    codecs.split_words, codecs.join_words's numpy branches
    c.offer                  parents.py's numpy branch of parents.find
    c.histograms             cluster.axis_histograms
    kmeans, class_sums       cluster._kmeans, cluster.class_sums_all's numpy branches
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np

try:
    from . import _ransc as _built
except ImportError:  # pragma: no cover - depends on the build machine
    _built = None

c = None if os.environ.get("RECURNORM_KERNEL", "1") == "0" else _built


def on() -> bool:
    """Whether the compiled kernel runs (else the numpy references)."""
    return c is not None


@contextmanager
def use(enabled: bool):
    """The kernel on (where built) or off inside the block: how tests run both backends."""
    global c
    was, c = c, _built if enabled else None
    try:
        yield
    finally:
        c = was


def kmeans(hist, slots, iters: int, sample_items: int, bins: int, length_scale: float, prior: float):
    """[len(slots), items] classes for one problem, or None where its float32 sums would not be
    exact integers (reference: cluster._kmeans)."""
    h = np.ascontiguousarray(hist, dtype=np.float32)
    ks = np.ascontiguousarray(slots, dtype=np.int64)
    out = np.empty((len(ks), len(h)), dtype=np.int64)
    done = c.kmeans(h, len(h), h.shape[1], ks, iters, sample_items, bins, length_scale, prior, out)
    return out if done else None


def class_sums(hist: np.ndarray, ids_list, ks) -> list[np.ndarray] | None:
    """[k, nsym] float32 class sums per clustering, or None where float32 sums would round
    (reference: cluster.class_sums_all's numpy branch)."""
    h = np.ascontiguousarray(hist, dtype=np.float32)
    ids = np.ascontiguousarray(np.concatenate([np.asarray(i, dtype=np.int64) for i in ids_list]).ravel())
    ks = np.ascontiguousarray(ks, dtype=np.int64)
    out = np.empty((int(ks.sum()), h.shape[1]), dtype=np.float32)
    if not c.class_sums(h, h.shape[0], h.shape[1], ids, ks, out):
        return None
    return np.split(out, np.cumsum(ks)[:-1])
