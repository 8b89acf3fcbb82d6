"""The rans search: its shortcuts agree with the slow definitions, and it finds real structure."""

from __future__ import annotations

import re

import numpy as np
import pytest
import zstandard
from helpers import embedding_like, joint_like

from recurnorm.budget import cluster, codecs, compress, race, rans, search, spec
from recurnorm.budget.codecs import StreamContext
from recurnorm.budget.options import PackOptions

MAX = PackOptions.for_effort("max")


def _ctx(codes, tensor_shape=None, scales=None):
    return StreamContext("codes", codes.dtype.name, codes.shape, tensor_shape or codes.shape, scales)


def _choose(sym, nsym, geo, effort="normal"):
    """The cheapest coding found for one stream."""
    return search.plan([(sym, nsym, geo)], PackOptions.for_effort(effort).search)[0]


def _choice(codes, tensor_shape=None, scales=None):
    ctx = _ctx(codes, tensor_shape, scales)
    sym, _, nsym = codecs.Rans().symbols(codes)
    return _choose(sym, nsym, codecs.geometry(ctx)), ctx


def test_normalize_table_per_row_precision_and_crowded_rows():
    rng = np.random.default_rng(0)
    # Heavy tails: most symbols get bumped to 1, so the excess must come from many counts.
    counts = (rng.exponential(size=(6, 250)) ** 4 * 50).astype(np.int64) * (rng.random((6, 250)) < 0.9)
    counts[2] = 0
    precs = np.array([8, 9, 10, 12, 16, 8])
    f = rans.normalize_table(counts, precs)
    for row, c, p in zip(f, counts, precs, strict=True):
        assert row.sum() == (1 << p if c.sum() else 0)
        assert np.array_equal(row > 0, c > 0)
    # Per-row precision is the scalar one, row by row.
    for i, p in enumerate(precs):
        assert np.array_equal(f[i], rans.normalize_table(counts[i], int(p))[0])
    with pytest.raises(ValueError, match="more used symbols"):
        rans.normalize_table(np.ones((1, 300), np.int64), 8)


def test_ranked_class_sums_equal_class_sums_of_ranked_classes():
    rng = np.random.default_rng(1)
    hist = rng.integers(0, 20, size=(37, 9)).astype(np.float64)
    order = cluster.spread_order(hist)
    for k, got in zip((2, 4, 8, 16), cluster.ranked_class_sums(hist, order, (2, 4, 8, 16)), strict=True):
        assert np.allclose(got, cluster.class_sums_all(hist, [rans.rank_buckets(order, k)], [k])[0])


def test_coarse_bins_keep_every_count():
    rng = np.random.default_rng(2)
    hist = rng.poisson(rng.exponential(3, size=255), size=(20, 255)).astype(np.float64)
    coarse = cluster.coarse_bins(hist, 16)
    assert coarse.shape[1] <= 16 and np.allclose(coarse.sum(axis=1), hist.sum(axis=1))
    assert cluster.coarse_bins(hist[:, :10], 16) is not None and cluster.coarse_bins(hist[:, :10], 16).shape[1] == 10


def test_cluster_many_separates_groups_by_any_difference():
    """Columns that differ in mean, not spread: k-means finds them, and labels are canonical."""
    rng = np.random.default_rng(3)
    shift = np.where(np.arange(64) % 3 == 0, 2, -2)
    codes = np.clip(np.round(rng.normal(size=(256, 64)) + shift), -7, 7).astype(np.int64) + 7
    hist = cluster.axis_histograms(codes, 1, 15)
    ids2, ids4 = cluster.cluster_many([hist], [[2, 4]])[0]
    assert np.array_equal(ids2, (shift != shift[0]).astype(np.int64))  # first item gets class 0
    assert ids4.max() < 4
    again = cluster.cluster_many([hist], [[2, 4]])[0]
    assert all(np.array_equal(a, b) for a, b in zip(again, (ids2, ids4), strict=True))


def _first_round(codes):
    ctx = _ctx(codes)
    sym, _, nsym = codecs.Rans().symbols(codes)
    streams = [search.Stream(sym, nsym, codecs.geometry(ctx))]
    cands, later = search.candidates_many(streams)
    pools = {0: cands[0]}
    return streams, pools, search.deeper(pools, search._rough_by_job(streams, pools), later)


def test_more_classes_are_tried_only_where_the_second_k_paid():
    """Columns of 8 spreads: 4 classes beat 2, so 8 and 16 are tried too, and the search
    lands on 8 (past the first round). No structure: 4 classes lose to 2, and no more are
    tried; every other family stops where its second k lost."""
    rng = np.random.default_rng(5)
    spread = np.geomspace(0.4, 6.0, 8)[rng.integers(0, 8, 512)]
    codes = np.clip(np.round(rng.normal(size=(128, 512)) * spread), -7, 7).astype(np.int8)
    streams, pools, more = _first_round(codes)
    assert sorted({c.k for c in pools[0] if c.variant == "col"}) == [2, 4]
    assert more.get((0, "col")) == [8, 16]
    choice = _choose(streams[0].sym, streams[0].nsym, streams[0].geo)
    assert (choice.variant, choice.k) == ("col", 8)

    flat = np.clip(np.round(rng.normal(size=(128, 512)) * 2), -7, 7).astype(np.int8)
    _, pools, more = _first_round(flat)
    assert {c.variant for c in pools[0]} >= {"row", "col"} and more == {}
    # max effort sweeps nothing: every k in the first round
    ctx = _ctx(flat)
    sym, _, nsym = codecs.Rans().symbols(flat)
    cands, later = search.candidates_many([search.Stream(sym, nsym, codecs.geometry(ctx))], MAX.search)
    assert later == {} and sorted({c.k for c in cands[0] if c.variant == "col"}) == [2, 4, 8, 16, 32]


def test_choose_finds_column_classes_and_estimates_its_bytes():
    rng = np.random.default_rng(4)
    w = rng.normal(size=(256, 512)) * np.where(rng.random(512) < 0.5, 0.3, 2.0)
    s = np.abs(w).max(1) / 127
    codes = np.round(w / s[:, None]).astype(np.int8)
    choice, ctx = _choice(codes, scales=s)
    assert (choice.variant, choice.k) in (("col", 2), ("col", 4), ("col", 8), ("col", 16))
    data, params = codecs.Rans().encode(codes, ctx)
    assert abs(len(data) - choice.cost) < 0.01 * len(data)  # the estimate is the real size
    assert np.array_equal(codecs.Rans().decode(data, params, ctx), codes)


def test_choose_keeps_order0_on_iid_codes():
    codes = np.random.default_rng(5).integers(-7, 8, size=(64, 512)).astype(np.int8)
    choice, _ = _choice(codes)
    assert choice.variant == "none" and choice.t == 1 and choice.lanes <= rans.ILP_LANES


def test_zstd_slow_level_still_runs_where_repetition_pays():
    """Duplicated rows with noise (a byte embedding's unused rows look so): zstd's slow level
    finds the repeats and beats rans; the quick level alone would not."""
    rng = np.random.default_rng(6)
    rows = np.repeat(rng.integers(-3, 4, (8, 1024)), 8, axis=0)[rng.permutation(64)]
    codes = (rows * (rng.random((64, 1024)) < 0.9)).astype(np.int8)
    ctx = _ctx(codes)
    name, params, data = race.encode_best(codes, ctx, ("rans", "zstd", "raw"))
    raw = codecs.layout_bytes(codes, "int8", params["layout"])
    assert name == "zstd"
    assert len(data) == len(zstandard.ZstdCompressor(level=compress.ZSTD_LEVEL).compress(raw))
    assert len(data) < len(zstandard.ZstdCompressor(level=3).compress(raw))  # (the race's quick level)


def test_effort_max_finds_what_normal_skips():
    """Noisy duplicated rows: only the exhaustive zstd search sees that the plain layout wins."""
    from recurnorm.budget import pack_qtensors, read_artifact
    from recurnorm.errors import QuantError
    from recurnorm.quant.qtensor import QTensor

    rng = np.random.default_rng(6)
    rows = np.repeat(rng.integers(-1, 2, (8, 1024)), 8, axis=0)[rng.permutation(64)]
    codes = (rows * (rng.random((64, 1024)) < 0.9)).astype(np.int8)
    qts = {"w": QTensor("ternary", codes.shape, "float32", codes.reshape(1, -1), np.ones(1, np.float32))}
    normal, full = pack_qtensors(qts), pack_qtensors(qts, effort="max")
    assert len(full) < 0.8 * len(normal)
    assert np.array_equal(read_artifact(full).qtensors["w"].codes, qts["w"].codes)
    with pytest.raises(QuantError, match="effort"):
        pack_qtensors(qts, effort="huge")


def _jobs(seed=7):
    """Streams of several shapes and alphabets, some with column structure."""
    rng = np.random.default_rng(seed)
    out = []
    for rows, cols, span in ((64, 512, 7), (128, 128, 1), (256, 256, 127), (40, 100, 7), (96, 700, 1)):
        w = rng.normal(size=(rows, cols)) * np.where(rng.random(cols) < 0.3, 0.4, 1.5)
        codes = np.clip(np.round(w * span / 3), -span, span).astype(np.int8)
        ctx = _ctx(codes, scales=np.abs(w).max(1))
        sym, _, nsym = codecs.Rans().symbols(codes)
        out.append((codes, ctx, (sym, nsym, codecs.geometry(ctx))))
    return out


def test_plan_of_many_streams_is_plan_of_each():
    """Batching streams shares numpy calls, not decisions: each choice is the one it gets alone."""
    jobs = _jobs()
    together = search.plan([j for *_, j in jobs])
    for (_, _, job), got in zip(jobs, together, strict=True):
        alone = _choose(*job)
        assert (got.variant, got.k, got.t, got.prec, got.lanes) == (
            alone.variant,
            alone.k,
            alone.t,
            alone.prec,
            alone.lanes,
        )
        assert (got.ids is None) == (alone.ids is None)
        assert got.ids is None or np.array_equal(got.ids, alone.ids)
        assert got.cost == pytest.approx(alone.cost, rel=1e-9)
    assert {c.variant for c in together} > {"none"}  # the structured streams found contexts


def test_search_side_data_is_what_the_encoder_would_make():
    """Below BIG_SYMBOLS the search counts exactly, so the encoder reuses its tables and blobs:
    they must equal what it computes from the codes themselves."""
    for codes, ctx, (sym, nsym, geo) in _jobs(8):
        c = _choose(sym, nsym, geo)
        assert c.side is not None
        cvec = geo.context_vector(c.variant, c.k, c.ids, c.t)
        counts = np.bincount(cvec * nsym + sym, minlength=c.k * nsym).reshape(c.k, nsym)
        tables = rans.normalize_table(counts, c.prec)
        assert np.array_equal(c.side.tables, tables)
        assert c.side.blobs() == search.SideData.of(tables, c.ids).blobs()
        data, params = codecs.Rans().encode(codes, ctx)
        assert np.array_equal(codecs.Rans().decode(data, params, ctx), codes)


def test_lanes_for_is_the_fewest_the_step_bound_allows_plus_ilp():
    """The rule, not a table: enough lanes for the step bound, and beyond that extra lanes
    (up to ILP_LANES) only while their 4 flush bytes each stay under payload / FLUSH_SHARE."""
    S, budget_per_byte = rans.WRITE_STEPS, 1 / rans.FLUSH_SHARE
    n = np.array([1, 10, 100, S - 1, S, S + 1, 3 * S, 16 * S, 16 * S + 1, 1000 * S])
    payload = np.array([1.0, 10.0, 4 * rans.FLUSH_SHARE, 8 * rans.FLUSH_SHARE, 1e5, 1e9])
    nn, pp = np.meshgrid(n, payload, indexing="ij")
    lanes = rans.lanes_for(nn, pp)
    assert lanes.shape == nn.shape
    assert np.all((lanes & (lanes - 1)) == 0) and np.all((lanes >= 1) & (lanes <= spec.MAX_LANES))
    assert np.all(-(-nn // lanes) <= S)  # the step bound holds
    needed = np.ones_like(lanes)  # the fewest the step bound allows
    while np.any(-(-nn // needed) > S):
        needed = np.where(-(-nn // needed) > S, 2 * needed, needed)
    extra = lanes > needed
    assert np.all(lanes[extra] <= rans.ILP_LANES)
    assert np.all(4 * lanes[extra] <= pp[extra] * budget_per_byte)  # extra lanes are paid for
    # ... and one more doubling would not be: fewer lanes than ILP_LANES only when unaffordable.
    short = lanes < rans.ILP_LANES
    assert np.all(8 * lanes[short] > pp[short] * budget_per_byte)
    # More units or more payload never means fewer lanes.
    assert np.all(np.diff(lanes, axis=0) >= 0) and np.all(np.diff(lanes, axis=1) >= 0)
    assert lanes.min() == 1 and lanes.max() > rans.ILP_LANES  # both ends are reached
    past = rans.lanes_for(np.array([spec.MAX_LANES * S + 1, spec.MAX_UNITS]), 1e9)  # (more steps, not lanes)
    assert np.all(past == spec.MAX_LANES)
    with pytest.raises(ValueError, match="exceed"):
        rans.lanes_for(spec.MAX_UNITS + 1, 1.0)


def test_kmeans_batches_agree_with_single_problems():
    rng = np.random.default_rng(9)
    hists = [
        rng.poisson(rng.exponential(3, size=(n, m)) * (1 + (np.arange(n) % 3 == 0)[:, None])).astype(np.float32)
        for n, m in ((20, 5), (300, 40), (600, 255), (9, 3))
    ]
    kss = [[2, 4], [2, 4, 8, 16], [2, 16], [2, 4, 8]]
    together = cluster.cluster_many(hists, kss)
    for h, ks, got in zip(hists, kss, together, strict=True):
        alone = cluster.cluster_many([h], [ks])[0]
        assert all(np.array_equal(a, b) for a, b in zip(got, alone, strict=True))
        assert all(g.max() < k for g, k in zip(got, ks, strict=True))


def test_grid_context_finds_row_and_column_structure_together():
    codes = embedding_like()
    choice, ctx = _choice(codes.reshape(1, -1), tensor_shape=codes.shape)
    assert choice.variant == "grid" and choice.kc >= 2 and choice.k // choice.kc >= 2
    sym, _, nsym = codecs.Rans().symbols(codes)
    assert _choose(sym, nsym, codecs.geometry(ctx), "max").variant == "grid"  # max looks wider
    data, params = codecs.Rans().encode(codes.reshape(1, -1), ctx)
    assert params["context"] == "grid" and params["kc"] == choice.kc
    assert np.array_equal(codecs.Rans().decode(data, params, ctx), codes.reshape(1, -1))
    # Better than either axis alone, by more than the grid's extra tables and ids.
    stream = search.Stream(sym, nsym, codecs.geometry(ctx))
    alone = search.candidates_many([stream], MAX.search)[0][0]  # every k of each axis
    best_axis = min(
        search.score([c], stream.units, search.PRECS, False).total().min() for c in alone if c.variant in ("row", "col")
    )
    assert len(data) < 0.9 * best_axis


def test_plan_counts_the_grid_pairs_asked_for_and_a_float_head_asks_for_one(monkeypatch):
    """Grids are counted for the `grids` best-ranked (row k, column k) pairs; a float head's
    search counts one, of 4 or 8 classes an axis (PackOptions.fields_search), at normal effort."""
    kinds, asked = [], []
    count, plan = search.Stream.unit_counts, search.plan
    monkeypatch.setattr(search.Stream, "unit_counts", lambda st, t, v, *a: kinds.append(v) or count(st, t, v, *a))
    codes = joint_like()
    sym, _, nsym = codecs.Rans().symbols(codes)
    geo = codecs.geometry(_ctx(codes.reshape(1, -1), codes.shape))
    counted = {}
    for grids in (1, 3):
        kinds.clear()
        assert search.plan([(sym, nsym, geo)], search.Effort(grids=grids))[0].variant == "grid"
        counted[grids] = kinds.count("grid")
    assert counted[1] == 1 < counted[3] <= 3
    monkeypatch.setattr(search, "plan", lambda jobs, how: asked.append(how) or plan(jobs, how))
    w = (np.random.default_rng(0).standard_normal((64, 128)) * np.logspace(-3, 0, 128)).astype(np.float32)
    for options in (PackOptions(), MAX):  # (max searches as wide as for codes)
        ctx = StreamContext("codes", "uint32", w.shape, w.shape, options=options, mant=23)
        codecs.Fields().encode(w.view(np.uint32), ctx)
    assert asked == [search.Effort(grids=1, big_ks=(4, 8)), MAX.search]


def test_hostile_grid_params_and_ids_are_refused():
    from recurnorm.errors import ArtifactError

    codes = embedding_like(11).reshape(1, -1)
    ctx = _ctx(codes, (256, 128))
    data, params = codecs.Rans().encode(codes, ctx)
    assert params["context"] == "grid"
    k, kc = params["k"], params["kc"]
    for bad in (
        {"kc": kc + 1} if k % (kc + 1) else {"kc": 3},
        {"kc": k},
        {"kc": 1},
        {"kc": True},
        {"context": "row"},
        {"kc": 0},
    ):
        with pytest.raises(ArtifactError):
            codecs.Rans().decode(data, {**params, **bad}, ctx)
    no_kc = {key: v for key, v in params.items() if key != "kc"}
    with pytest.raises(ArtifactError, match="grid"):
        codecs.Rans().decode(data, no_kc, ctx)
    # Row ids that reach past the row classes (but not past k) are caught, not read as columns.
    tables, ids, words = rans.split_body(data, k, params["nsym"], 256 + 128)
    forged = ids.copy()
    forged[0] = k // kc
    side = (compress.smallest(rans.varint_encode(tables.ravel())), compress.smallest(forged.astype(np.uint8).tobytes()))
    head = rans.varint_encode(np.array([4 * len(side[0][0]) + side[0][1], 4 * len(side[1][0]) + side[1][1]]))
    with pytest.raises(ArtifactError, match="grid class ids"):
        codecs.Rans().decode(head + side[0][0] + side[1][0] + words, params, ctx)


def test_inspect_names_the_grid_shape():
    from recurnorm.budget import pack_qtensors, read_artifact
    from recurnorm.budget.api import tensor_stats
    from recurnorm.quant.qtensor import QTensor

    codes = embedding_like(13)
    art = read_artifact(
        pack_qtensors({"e": QTensor("ternary", codes.shape, "float32", codes.reshape(1, -1), np.ones(1, np.float32))})
    )
    p = art.manifest["tensors"][0]["streams"]["codes"]["params"]
    label = tensor_stats(art.manifest)[0]["codec"]
    # The label says grid and gives both class counts (its exact spelling is inspect's business).
    assert "grid" in label and sorted(map(int, re.findall(r"\d+", label))) == sorted([p["k"] // p["kc"], p["kc"]])


def test_wide_grid_finds_joint_row_and_column_classes(monkeypatch):
    """More than 64 contexts (row classes x column classes) where rows and columns both carry
    structure; bit-exact round trip; and smaller than the best the old 64-context cap allowed."""
    codes = joint_like()
    choice, ctx = _choice(codes.reshape(1, -1), tensor_shape=codes.shape)
    assert choice.variant == "grid" and choice.k > 64 and choice.kc >= 8 and choice.k // choice.kc >= 4
    data, params = codecs.Rans().encode(codes.reshape(1, -1), ctx)
    assert params["context"] == "grid" and params["k"] == choice.k
    assert np.array_equal(codecs.Rans().decode(data, params, ctx), codes.reshape(1, -1))
    monkeypatch.setattr(spec, "MAX_CONTEXTS", 64)
    capped, capped_params = codecs.Rans().encode(codes.reshape(1, -1), ctx)
    assert capped_params.get("k", 1) <= 64
    assert len(data) < 0.99 * len(capped)


@pytest.mark.parametrize("axis", ["none", "row", "col"])
def test_no_grid_without_joint_structure(axis):
    """iid codes: no class context; structure on one axis only: that axis, never a grid."""
    rows, cols = 2048, 256
    kw = {"none": {"structure": False}, "row": {"col_signs": 1, "col_dens": 1}, "col": {"row_classes": 1}}[axis]
    codes = joint_like(21, rows, cols, **kw)
    choice, _ = _choice(codes.reshape(1, -1), tensor_shape=codes.shape)
    assert choice.variant == axis


def test_hostile_wide_grid_ids_and_counts_are_refused():
    from recurnorm.errors import ArtifactError

    codes = joint_like(22).reshape(1, -1)
    ctx = _ctx(codes, (2048, 256))
    data, params = codecs.Rans().encode(codes, ctx)
    k, kc = params["k"], params["kc"]
    assert params["context"] == "grid" and k > 64
    for bad in ({"k": spec.MAX_CONTEXTS * 2, "kc": kc}, {"k": k, "kc": spec.MAX_CONTEXTS * 2}, {"k": k * 2}):
        with pytest.raises(ArtifactError):
            codecs.Rans().decode(data, {**params, **bad}, ctx)
    tables, ids, words = rans.split_body(data, k, params["nsym"], 2048 + 256)
    for where, value in ((0, k // kc), (2048, kc), (2048 + 255, 255)):  # a row / column id past its classes
        forged = ids.copy()
        forged[where] = value
        side = (
            compress.smallest(rans.varint_encode(tables.ravel())),
            compress.smallest(forged.astype(np.uint8).tobytes()),
        )
        head = rans.varint_encode(np.array([4 * len(side[0][0]) + side[0][1], 4 * len(side[1][0]) + side[1][1]]))
        with pytest.raises(ArtifactError, match="grid class ids"):
            codecs.Rans().decode(head + side[0][0] + side[1][0] + words, params, ctx)


def test_grid_codes_single_symbols_where_order0_codes_tuples():
    """A tuple-sized stream (>= 2**20 trits, where order-0 codes 5-trit tuples) with joint
    structure still gets its grid, over single symbols: a tuple spans columns of different
    classes (a real 30522 x 384 token embedding: 0.963 of order-0 so, 0.988 with tuples)."""
    codes = joint_like(23, rows=4096, cols=256)
    choice, ctx = _choice(codes.reshape(1, -1), tensor_shape=codes.shape)
    sym, _, nsym = codecs.Rans().symbols(codes)
    assert search.tuple_size(nsym, sym.size) == 5
    assert choice.variant == "grid" and choice.t == 1 and choice.k > 64
    data, params = codecs.Rans().encode(codes.reshape(1, -1), ctx)
    assert "tuple" not in params and np.array_equal(codecs.Rans().decode(data, params, ctx), codes.reshape(1, -1))
    assert len(data) < 0.7 * rans.order0_bits(codes) / 8


@pytest.mark.parametrize(("nsym", "t"), [(3, 5), (15, 2), (16, 2), (5, 3), (6, 4), (64, 2)])
def test_from_tuples_inverts_to_tuples(nsym, t):
    """Every tuple size the packer writes, a word gather (pairs, quads of byte digits) or a
    row gather: more than one piece of tuples, and a last tuple that is padded."""
    rng = np.random.default_rng(nsym * 10 + t)
    n = (1 << 20) * t + 2 * t + 1 if nsym == 15 else 5000 * t + 1
    sym = rng.integers(0, nsym, n).astype(np.uint16)
    got = rans.from_tuples(rans.to_tuples(sym, nsym, t), nsym, t, n)
    assert got.size == n and np.array_equal(got, sym)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_order0_bits_of_bytes_counted_in_pairs_is_bincounts(dtype, monkeypatch):
    """The compiled path counts byte pairs: the same bound, bit for bit, as counting each byte,
    for even and odd lengths, and as the numpy path."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 2, 7, 100_001, 1 << 20):
        x = np.clip(np.round(rng.normal(0, 20, n)), -128, 127).astype(dtype)
        want = rans.entropy_bits(np.bincount(x.view(np.uint8), minlength=256))
        assert rans.order0_bits(x) == want, n
        monkeypatch.setattr(rans.kernel, "on", lambda: False)
        assert rans.order0_bits(x) == want, n
        monkeypatch.undo()
