"""plan --like CKPT: a checkpoint's shapes scaled, predicted within 2% of the packed artifact."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from pg_model import baseline_state, build, train_briefly
from safetensors.torch import save_file

from recurnorm.cli.main import main
from recurnorm.export import build_policy
from recurnorm.export.like import LikePlanner, infer_shape
from recurnorm.export.pack import pack_state


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def predicted(*args) -> dict:
    r = run("plan", *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_shape_of_the_baseline_gqa_and_tied():
    sd = baseline_state(n_layer=3, dim=128, vocab=256)
    shape = infer_shape(sd, build_policy("int6"))
    assert (shape.d_model, shape.depth, shape.vocab_size, shape.prefix) == (128, 3, 256, "blocks.")
    planner = LikePlanner(sd, build_policy("int6"))
    plan = planner.predict(planner.target(d_model=512, depth=9, vocab_size=1024))
    assert plan.weights == 17_059_912  # the challenge baseline's count: KV heads at half width


def test_unscaled_is_the_packed_artifact(pg_ckpt):
    from recurnorm.export.pack import pack_checkpoint

    actual = len(pack_checkpoint(pg_ckpt, build_policy("int6")).data)
    assert predicted("--like", pg_ckpt, "-q", "int6")["predicted_bytes"] == actual


@pytest.mark.slow  # trains a second, wider and deeper model
def test_scaled_trained_checkpoint_within_2_percent(pg_ckpt, tmp_path, default_corpus):
    torch.manual_seed(0)
    big = train_briefly(build({"dim": 128, "n_layer": 6}), default_corpus.train_tokens, steps=30)
    for quant in ("int8", "int6"):
        actual = len(pack_state(big.state_dict(), build_policy(quant), {"source": "pg.safetensors"}))
        plan = predicted("--like", pg_ckpt, "-q", quant, "--d", 128, "--depth", 6)
        assert abs(plan["predicted_bytes"] - actual) <= 0.02 * actual, (quant, plan["predicted_bytes"], actual)


@pytest.mark.slow  # packs a 17M-parameter state dict
def test_scaled_baseline_shaped_within_2_percent(tmp_path):
    small = tmp_path / "small.safetensors"
    save_file(baseline_state(n_layer=3, dim=256, seed=1), str(small))
    policy = "tok_emb.weight=int8,int6:clip=sigma:12.85"
    actual = len(pack_state(baseline_state(), build_policy(policy), {"source": "small.safetensors"}))
    code = tmp_path / "train_gpt.py"
    code.write_text("x = 1\n" * 5000)
    plan = predicted("--like", small, "-q", policy, "--d", 512, "--depth", 9, "--code", code)
    assert abs(plan["predicted_bytes"] - actual) <= 0.02 * actual, (plan["predicted_bytes"], actual)
    assert plan["code_bytes"] == 30_000 and plan["total_bytes"] == plan["predicted_bytes"] + 30_000


def test_fit_finds_the_largest_width_and_counts_code(pg_ckpt, tmp_path):
    code = tmp_path / "train_gpt.py"
    code.write_text("x = 1\n" * 1000)
    base = predicted("--like", pg_ckpt, "-q", "int6")["predicted_bytes"]
    budget = 3 * base
    fitted = predicted("--like", pg_ckpt, "-q", "int6", "--n-heads", 2, "--fit", budget, "--code", code)
    d = fitted["config"]["d_model"]
    assert d % 16 == 0 and d > 64 and fitted["total_bytes"] <= budget and fitted["code_bytes"] == 6000
    wider = predicted("--like", pg_ckpt, "-q", "int6", "--d", d + 16, "--code", code, "--max-bytes", budget)
    assert wider["total_bytes"] > budget and wider["cap"]["over_cap"]


def test_like_refuses_what_it_cannot_do(pg_ckpt, tmp_path):
    r = run("plan", "--like", pg_ckpt, "--scheme", "norm")
    assert r.exit_code == 2 and "--like" in r.output
    gqa = tmp_path / "gqa.safetensors"
    save_file(baseline_state(n_layer=2, dim=128, vocab=256), str(gqa))
    r = run("plan", "--like", gqa, "--d", 129)  # the KV width would be 64.5
    assert r.exit_code == 2 and "multiple of 2" in r.output
    r = run("plan", "--like", pg_ckpt, "-q", "tok_emb.weigth=int8")
    assert r.exit_code == 2 and "tok_emb.weight" in r.output


def test_golf_preset_still_plans():
    plan = predicted("--preset", "golf", "-q", "int8")
    assert plan["config"]["vocab_size"] == 8192 and 10_000_000 < plan["predicted_bytes"] < 16_000_000
