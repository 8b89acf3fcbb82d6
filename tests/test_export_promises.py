"""What the export says is what it does: float formats, --fit's embedding and summary, one cap,
the over-cap hint, rules that match nothing, wrapper prefixes, GPTQ in the record."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from recurnorm.budget.api import read_artifact
from recurnorm.cli.main import main

TESTS = Path(__file__).resolve().parent
PG_FACTORY = f"{TESTS / 'pg_model.py'}:build"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def stored_formats(data: bytes) -> Counter:
    """Format of every stored tensor, tied names once."""
    art = read_artifact(data)
    aliases = {t["name"] for t in art.manifest["tensors"] if "alias_of" in t}
    return Counter(qt.format for n, qt in art.qtensors.items() if n not in aliases)


def line_counts(line: str) -> Counter:
    """'int6 x30' items of a policy line, summed per format (options dropped)."""
    out: Counter = Counter()
    for spec, n in re.findall(r"(\S+) x(\d+)", line):
        spec = spec.strip("(),;")
        head, eq, fmt = spec.partition("=")
        if eq and ":" not in head:  # a rule's label, PATTERN=FORMAT
            spec = fmt
        out[spec.split(":")[0]] += int(n)
    out.pop("GPTQ", None)
    return out


# -- 1. a float format loses no bit ----------------------------------------------------


@pytest.mark.parametrize("dtype,fmt", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_float_format_round_trips_bit_for_bit(tmp_path, dtype, fmt):
    g = torch.Generator().manual_seed(0)
    sd = {
        "embeddings.word_embeddings.weight": torch.randn(300, 64, generator=g),
        "embeddings.LayerNorm.weight": 1 + 0.1 * torch.randn(64, generator=g),
        "embeddings.LayerNorm.bias": torch.randn(64, generator=g) * 1e-3,
        "encoder.layer.0.intermediate.dense.weight": torch.randn(256, 64, generator=g) * 0.05,
        "encoder.layer.0.intermediate.dense.bias": torch.randn(256, generator=g) * 1e-5,
        "encoder.layer.0.attention.self.query.weight": torch.randn(64, 64, generator=g) * 0.05,
    }
    sd = {k: v.to(dtype) for k, v in sd.items()}
    ckpt, out, back = tmp_path / "m.safetensors", tmp_path / "m.rnpk", tmp_path / "back.safetensors"
    save_file(sd, str(ckpt))
    r = run("pack", ckpt, "-q", fmt, "-o", out)
    assert r.exit_code == 0, r.output
    assert run("unpack", out, "-o", back).exit_code == 0
    got = load_file(str(back))
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    for name, t in sd.items():  # every value, every bit, in its own dtype
        assert got[name].dtype == dtype and torch.equal(got[name].view(bits), t.view(bits)), name


# -- 2. --fit keeps the embedding rule; its summary says what it chose ------------------


@pytest.mark.slow  # packs one model per candidate format
def test_fit_keeps_the_embedding_int8_and_its_line_matches_the_artifact(pg_ckpt, tmp_path):
    from recurnorm.export import build_policy
    from recurnorm.export.pack import pack_checkpoint

    s4 = len(pack_checkpoint(pg_ckpt, build_policy("int4")).data)
    s8 = len(pack_checkpoint(pg_ckpt, build_policy("int8")).data)
    out = tmp_path / "fit.rnpk"
    r = run("pack", pg_ckpt, "--fit", (s4 + s8) // 2, "-o", out)
    assert r.exit_code == 0, r.output
    art = read_artifact(out.read_bytes())
    fmts = {n: qt.format for n, qt in art.qtensors.items()}
    assert fmts["tok_emb.weight"] == "int8" and fmts["lm_head.weight"] == "int8"
    assert len({fmts[n] for n in fmts if n.startswith("blocks.") and n.endswith(".weight")}) > 1
    line = art.metadata["export"]["policy"]
    assert line in r.output  # the printed line is the recorded one
    assert line_counts(line) == stored_formats(out.read_bytes()), line
    assert "embeddings int8 x2" in line


def test_policy_line_counts_what_wildcards_took(pg_ckpt, tmp_path):
    """A wildcard rule that takes the embedding shows in the line: no 'embeddings int8' promise."""
    out = tmp_path / "w.rnpk"
    r = run("pack", pg_ckpt, "-q", "*=int6", "-o", out)
    assert r.exit_code == 0, r.output
    line = read_artifact(out.read_bytes()).metadata["export"]["policy"]
    assert line_counts(line) == stored_formats(out.read_bytes()), line
    assert "embeddings int8" not in line


# -- 3. --fit N is the cap -------------------------------------------------------------


@pytest.mark.slow  # 19M weights packed three times
def test_fit_over_16_mb_writes_an_artifact_of_that_size(tmp_path):
    g = torch.Generator().manual_seed(0)
    sd = {f"blocks.{i}.mlp.fc.weight": torch.rand(2048, 3072, generator=g) * 2 - 1 for i in range(3)}
    ckpt, out = tmp_path / "big.safetensors", tmp_path / "big.rnpk"
    save_file(sd, str(ckpt))
    r = run("pack", ckpt, "--fit", 18_000_000, "--fit-formats", "int8,int6", "-o", out)
    assert r.exit_code == 0, r.output
    assert 16_000_000 < out.stat().st_size <= 18_000_000  # int8, int8, int6: the best that fits


def test_fit_over_an_explicit_cap_is_a_usage_error_before_any_work(pg_ckpt, tmp_path):
    r = run("pack", pg_ckpt, "--fit", 20_000_000, "--max-bytes", 16_000_000, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 2, r.output
    assert "--fit" in r.output and "--max-bytes" in r.output and "fit: packing" not in r.output


# -- 4. the over-cap hint: measured, quick and true --------------------------------------


def test_over_cap_hint_names_a_format_that_then_fits(pg_ckpt, tmp_path, monkeypatch):
    import recurnorm.budget.api as api
    from recurnorm.export import build_policy
    from recurnorm.export.pack import pack_checkpoint

    bf16 = tmp_path / "bf16.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(pg_ckpt)).items()}, str(bf16))
    s6 = len(pack_checkpoint(bf16, build_policy("int6")).data)
    s7 = len(pack_checkpoint(bf16, build_policy("int7")).data)
    cap = (s6 + s7) // 2
    packs = []
    real = api.pack_qtensors
    monkeypatch.setattr(api, "pack_qtensors", lambda *a, **k: packs.append(1) or real(*a, **k))
    r = run("pack", bf16, "-q", "bf16", "--max-bytes", cap, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 3, r.output
    assert len(packs) <= 2  # the user's pack, and at most one to prove the hint: no re-packing every format
    named = re.search(r"-q (\S+) fits", r.output)
    assert named and named[1] == "int6", r.output
    assert run("pack", bf16, "-q", named[1], "--max-bytes", cap, "-o", tmp_path / "y.rnpk").exit_code == 0
    assert f"--fit {cap}" in r.output


# -- 5. rules that match nothing, wrapper prefixes, names as ecosystems write them -------


@pytest.mark.parametrize(
    "args,closest",
    [
        (["-q", "blocks.*.mlp.fc.weigth=int5,int6"], "blocks.*.mlp.fc.weight"),
        (["-q", "tok_emb.weigth=int8"], "tok_emb.weight"),
        (["--keep-float", "blocks.0.attn.c_q.weigth"], "blocks.0.attn.c_q.weight"),
    ],
)
def test_a_rule_that_matches_nothing_is_a_usage_error_naming_the_closest(pg_ckpt, tmp_path, args, closest):
    r = run("pack", pg_ckpt, *args, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 2, r.output
    assert "matches no tensor" in r.output and closest in r.output
    assert not (tmp_path / "x.rnpk").exists()
    assert run("inspect", pg_ckpt, *args).exit_code == 2


def test_policy_file_rule_that_matches_nothing(pg_ckpt, tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text('format = "int6"\nrules = ["blocks.*.mlp.proj.weight=int5", "blocks.*.attn.cq.weight=int7"]\n')
    r = run("pack", pg_ckpt, "--policy", toml, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 2 and "blocks.*.attn.c_q.weight" in r.output, r.output


def test_wrapper_prefixes_are_stripped_and_said(pg_ckpt, tmp_path):
    sd = load_file(str(pg_ckpt))
    ckpt, out = tmp_path / "compiled.safetensors", tmp_path / "c.rnpk"
    save_file({f"module._orig_mod.{k}": v for k, v in sd.items()}, str(ckpt))
    r = run("pack", ckpt, "-q", "tok_emb.weight=int8,*=int6", "-o", out)
    assert r.exit_code == 0, r.output
    assert "_orig_mod." in r.output and "module." in r.output and "stripped" in r.output
    art = read_artifact(out.read_bytes())
    assert set(art.qtensors) == set(sd)
    assert art.qtensors["tok_emb.weight"].format == "int8"
    assert art.qtensors["blocks.0.attn_scale"].format == "fp32"


def test_control_and_embedding_names_as_ecosystems_write_them():
    from recurnorm.export.policy import ExportPolicy

    sd = {
        "embeddings.LayerNorm.weight": torch.ones(64),
        "encoder.layer.0.output.LayerNorm.bias": torch.zeros(64),
        "decoder.block.0.layer.0.layer_norm.weight": torch.ones(64),
        "transformer.ln_f.weight": torch.ones(64),
        "transformer.h.0.ln_1.bias": torch.zeros(64),
        "model.norm.weight": torch.ones(64),
        "transformer.WTE.weight": torch.randn(100, 64),
        "encoder.layer.0.output.dense.bias": torch.zeros(64),
    }
    plan = ExportPolicy(quantizer="int6").plan(sd)
    for name in list(sd)[:6]:
        assert plan[name][:1] == ("fp32",) and plan[name][2] == "control", name
    assert plan["transformer.WTE.weight"][2] == "embedding"
    assert plan["encoder.layer.0.output.dense.bias"][0] == "fp16"  # a plain bias is no control


# -- 6. one count of the cap -----------------------------------------------------------


def test_inspect_verify_and_pack_count_code_and_loader_alike(pg_ckpt, tmp_path):
    code, loader, out = tmp_path / "train_gpt.py", tmp_path / "rnpk_load.py", tmp_path / "a.rnpk"
    code.write_text("print('hi')\n" * 2000)
    assert run("loader", "--compact", "-o", loader).exit_code == 0
    r = run("pack", pg_ckpt, "-q", "int6", "-o", out, "--code", code, "--loader", loader, "--json")
    packed = json.loads(r.output[r.output.index("{") :])
    for extra in ([], ["--code", code], ["--code", code, "--loader", loader]):
        verified = json.loads(run("verify", out, *extra, "--json").output)["artifacts"][0]["cap"]
        inspected = json.loads(run("inspect", out, *extra, "--json").output)["cap"]
        keys = ("max_bytes", "artifact_bytes", "code_bytes", "loader_bytes", "total_bytes", "headroom_bytes")
        assert {k: inspected[k] for k in keys} == {k: verified[k] for k in keys}, extra
    assert {k: packed[k] for k in keys} == {k: verified[k] for k in keys}


def test_pack_without_code_says_that_code_counts(pg_ckpt, tmp_path):
    r = run("pack", pg_ckpt, "-q", "int6", "-o", tmp_path / "a.rnpk")
    assert r.exit_code == 0
    notes = [ln for ln in r.output.splitlines() if "--code" in ln]
    assert len(notes) == 1 and "counts" in notes[0], r.output
    r = run("pack", pg_ckpt, "-q", "int6", "-o", tmp_path / "b.rnpk", "--code", TESTS / "pg_model.py")
    assert not [ln for ln in r.output.splitlines() if "pass --code" in ln]


# -- 8. GPTQ in the record ---------------------------------------------------------------


@pytest.mark.slow  # GPTQ over the calibration windows
def test_gptq_is_recorded_in_the_manifest_and_the_policy_line(pg_ckpt, tmp_path):
    out = tmp_path / "g.rnpk"
    calib = ["--calib-data", "default", "--calib-tokens", 512, "--model-factory", PG_FACTORY]
    r = run("pack", pg_ckpt, "-q", "int6", "--gptq", *calib, "-o", out)
    assert r.exit_code == 0, r.output
    meta = read_artifact(out.read_bytes()).metadata
    rules = meta["export"]["rules"]
    assert rules["blocks.0.mlp.fc.weight"] == "weight + GPTQ"
    assert rules["blocks.0.attn_scale"] == "control"
    n_gptq = sum(r.endswith("+ GPTQ") for r in rules.values())
    assert f"GPTQ x{n_gptq}" in meta["export"]["policy"] and n_gptq == 4 * 6 + 1  # lm_head is an nn.Linear


# -- 8. the --model-factory contract: a model whose forward(x, y) returns the loss --------


@pytest.mark.slow  # GPTQ, a calibrated --fit and the loss gate on a foreign model
def test_a_model_that_returns_its_loss_is_accepted(pg_ckpt, tmp_path):
    factory = f"{TESTS / 'pg_model.py'}:build_loss"
    calib = ["--calib-data", "default", "--calib-tokens", 512, "--model-factory", factory]
    out = tmp_path / "g.rnpk"
    r = run("pack", pg_ckpt, "-q", "int6", "--gptq", *calib, "-o", out)
    assert r.exit_code == 0, r.output
    assert read_artifact(out.read_bytes()).metadata["export"]["rules"]["blocks.0.attn.c_q.weight"].endswith("GPTQ")
    r = run("pack", pg_ckpt, "--fit", out.stat().st_size + 20_000, *calib, "-o", tmp_path / "f.rnpk")
    assert r.exit_code == 0 and "direct Δloss" in r.output, r.output
    r = run("verify", out, "--reference", pg_ckpt, "--max-loss-delta", 1.0, "--model-factory", factory)
    assert r.exit_code == 0 and "loss gate" in r.output, r.output
    r = run("pack", pg_ckpt, "--gptq", *calib[:-1], f"{TESTS / 'pg_model.py'}:build_loss_without_length")
    assert r.exit_code == 2 and "model.seq_len" in r.output, r.output
