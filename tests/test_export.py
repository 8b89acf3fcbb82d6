"""recurnorm.export: policies (defaults, name conventions, -q rules), inspect's rules, GPTQ and --fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from recurnorm.budget.api import read_artifact
from recurnorm.cli.main import main
from recurnorm.errors import ConfigError, OverCapError
from recurnorm.export import build_policy, parse_quant
from recurnorm.export.policy import ExportPolicy

TESTS = Path(__file__).resolve().parent
PG_FACTORY = f"{TESTS / 'pg_model.py'}:build"
PG_CONTROLS = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights")


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def tiny_ckpt(trained_tiny, tmp_path_factory) -> Path:
    from recurnorm.model import save_checkpoint

    path = tmp_path_factory.mktemp("tiny") / "ckpt"
    save_checkpoint(trained_tiny[0], path)
    return path


def formats_of(data: bytes) -> dict[str, str]:
    return {n: qt.format for n, qt in read_artifact(data).qtensors.items()}


# -- the default policy ----------------------------------------------------------


def test_default_policy_on_parameter_golf_names(pg_ckpt, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "pg.rnpk"
    r = cli("pack", pg_ckpt, "-q", "int6", "-o", out)
    assert r.exit_code == 0, r.output
    assert "export policy: weights int6" in r.output  # printed with every result
    art = read_artifact(out.read_bytes())
    fmts = {n: qt.format for n, qt in art.qtensors.items()}
    original = load_file(str(pg_ckpt))
    from recurnorm.quant import dequantize

    controls = [n for n in fmts if any(p in n for p in PG_CONTROLS)]
    assert len(controls) == 4 * 4 + 1
    for n in controls:  # fp32 and exact
        assert fmts[n] == "fp32", n
        assert torch.equal(dequantize(art.qtensors[n]), original[n])
    assert fmts["tok_emb.weight"] == "int8" and fmts["lm_head.weight"] == "int8"
    assert fmts["blocks.0.mlp.fc.weight"] == "int6" and fmts["blocks.3.attn.c_q.weight"] == "int6"
    assert art.metadata["export"]["rules"]["blocks.0.resid_mix"] == "control"


def test_every_weight_matrix_gets_the_requested_format(tiny_ckpt, tmp_path):
    out = tmp_path / "t.rnpk"
    assert cli("pack", tiny_ckpt, "-q", "ternary", "-o", out).exit_code == 0
    fmts = formats_of(out.read_bytes())
    projections = [n for n in fmts if n.startswith("blocks.") and n.endswith(("q.weight", "up.weight"))]
    assert projections and all(fmts[n] == "ternary" for n in projections)  # not silently fp16
    assert fmts["embed.weight"] == "int8"
    assert all(fmts[n] == "fp32" for n in fmts if "norm" in n)


def test_hugging_face_names():
    sd = {
        "model.embed_tokens.weight": torch.randn(300, 64),
        "lm_head.weight": torch.randn(300, 64),
        "model.layers.0.input_layernorm.weight": torch.ones(64),
        "model.layers.0.mlp.up_proj.weight": torch.randn(128, 64),
        "model.layers.0.mlp.up_proj.bias": torch.zeros(128),
    }
    plan = ExportPolicy(quantizer="int4").plan(sd)
    assert plan["model.embed_tokens.weight"][:1] == ("int8",) and plan["lm_head.weight"][2] == "embedding"
    assert plan["model.layers.0.input_layernorm.weight"][0] == "fp32"
    assert plan["model.layers.0.mlp.up_proj.weight"][0] == "int4"
    assert plan["model.layers.0.mlp.up_proj.bias"][0] == "fp16"


# -- policies as text ------------------------------------------------------------


def test_rules_first_match_wins_and_wildcards_spare_controls(pg_ckpt):
    from safetensors.torch import load_file

    sd = load_file(str(pg_ckpt))
    policy = build_policy("blocks.0.*=int4:group=32,blocks.*=int6,blocks.1.attn_scale=fp16,*=int5")
    plan = policy.plan(sd)
    assert plan["blocks.0.mlp.fc.weight"][:2] == ("int4", {"group": 32})  # the first match
    assert plan["blocks.2.attn.c_q.weight"][0] == "int6"
    assert plan["tok_emb.weight"][0] == "int5"  # "*" reaches embeddings: they were asked for
    assert plan["blocks.0.attn_scale"][0] == "fp32"  # a wildcard never reaches a control...
    assert plan["blocks.1.attn_scale"][0] == "fp16"  # ...its exact name does
    assert plan["blocks.0.mlp.fc.weight"][2] == "rule blocks.0.*=int4:group=32"
    main_fmt, rules = parse_quant("int4:group=128:clip_search=true")
    assert main_fmt == ("int4", {"group": 128, "clip_search": True}) and rules == []


def test_keep_float_and_policy_file(pg_ckpt, tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text(
        'format = "int5"\nembedding = "int6"\nkeep_float = ["lm_head.weight"]\nrules = ["blocks.*.mlp.*=int4"]\n'
    )
    out = tmp_path / "p.rnpk"
    r = cli("pack", pg_ckpt, "--policy", toml, "--keep-float", "blocks.0.attn.c_q.weight", "-o", out)
    assert r.exit_code == 0, r.output
    fmts = formats_of(out.read_bytes())
    assert fmts["tok_emb.weight"] == "int6" and fmts["lm_head.weight"] == "fp32"
    assert fmts["blocks.0.attn.c_q.weight"] == "fp32" and fmts["blocks.1.attn.c_q.weight"] == "int5"
    assert fmts["blocks.2.mlp.proj.weight"] == "int4"


@pytest.mark.parametrize(
    "args,named,listed",
    [
        (["-q", "int9"], "int9", "int8"),
        (["-q", "int4:bogus=1"], "bogus", "clip_search"),
        (["-q", "int6:clip=median:3"], "clip", "sigma:K"),
        (["-q", "blocks.*=int17"], "int17", "ternary"),
        (["-q", "int4:group=-3"], "group", "positive"),
    ],
)
def test_unknown_format_or_option_is_a_usage_error(pg_ckpt, tmp_path, args, named, listed):
    r = CliRunner().invoke(main, ["pack", str(pg_ckpt), *args, "-o", str(tmp_path / "x.rnpk")])
    assert r.exit_code == 2, r.output
    assert named in r.output and listed in r.output
    assert not (tmp_path / "x.rnpk").exists()


def test_bad_policy_file_is_a_usage_error(pg_ckpt, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('formats = "int6"\n')
    r = CliRunner().invoke(main, ["pack", str(pg_ckpt), "--policy", str(bad), "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "formats" in r.output and "known" in r.output
    with pytest.raises(ConfigError, match="unknown format 'int9'"):
        build_policy("tok_emb.weight=int9")


def test_inspect_reports_the_rule_per_tensor(pg_ckpt, tmp_path):
    out = tmp_path / "r.rnpk"
    assert (
        cli("pack", pg_ckpt, "-q", "blocks.*.mlp.*=int5,int6", "--keep-float", "lm_head.weight", "-o", out).exit_code
        == 0
    )
    r = cli("inspect", out)
    assert r.exit_code == 0
    lines = {ln.split()[0]: ln for ln in r.output.splitlines() if ln.strip()}
    assert "rule blocks.*.mlp.*=int5" in lines["blocks.1.mlp.fc.weight"]
    assert "keep-float lm_head.weight" in lines["lm_head.weight"]
    assert lines["blocks.1.attn.c_q.weight"].split()[1:] == ["int6", "weight"]
    assert lines["tok_emb.weight"].split()[1:] == ["int8", "embedding"]
    assert lines["skip_weights"].split()[1:] == ["fp32", "control"]
    rows = json.loads(cli("inspect", out, "--json").output)["tensors"]
    assert {r["name"]: r["rule"] for r in rows}["blocks.0.mlp.proj.weight"] == "rule blocks.*.mlp.*=int5"
    # a checkpoint is inspected under the same policy options
    r = cli("inspect", pg_ckpt, "-q", "int4")
    assert "blocks.0.mlp.fc.weight" in r.output and " int4 " in r.output


def test_recurnorm_pack_is_the_export_stage(trained_tiny):
    import recurnorm

    model = trained_tiny[0]
    data = recurnorm.pack(model, quant="int4:group=32")
    art = read_artifact(data)
    assert art.metadata["config"]["scheme"] == model.config.scheme
    qt = art.qtensors["blocks.0.attn.q.weight"]
    assert qt.format == "int4" and qt.params["group"] == 32
    assert art.metadata["export"]["rules"]["embed.weight"] == "embedding"


# -- GPTQ from the CLI --------------------------------------------------------------


def test_gptq_from_the_cli(tiny_ckpt, pg_ckpt, tmp_path):
    rtn, gq = tmp_path / "rtn.rnpk", tmp_path / "gq.rnpk"
    assert cli("pack", tiny_ckpt, "-q", "int4", "-o", rtn).exit_code == 0
    r = cli("pack", tiny_ckpt, "-q", "int4", "--gptq", "--calib-data", "default", "--calib-tokens", 2048, "-o", gq)
    assert r.exit_code == 0, r.output
    a, b = read_artifact(rtn.read_bytes()), read_artifact(gq.read_bytes())
    assert b.metadata["gptq"]["calib_tokens"] == 2048
    name = "blocks.0.mlp.up.weight"
    assert b.qtensors[name].format == "int4" and not a.qtensors[name].equal(b.qtensors[name])
    assert a.qtensors["embed.weight"].equal(b.qtensors["embed.weight"])  # not a projection
    # a foreign checkpoint through --model-factory
    out = tmp_path / "pg.rnpk"
    r = cli(
        "pack",
        pg_ckpt,
        "-q",
        "int5",
        "--gptq",
        "--calib-data",
        "default",
        "--calib-tokens",
        1024,
        "--model-factory",
        PG_FACTORY,
        "-o",
        out,
    )
    assert r.exit_code == 0, r.output
    assert formats_of(out.read_bytes())["blocks.1.mlp.fc.weight"] == "int5"
    r = CliRunner().invoke(main, ["pack", str(pg_ckpt), "--gptq", "-o", str(tmp_path / "n.rnpk")])
    assert r.exit_code == 2 and "--calib-data" in r.output
    r = CliRunner().invoke(
        main, ["pack", str(pg_ckpt), "--gptq", "--calib-data", "default", "-o", str(tmp_path / "n.rnpk")]
    )
    assert r.exit_code == 2 and "--model-factory" in r.output


# -- --fit --------------------------------------------------------------------------


def uniform_size(ckpt, fmt: str) -> int:
    from recurnorm.export.pack import pack_checkpoint

    return len(pack_checkpoint(ckpt, build_policy(fmt)).data)


@pytest.mark.slow  # packs many --fit allocations
def test_fit_never_lands_over_the_budget(pg_ckpt, tmp_path):
    code = tmp_path / "train_gpt.py"
    code.write_text("print('hello')\n" * 40)
    n_code = len(code.read_bytes())
    s4, s8 = uniform_size(pg_ckpt, "int4"), uniform_size(pg_ckpt, "int8")  # --fit keeps the embeddings int8
    budgets = [s4 + n_code + 300, (s4 + s8) // 2 + n_code, s8 + n_code - 2000]
    for i, n in enumerate(budgets):
        out = tmp_path / f"fit{i}.rnpk"
        r = cli("pack", pg_ckpt, "--fit", n, "--code", code, "-o", out, "--json")
        assert r.exit_code == 0, r.output
        report = json.loads(r.output[r.output.index("{") :])
        size = len(out.read_bytes())
        assert size + n_code <= n and report["fit"]["measured_bytes"] == size
        assert "weight-space proxy" in report["fit"]["method"]  # no --calib-data: says so
        fmts = formats_of(out.read_bytes())
        if i == 0:  # forced most tensors to the narrowest width
            weights = [f for k, f in fmts.items() if k.endswith(".weight")]
            assert sum(f == "int4" for f in weights) >= len(weights) * 0.7
    # impossible: refused, naming the smallest achievable size
    r = CliRunner().invoke(main, ["pack", str(pg_ckpt), "--fit", str(s4 // 2), "-o", str(tmp_path / "x")])
    assert r.exit_code == 3 and "smallest achievable" in r.output
    assert not (tmp_path / "x").exists()
    import re

    smallest = int(re.search(r"smallest achievable artifact is ([\d,]+) bytes", r.output)[1].replace(",", ""))
    # the narrowest uniform candidate: int4, or int5/int6 with the record's clips (clip=record) when smaller
    assert smallest <= s4 + 64 and "every candidate tensor at int" in r.output
    assert cli("pack", pg_ckpt, "--fit", smallest, "-o", tmp_path / "min.rnpk").exit_code == 0


@pytest.mark.slow  # packs many --fit allocations
def test_fit_that_allows_int8_everywhere_gives_int8(pg_ckpt, tmp_path):
    s8 = uniform_size(pg_ckpt, "int8")
    out = tmp_path / "f.rnpk"
    r = cli(
        "pack",
        pg_ckpt,
        "--fit",
        s8,
        "--calib-data",
        "default",
        "--calib-tokens",
        512,
        "--model-factory",
        PG_FACTORY,
        "-o",
        out,
    )
    assert r.exit_code == 0, r.output
    assert "direct Δloss" in r.output and "predicted" in r.output and "measured" in r.output
    fmts = formats_of(out.read_bytes())
    assert all(fmts[n] == "int8" for n in fmts if n.endswith(".weight"))


def test_fit_with_direct_sensitivity_prefers_the_cheap_tensors(tiny_ckpt):
    from recurnorm.export import ship

    s4, s8 = uniform_size(tiny_ckpt, "int4"), uniform_size(tiny_ckpt, "int8")
    packed = ship.ship(
        tiny_ckpt, build_policy("int8"), fit_bytes=(s4 + s8) // 2, calib_data="default", calib_tokens=1024
    )
    fit = packed.fit
    assert fit.measured_bytes <= (s4 + s8) // 2 and len(set(fit.allocation.values())) > 1
    assert fit.method.startswith("direct")
    # the knapsack's choice is no worse than the uniform choices that fit, by its own measure
    assert fit.predicted_dloss <= min(sum(fit.sensitivity[n]["int4"] for n in fit.allocation), 1e9) + 1e-9


def test_fit_embeddings_lets_the_fit_choose_the_embedding_too(pg_ckpt, tmp_path):
    import re

    # the smallest the default fit reaches (every weight matrix at its narrowest candidate, the embedding int8)
    r = CliRunner().invoke(main, ["pack", str(pg_ckpt), "--fit", "1000", "-o", str(tmp_path / "x.rnpk")])
    s4 = int(re.search(r"smallest achievable artifact is ([\d,]+) bytes", r.output)[1].replace(",", ""))
    args = ["pack", str(pg_ckpt), "--fit", str(s4 - 200), "-o", str(tmp_path / "f.rnpk")]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 3 and "the embedding keeps int8" in r.output  # by default it stays int8
    r = CliRunner().invoke(main, [*args, "--fit-embeddings", "--json"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "f.rnpk").stat().st_size <= s4 - 200
    assert formats_of((tmp_path / "f.rnpk").read_bytes())["tok_emb.weight"] != "int8"
    r = CliRunner().invoke(main, ["pack", str(pg_ckpt), "--fit-embeddings", "-o", str(tmp_path / "g.rnpk")])
    assert r.exit_code == 2 and "--fit-embeddings only applies with --fit BYTES" in r.output


def test_over_cap_refusal_names_what_would_fit(pg_ckpt, tmp_path):
    s6 = uniform_size(pg_ckpt, "int6")
    r = CliRunner().invoke(
        main, ["pack", str(pg_ckpt), "-q", "int8", "--max-bytes", str(s6 + 100), "-o", str(tmp_path / "x.rnpk")]
    )
    assert r.exit_code == 3
    assert "-q int6 fits" in r.output and f"--fit {s6 + 100}" in r.output


def test_fit_impossible_is_overcap_error(pg_ckpt):
    from recurnorm.export import ship

    with pytest.raises(OverCapError, match="smallest achievable"):
        ship.ship(pg_ckpt, build_policy("int8"), fit_bytes=1000)


# -- the planner ----------------------------------------------------------------------


@pytest.mark.parametrize("quant", ["int8", "int6", "int4", "ternary"])
def test_planner_predicts_a_trained_tiny_model_within_2_percent(trained_tiny, quant):
    from recurnorm.export.pack import pack
    from recurnorm.export.plan import predict_size

    model = trained_tiny[0]
    actual = len(pack(model, quant=quant))
    plan = predict_size(model.config.to_dict(), build_policy(quant))
    assert abs(plan.predicted_bytes - actual) <= 0.02 * actual, (plan.predicted_bytes, actual)
    assert plan.formats[quant]["bits_per_weight"] > 0


def test_plan_cli_and_fit(tmp_path):
    r = cli("plan", "--scheme", "norm", "--d", 64, "--depth", 3, "--n-heads", 2, "-q", "int6", "--json")
    assert r.exit_code == 0, r.output
    small = json.loads(r.output)["total_bytes"]
    code = tmp_path / "c.py"
    code.write_text("x = 1\n" * 100)
    budget = 3 * small
    r = cli(
        "plan",
        "--scheme",
        "norm",
        "--depth",
        3,
        "--n-heads",
        2,
        "-q",
        "int6",
        "--fit",
        budget,
        "--code",
        code,
        "--json",
    )
    fitted = json.loads(r.output)
    d = fitted["config"]["d_model"]
    assert fitted["total_bytes"] <= budget and fitted["code_bytes"] == 600 and d > 64 and d % 4 == 0
    bigger = cli(
        "plan", "--scheme", "norm", "--d", d + 4, "--depth", 3, "--n-heads", 2, "-q", "int6", "--code", code, "--json"
    )
    assert json.loads(bigger.output)["total_bytes"] > budget  # the largest width that fits
    r = CliRunner().invoke(main, ["plan", "-q", "int4:nope=1"])
    assert r.exit_code == 2 and "nope" in r.output


def test_fisher_proxy_agrees_with_direct_sensitivity(trained_tiny):
    """The cheap sensitivity (½ΣFδ², one backward per window) ranks tensors like the direct Δloss
    where quantization matters (int4; at int6 both are at the noise level of a tiny model)."""
    import numpy as np

    from recurnorm.export.fit import calibration_loss_fn, fisher_diagonal, fit_budget
    from recurnorm.export.gptq import calibration_windows
    from recurnorm.model import state_dict_for_export

    model, corpus = trained_tiny
    windows = calibration_windows(model, corpus.train_tokens, 4096)
    state = state_dict_for_export(model)
    policy = build_policy("int8", embedding_names=())  # the embeddings are candidates here too
    formats = [("int4", {})]
    direct = fit_budget(state, policy, 10**9, formats=formats, loss_fn=calibration_loss_fn(model, windows))
    fisher = fit_budget(state, policy, 10**9, formats=formats, fisher=fisher_diagonal(model, windows))
    names = sorted(direct.sensitivity)
    x = [direct.sensitivity[n]["int4"] for n in names]
    y = [fisher.sensitivity[n]["int4"] for n in names]
    # measured: 0.75 here (7 tensors, direct Δloss partly noise), 0.98 on unique d=64 (19 tensors)
    assert np.corrcoef(x, y)[0, 1] > 0.6, list(zip(names, x, y, strict=True))
    assert fisher.method.startswith("Fisher") and direct.method.startswith("direct")


def test_recurnorm_pack_applies_the_qat_policy_like_the_cli(trained_tiny):
    """recurnorm.pack(state_dict, config=...) and recurnorm.pack(model) ship a QAT model's codes."""
    import copy

    import recurnorm
    from recurnorm.export.qat import projection_weight_names
    from recurnorm.model import state_dict_for_export
    from recurnorm.train.qat import apply_qat

    model = copy.deepcopy(trained_tiny[0])
    apply_qat(model, {"format": "int4", "options": {"group": 32}}, weights=True)
    for art in (
        read_artifact(recurnorm.pack(model, quant="int8")),
        read_artifact(recurnorm.pack(state_dict_for_export(model), quant="int8", config=model.config.to_dict())),
    ):
        for name in projection_weight_names(model.config):
            assert art.qtensors[name].format == "int4" and art.qtensors[name].params["group"] == 32
        assert art.metadata["config"]["qat"]["exported"] is True
        assert art.qtensors["embed.weight"].format == "int8"
