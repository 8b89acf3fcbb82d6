"""Quantizer registry and formats: error figures, code ranges, fixed points, edge cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import recurnorm.quant as q
from recurnorm.errors import QuantError
from recurnorm.quant.intn import PG_CLIP_PERCENTILE

FLOAT_FORMATS = [n for n in q.available() if n != "raw"]
GRID_CASES = [
    ("int8", {}),
    ("int8_pg", {}),
    ("int7", {}),
    ("int6", {}),
    ("int5", {}),
    ("int4", {}),
    ("int3", {}),
    ("int2", {}),
    ("int4", {"asymmetric": True}),
    ("int4", {"clip_search": True}),
    ("int6", {"group": 32, "asymmetric": True, "clip_search": True}),
    ("nf4", {}),
    ("ternary", {}),
    ("ternary", {"group": 64, "lsq_rescale": True}),
]


def gaussian(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def rel_err(fmt: str, w: torch.Tensor, **opts) -> float:
    d = q.dequantize(q.get(fmt, **opts).quantize(w))
    return float((d - w).norm() / w.norm())


# -- registry ---------------------------------------------------------------


def test_available_lists_every_format():
    names = set(q.available())
    assert {"fp32", "fp16", "bf16", "raw", "int8", "int8_pg", "int6", "int5", "int4", "nf4", "ternary"} <= names


def test_unknown_name_and_option_list_what_exists():
    with pytest.raises(QuantError, match="available: .*int4"):
        q.get("int9")
    with pytest.raises(QuantError, match="known options: .*group"):
        q.get("int4", grop=32)
    with pytest.raises(QuantError, match="group"):
        q.get("int4", group=0)
    with pytest.raises(QuantError, match="group"):
        q.get("nf4", group=48)


@pytest.mark.parametrize("fmt,opts", GRID_CASES)
def test_params_rebuild_the_quantizer(fmt, opts):
    qt = q.get(fmt, **opts).quantize(gaussian(16, 96))
    assert qt.format == fmt
    for k, v in opts.items():
        assert qt.params[k] == v
    import json

    assert json.loads(json.dumps(qt.params)) == qt.params
    assert torch.equal(q.dequantize(qt), q.get(fmt, **qt.params).dequantize(qt))


# -- error figures (reference §3, Gaussian 256x256) ----------------------------


def test_reconstruction_error_figures():
    w = gaussian(256, 256)
    assert rel_err("int8", w) <= 0.01
    assert rel_err("int4", w) <= 0.115
    assert rel_err("nf4", w, group=64) <= 0.10
    assert rel_err("int4", w, asymmetric=True) < rel_err("int4", w)
    assert rel_err("int4", w, clip_search=True) < rel_err("int4", w)
    assert rel_err("int6", w) < rel_err("int5", w) < rel_err("int4", w, group=None)
    assert rel_err("ternary", w, lsq_rescale=True) < rel_err("ternary", w)


# -- codes -------------------------------------------------------------------


@pytest.mark.parametrize("fmt,opts", GRID_CASES)
def test_codes_in_range_fixed_point_and_deterministic(fmt, opts):
    quant = q.get(fmt, **opts)
    w = gaussian(24, 200, seed=1) * 0.05
    qt = quant.quantize(w)
    c = qt.codes.astype(np.int64)
    assert qt.codes.ndim == 2 and qt.codes.size >= w.numel()
    if fmt == "nf4":
        lo, hi = 0, 15
    elif fmt == "ternary":
        lo, hi = -1, 1
    elif opts.get("asymmetric"):
        lo, hi = 0, 2**quant.bits - 1
    else:
        bits = 8 if fmt == "int8_pg" else quant.bits
        lo, hi = -(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1
    assert lo <= c.min() and c.max() <= hi
    assert qt.scales is not None and len(qt.scales) == qt.codes.shape[0]
    # identical input -> identical QTensor
    assert quant.quantize(w.clone()).equal(qt)
    # quantize -> dequantize -> quantize keeps the codes (and the reconstruction)
    d = q.dequantize(qt)
    qt2 = quant.quantize(d)
    assert np.array_equal(qt2.codes, qt.codes)
    if not (fmt == "ternary" and not opts.get("lsq_rescale")):
        # absmean alone shrinks on a ternary tensor (zeros count in the mean): codes only
        assert torch.equal(q.dequantize(qt2), d)


def test_fp16_and_int8_scales_are_fp16():
    w = gaussian(8, 64)
    assert q.get("int8").quantize(w).scales.dtype == np.float16
    assert q.get("int4").quantize(w).scales.dtype == np.float16
    assert q.get("nf4").quantize(w).scales.dtype == np.float32


# -- int8_pg: the Parameter Golf baseline, bit for bit ---------------------------


def _baseline(t: torch.Tensor):
    """Parameter Golf train_gpt.py quantize_float_tensor + dequantize (reference §1)."""
    t32 = t.float()
    qc = PG_CLIP_PERCENTILE / 100.0
    if t32.ndim == 2:
        clip_abs = torch.quantile(t32.abs(), qc, dim=1)
        clipped = torch.maximum(torch.minimum(t32, clip_abs[:, None]), -clip_abs[:, None])
        scale = (clip_abs / 127.0).clamp_min(1.0 / 127.0)
        codes = torch.clamp(torch.round(clipped / scale[:, None]), -127, 127).to(torch.int8)
        s16 = scale.to(torch.float16)
        return codes, s16, codes.float() * s16.float()[:, None]
    clip_abs = float(torch.quantile(t32.abs().flatten(), qc).item())
    scale = torch.tensor(clip_abs / 127.0 if clip_abs > 0 else 1.0, dtype=torch.float32)
    codes = torch.clamp(torch.round(torch.clamp(t32, -clip_abs, clip_abs) / scale), -127, 127).to(torch.int8)
    return codes, scale, codes.float() * float(scale.item())


def test_int8_pg_reproduces_the_baseline_including_the_floor():
    # Row 0: small weights (clip < 1) -> the 1/127 floor; row 1: clip > 1; row 2: zeros.
    w = torch.tensor(
        [
            [0.01, -0.02, 0.5, -0.3, 0.123, 0.0, 0.07, -0.45],
            [1.5, -2.5, 0.2, 3.0, -0.01, 0.7, -1.1, 2.2],
            [0.0] * 8,
        ]
    )
    codes, s16, deq = _baseline(w)
    qt = q.get("int8_pg").quantize(w)
    assert np.array_equal(qt.codes, codes.numpy())
    assert np.array_equal(qt.scales, s16.numpy())
    assert torch.equal(q.dequantize(qt), deq)
    assert qt.scales[0] == np.float16(1 / 127)  # the floor bites: 0.5 -> code ~64, not 127
    assert qt.codes[0, 2] in (63, 64)  # half the int8 range left unused
    # good int8 has no floor: the row's largest weight gets the full code range
    good = q.get("int8").quantize(w)
    assert abs(int(good.codes[0, 2])) == 127
    assert good.scales[0] < 1 / 127
    assert float((q.dequantize(good) - w).norm()) < float((deq - w).norm())


def test_int8_pg_per_tensor_for_other_shapes():
    for t in (gaussian(300) * 0.01, gaussian(4, 5, 6) * 3):
        codes, scale, deq = _baseline(t)
        qt = q.get("int8_pg").quantize(t)
        assert qt.codes.shape == (1, t.numel()) and qt.scales.dtype == np.float32
        assert np.array_equal(qt.codes.reshape(-1), codes.numpy().reshape(-1))
        assert qt.scales[0] == scale.item()  # no floor on the per-tensor scale
        assert torch.equal(q.dequantize(qt), deq)


def test_int8_pg_on_a_large_gaussian_matches_the_baseline():
    w = gaussian(64, 512) * 0.02
    codes, s16, deq = _baseline(w)
    qt = q.get("int8_pg").quantize(w)
    assert np.array_equal(qt.codes, codes.numpy()) and torch.equal(q.dequantize(qt), deq)


# -- passthrough -----------------------------------------------------------------


def test_passthrough_formats():
    w = gaussian(5, 7)
    qt = q.get("fp32").quantize(w)
    assert qt.codes.dtype == np.uint32 and qt.codes.shape == (1, 35) and qt.scales is None
    assert torch.equal(q.dequantize(qt), w)
    for fmt, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        qt = q.get(fmt).quantize(w)
        assert qt.codes.dtype == np.uint16 and qt.codes.shape == (1, 35)
        assert torch.equal(q.dequantize(qt), w.to(dt).float())
        assert q.dequantize(qt).dtype == torch.float32


@pytest.mark.parametrize(
    "t",
    [
        torch.arange(-5, 7, dtype=torch.int64).reshape(3, 4),
        torch.tensor([1, -2, 3], dtype=torch.int32),
        torch.tensor([[True, False], [False, True]]),
        torch.tensor(7, dtype=torch.int64),
        torch.zeros(0, 3, dtype=torch.int16),
    ],
)
def test_raw_is_exact(t):
    qt = q.get("raw").quantize(t)
    assert qt.codes.ndim == 2 and qt.codes.shape[0] == 1 and qt.dtype == str(t.dtype).removeprefix("torch.")
    back = q.dequantize(qt, original_dtype=True)
    assert back.dtype == t.dtype and torch.equal(back, t)


def test_raw_rejects_floats_and_floats_reject_ints():
    with pytest.raises(QuantError, match="raw"):
        q.get("raw").quantize(gaussian(3))
    with pytest.raises(QuantError, match="int64"):
        q.get("int4").quantize(torch.arange(4), name="ids")


# -- edge cases ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
def test_all_zero_rows_and_groups_give_no_nan(fmt):
    w = gaussian(6, 128)
    w[2] = 0.0
    w[4, :64] = 0.0
    d = q.dequantize(q.get(fmt).quantize(w))
    assert torch.isfinite(d).all()
    assert (d[2] == 0).all()
    z = torch.zeros(4, 64)
    assert (q.dequantize(q.get(fmt).quantize(z)) == 0).all()


@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
@pytest.mark.parametrize("bad,what", [(float("nan"), "NaN"), (float("inf"), "Inf"), (-float("inf"), "Inf")])
def test_nan_inf_names_tensor_and_index(fmt, bad, what):
    w = gaussian(5, 20)
    w[3, 17] = bad
    with pytest.raises(QuantError, match=rf"tensor blocks\.0\.mlp\.up\.weight has {what} at index \(3, 17\)"):
        q.get(fmt).quantize(w, name="blocks.0.mlp.up.weight")


@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
@pytest.mark.parametrize("shape", [(0,), (0, 5), (5, 0), (), (7,), (3, 5, 7), (10, 100), (3, 70)])
def test_shapes_roundtrip(fmt, shape):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    qt = q.get(fmt).quantize(w)
    G, L = qt.codes.shape
    assert G * L >= w.numel() and qt.codes.ndim == 2
    if qt.scales is not None:
        assert qt.scales.shape == (G,)
    # trailing padding is zeros
    assert (qt.codes.reshape(-1)[w.numel() :] == 0).all()
    d = q.dequantize(qt)
    assert d.shape == w.shape and d.dtype == torch.float32 and torch.isfinite(d).all()
    if w.numel():
        assert float((d - w).norm() / w.norm()) < (0.75 if fmt in ("ternary", "int2") else 0.35)


def test_group_not_dividing_size_pads_the_last_group():
    w = gaussian(3, 70)  # 210 elements: 4 groups of 64, the last one padded by 46
    qt = q.get("int4").quantize(w)
    assert qt.codes.shape == (4, 64)
    assert rel_err("int4", w) < 0.13
    qt = q.get("ternary", group=64).quantize(w)
    assert qt.codes.shape == (4, 64)


@pytest.mark.parametrize(
    "fmt,opts",
    [
        ("int8", {}),
        ("int4", {}),
        ("int6", {"clip": "std:12.85"}),
        ("int5", {"clip": "sigma:3"}),
        ("int4", {"asymmetric": True, "clip_search": True}),
        ("int3", {"group": 100, "clip_percentile": 99.0}),
        ("int8_pg", {}),
        ("ternary", {}),
    ],
)
def test_a_tensor_quantized_a_block_of_groups_at_a_time_gives_the_same_codes(fmt, opts, monkeypatch):
    """Grid formats quantize a block of groups at a time (a 32000x2048 embedding's float copies
    took 1.0 GB whole): the codes, scales and zeros equal those of the tensor in one block,
    a padded last group included."""
    from recurnorm.quant import grid

    w = gaussian(301, 70) ** 3
    whole = q.get(fmt, **opts).quantize(w)
    monkeypatch.setattr(grid, "QUANTIZE_BLOCK", 1000)  # blocks of 14 rows (or 10 groups of 100)
    blocks = q.get(fmt, **opts).quantize(w)
    for field in ("codes", "scales", "zeros"):
        a, b = getattr(whole, field), getattr(blocks, field)
        assert (a is None and b is None) or (np.array_equal(a, b) and a.dtype == b.dtype), field


def test_empty_tensors_are_budget_friendly():
    assert q.get("int4").quantize(torch.zeros(0)).codes.shape == (0, 64)
    assert q.get("int8").quantize(torch.zeros(0)).codes.shape == (1, 0)
    assert q.get("int8").quantize(torch.zeros(0, 16)).codes.shape == (0, 16)
    assert q.get("fp16").quantize(torch.zeros(0)).codes.shape == (1, 0)


@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(fmt, dt):
    w = gaussian(8, 128).to(dt)
    qt = q.get(fmt).quantize(w)
    assert qt.dtype == str(dt).removeprefix("torch.")
    assert q.dequantize(qt).dtype == torch.float32
    back = q.dequantize(qt, original_dtype=True)
    assert back.dtype == dt
    # same codes as the float32 copy of the same values
    assert np.array_equal(q.get(fmt).quantize(w.float()).codes, qt.codes) or fmt in ("fp32",)


def test_bits_per_weight():
    w = gaussian(256, 256)
    assert q.bits_per_weight(q.get("int8").quantize(w)) == pytest.approx(8 + 16 / 256)
    assert q.bits_per_weight(q.get("int4").quantize(w)) == pytest.approx(4 + 16 / 64)
    assert q.bits_per_weight(q.get("int4", asymmetric=True).quantize(w)) == pytest.approx(4 + 32 / 64)
    assert q.bits_per_weight(q.get("nf4").quantize(w)) == pytest.approx(4 + 32 / 64)
    assert q.bits_per_weight(q.get("ternary").quantize(w)) == pytest.approx(np.log2(3) + 16 / 65536)


def test_sigma_clip_from_the_cli_grammar():
    """`-q int6:clip=sigma:3` (the Parameter Golf records' k * std(row) clip) parses and clips."""
    from recurnorm.errors import ConfigError
    from recurnorm.export.spec import parse_format

    assert parse_format("int6:clip=sigma:3") == ("int6", {"clip": "sigma:3"})
    with pytest.raises(ConfigError, match="clip"):
        parse_format("int6:clip=median:3")
    w = torch.randn(8, 512)
    w[:, 0] = 50.0  # one outlier per row: absmax would waste the grid on it
    qt = q.get("int6", clip="sigma:3").quantize(w)
    assert qt.params["clip"] == "sigma:3"
    err = (q.dequantize(qt) - w)[:, 1:].abs().mean()
    assert err < 0.5 * (q.dequantize(q.get("int6").quantize(w)) - w)[:, 1:].abs().mean()


@pytest.mark.parametrize(
    "codes,scales,dtype,peak",
    [
        ([[127, -3], [1, -1]], [1.0, 600.0], "float16", None),  # bound 127 x 600 is past 65504: the groups are not
        ([[127, -3], [1, -127]], [1.0, 600.0], "float16", 76200.0),  # group 1 is
        ([[127, -128], [5, 0]], [200.0, 10.0], "float16", None),  # the bound settles it
        ([[2, 1], [1, 1]], [np.inf, 1.0], "float32", np.inf),  # an infinite scale (64-bit 1e300 in float32)
        ([[0, 0], [0, 0]], [np.inf, 1.0], "float32", np.inf),  # 0 x inf: NaN, counted as Inf
    ],
)
def test_range_bound_agrees_with_the_exact_peak(codes, scales, dtype, peak):
    """Grid formats bound the peak first (largest |code| x largest |scale|), then measure it per
    group where the bound is past the output dtype's limit: the verdict is the exact peak's."""
    qt = q.QTensor("int8", (2, 2), dtype, np.array(codes, np.int8), np.array(scales, np.float64))
    why = q.get("int8").range_problem(qt)
    assert why is None if peak is None else f"values up to {peak:.4g}" in why


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize(
    "values,problem",
    [
        ([-3.0, 1.0], None),
        ([-0.0, 0.0], None),
        ([-1e6, 1.0], "beyond float16"),  # the largest magnitude is a negative one
        ([1e6, -1.0], "beyond float16"),
        ([-np.inf, 1.0], "NaN or Inf"),
        ([np.nan, -1.0], "NaN or Inf"),
    ],
)
def test_float_bits_peak_is_the_largest_magnitude_of_either_sign(fmt, values, problem):
    """A float format's stored words are checked for NaN/Inf and for the output dtype's range
    (float16 here) from their largest magnitude, read without the sign from either sign's side."""

    store = q.get(fmt).store
    signed = {2: torch.int16, 4: torch.int32}[store.itemsize]
    bits = torch.tensor(values).to(store).view(signed).numpy().view(f"u{store.itemsize}").reshape(1, -1)
    why = q.get(fmt).check_values(q.QTensor(fmt, (2,), "float16", bits.copy(), params={}))
    if fmt == "fp16" and problem == "beyond float16":
        problem = "NaN or Inf"  # (1e6 is Inf as fp16)
    assert why is None if problem is None else problem in why


@pytest.mark.parametrize(
    "fmt,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32), ("bf16", torch.float32)]
)
def test_a_float_format_dequantizes_to_its_original_dtype_bit_for_bit(fmt, dtype):
    """In its own dtype a float format gives back its words (unpack: no float32 between), as a
    tensor of its own: writing to it leaves the QTensor's codes as they were."""
    w = (torch.randn(6, 5) * 3).to(dtype)
    qt = q.get(fmt).quantize(w)
    got = q.dequantize(qt, original_dtype=True)
    want = w.to(q.get(fmt).store).to(dtype)
    assert (
        got.dtype == dtype
        and got.shape == w.shape
        and torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8))
    )
    before = qt.codes.copy()
    got.zero_()
    assert np.array_equal(qt.codes, before)
    with pytest.raises(QuantError, match="format"):
        q.get("fp16" if fmt != "fp16" else "bf16").dequantize_to(qt, dtype)
