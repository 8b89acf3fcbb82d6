"""LQER (quant/lqer.py): a low-rank correction of the quantization error, stored as two small
quantized factors; the record recipe (-q @pg-record) that uses it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import hostile_corpus as hc
import numpy as np
import pytest
import torch

from recurnorm.budget import pack_qtensors, read_artifact, spec, unpack
from recurnorm.errors import ArtifactError, ConfigError, QuantError
from recurnorm.export.pack import quantize
from recurnorm.export.spec import build_policy, parse_format
from recurnorm.quant import dequantize, extras, get, lqer


def _trained_like(rows=96, cols=160, seed=0) -> torch.Tensor:
    """A weight with a few strong directions and outlier columns, as trained matrices have."""
    g = torch.Generator().manual_seed(seed)
    low = torch.randn(rows, 3, generator=g) @ torch.randn(3, cols, generator=g)
    w = 0.02 * torch.randn(rows, cols, generator=g) + 0.01 * low
    w[:, :4] *= 8
    return w


def _loader():
    spec = importlib.util.spec_from_file_location(
        "rnpk_load_t", Path(__file__).parents[1] / "recurnorm" / "budget" / "rnpk_load.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_correction_reduces_the_error_it_targets():
    w = _trained_like()
    qt = get("int4").quantize(w)
    plain = lqer.error_norm(w, qt)
    for rank, errs in ((2, []), (4, []), (8, [])):
        fixed = lqer.correct(w, qt, lqer.LowRank(rank, "int8", "int8"))
        errs.append(lqer.error_norm(w, fixed))
        assert errs[0] < plain
    # a higher rank removes more; coarse factors still help
    e = [lqer.error_norm(w, lqer.correct(w, qt, lqer.LowRank(r, "int8", "int8"))) for r in (1, 4, 16)]
    assert e[0] > e[1] > e[2]
    assert lqer.error_norm(w, lqer.correct(w, qt, lqer.LowRank(4, "int2", "int4"))) < plain


def test_a_hessian_weights_the_correction_toward_the_inputs_that_matter():
    """With H = Σ xxᵀ, the error the layer's outputs see is tr(δ H δᵀ); the weighted SVD cuts it more."""
    w = _trained_like()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 160, generator=g) * torch.linspace(0.1, 3.0, 160)  # some inputs are loud
    H = x.T @ x
    qt = get("int4").quantize(w)

    def out_err(q):
        d = w - dequantize(q)
        return float(torch.einsum("ij,jk,ik->", d, H, d))

    spec = lqer.LowRank(4, "int8", "int8")
    assert out_err(lqer.correct(w, qt, spec, H)) < out_err(lqer.correct(w, qt, spec)) < out_err(qt)


def test_round_trip_library_and_standalone_loader_bit_for_bit():
    w = _trained_like()
    qts = {
        "w": lqer.correct(w, get("int5").quantize(w), lqer.LowRank(4)),
        "wbf": lqer.correct(w.bfloat16(), get("int4").quantize(w.bfloat16()), lqer.LowRank(3, "int2", "int8")),
        "conv": lqer.correct(w.reshape(96, 10, 16), get("int6").quantize(w.reshape(96, 10, 16)), lqer.LowRank(2)),
        "v": get("fp16").quantize(torch.randn(7)),
    }
    qts["tied"] = qts["w"]
    data = pack_qtensors(qts)
    assert data[6] & spec.FIELD_FLAGS["lowrank"]  # readers that do not know the field refuse it
    art = read_artifact(data)
    assert sorted(art.qtensors) == ["conv", "tied", "v", "w", "wbf"]  # factors live on their tensor
    for name in ("w", "wbf", "conv"):
        assert art.qtensors[name].equal(qts[name])
    sd = unpack(data)
    for name in ("w", "wbf", "conv"):  # the library's unpack is dequantize with the correction
        assert torch.equal(sd[name], dequantize(qts[name], original_dtype=True))
    assert sd["wbf"].dtype == torch.bfloat16 and sd["conv"].shape == (96, 10, 16)
    loaded = _loader().load(data)
    assert list(loaded) == list(sd)
    for name, t in sd.items():
        got = loaded[name]
        assert got.dtype == t.dtype and torch.equal(got.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    # the correction is what changed the weights
    assert not torch.equal(sd["w"], dequantize(get("int5").quantize(w)))


def test_options_are_checked_and_spelled_in_q():
    assert parse_format("int6:lqer=4:lqer_l=int8") == ("int6", {"lqer": 4, "lqer_l": "int8"})
    for bad, what in (
        ("int6:lqer=-1", "rank"),
        ("int6:lqer=4:lqer_r=nf4", "lqer_r"),
        ("int6:lqer_l=int8", "lqer=RANK"),
        ("int6:lqer=true", "rank"),
    ):
        with pytest.raises(ConfigError, match=what):
            build_policy(bad)
    with pytest.raises(QuantError):
        lqer.split_options({"lqer": 999})
    # a vector that takes the main format has nothing low-rank to correct: it comes as it is
    qt = extras.quantize(torch.randn(300), "int6", {"lqer": 4})
    assert qt.lowrank is None


def test_pack_q_with_lqer_end_to_end(tmp_path):
    from recurnorm.export.pack import pack

    g = torch.Generator().manual_seed(0)
    state = {
        "a.weight": _trained_like(),
        "b.weight": torch.randn(64, 64, generator=g) * 0.02,
        "n.weight": torch.ones(64),
    }
    plain, fixed = pack(state, "int4"), pack(state, "int4:lqer=4")
    assert len(fixed) > len(plain)  # the factors cost bytes
    a, b = unpack(plain), unpack(fixed)
    err = {k: float((state[k] - v[k]).norm()) for v, k in ((a, "a.weight"), (a, "b.weight"))}
    assert float((state["a.weight"] - b["a.weight"]).norm()) < err["a.weight"]
    assert set(b) == set(state)


@pytest.mark.parametrize("case", sorted(hc.LQER_CASES))
def test_forged_corrections_are_refused(case):
    with pytest.raises(ArtifactError):
        read_artifact(hc.LQER_CASES[case]())


def test_the_hostile_base_with_a_correction_is_valid():
    art = read_artifact(hc._lqer_base())
    assert art.qtensors["w"].lowrank is not None and set(art.qtensors) == {"v", "w"}


# ------------------------------------------------------------------ the record recipe


def _baseline_state(layers=2, d=512) -> dict[str, torch.Tensor]:
    """A Parameter Golf baseline-named state dict (GQA, tied tok_emb, the record's gates and controls)."""
    g = torch.Generator().manual_seed(0)
    sd = {"tok_emb.weight": torch.randn(1024, d, generator=g) * 0.02}
    for i in range(layers):
        for proj, shape in (
            ("attn.c_q", (d, d)),
            ("attn.c_k", (d // 2, d)),
            ("attn.c_v", (d // 2, d)),
            ("attn.proj", (d, d)),
            ("mlp.fc", (4 * d, d)),
            ("mlp.proj", (d, 4 * d)),
        ):
            sd[f"blocks.{i}.{proj}.weight"] = torch.randn(*shape, generator=g) * 0.02
        sd[f"blocks.{i}.attn.attn_gate_w"] = torch.randn(8, 12, generator=g)
        sd[f"blocks.{i}.attn.q_gain"] = torch.full((8,), 5.0)
        sd[f"blocks.{i}.attn_scale"] = torch.ones(d)
        sd[f"blocks.{i}.mlp_scale"] = torch.ones(d)
        sd[f"blocks.{i}.resid_mix"] = torch.ones(2, d)
    sd["skip_weights"] = torch.ones(5, d)
    sd["step"] = torch.tensor(7)
    return sd


def test_the_record_recipe_reproduces_the_records_formats():
    state = _baseline_state()
    policy = build_policy("@pg-record")
    qts, plan = quantize(state, policy)
    fmt_of = {n: (f, o) for n, (f, o, _) in plan.items()}
    for i in range(2):
        for proj in ("c_q", "c_k", "c_v", "proj"):
            assert fmt_of[f"blocks.{i}.attn.{proj}.weight"][0] == "int6"
            assert fmt_of[f"blocks.{i}.attn.{proj}.weight"][1]["clip"] == "std:13"
        for proj in ("fc", "proj"):
            assert fmt_of[f"blocks.{i}.mlp.{proj}.weight"][1]["clip"] == "std:11.5"
        assert fmt_of[f"blocks.{i}.attn.attn_gate_w"] == ("int8", {"clip_percentile": None})
        for ctl in ("attn.q_gain", "attn_scale", "mlp_scale", "resid_mix"):
            assert fmt_of[f"blocks.{i}.{ctl}"] == ("fp16", {})
    assert fmt_of["tok_emb.weight"][0] == "int7" and fmt_of["tok_emb.weight"][1]["clip"] == "std:14"
    assert fmt_of["skip_weights"] == ("fp16", {}) and fmt_of["step"] == ("raw", {})
    # LQER rank 4 on the 3 largest errors, and nowhere else
    fixed = sorted(n for n, qt in qts.items() if qt.lowrank is not None)
    assert len(fixed) == 3 and all(qts[n].lowrank[0].shape[0] == 4 for n in fixed)
    matrices = [n for n, (f, _) in fmt_of.items() if f in ("int6", "int7")]
    errors = {
        n: float(
            (state[n] - dequantize(get(fmt_of[n][0], **lqer.split_options(fmt_of[n][1])[0]).quantize(state[n]))).norm()
        )
        for n in matrices
    }
    ranked = sorted(matrices, key=lambda n: -errors[n])
    assert fixed == sorted(ranked[:3])
    # SDClip bit for bit: scale = k * std(row) / 31 in fp16, codes = round(w / scale)
    w = state["blocks.0.attn.c_q.weight"]
    s = (13.0 * w.std(dim=1) / 31).to(torch.float16)
    assert np.array_equal(qts["blocks.0.attn.c_q.weight"].scales, s.numpy())
    assert np.array_equal(
        qts["blocks.0.attn.c_q.weight"].codes, torch.clamp(torch.round(w / s.float()[:, None]), -31, 31).numpy()
    )
    assert "@pg-record" in policy.summary() and "lqer rank 4" in policy.summary()


def test_recipe_errors_and_rules():
    with pytest.raises(ConfigError, match="@pg-record"):
        build_policy("@nope")
    with pytest.raises(ConfigError, match="recipe"):
        build_policy("@pg-record,int8")
    state = _baseline_state(layers=1)
    _, plan = quantize(state, build_policy("@pg-record,tok_emb.weight=int8"))
    assert plan["tok_emb.weight"][0] == "int8"  # a user rule still comes first


# ------------------------------------------------------------------ --fit with LQER candidates


def test_fit_with_lqer_candidates_never_exceeds_its_budget(trained_tiny, tmp_path):
    """Budgets from the narrowest to the widest: every artifact lands at or under its budget, the
    factors' bytes are counted with their tensor, and where a correction is chosen it is in the artifact."""
    from recurnorm.export.fit import calibration_loss_fn, fit_measured, measure, parse_formats
    from recurnorm.export.gptq import GPTQExporter, calibration_windows
    from recurnorm.model import state_dict_for_export

    model, corpus = trained_tiny
    windows = calibration_windows(model, corpus.train_tokens, 2048)
    exporter = GPTQExporter(model, corpus.train_tokens, 2048)
    state = state_dict_for_export(model)
    formats = parse_formats("int8,int6:lqer=4,int5:clip=std:5:lqer=2:lqer_r=int8,int4:lqer=4,int4")
    m = measure(
        state,
        build_policy("int8"),
        formats=formats,
        loss_fn=calibration_loss_fn(model, windows),
        hessians=dict(exporter.hessians),
        quantize_fn=exporter.quantize,
    )
    assert m.method.startswith("Hessian proxy")
    # the correction's factors are counted in its tensor's bytes
    n = "blocks.0.attn.q.weight"
    assert m.bytes_table[n]["int6:lqer=4"] > m.bytes_table[n]["int4"]
    lo, hi = min(m.uniform.values()), max(m.uniform.values())
    chose_lqer = False
    for budget in np.linspace(lo + 200, hi, 6).astype(int):
        fit = fit_measured(m, int(budget))
        assert fit.measured_bytes == len(fit.data) <= budget
        art = read_artifact(fit.data)
        fixed = {name for name, qt in art.qtensors.items() if qt.lowrank is not None}
        want = {name for name, spec in fit.allocation.items() if "lqer" in spec}
        assert fixed == want
        chose_lqer |= bool(want)
    assert chose_lqer  # on this model some budget pays for a correction


@pytest.mark.slow  # GPTQ, Hessians and a fit through the CLI
def test_cli_fit_with_everything(trained_tiny, tmp_path):
    from click.testing import CliRunner

    from recurnorm.cli.main import main
    from recurnorm.model import save_checkpoint

    model, _ = trained_tiny
    ckpt = save_checkpoint(model, tmp_path / "ck")
    runner = CliRunner()
    r = runner.invoke(main, ["pack", str(ckpt), "-q", "int6", "-o", str(tmp_path / "u.rnpk"), "--json"])
    budget = int(0.9 * (tmp_path / "u.rnpk").stat().st_size)
    args = ["pack", str(ckpt), "-o", str(tmp_path / "f.rnpk"), "--fit", str(budget), "--gptq"]
    args += ["--calib-data", "default", "--calib-tokens", "2048", "--fit-formats", "quick"]
    args += ["--fit-sensitivity", "hessian", "--json"]
    r = runner.invoke(main, args)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "f.rnpk").stat().st_size <= budget
    r = runner.invoke(main, ["pack", str(ckpt), "-q", "@pg-record", "-o", str(tmp_path / "r.rnpk"), "--json"])
    assert r.exit_code == 0, r.output
    assert "@pg-record" in r.output


# ------------------------------------------------------------------ rate-aware rounding


def test_rate_aware_rounding_trades_a_little_error_for_fewer_bytes():
    """Same grid, same scales: codes move only to a neighbour, the packed codes shrink, and the
    error grows by less than a coarser step would cost for the same bytes."""
    from recurnorm.quant.rdo import SLOPE, rate_aware

    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(3)) * 0.02  # no outliers: clips never bite
    plain = get("int6", clip="std:12").quantize(w)
    rdo = extras.quantize(w, "int6", {"clip": "std:12", "rdo": SLOPE})
    assert np.array_equal(rdo.scales, plain.scales) and rdo.params == plain.params
    assert np.abs(rdo.codes.astype(int) - plain.codes.astype(int)).max() == 1
    b_plain, b_rdo = len(pack_qtensors({"w": plain})), len(pack_qtensors({"w": rdo}))
    e_plain, e_rdo = (float((w - dequantize(q)).square().sum()) for q in (plain, rdo))
    assert b_rdo < b_plain and e_plain < e_rdo
    coarse = get("int6", clip="std:13").quantize(w)  # a coarser step: fewer bytes, more error
    b_c, e_c = len(pack_qtensors({"w": coarse})), float((w - dequantize(coarse)).square().sum())
    assert (e_rdo - e_plain) / (b_plain - b_rdo) < (e_c - e_plain) / (b_plain - b_c)
    assert torch.equal(rate_aware(torch.tensor([0.2, 2.7]), -3, 3, 0.0), torch.tensor([0.0, 3.0]))
    with pytest.raises(ConfigError, match="rdo"):
        build_policy("nf4:rdo=0.1")


def test_rate_aware_rounding_inside_gptq():
    from recurnorm.quant.gptq import gptq_quantize

    w = _trained_like(64, 160)
    x = torch.randn(3000, 160, generator=torch.Generator().manual_seed(2))
    H = x.T @ x
    q = get("int5", clip="std:6")
    plain, rdo = gptq_quantize(w, H, q), gptq_quantize(w, H, q, rdo=0.2)
    assert len(pack_qtensors({"w": rdo})) < len(pack_qtensors({"w": plain}))
    assert rdo.codes.min() >= -15 and rdo.codes.max() <= 15
