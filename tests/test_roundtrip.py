"""The roundtrip evaluator: real artifact bytes, fresh models, outputs, and the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from recurnorm.cli.main import main
from recurnorm.evaluate.loss import loss
from recurnorm.evaluate.roundtrip import export_model, resolve_schemes, roundtrip
from recurnorm.model import ModelConfig, RecurrentLM
from recurnorm.train.corpus import Corpus

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = dict(d_model=32, n_heads=2, depth=3, seq_len=64)
FAST = dict(batch_size=8, lr=3e-3, warmup=5)


@pytest.fixture(scope="module")
def small_corpus(default_corpus) -> Corpus:
    """The default corpus with a 4,096-token validation split: evaluation stays cheap."""
    c = default_corpus
    return Corpus(c.train_tokens, c.val_tokens[:4096], c.val_bytes[:4096], c.vocab_size, c.tokenizer, c.source)


def test_fp32_export_is_lossless(small_corpus):
    torch.manual_seed(0)
    model = RecurrentLM(ModelConfig(scheme="norm_gate", **TINY)).eval()
    with torch.no_grad():  # make the controls differ from their init so a loss would show
        for p in model.spec.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    exp = export_model(model, "fp32")
    before, after = model.state_dict(), exp.model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert loss(exp.model, small_corpus).bits_per_byte == loss(model, small_corpus).bits_per_byte
    assert exp.step_specific_bytes > 0 and exp.artifact_bytes == len(exp.data)
    # A real quantizer loses something and shrinks the artifact.
    exp4 = export_model(model, "int4")
    assert exp4.artifact_bytes < exp.artifact_bytes
    assert not all(torch.equal(before[k], exp4.model.state_dict()[k]) for k in before)


def test_resolve_schemes_puts_anchors_first():
    assert resolve_schemes("norm,unique,shared") == ["shared", "unique", "norm"]
    assert resolve_schemes("all")[:2] == ["shared", "unique"]


def test_tiny_roundtrip_writes_everything(small_corpus, tmp_path):
    out, ckpts = tmp_path / "rt", tmp_path / "ckpts"
    result = roundtrip(
        ["norm", "shared"],
        ["fp32", "int4"],
        data=small_corpus,
        steps=20,
        out_dir=out,
        checkpoints_dir=ckpts,
        progress=False,
        model_overrides=TINY,
        train_overrides=FAST,
    )
    assert {p.name for p in out.iterdir()} >= {"results.json", "results.csv", "results.md", "roundtrip.png"}
    doc = json.loads((out / "results.json").read_text())
    keys = {(r["scheme"], r["quant"], r["seed"]) for r in doc["rows"]}
    assert keys == {(s, q, 0) for s in ("shared", "norm") for q in ("fp32", "int4")}
    assert len(doc["falsification"]) == 4 and doc["config"]["steps"] == 20
    rows = {(r.scheme, r.quant): r for r in result.rows}
    for s in ("shared", "norm"):
        assert rows[(s, "fp32")].delta_bpb == 0.0  # lossless passthrough, exactly
        assert rows[(s, "int4")].artifact_bytes < rows[(s, "fp32")].artifact_bytes
    assert rows[("shared", "int4")].step_specific_bytes == 0
    assert rows[("norm", "int4")].step_specific_bytes > 0
    assert rows[("norm", "fp32")].params["step_specific"] == 2 * 32 * 3
    png = (out / "roundtrip.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE
    import matplotlib.image

    assert matplotlib.image.imread(str(out / "roundtrip.png")).shape[0] > 100
    assert "| norm |" in (out / "results.md").read_text()
    # Refuses to clobber; the trained checkpoints are reused, giving the same numbers.
    from recurnorm.errors import OutputExistsError

    with pytest.raises(OutputExistsError):
        roundtrip(["shared"], ["fp32"], data=small_corpus, out_dir=out, progress=False)
    again = roundtrip(
        ["shared", "norm"],
        ["fp32"],
        data=small_corpus,
        out_dir=out,
        write=False,
        checkpoints_dir=ckpts,
        progress=False,
        model_overrides=TINY,
    )
    assert all(v.startswith("loaded") for v in again.config["sources"].values())
    for r in again.rows:
        assert r.bpb_pre == rows[(r.scheme, "fp32")].bpb_pre


def test_paired_training_shares_init_and_batches(small_corpus):
    """Same seed: the shared scheme and norm differ only by norm's gains (which start at 1)."""
    result = roundtrip(
        ["shared", "norm"],
        ["fp32"],
        data=small_corpus,
        steps=1,
        write=False,
        progress=False,
        model_overrides=TINY,
        train_overrides=dict(batch_size=4, lr=1e-9, warmup=0),
    )
    pre = {r.scheme: r.bpb_pre for r in result.rows}
    assert pre["shared"] == pytest.approx(pre["norm"], abs=1e-5)


@pytest.mark.slow  # trains the roundtrip matrix through the CLI
def test_cli_roundtrip_json(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text(
        "\n\n".join(
            f"Paragraph {i}: the quick brown fox jumps over the lazy dog number {i * 7 % 13}." * 3 for i in range(60)
        )
    )
    out = tmp_path / "out"
    # Only the first call trains (tiny preset, 2 steps); the others reuse its checkpoints.
    args = [
        "roundtrip",
        "--schemes",
        "shared,norm",
        "--quants",
        "int8",
        "--data",
        str(text),
        "--steps",
        "2",
        "--out",
        str(out),
        "--no-progress",
        "--checkpoints",
        str(tmp_path / "ckpts"),
    ]
    runner = CliRunner()
    res = runner.invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["rows"]) == 2 and (out / "results.md").is_file()
    assert doc["paths"]["png"].endswith("roundtrip.png")
    res = runner.invoke(main, args)
    assert res.exit_code == 2 and "exists" in res.output
    res = runner.invoke(main, [*args, "--force"])
    assert res.exit_code == 0 and "## int8" in res.output
    res = runner.invoke(main, ["roundtrip", "--schemes", "nope", "--out", str(out)])
    assert res.exit_code == 2 and "unknown scheme" in res.output


def test_match_width_finds_the_width_of_a_known_size():
    from recurnorm.evaluate.matching import fresh_artifact_bytes, match_width

    base = dict(vocab_size=256, n_heads=2, depth=3, seq_len=64, scheme="norm_gate")
    target = fresh_artifact_bytes({**base, "d_model": 48}, "int8")
    m = match_width(base, "int8", target)
    assert m.d_model == 48 and m.within_tolerance and m.d_model % 4 == 0
    assert m.to_dict()["deviation"] == 0.0
    # unique stores a block per step: the same byte target buys it a narrower model
    assert match_width({**base, "scheme": "unique"}, "int8", target).d_model < 48
