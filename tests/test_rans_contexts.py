"""rans over row deltas (params.delta) and block contexts (context "block"): the packer
races each where it may win, and the library, the standalone loader (readable and compact)
and the numpy reference coder agree bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import standalone_loader

from recurnorm import quant
from recurnorm.budget import rans, search
from recurnorm.budget.api import pack_qtensors, read_artifact, unpack, verify_bytes


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
    qts = {k: quant.get(fmt, **(opts or {})).quantize(v, name=k) for k, v in _weights().items()}
    data = pack_qtensors(qts)
    params = {t["name"]: t["streams"]["codes"]["params"] for t in read_artifact(data).manifest["tensors"]}
    return qts, data, params


@pytest.mark.parametrize("fmt,opts", [("int8", {}), ("int6", {"clip": "sigma:3"}), ("int4", {})])
@pytest.mark.parametrize("compact", [False, True])
def test_smooth_rows_code_deltas_and_every_reader_gets_the_codes_back(fmt, opts, compact):
    qts, data, params = _packed(fmt, opts)
    assert params["pos"].get("delta") == 1 and "delta" not in params["iid"]
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


def test_deltas_never_make_a_stream_bigger(monkeypatch):
    """The plain codes race beside the deltas: no stream is bigger than without them."""
    _, data, _ = _packed("int6", {"clip": "sigma:3"})
    monkeypatch.setattr(rans, "row_deltas", lambda *a: None)
    monkeypatch.setattr(search, "block_choice", lambda *a: None)
    _, plain, params = _packed("int6", {"clip": "sigma:3"})
    assert not any(p.get("delta") or p.get("context") == "block" for p in params.values())
    sizes = [
        {t["name"]: t["streams"]["codes"]["length"] for t in read_artifact(d).manifest["tensors"]}
        for d in (data, plain)
    ]
    assert all(sizes[0][k] <= sizes[1][k] for k in sizes[0]) and sizes[0]["pos"] < 0.95 * sizes[1]["pos"]
    assert sizes[0]["emb"] < 0.99 * sizes[1]["emb"]


def test_the_gate_and_the_deltas():
    rng = np.random.default_rng(1)
    smooth = np.cumsum(rng.integers(-2, 3, size=(64, 32)), axis=0)
    d = rans.row_deltas(smooth.ravel() - smooth.min(), 64, 32, int(smooth.min()))
    assert d is not None and np.array_equal(np.cumsum(d.reshape(64, 32), axis=0), smooth)
    noise = rng.integers(0, 50, size=(64, 32))
    assert rans.row_deltas(noise.ravel(), 64, 32, 0) is None
    assert rans.row_deltas(smooth.ravel(), 1, 64 * 32, 0) is None  # one row: nothing to subtract
    assert rans.row_deltas(smooth.ravel(), 32, 32, 0) is None  # the view is not the whole stream


def test_the_numpy_reference_writes_the_same_artifact(monkeypatch):
    _, data, params = _packed("int6", {"clip": "sigma:3"})
    assert params["pos"].get("delta") == 1 and params["emb"]["context"] == "block"
    monkeypatch.setattr(rans, "_ransc", None)
    again = _packed("int6", {"clip": "sigma:3"})[1]
    assert again == data
    assert read_artifact(again).qtensors  # and the reference decodes it


def test_block_contexts_of_a_short_last_block_and_their_ids():
    """The context vector the encoder uses is the one every reader builds: block (r // rb, c)."""
    ids = np.arange(3 * 5, dtype=np.uint8).reshape(3, 5)
    for step in (1, 2, 3):
        got = rans.context_vector("block", 15, 11 * 5 + 4, 11, 5, 5, None, ids.ravel(), step, np.uint8, 4)
        want = np.r_[ids[np.arange(11) // 4].ravel(), np.zeros(4, np.uint8)][::step]
        assert np.array_equal(got, want)


def test_inspect_says_deltas_and_blocks():
    """What `recurnorm inspect` prints of a stream says how it was coded: row deltas, and a
    block context's contexts and rows per block."""
    from recurnorm.budget.api import tensor_stats

    _, data, params = _packed("int6", {"clip": "sigma:3"})
    labels = {r["name"]: r["codec"] for r in tensor_stats(read_artifact(data).manifest)}
    assert "row deltas" in labels["pos"] and "row deltas" not in labels["iid"]
    assert f"block{params['emb']['k']},{params['emb']['rb']} rows" in labels["emb"]
