"""benchmarks/pack.py's ZPAQ-per-role-group anchor: the grouping, the row sort, and that the
counted permutations are exactly what undoes the sort."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from recurnorm import quant

_SPEC = importlib.util.spec_from_file_location("bench_pack", Path(__file__).parents[1] / "benchmarks" / "pack.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def test_role_strips_layer_indices():
    assert bench.role("encoder.layer.3.attention.self.query.weight") == "encoder.layer.attention.self.query.weight"
    assert bench.role("blocks.10.mlp.fc.weight") == "blocks.mlp.fc.weight"
    assert bench.role("layers.2") == "layers"
    assert bench.role("embed") == "embed"
    names = ["h.0.q", "h.0.fc", "h.1.q", "h.1.fc", "emb"]
    assert bench.role_groups(names) == {"h.q": ["h.0.q", "h.1.q"], "h.fc": ["h.0.fc", "h.1.fc"], "emb": ["emb"]}


def test_matrix_undoes_groups_and_flat_rows():
    w = torch.randn(8, 128)
    for fmt in ("int4", "ternary", "int6"):
        qt = quant.get(fmt).quantize(w, name="w")
        m = bench.matrix(qt)
        assert m.shape == (8, 128)
        assert np.array_equal(m.ravel(), qt.codes.ravel()[: w.numel()])


def test_l1_chain_follows_nearest_rows():
    values = np.array([0, 7, 3, 9, 1, 5, 2, 8, 4, 6])  # row 0 holds the smallest value
    m = np.repeat(values[:, None], 5, axis=1).astype(np.int8)
    order = bench.l1_chain(m)
    assert sorted(order.tolist()) == list(range(len(m)))
    assert values[order].tolist() == sorted(values.tolist())
    assert bench.l1_chain(m[:1]).tolist() == [0]


def _undo(codes: bytes, perms: bytes, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    """The matrices back from a group blob: transposes undone, then the counted permutations."""
    flat, p = np.frombuffer(codes, np.int8), np.frombuffer(perms, np.uint16)
    out = []
    for r, c in shapes:
        m, flat = flat[: r * c].reshape(c, r).T, flat[r * c :]
        if len(p):
            order, p = p[:r], p[r:]
            m = m[np.argsort(order)]
        out.append(m)
    assert not len(flat) and not len(p)
    return out


def test_group_blob_counts_what_undoes_the_sort(monkeypatch):
    rng = np.random.default_rng(0)
    mats = [rng.integers(-31, 32, size=(12, 5)).astype(np.int8) for _ in range(3)]
    codes, perms = bench.group_blob(mats, sort=False)
    assert perms == b"" and len(codes) == 3 * 12 * 5
    assert all(np.array_equal(a, b) for a, b in zip(_undo(codes, perms, [(12, 5)] * 3), mats, strict=True))

    codes, perms = bench.group_blob(mats, sort=True)
    assert len(perms) == 3 * 12 * 2  # one uint16 per row
    assert all(np.array_equal(a, b) for a, b in zip(_undo(codes, perms, [(12, 5)] * 3), mats, strict=True))

    monkeypatch.setattr(bench, "SORT_MAX_ROWS", 4)  # too many rows: left unsorted, nothing counted
    assert bench.group_blob(mats, sort=True) == bench.group_blob(mats, sort=False)


@pytest.mark.skipif(shutil.which("zpaq") is None, reason="zpaq is not installed")
def test_zpaq_bytes_sort_never_larger(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "SIZES", str(tmp_path / "sizes.json"))
    rng = np.random.default_rng(1)
    w = {f"h.{i}.q": torch.from_numpy(rng.standard_t(5, size=(64, 32)).astype(np.float32)) for i in range(2)}
    qts = {k: quant.get("int6").quantize(v, name=k) for k, v in w.items()}
    got = bench.zpaq_bytes(qts)
    assert 0 < got["zpaq-sort"] <= got["zpaq"] < 2 * 64 * 32 + 1000


def test_anchor_sizes_are_remembered_by_content(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "SIZES", str(tmp_path / "sizes.json"))
    calls = []

    def size(data):
        calls.append(data)
        return len(data) + 1

    assert bench.remembered("x", b"abc", size) == 4
    assert bench.remembered("x", b"abc", size) == 4  # from the file
    assert bench.remembered("y", b"abc", size) == 4 and bench.remembered("x", b"abcd", size) == 5
    assert len(calls) == 3


def test_gates_benchmark_refuses_an_unknown_gate():
    """A misspelt gate would otherwise be measured as a no-op (on and off the same) and print +0%."""
    import subprocess
    import sys

    gates = Path(__file__).parents[1] / "benchmarks" / "gates.py"
    run = subprocess.run([sys.executable, str(gates), "--gate", "lzma_norep"], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown gate 'lzma_norep'" in run.stderr and "codes_norep" in run.stderr
