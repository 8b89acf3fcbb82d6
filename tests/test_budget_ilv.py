"""Interleaved rANS (big streams): exact round trips, tuples, contexts, hostile input."""

from __future__ import annotations

import numpy as np
import pytest

from recurnorm.budget import codecs, rans, spec
from recurnorm.budget.codecs import StreamContext
from recurnorm.errors import ArtifactError


def _ctx(arr, tensor_shape, scales=None):
    return StreamContext("codes", arr.dtype.name, arr.shape, tensor_shape, scales)


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000, 4097])
@pytest.mark.parametrize("prec", [1, 8, 16])
def test_ilv_round_trip_small_lane_counts(n, prec):
    rng = np.random.default_rng(n + prec)
    nsym = 2 if prec == 1 else 200
    sym = rng.integers(0, nsym, n)
    freq = rans.normalize_table(np.bincount(sym, minlength=nsym), prec)
    for lanes in (1, 64):
        data = rans.ilv_encode(sym, None, freq, prec, lanes)
        assert np.array_equal(rans.ilv_decode(data, None, freq, prec, lanes, n), sym)


def test_ilv_certain_symbol_and_contexts():
    rng = np.random.default_rng(0)
    n = 10_000
    ctx = rng.integers(0, 3, n)
    sym = np.where(ctx == 0, 5, rng.integers(0, 7, n))  # context 0: probability 1 (f = 2**prec)
    counts = np.bincount(ctx * 7 + sym, minlength=21).reshape(3, 7)
    freq = rans.normalize_table(counts, 16)
    assert freq[0, 5] == 1 << 16
    data = rans.ilv_encode(sym, ctx, freq, 16, 128)
    assert np.array_equal(rans.ilv_decode(data, ctx, freq, 16, 128, n), sym)


def test_normalize_table_exact():
    rng = np.random.default_rng(1)
    for _ in range(50):
        c = rng.integers(0, 1000, size=(3, 40)) * (rng.random((3, 40)) < 0.5)
        c[1] = 0
        for prec in (6, 12, 16):
            f = rans.normalize_table(c, prec)
            assert list(f.sum(axis=1)) == [(1 << prec) if r.sum() else 0 for r in c]
            assert np.array_equal(f > 0, c > 0)


def _big(case, rng):
    w = rng.normal(size=(512, 1024)) * rng.uniform(0.2, 2.0, size=(512, 1))
    if case == "int8":
        s = np.abs(w).max(1) / 127
        return np.round(w / s[:, None]).astype(np.int8), s.astype(np.float16), (512, 1024)
    if case == "int4":
        g = w.reshape(-1, 64)
        s = np.abs(g).max(1) / 7
        return np.round(g / s[:, None]).astype(np.int8), s.astype(np.float16), (512, 1024)
    w = np.concatenate([w, w[::-1]])  # 1M trits: 210K 5-trit tuples, enough for lanes
    return np.clip(np.round(w / np.abs(w).mean()), -1, 1).astype(np.int8).reshape(1, -1), None, (1024, 1024)


@pytest.mark.parametrize("case", ["int8", "int4", "ternary"])
def test_big_streams_use_few_lanes_and_round_trip(case):
    codes, scales, shape = _big(case, np.random.default_rng(2))
    ctx = _ctx(codes, shape, scales)
    data, params = codecs.Rans().encode(codes, ctx)
    units = -(-codes.size // params.get("tuple", 1))
    lanes = params["lanes"]
    # As few lanes as the step bound allows (each costs 4 bytes), or ILP_LANES.
    assert -(-units // lanes) <= rans.WRITE_STEPS <= spec.MAX_STEPS and params["prec"] <= spec.MAX_PREC
    assert lanes <= rans.ILP_LANES or -(-units // (lanes // 2)) > rans.WRITE_STEPS
    if case == "ternary" and "context" not in params:  # 2**20 symbols: order-0 codes tuples
        assert params["tuple"] == 5  # (class contexts code single symbols: columns differ)
    out = codecs.Rans().decode(data, params, ctx)
    assert out.dtype == codes.dtype and np.array_equal(out, codes)
    assert len(data) < 1.004 * rans.order0_bits(codes) / 8
    again, params2 = codecs.Rans().encode(codes, ctx)
    assert again == data and params2 == params


def test_mid_size_streams_pick_the_smaller_coder():
    codes, scales, shape = _big("ternary", np.random.default_rng(6))
    ctx = _ctx(codes, shape, scales)
    data, params = codecs.Rans().encode(codes, ctx)
    assert np.array_equal(codecs.Rans().decode(data, params, ctx), codes)
    assert len(data) < 1.002 * rans.order0_bits(codes) / 8


@pytest.mark.parametrize("variant", ["none", "scale", "row", "col", "grid"])
@pytest.mark.parametrize("t", [1, 2, 5, 7])
def test_context_vector_step_matches_full(variant, t):
    rng = np.random.default_rng(3)
    rows, cols, L = 30, 50, 50
    scales = rng.normal(size=rows)
    n_ids = {"row": rows, "col": cols, "grid": rows + cols}.get(variant, cols)
    ids = rng.integers(0, 4, size=n_ids)
    n = rows * cols + (0 if variant == "scale" else 9)  # 9 padding codes past the tensor
    geo = rans.Geometry(n, rows, L, rows, cols, True, scales)
    full = geo.context_vector(variant, 8, ids, kc=2)
    step = geo.context_vector(variant, 8, ids, t, kc=2)
    assert np.array_equal(step, full[::t])
    pos = np.arange(rows * cols)
    if variant == "grid":  # row class * kc + column class; padding positions in context 0
        assert np.array_equal(full[: rows * cols], ids[pos // cols] * 2 + ids[rows + pos % cols])
        assert not full[rows * cols :].any()


def test_hostile_ilv_streams_raise_artifact_error():
    codes, scales, shape = _big("int4", np.random.default_rng(4))
    ctx = _ctx(codes, shape, scales)
    data, params = codecs.Rans().encode(codes, ctx)
    rng = np.random.default_rng(5)
    bad = [data[: len(data) // 2], data[:-2], data + b"\0\0", data[:9]]
    for _ in range(20):
        b = bytearray(data)
        for i in rng.integers(8, len(b), size=3):
            b[i] ^= int(rng.integers(1, 256))
        bad.append(bytes(b))
    for blob in bad:
        with pytest.raises(ArtifactError):
            out = codecs.Rans().decode(blob, params, ctx)
            if not np.array_equal(out, codes):  # a flip in a table may still decode: the sha catches it
                raise ArtifactError("differs")
    for key, value in (
        ("lanes", 3),
        ("lanes", 8192),
        ("prec", 17),
        ("prec", 0),
        ("tuple", 9),
        ("lanes", params["lanes"] // 2),
        ("lanes", params["lanes"] * 2),
    ):
        with pytest.raises(ArtifactError):
            codecs.Rans().decode(data, {**params, key: value}, ctx)


def test_version_1_side_data_still_decodes():
    """Format version 1 stored a side blob's form in one bit (raw or magicless zstd)."""
    from helpers import magicless_zstd

    rng = np.random.default_rng(7)
    codes = rng.integers(-3, 4, size=(40, 300)).astype(np.int8)
    sym = codes.astype(np.int64).ravel() + 3
    tables = rans.normalize_table(np.bincount(sym, minlength=7), 12)
    tblob = magicless_zstd(rans.varint_encode(tables.ravel()))
    body = rans.varint_encode(np.array([2 * len(tblob) + 1, 0])) + tblob + rans.ilv_encode(sym, None, tables, 12, 1)
    params = {"offset": -3, "nsym": 7, "prec": 12, "lanes": 1}
    old = _ctx(codes, codes.shape)
    old.version = 1
    assert np.array_equal(codecs.Rans().decode(body, params, old), codes)
    with pytest.raises(ArtifactError):  # read as version 2, the header means something else
        codecs.Rans().decode(body, params, _ctx(codes, codes.shape))


def test_side_data_takes_its_shortest_portable_form():
    from recurnorm.budget import compress

    rng = np.random.default_rng(8)
    for raw in (b"", b"\x01\x02", bytes(rng.integers(0, 4, 3000).astype(np.uint8)), bytes(3000)):
        blob, z = compress.smallest(raw)
        assert z in spec.PORTABLE and len(blob) <= len(raw)
        assert compress.decompress(z, blob, max(len(raw), 1), "side") == raw
    for z in (spec.DEFLATE, spec.LZMA):  # bounded: more output than expected is refused
        with pytest.raises(ArtifactError):
            compress.decompress(z, compress.compress(z, bytes(3000)), 100, "side")


def test_streams_past_the_writers_lanes_take_more_steps_and_past_the_coder_another_codec(monkeypatch):
    """A stream over MAX_LANES x WRITE_STEPS units (a 128K-row vocabulary's int8 embedding: 131M
    codes) is coded in MAX_LANES lanes of more steps, up to the readers' MAX_STEPS; a stream over
    MAX_UNITS goes to the other codecs. (Limits shrunk here: 8 lanes; the readers' bound is theirs.)"""
    import torch
    from helpers import standalone_loader

    from recurnorm import quant
    from recurnorm.budget.api import pack_qtensors, read_artifact

    monkeypatch.setattr(spec, "MAX_LANES", 8)
    monkeypatch.setattr(spec, "MAX_UNITS", 8 * spec.MAX_STEPS)
    rng = np.random.default_rng(3)
    for rows, coded in ((400, True), (1200, False)):  # 200K codes: 25K steps of 8 lanes; 600K: past the coder
        w = torch.from_numpy(rng.standard_normal((rows, 500)).astype(np.float32))
        qt = quant.get("int8").quantize(w, name="w")
        data = pack_qtensors({"w": qt})
        s = read_artifact(data).manifest["tensors"][0]["streams"]["codes"]
        assert (s["codec"] == "rans") == coded and (not coded or s["params"]["lanes"] == 8)
        assert np.array_equal(read_artifact(data).qtensors["w"].codes, qt.codes)
        assert standalone_loader(True)["decode"](data)[0]["w"].tobytes() == quant.dequantize(qt).numpy().tobytes()
