"""Rows predicted from earlier rows (budget/parents.py): the search finds the
related rows of a token-embedding-like matrix, every reader restores the codes bit for bit, and
forged parents are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import standalone_loader

from recurnorm import quant
from recurnorm.budget import parents
from recurnorm.budget.api import pack_qtensors, read_artifact, unpack
from recurnorm.budget.options import PackOptions
from recurnorm.errors import ArtifactError


def _related_rows(seed: int = 0, roots: int = 150, kids: int = 450) -> torch.Tensor:
    """Roots, then rows that are a root's multiple plus noise (words of one stem)."""
    rng = np.random.default_rng(seed)
    stems = rng.standard_normal((roots, 64))
    words = stems[rng.integers(0, roots, kids)] * rng.uniform(0.5, 1.5, (kids, 1)) + 0.2 * rng.standard_normal(
        (kids, 64)
    )
    return torch.from_numpy(np.concatenate([stems, words]).astype(np.float32))


def test_the_search_finds_related_rows_and_residuals_invert():
    qt = quant.get("int8").quantize(_related_rows(), name="emb")
    p = parents.find(qt.codes)
    assert p is not None and (p[450:, 0] > 0).mean() > 0.9  # (kids come after their roots)
    assert (p[:, 0] <= np.arange(len(p))).all()
    res = parents.residuals(qt.codes, p)
    assert np.abs(res).mean() < 0.5 * np.abs(qt.codes).mean()
    assert np.array_equal(parents.restore(res, p, "emb"), qt.codes)
    iid = quant.get("int8").quantize(torch.randn(300, 64, generator=torch.Generator().manual_seed(0)), name="x")
    assert parents.find(iid.codes) is None  # nothing to gain: no stream
    assert parents.find(np.arange(-64, 64, dtype=np.int8).repeat(64)[:, None]) is None  # one column


@pytest.mark.parametrize("compact", [False, True])
def test_effort_max_packs_smaller_and_every_reader_restores_the_codes(compact):
    qts = {"emb": quant.get("int8").quantize(_related_rows(), name="emb")}
    normal, best = pack_qtensors(qts), pack_qtensors(qts, effort="max")
    art = read_artifact(best)
    assert "parents" in art.manifest["tensors"][0]["streams"] and len(best) < 0.9 * len(normal)
    assert np.array_equal(art.qtensors["emb"].codes, qts["emb"].codes)
    got, _ = standalone_loader(compact)["decode"](best)
    assert got["emb"].tobytes() == unpack(best)["emb"].numpy().tobytes()


def test_every_pack_searches_a_tall_tensor():
    """A token embedding's rows are searched at effort normal too (tensors of parents_search_rows
    rows or more): its kids' parents lie far back, where `previous` does not look."""
    emb = _related_rows(roots=1024, kids=PackOptions().parents_search_rows)
    qts = {"emb": quant.get("int8").quantize(emb, name="emb")}
    searched = pack_qtensors(qts)
    assert "parents" in read_artifact(searched).manifest["tensors"][0]["streams"]
    assert len(searched) < 0.9 * len(pack_qtensors(qts, options=PackOptions(parents_search_rows=len(emb) + 1)))
    assert np.array_equal(read_artifact(searched).qtensors["emb"].codes, qts["emb"].codes)


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_search_runs_on_one_blas_thread_inside_pack(monkeypatch, tmp_path, jobs):
    """pack runs tensors side by side itself: numpy's BLAS (the search's products) gets one
    thread there (in its worker processes too), and its own count back after (two OpenBLAS
    threads ran the search 1.3-15x slower whenever another process shared the cores)."""
    import json

    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    log, find = tmp_path / "seen", parents.find

    def logged(*a, **k):
        with open(log, "a") as f:  # (a file: with jobs, the search runs in worker processes)
            f.write(json.dumps(sorted(blas_threads())) + "\n")
        return find(*a, **k)

    monkeypatch.setattr(parents, "find", logged)
    emb = _related_rows(roots=1024, kids=PackOptions().parents_search_rows)
    qts = {f"emb{i}": quant.get("int8").quantize(emb + i, name="emb") for i in range(2)}
    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        pack_qtensors(qts, jobs=jobs)
        assert blas_threads() == before
    seen = [set(json.loads(line)) for line in log.read_text().splitlines()]
    assert len(seen) == 2 and all(s <= {1} for s in seen)
    if before != {1}:  # (a numpy built without a BLAS thread pool has nothing to limit)
        assert all(s == {1} for s in seen)


def test_the_search_holds_no_rows_by_clusters_matrix():
    """A large vocabulary's rows x clusters products go a block of rows at a time (128K rows x
    1,000 clusters took 1.2 GB whole): the peak stays far under one such matrix."""
    import tracemalloc

    rng = np.random.default_rng(0)
    codes = np.clip(rng.standard_normal((65536, 8)) * 40, -127, 127).astype(np.int8)
    codes[1::2] = codes[::2] // 2  # (rows with parents: the search runs to the end)
    whole = 4 * len(codes) * (len(codes) // parents.CLUSTER)  # float32 bytes of rows x clusters
    tracemalloc.start()
    try:
        assert parents.find(codes) is not None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < whole / 2  # (whole, it took two: the products and their partition)


@pytest.mark.parametrize(
    "forged,why",
    [
        (lambda p: p.__setitem__((5, 0), 6), "earlier row"),  # row 5 reaching back 6 rows
        (lambda p: p.__setitem__((5, 0), -1), "earlier row"),
        (lambda p: p.__setitem__((7, 1), 65), "multipliers"),
    ],
)
def test_forged_parents_are_refused(forged, why):
    codes = np.arange(40, dtype=np.int8).reshape(10, 4)
    p = np.zeros((10, 2), np.int32)
    forged(p)
    with pytest.raises(ArtifactError, match=why):
        parents.restore(codes, p, "tensor 'x'")


def test_parents_that_do_not_pay_lose_the_race(monkeypatch):
    """The sample (or the search) only proposes: the codes as they are race the residuals and
    their parents, and keep the artifact the same as without the proposal."""
    qts = {
        "iid": quant.get("int8").quantize(torch.randn(300, 64, generator=torch.Generator().manual_seed(1)), name="x")
    }
    plain = pack_qtensors(qts)
    every = np.r_[[[0, 0]], np.tile([[1, parents.STEP]], (299, 1))].astype(np.int32)
    monkeypatch.setattr(parents, "previous", lambda c, smooth: every)
    proposed = pack_qtensors(qts)
    assert proposed == plain and "parents" not in read_artifact(proposed).manifest["tensors"][0]["streams"]


def test_residuals_wrap_as_int32_arithmetic_would():
    """Every multiplier the format allows on every int8 code: the residuals (computed in int16)
    are the int32 formula's, wrapped to int8, and restore inverts them."""
    codes = np.arange(-128, 128, dtype=np.int8)[None, :].repeat(2 * parents.STEP * 2 + 2, 0)
    p = np.zeros((len(codes), 2), np.int32)
    p[1:] = np.stack([np.ones(len(codes) - 1, np.int32), np.arange(-2 * parents.STEP, 2 * parents.STEP + 1)], 1)
    pred = (p[1:, 1:] * codes[:-1].astype(np.int32) + parents.STEP // 2) >> parents.SHIFT
    res = parents.residuals(codes, p)
    assert np.array_equal(res[1:], (codes[1:] - pred).astype(np.int8)) and np.array_equal(res[0], codes[0])
    assert np.array_equal(parents.restore(res, p, "x"), codes)
