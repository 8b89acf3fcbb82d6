"""The compiled kernel (`_ransc.c`, built by setup.py where a C compiler is) behind one switch.

Each entry point names its numpy reference: the specification, and what its caller runs where
`on()` is False, because the kernel is not built or RECURNORM_KERNEL=0 is set (tests run both
backends through `use`). Either way an artifact has the same bytes, only slower without it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np

try:
    from . import _ransc as _built
except ImportError:  # pragma: no cover - depends on the build machine
    _built = None

_c = None if os.environ.get("RECURNORM_KERNEL", "1") == "0" else _built


def on() -> bool:
    """Whether the compiled kernel runs (else the numpy references)."""
    return _c is not None


def built() -> bool:
    """Whether the compiled kernel is built (RECURNORM_KERNEL=0 may still keep it off)."""
    return _built is not None


@contextmanager
def use(enabled: bool):
    """The kernel on (where built) or off inside the block: how tests run both backends."""
    global _c
    was, _c = _c, _built if enabled else None
    try:
        yield
    finally:
        _c = was


def encode(sym16, ctx8, freq32, nsym: int, prec: int, lanes: int) -> bytes:
    """Interleaved rANS encoding (reference: rans.ilv_encode_numpy)."""
    return _c.encode(sym16, ctx8, freq32, nsym, prec, lanes)


def decode(data, ctx8, freq32, nsym: int, prec: int, lanes: int, out16) -> None:
    """Its decoding into out16; ValueError on a malformed stream (reference: rans.ilv_decode_numpy)."""
    _c.decode(data, ctx8, freq32, nsym, prec, lanes, out16)


def counts(sym16, ctx8, nsym: int, k: int, out) -> None:
    """[k * nsym] counts of symbols under context ids (reference: np.bincount in rans.context_counts)."""
    _c.counts(sym16, ctx8, nsym, k, out)


def top_counts(words, itemsize: int, shift: int, out) -> None:
    """Counts of float words' bits above `shift` (reference: codecs.Fields.split's numpy branch)."""
    _c.top_counts(words, itemsize, shift, out)


def fields_split(words, itemsize: int, m: int, h: int, head, tail) -> None:
    """Float words into head and tail (reference: codecs.split_words's numpy branch)."""
    _c.fields_split(words, itemsize, m, h, head, tail)


def fields_join(words, itemsize: int, m: int, h: int, head, tail) -> None:
    """split_words inverted; ValueError on a malformed tail (reference: codecs.join_words's numpy branch)."""
    _c.fields_join(words, itemsize, m, h, head, tail)


def offer(*args):
    """parents.find's scoring of candidate rows (reference: parents.py's numpy branch)."""
    return _c.offer(*args)


def histograms(sym16: np.ndarray, rows: int, cols: int, nsym: int, axis: int, stride: int) -> np.ndarray:
    """Per-row (axis 0) or per-column (axis 1) symbol counts of a rows x cols matrix of uint16
    symbols, every `stride`-th position along the other axis (reference: cluster.axis_histograms)."""
    hist = np.zeros(((rows, cols)[axis], nsym), dtype=np.float32)
    _c.histograms(sym16, rows, cols, nsym, axis, stride, hist)
    return hist


def kmeans(hist, slots, iters: int, sample_items: int, bins: int, length_scale: float, prior: float):
    """[len(slots), items] classes for one problem, or None where its float32 sums would not be
    exact integers (reference: cluster._kmeans)."""
    h = np.ascontiguousarray(hist, dtype=np.float32)
    ks = np.ascontiguousarray(slots, dtype=np.int64)
    out = np.empty((len(ks), len(h)), dtype=np.int64)
    done = _c.kmeans(h, len(h), h.shape[1], ks, iters, sample_items, bins, length_scale, prior, out)
    return out if done else None


def class_sums(hist: np.ndarray, ids_list, ks) -> list[np.ndarray] | None:
    """[k, nsym] float32 class sums per clustering, or None where float32 sums would round
    (reference: cluster.class_sums_all's numpy branch)."""
    h = np.ascontiguousarray(hist, dtype=np.float32)
    ids = np.ascontiguousarray(np.concatenate([np.asarray(i, dtype=np.int64) for i in ids_list]).ravel())
    ks = np.ascontiguousarray(ks, dtype=np.int64)
    out = np.empty((int(ks.sum()), h.shape[1]), dtype=np.float32)
    if not _c.class_sums(h, h.shape[0], h.shape[1], ids, ks, out):
        return None
    return np.split(out, np.cumsum(ks)[:-1])
