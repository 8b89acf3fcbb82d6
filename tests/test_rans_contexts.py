"""Smooth rows predicted by the row above (a parents stream, parents.previous) and rans block
and map contexts (context "block", "map"): the packer uses each where it wins, and the library,
the standalone loader (readable and compact) and the numpy reference coder agree bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import standalone_loader

from recurnorm import quant
from recurnorm.budget import kernel, parents, rans, search
from recurnorm.budget.api import pack_qtensors, read_artifact, unpack, verify_bytes
from recurnorm.budget.options import PackOptions


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Smooth rows (a position embedding's random walk, as in all-MiniLM-L6-v2), i.i.d. rows,
    a smooth 3-D tensor (rows = dim 0), and a token embedding whose columns lean by region of
    rows (block contexts)."""
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.normal(size=(300, 48)), axis=0) * np.exp(rng.normal(0, 0.3, size=(1, 48)))
    lean = np.repeat(rng.normal(0, 0.8, size=(8, 96)), 300, axis=0)[:2100]
    spread = np.exp(np.repeat(rng.normal(0, 0.3, size=(8, 96)), 300, axis=0)[:2100])
    return {
        "pos": torch.from_numpy(walk.astype(np.float32)),
        "iid": torch.from_numpy(rng.standard_t(5, size=(256, 64)).astype(np.float32)),
        "conv": torch.from_numpy(np.cumsum(rng.normal(size=(64, 4, 16)), axis=0).astype(np.float32)),
        "emb": torch.from_numpy((lean + spread * rng.standard_t(6, size=(2100, 96))).astype(np.float32)),
    }


def _packed(fmt: str, opts=None) -> tuple[dict, bytes, dict]:
    """(QTensors, artifact, {name: codes params, plus "parents" where the rows are predicted})."""
    qts = {k: quant.get(fmt, **(opts or {})).quantize(v, name=k) for k, v in _weights().items()}
    data = pack_qtensors(qts)
    params = {
        t["name"]: {**t["streams"]["codes"]["params"], **({"parents": 1} if "parents" in t["streams"] else {})}
        for t in read_artifact(data).manifest["tensors"]
    }
    return qts, data, params


@pytest.mark.parametrize("fmt,opts", [("int8", {}), ("int6", {"clip": "sigma:3"}), ("int4", {})])
@pytest.mark.parametrize("compact", [False, True])
def test_smooth_rows_are_predicted_and_every_reader_gets_the_codes_back(fmt, opts, compact):
    qts, data, params = _packed(fmt, opts)
    assert params["pos"].get("parents") == 1 and "parents" not in params["iid"]
    if fmt != "int8":  # (int8 here: 75 tables of 255 symbols cost more than its scale buckets)
        assert params["emb"].get("context") == "block" and params["emb"]["rb"] in search.BLOCK_ROWS
    assert all(p.get("context") != "block" for k, p in params.items() if k != "emb")
    assert verify_bytes(data).ok
    art = read_artifact(data)
    for name, qt in qts.items():
        assert np.array_equal(art.qtensors[name].codes, qt.codes), name
    got, _ = standalone_loader(compact)["decode"](data)
    for name, t in unpack(data).items():
        assert got[name].tobytes() == t.numpy().tobytes(), name


def test_predicted_rows_and_blocks_make_streams_smaller(monkeypatch):
    """Without parents and block contexts the smooth and the leaning tensors take more bytes,
    and no tensor takes fewer."""
    _, data, _ = _packed("int6", {"clip": "sigma:3"})
    monkeypatch.setattr(parents, "previous", lambda *a: None)
    monkeypatch.setattr(search, "block_choice", lambda *a: None)
    _, plain, params = _packed("int6", {"clip": "sigma:3"})
    assert not any(p.get("parents") or p.get("context") == "block" for p in params.values())
    sizes = [
        {
            t["name"]: sum(s["length"] for k, s in t["streams"].items() if k != "scales")
            for t in read_artifact(d).manifest["tensors"]
        }
        for d in (data, plain)
    ]
    assert all(sizes[0][k] <= sizes[1][k] for k in sizes[0]) and sizes[0]["pos"] < 0.95 * sizes[1]["pos"]
    assert sizes[0]["emb"] < 0.99 * sizes[1]["emb"]


def test_smooth_rows_and_the_sample_that_finds_them():
    rng = np.random.default_rng(1)
    smooth = np.cumsum(rng.integers(-2, 3, size=(64, 32)), axis=0).astype(np.int8)
    smoothness = PackOptions().parents_smooth
    p = parents.previous(smooth, smoothness)
    assert p is not None and (p[1:] == (1, parents.STEP)).all() and (p[0] == 0).all()
    res = parents.residuals(smooth, p)
    assert np.abs(res[1:]).max() <= 2 and np.array_equal(parents.restore(res, p, "t"), smooth)
    noise = rng.integers(-50, 50, size=(64, 32)).astype(np.int8)
    assert parents.previous(noise, smoothness) is None
    assert parents.previous(smooth[:1], smoothness) is None  # one row: nothing to predict it from


def test_the_numpy_reference_writes_the_same_artifact(monkeypatch):
    _, data, params = _packed("int6", {"clip": "sigma:3"})
    assert params["pos"].get("parents") == 1 and params["emb"]["context"] == "block"
    monkeypatch.setattr(kernel, "c", None)
    again = _packed("int6", {"clip": "sigma:3"})[1]
    assert again == data
    assert read_artifact(again).qtensors  # and the reference decodes it


def test_block_contexts_of_a_short_last_block_and_their_ids():
    """The context vector the encoder uses is the one every reader builds: block (r // rb, c)."""
    ids = np.arange(3 * 5, dtype=np.uint8).reshape(3, 5)
    for step in (1, 2, 3):
        got = rans.Geometry(11 * 5 + 4, 12, 5, 11, 5, True).context_vector("block", 15, ids.ravel(), step, np.uint8, 4)
        want = np.r_[ids[np.arange(11) // 4].ravel(), np.zeros(4, np.uint8)][::step]
        assert np.array_equal(got, want)


def test_inspect_says_parents_and_blocks():
    """What `recurnorm inspect` prints of a tensor says how it was coded: its parents stream,
    and a block context's contexts and rows per block."""
    from recurnorm.budget.api import tensor_stats

    _, data, params = _packed("int6", {"clip": "sigma:3"})
    labels = {r["name"]: r["codec"] for r in tensor_stats(read_artifact(data).manifest)}
    assert "parents:" in labels["pos"] and "parents" not in labels["iid"]
    assert f"block{params['emb']['k']},{params['emb']['rb']} rows" in labels["emb"]


def _unused_rows(seed: int = 0) -> torch.Tensor:
    """A token embedding whose rows come in kinds (scattered: no block holds one kind), six of
    them each near one column pattern of its own, the rest differing in spread: map contexts
    (row classes, each with its own column classes; a grid's shared column classes would need
    3^6 of them)."""
    rng = np.random.default_rng(seed)
    spread = np.exp(rng.normal(0, 0.4, size=(2048, 1)))
    w = spread * rng.normal(size=(2048, 96))
    for kind in range(6):
        w[kind::8] = rng.normal(size=96) + 0.2 * rng.normal(size=(256, 96))
    return torch.from_numpy(w.astype(np.float32))


@pytest.mark.parametrize("compact", [False, True])
def test_map_contexts_code_such_rows_and_every_reader_gets_them_back(compact, monkeypatch):
    qts = {"emb": quant.get("ternary").quantize(_unused_rows(), name="emb")}
    data = pack_qtensors(qts)
    p = read_artifact(data).manifest["tensors"][0]["streams"]["codes"]["params"]
    assert p["context"] == "map" and p["kr"] == search.MAP_ROWS
    assert verify_bytes(data).ok
    assert np.array_equal(read_artifact(data).qtensors["emb"].codes, qts["emb"].codes)
    got, _ = standalone_loader(compact)["decode"](data)
    assert got["emb"].tobytes() == unpack(data)["emb"].numpy().tobytes()
    monkeypatch.setattr(search, "map_choice", lambda *a: None)
    assert len(pack_qtensors(qts)) > len(data)
    if not compact:
        monkeypatch.undo()
        monkeypatch.setattr(kernel, "c", None)
        assert pack_qtensors(qts) == data  # the numpy reference writes the same bytes


def test_map_contexts_of_padded_codes_and_their_ids():
    """The context vector the encoder uses is the one every reader builds: map[row class, c]."""
    rows, cmap = np.array([1, 0, 2, 1, 1, 0, 2], np.uint8), np.arange(3 * 5, dtype=np.uint8).reshape(3, 5)
    for step in (1, 2, 3):
        geo = rans.Geometry(7 * 5 + 4, 8, 5, 7, 5, True)
        got = geo.context_vector("map", 15, np.r_[rows, cmap.ravel()], step, np.uint8, 3)
        assert np.array_equal(got, np.r_[cmap[rows].ravel(), np.zeros(4, np.uint8)][::step])
