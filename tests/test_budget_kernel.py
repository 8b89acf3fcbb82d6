"""The compiled rANS kernel is the numpy reference, only faster: same bytes, same verdicts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recurnorm.budget import kernel, pack_qtensors, rans, read_artifact, search, spec
from recurnorm.errors import ArtifactError
from recurnorm.quant.qtensor import QTensor

compiled = pytest.mark.skipif(kernel._built is None, reason="compiled rANS kernel not built (no C compiler)")


def _stream(seed: int, n: int, nsym: int, k: int, prec: int):
    """Skewed symbols with per-context tables normalized to 2**prec."""
    rng = np.random.default_rng(seed)
    ctx = rng.integers(0, k, n)
    sym = np.minimum((rng.exponential(size=n) * (ctx + 1) * nsym / 8).astype(np.int64), nsym - 1)
    counts = np.bincount(ctx * nsym + sym, minlength=k * nsym).reshape(k, nsym)
    if int((counts > 0).sum(axis=1).max()) > 1 << prec:  # too many symbols for the table
        sym %= 1 << prec
        counts = np.bincount(ctx * nsym + sym, minlength=k * nsym).reshape(k, nsym)
    return sym, (ctx if k > 1 else None), rans.normalize_table(counts, prec)


def _compiled_decode(data, ctx, freq, prec, lanes, n):
    try:
        return rans.ilv_decode(data, ctx, freq, prec, lanes, n)
    except ArtifactError:
        return None


def _reference_decode(data, ctx, freq, prec, lanes, n):
    if -(-n // lanes) > spec.MAX_STEPS or len(data) < 4 * lanes or len(data) % 2:
        return None
    try:
        with np.errstate(over="ignore"):
            return rans.ilv_decode_numpy(data, ctx, freq, prec, lanes, n)
    except ArtifactError:
        return None


@compiled
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(0, 3000),
    nsym=st.integers(1, 300),
    k=st.integers(1, 5),
    prec=st.integers(1, 16),
    lanes_log=st.integers(0, 7),
)
def test_kernel_bytes_equal_numpy_reference(seed, n, nsym, k, prec, lanes_log):
    sym, ctx, freq = _stream(seed, n, nsym, k, prec)
    lanes = 1 << lanes_log
    data = rans.ilv_encode(sym, ctx, freq, prec, lanes)
    assert data == rans.ilv_encode_numpy(sym, ctx, freq, prec, lanes)
    out = rans.ilv_decode(data, ctx, freq, prec, lanes, n)
    assert np.array_equal(out, sym)
    assert np.array_equal(rans.ilv_decode_numpy(data, ctx, freq, prec, lanes, n), sym)


@compiled
@pytest.mark.parametrize("prec", [8, pytest.param(16, marks=pytest.mark.slow)])  # 16: 64K-slot tables
def test_kernel_codes_every_one_byte_context(prec):
    """All 256 contexts a uint8 id can name (wide grids): the reference's bytes; one more is refused."""
    k = spec.MAX_CONTEXTS
    assert k == 256
    sym, ctx, freq = _stream(7, 50_000, 3, k, prec)
    assert ctx.max() == k - 1
    data = rans.ilv_encode(sym, ctx, freq, prec, 16)
    assert data == rans.ilv_encode_numpy(sym, ctx, freq, prec, 16)
    assert np.array_equal(rans.ilv_decode(data, ctx, freq, prec, 16, len(sym)), sym)
    assert np.array_equal(rans.ilv_decode_numpy(data, ctx, freq, prec, 16, len(sym)), sym)
    wider = np.vstack([freq, freq[:1]])
    with pytest.raises((ValueError, ArtifactError)):
        kernel._built.encode(sym.astype(np.uint16), ctx.astype(np.uint8), wider.astype(np.uint32).ravel(), 3, prec, 16)


@compiled
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), flips=st.integers(1, 4), cut=st.integers(-6, 6))
def test_kernel_accepts_and_rejects_what_the_reference_does(seed, flips, cut):
    """Mutated and truncated streams: both raise, or both return the same symbols."""
    rng = np.random.default_rng(seed)
    sym, ctx, freq = _stream(seed, 2000, 40, 3, 10)
    lanes = 4
    blob = bytearray(rans.ilv_encode(sym, ctx, freq, 10, lanes))
    for i in rng.integers(0, len(blob), size=flips):
        blob[i] ^= int(rng.integers(1, 256))
    blob = bytes(blob[: len(blob) + cut] if cut < 0 else blob + bytes(cut))
    got = _compiled_decode(blob, ctx, freq, 10, lanes, len(sym))
    want = _reference_decode(blob, ctx, freq, 10, lanes, len(sym))
    assert (got is None) == (want is None)
    if got is not None:
        assert np.array_equal(got, want)


@compiled
def test_kernel_reads_hostile_tables_as_the_reference():
    """Rows that do not sum to 2**prec (or hold huge counts) select the reference's stand-in."""
    sym, ctx, freq = _stream(1, 500, 20, 2, 8)
    data = rans.ilv_encode(sym, ctx, freq, 8, 2)
    for bad in (freq * 3, freq + (1 << 40), np.zeros_like(freq)):
        assert (
            _compiled_decode(data, ctx, bad, 8, 2, 500) is None and _reference_decode(data, ctx, bad, 8, 2, 500) is None
        )
    with pytest.raises(ValueError, match="zero frequency"):
        rans.ilv_encode(sym, ctx, np.zeros_like(freq), 8, 2)


@compiled
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    rows=st.integers(0, 70),
    cols=st.integers(1, 90),
    nsym=st.sampled_from([1, 3, 15, 255, 4096]),
    axis=st.integers(0, 1),
    stride=st.integers(1, 4),
)
def test_kernel_histograms_equal_numpy_reference(seed, rows, cols, nsym, axis, stride):
    from recurnorm.budget import cluster

    sym = np.random.default_rng(seed).integers(0, nsym, rows * cols + 5)
    mat = sym[: rows * cols].reshape(rows, cols)
    part = mat[:, ::stride] if axis == 0 else mat[::stride]
    got = np.zeros(((rows, cols)[axis], nsym), np.float32)
    kernel._built.histograms(sym.astype(np.uint16), rows, cols, nsym, axis, stride, got)
    assert np.array_equal(got, cluster.axis_histograms(part, axis, nsym))
    if rows * cols:  # a symbol past the alphabet is refused, not counted out of bounds
        with pytest.raises(ValueError, match="out of range"):
            kernel._built.histograms(
                np.full(rows * cols, nsym, np.uint16), rows, cols, nsym, axis, stride, np.zeros_like(got)
            )


@compiled
@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(0, 3000),
    nsym=st.sampled_from([1, 3, 16, 243, 4096]),
    k=st.sampled_from([1, 2, 7, 256]),
)
def test_kernel_context_counts_equal_numpy_reference(seed, n, nsym, k):
    rng = np.random.default_rng(seed)
    sym, ctx = rng.integers(0, nsym, n), rng.integers(0, k, n).astype(np.uint8)
    got = rans.context_counts(sym, ctx, k, nsym)
    want = np.bincount(ctx.astype(np.int64) * nsym + sym, minlength=k * nsym).reshape(k, nsym)
    assert got.shape == (k, nsym) and np.array_equal(got, want)
    with kernel.use(False):  # the numpy fallback (no fixture: hypothesis)
        assert np.array_equal(rans.context_counts(sym, ctx, k, nsym), want)
    if n:  # a symbol or context past its range is refused, not counted out of bounds
        with pytest.raises(ValueError, match="out of range"):
            kernel._built.counts(np.full(n, nsym, np.uint16), None, nsym, 1, np.zeros(nsym, np.int64))
        if k < 256:
            with pytest.raises(ValueError, match="out of range"):
                kernel._built.counts(
                    sym.astype(np.uint16), np.full(n, k, np.uint8), nsym, k, np.zeros(k * nsym, np.int64)
                )


def test_reference_encoder_takes_narrow_ids_and_units():
    """The encoder hands uint8 ids and uint16 units to the coder; the numpy reference must
    code them as it codes int64 ones (ctx * nsym would wrap in uint8)."""
    sym, ctx, freq = _stream(4, 3000, 255, 7, 12)
    want = rans.ilv_encode_numpy(sym.astype(np.int64), ctx.astype(np.int64), freq, 12, 4)
    assert rans.ilv_encode_numpy(sym.astype(np.uint16), ctx.astype(np.uint8), freq, 12, 4) == want
    assert rans.ilv_encode(sym.astype(np.uint16), ctx.astype(np.uint8), freq, 12, 4) == want


@compiled
@pytest.mark.slow  # packs through the numpy reference coder
def test_fallback_writes_the_same_artifact(monkeypatch):
    """Without the compiled kernel the numpy reference (coder and search histograms) writes
    and reads identical bytes."""
    rng = np.random.default_rng(3)
    qts = {}
    for name, (rows, cols, span) in {"a": (48, 96, 7), "b": (256, 160, 7), "c": (200, 192, 127)}.items():
        w = rng.normal(size=(rows, cols)) * rng.uniform(0.3, 2.0, size=(1, cols))
        s = np.abs(w).max(1) / span
        qts[name] = QTensor(
            "int4" if span == 7 else "int8",
            w.shape,
            "float32",
            np.round(w / s[:, None]).astype(np.int8),
            s.astype(np.float16),
        )
    from helpers import embedding_like

    qts["e"] = QTensor("ternary", (256, 128), "float32", embedding_like().reshape(1, -1), np.ones(1, np.float32))
    fast = pack_qtensors(qts)
    contexts = {t["streams"]["codes"]["params"].get("context") for t in read_artifact(fast).manifest["tensors"]}
    assert {"col", "grid"} <= contexts
    monkeypatch.setattr(kernel, "c", None)
    assert pack_qtensors(qts) == fast
    assert all(np.array_equal(read_artifact(fast).qtensors[k].codes, q.codes) for k, q in qts.items())


@compiled
@pytest.mark.slow  # packs 4M codes through the numpy reference coder (about 3 s)
def test_fallback_writes_the_same_artifact_on_millions_of_codes(monkeypatch):
    """The README's promise at the size where the context search once sampled without the kernel
    (2M codes a tensor, past 2 x search.SEARCH_SAMPLE): the same bytes, grids chosen alike."""
    from helpers import joint_like

    rng = np.random.default_rng(7)
    rows, cols = 4096, 512
    w = rng.normal(size=(rows, cols)) * rng.uniform(0.3, 2.0, (1, cols)) * np.where(rng.random((rows, 1)) < 0.3, 0.4, 2)
    s = np.abs(w).max(1) / 7
    qts = {
        "w": QTensor("int4", w.shape, "float32", np.round(w / s[:, None]).astype(np.int8), s.astype(np.float16)),
        "e": QTensor("ternary", (rows, cols), "float32", joint_like(rows=rows, cols=cols).reshape(1, -1), np.ones(1)),
    }
    assert min(q.codes.size for q in qts.values()) >= 2 * search.SEARCH_SAMPLE  # (sampled every 2nd row)
    with kernel.use(True):
        fast = pack_qtensors(qts)
    tensors = read_artifact(fast).manifest["tensors"]
    assert {t["streams"]["codes"]["params"].get("context") for t in tensors} == {"grid"}
    monkeypatch.setattr(rans, "_FALLBACK_NOTE_UNITS", 1 << 20)  # (it warns once a process)
    with kernel.use(False), pytest.warns(RuntimeWarning, match="kernel is not built"):
        assert pack_qtensors(qts) == fast


def test_fallback_warns_once_on_big_streams(monkeypatch):
    monkeypatch.setattr(kernel, "c", None)
    monkeypatch.setattr(rans, "_FALLBACK_NOTE_UNITS", 1000)
    sym, ctx, freq = _stream(9, 1200, 10, 1, 8)
    with pytest.warns(RuntimeWarning, match="compiled rANS kernel is not built"):
        data = rans.ilv_encode(sym, ctx, freq, 8, 64)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: a second big stream is quiet
        assert np.array_equal(rans.ilv_decode(data, ctx, freq, 8, 64, len(sym)), sym)


@compiled
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    items=st.integers(4, 700),
    nsym=st.sampled_from([2, 3, 15, 16, 17, 255, 1000]),
    ks=st.sampled_from([(2,), (2, 4, 8, 16), (4, 16), (2, 4, 8, 16, 32)]),
    iters=st.sampled_from([0, 1, 4, 8]),
)
def test_kernel_kmeans_equals_numpy_reference(seed, items, nsym, ks, iters):
    """The compiled k-means gives the numpy batch's classes, class for class (sampled
    problems, coarse bins, ties, empty classes, no iterations), or declines."""
    from recurnorm.budget import cluster

    rng = np.random.default_rng(seed)
    spread = rng.exponential(3, size=(items, 1)) * (1 + (np.arange(items) % 3 == 0))[:, None]
    hist = rng.poisson(spread * rng.exponential(1, size=(1, nsym))).astype(np.float32)
    ks = tuple(k for k in ks if k < items) or (2,)
    want = cluster._kmeans([hist], list(ks), iters)[0]
    got = kernel.kmeans(hist, ks, iters, cluster.KMEANS_ITEMS, cluster.KMEANS_BINS, 1024.0, 0.5)
    # It declines exactly where the reference's float32 spreads (count x distance) would round.
    spread = hist.astype(np.float64) @ np.abs(np.arange(nsym) - hist.sum(axis=0).argmax())
    assert (got is not None) == (spread.max() < 2**24)
    assert got is None or np.array_equal(got, want)


@compiled
def test_kernel_kmeans_declines_past_exact_float32_sums():
    """Counts whose float32 sums the reference would round: the kernel declines and
    cluster_many runs the numpy reference (same classes as without the kernel)."""
    from recurnorm.budget import cluster

    hist = np.full((8, 4), 3e6, dtype=np.float32)  # total 9.6e7 > 2**24
    hist[::2, 0] = 1.0
    assert kernel.kmeans(hist, (2,), 4, cluster.KMEANS_ITEMS, cluster.KMEANS_BINS, 1024.0, 0.5) is None
    assert np.array_equal(cluster.cluster_many([hist], [[2]])[0][0], cluster._kmeans([hist], [2], 4)[0][0])


@compiled
@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    items=st.integers(1, 400),
    nsym=st.sampled_from([1, 3, 15, 255]),
    ks=st.sampled_from([(1,), (2,), (2, 4, 8, 16), (32, 3)]),
)
def test_kernel_class_sums_equal_numpy_reference(seed, items, nsym, ks):
    """Class sums of histograms (class_sums_all, and ranked_class_sums' runs) from the kernel
    are the reference's float32 sums; past float32's exact integers it declines."""
    from recurnorm.budget import cluster

    rng = np.random.default_rng(seed)
    hist = rng.poisson(3, size=(items, nsym)).astype(np.float32)
    ids = [rng.integers(0, k, items) for k in ks]
    member = [np.stack([hist[i == c].sum(axis=0) for c in range(k)]) for i, k in zip(ids, ks, strict=True)]
    got = kernel.class_sums(hist, ids, ks)
    assert all(g.dtype == np.float32 and np.array_equal(g, m) for g, m in zip(got, member, strict=True))
    order = rng.permutation(items)
    want = [np.stack([hist[rans.rank_buckets(order, k) == c].sum(axis=0) for c in range(k)]) for k in ks]
    assert all(np.array_equal(g, w) for g, w in zip(cluster.ranked_class_sums(hist, order, ks), want, strict=True))
    assert kernel.class_sums(np.full((2, 2), 5e6, np.float32), [np.array([0, 1])], [2]) is None
    with pytest.raises(ValueError, match="out of range"):
        kernel.class_sums(hist, [np.full(items, ks[0])], ks[:1])


def _families(seed: int, rows: int, cols: int) -> np.ndarray:
    """int8 rows that are multiples of earlier roots plus noise (a token embedding's families)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols))
    kids = np.flatnonzero(rng.random(rows) < 0.7)
    kids = kids[kids > 0]
    roots = (rng.random(len(kids)) * kids).astype(np.int64)
    w[kids] = w[roots] * rng.uniform(-1.5, 1.5, (len(kids), 1)) + 0.3 * w[kids]
    return np.clip(np.round(w * 127 / np.abs(w).max(1, keepdims=True)), -127, 127).astype(np.int8)


@compiled
@pytest.mark.parametrize("rows,cols,wide", [(600, 64, False), (3000, 96, False), (1500, 40, True)])
def test_kernel_parents_search_equals_numpy_reference(monkeypatch, rows, cols, wide):
    """parents.find proposes the same parents with the kernel's offer as with numpy's."""
    from recurnorm.budget import parents
    from recurnorm.budget.options import PackOptions

    codes, probes = _families(rows, rows, cols), PackOptions.for_effort("max" if wide else "normal").parents_probes
    fast = parents.find(codes, probes)
    assert fast is not None and (fast[:, 0] > 0).mean() > 0.3
    assert np.array_equal(parents.find(np.asfortranarray(codes), probes), fast)  # (the kernel takes a contiguous copy)
    monkeypatch.setattr(kernel, "c", None)
    assert np.array_equal(parents.find(codes, probes), fast)


@compiled
def test_kernel_offer_picks_numpy_argmax():
    """The kernel's choice among sketched candidates is np.argmax's over the masked |values|:
    the first maximum, the first candidate on an all-zero row, the first NaN (an infinity past
    the mask is one), and each row's exact score against the one it holds."""
    rng = np.random.default_rng(3)
    codes = rng.integers(-128, 128, (40, 37)).astype(np.int8)  # (37: past the kernel's 16-code steps)
    codes[30] = -128
    norm = np.maximum((codes.astype(np.float32) ** 2).sum(1), 1)
    q, cand = np.array([5, 9, 20, 30, 31, 39]), np.array([1, 4, 7, 9, 15, 28, 33])
    sk = rng.standard_normal((len(q), len(cand))).astype(np.float32)
    sk[0, :] = 0  # only cand 1 and 4 come before row 5: both zero
    sk[1, 1] = sk[1, 2] = -9  # a tie: the first
    sk[2, 5] = np.inf  # an infinity past the mask: NaN there
    sk[3, 3], sk[3, 1] = np.nan, 50  # a NaN before the mask's end
    sk[4, 6] = 1e30  # large, but masked away
    sk[5, 2] = np.inf  # an infinity that counts
    with np.errstate(invalid="ignore"):  # (inf * 0)
        want = cand[np.argmax(np.abs(sk) * (cand < q[:, None]), 1)]
    d = (codes[q].astype(np.int16) * codes[want]).sum(1, dtype=np.int32)
    s = d.astype(np.float32) ** 2 / norm[want]
    score, parent, dot = np.zeros(40, np.float32), np.zeros(40, np.int64), np.zeros(40, np.int32)
    score[q[0]] = np.inf  # a row already holding a better parent keeps it
    kernel._built.offer(codes, q, cand, sk, norm, score, parent, dot)
    better = (want < q) & (np.arange(len(q)) > 0)
    assert np.array_equal(parent[q], np.where(better, want, 0)) and np.array_equal(dot[q], np.where(better, d, 0))
    assert np.array_equal(score[q[1:]], np.where(better, s, 0)[1:])
    assert list(want[[0, 1, 2, 3, 5]]) == [1, 4, 28, 9, 7]  # (what the cases above ask of np.argmax)
