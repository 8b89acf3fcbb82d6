"""Several training lengths in one roundtrip: rows per length, pairing within a length, failures reported."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from recurnorm.cli.main import main
from recurnorm.evaluate.report import (
    Row,
    aggregate,
    falsification,
    fill_gap_recovered,
    length_changes,
    paired_diffs,
    to_markdown,
    write_outputs,
)
from recurnorm.evaluate.roundtrip import resolve_steps, roundtrip
from recurnorm.train.corpus import Corpus

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = dict(d_model=32, n_heads=2, depth=3, seq_len=64)
FAST = dict(batch_size=4, lr=3e-3, warmup=1)
# norm − shared per seed: better than shared early, worse late (the direction can flip with length).
NORM_MINUS_SHARED = {150: (-0.010, -0.012, -0.008), 2400: (0.020, 0.030, 0.025)}


def length_rows() -> list[Row]:
    """shared / unique / norm × int8 × seeds 0-2 at 150 and 2400 steps; the same seed numbers at both."""
    rows = []
    for steps, diffs in NORM_MINUS_SHARED.items():
        base = 3.0 if steps == 150 else 2.2
        for seed, d in enumerate(diffs):
            for scheme, bpb in (("shared", base), ("unique", base - 0.2), ("norm", base + d)):
                rows.append(
                    Row(
                        scheme=scheme,
                        quant="int8",
                        seed=seed,
                        bpb_pre=bpb + 0.05 * seed,  # seed noise larger than the differences
                        bpb_post=bpb + 0.05 * seed + 0.001,
                        artifact_bytes=1000,
                        step_specific_bytes=0 if scheme == "shared" else 10,
                        steps=steps,
                        probes={"shuffle": {"delta": 0.004 if scheme == "norm" else 0.0}},
                    )
                )
    return fill_gap_recovered(rows)


def test_resolve_steps_parses_lengths():
    assert resolve_steps("2400,150, 600", 600) == [150, 600, 2400]
    assert resolve_steps(None, 600) == [600] and resolve_steps(20, 600) == [20]
    from recurnorm.errors import ConfigError

    for bad in ("150,x", "0", [], [150, -1], True):
        with pytest.raises(ConfigError):
            resolve_steps(bad, 600)


def test_pairs_are_taken_within_one_length_only():
    rows = length_rows()
    # The same seed at another length is never a pair: three diffs per length, not six or nine.
    both = paired_diffs(rows, "norm", "shared", "int8", "bpb_pre")
    assert sorted(both) == pytest.approx(sorted(NORM_MINUS_SHARED[150] + NORM_MINUS_SHARED[2400]))
    aggs = aggregate(rows)
    norm = {a["steps"]: a["vs_shared"]["bpb_pre"] for a in aggs if a["scheme"] == "norm"}
    assert set(norm) == {150, 2400}
    for steps, want in NORM_MINUS_SHARED.items():
        assert norm[steps]["n"] == 3
        assert norm[steps]["diffs"] == pytest.approx(list(want))
        assert (norm[steps]["min"], norm[steps]["max"]) == pytest.approx((min(want), max(want)))
    # Paired, the sign is clear at each length even though seed noise (0.05) dwarfs it.
    assert norm[150]["verdict"] == "lower" and norm[2400]["verdict"] == "higher"
    # Gap recovered is per length too: unique is 0.2 better at both.
    gaps = {r.steps: r.gap_recovered_pre for r in rows if r.scheme == "norm" and r.seed == 0}
    assert gaps[150] == pytest.approx(0.05) and gaps[2400] == pytest.approx(-0.1)


def test_answers_per_length_and_what_changed(tmp_path):
    rows = length_rows()
    aggs = aggregate(rows)
    answers = falsification(rows, aggs)
    assert [a["steps"] for a in answers] == [150] * 4 + [2400] * 4
    q2 = {a["steps"]: a["answer"] for a in answers if a["question"].startswith("(2)")}
    assert "survives for norm at int8" in q2[150] and "no gain over shared" in q2[2400]
    q3 = next(a for a in answers if a["question"].startswith("(3)") and a["steps"] == 150)
    assert any("norm: " in e and "by one step costs +0.0040 ± 0.0000 bpb" in e for e in q3["evidence"])
    changes = {c["question"][:3]: c for c in length_changes(answers)}
    assert changes["(2)"]["changed"] and (changes["(2)"]["from_steps"], changes["(2)"]["to_steps"]) == (150, 2400)
    config = {"steps": [150, 600, 2400], "failures": [{"steps": 600, "scheme": "shared", "seed": 0, "error": "boom"}]}
    md = to_markdown(rows, aggs, answers, config)
    assert "## 150 steps" in md and "## 2,400 steps" in md
    assert "| norm | before export | -0.0100 [-0.0120..-0.0080] lower | " in md
    # A length with no model at all is still there, and says why.
    assert "## 600 steps" in md and "No model trained at this length" in md
    assert "600 steps, shared/seed0: boom" in md and "## What changed between 150 steps and 2,400 steps" in md
    paths = write_outputs(rows, config, tmp_path / "out", aggs=aggs, answers=answers)
    assert paths["lengths_png"].read_bytes()[:8] == PNG_SIGNATURE
    doc = json.loads(paths["json"].read_text())
    assert {r["steps"] for r in doc["rows"]} == {150, 2400} and len(doc["length_changes"]) == 4
    assert "steps" in paths["csv"].read_text().splitlines()[0].split(",")


@pytest.fixture(scope="module")
def small_corpus(default_corpus) -> Corpus:
    c = default_corpus
    return Corpus(c.train_tokens, c.val_tokens[:2048], c.val_bytes[:2048], c.vocab_size, c.tokenizer, c.source)


def test_roundtrip_trains_each_length_and_reports_a_failed_one(small_corpus, tmp_path, monkeypatch):
    import recurnorm.train.loop as loop

    real_train = loop.train

    def flaky(config, corpus, hp, **kw):
        if hp.steps == 4 and config.scheme == "norm" and hp.seed == 1:
            raise loop.RecurnormError("training loss became nan at step 3; lower the learning rate")
        return real_train(config, corpus, hp, **kw)

    monkeypatch.setattr(loop, "train", flaky)
    ckpts = tmp_path / "ckpts"
    result = roundtrip(
        ["shared", "norm"],
        ["int8"],
        data=small_corpus,
        seeds=2,
        steps=[2, 4],
        out_dir=tmp_path / "rt",
        checkpoints_dir=ckpts,
        progress=False,
        model_overrides=TINY,
        train_overrides=FAST,
    )
    got = {(r.steps, r.scheme, r.seed) for r in result.rows}
    want = {(n, s, k) for n in (2, 4) for s in ("shared", "norm") for k in (0, 1)} - {(4, "norm", 1)}
    assert got == want
    assert result.config["steps"] == [2, 4]
    assert result.config["failures"] == [
        {"steps": 4, "scheme": "norm", "seed": 1, "error": "RecurnormError: training loss became nan at step 3; "
         "lower the learning rate"}
    ]  # fmt: skip
    # Each length is its own run: its own checkpoint folder, and a longer run is a different model.
    assert (ckpts / "steps2" / "norm" / "seed1" / "model.safetensors").is_file()
    assert not (ckpts / "steps4" / "norm" / "seed1").exists()
    pre = {(r.steps, r.scheme, r.seed): r.bpb_pre for r in result.rows}
    assert pre[(2, "shared", 0)] != pre[(4, "shared", 0)]
    # The length with the failure pairs the seed that remains, and says so.
    norm4 = next(a for a in result.aggregates if a["steps"] == 4 and a["scheme"] == "norm")
    assert norm4["vs_shared"]["bpb_pre"]["n"] == 1
    md = (tmp_path / "rt" / "results.md").read_text()
    assert "## Training failures" in md and "4 steps, norm/seed1: RecurnormError" in md
    assert (tmp_path / "rt" / "lengths.png").is_file()


def test_cli_several_lengths_exit_nonzero_on_a_failed_training(tmp_path, monkeypatch):
    import recurnorm.train.loop as loop

    def broken(*_a, **_kw):
        raise loop.RecurnormError("training loss became nan at step 1; lower the learning rate")

    monkeypatch.setattr(loop, "train", broken)
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: a short line of text, number {i}." * 4 for i in range(40)))
    args = ["roundtrip", "--schemes", "shared", "--quants", "int8", "--data", str(text), "--no-progress"]
    res = CliRunner().invoke(main, [*args, "--steps", "2,3", "--out", str(tmp_path / "o"), "--json"])
    assert res.exit_code == 1, res.output
    assert "2 model(s) failed to train" in res.output and "shared/seed0 at 2 steps" in res.output
    doc = json.loads(res.output[: res.output.rindex("}") + 1])
    assert doc["rows"] == [] and [f["steps"] for f in doc["config"]["failures"]] == [2, 3]
    assert (tmp_path / "o" / "results.md").is_file()  # written before the exit
    res = CliRunner().invoke(main, [*args, "--steps", "2,x", "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "--steps" in res.output
    res = CliRunner().invoke(main, [*args, "--match-bytes", "nope", "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "neither a byte count nor a scheme" in res.output


def test_match_bytes_scheme_picks_the_lora_rank_nearest_its_bytes():
    from recurnorm.evaluate.matching import fresh_artifact_bytes, match_rank

    base = dict(vocab_size=256, d_model=32, n_heads=2, depth=3, seq_len=64, scheme_options={})
    configs = {s: {**base, "scheme": s} for s in ("shared", "norm_gate", "lora")}
    # A target that lora reaches at rank 3 exactly: the search must land on 3.
    configs["unique"] = {**base, "scheme": "lora", "scheme_options": {"rank": 3}}
    m = match_rank(configs, "unique", "int8")
    assert m.rank == 3 and m.deviation == 0.0 and m.within_tolerance
    m = match_rank(configs, "norm_gate", "int8")
    sizes = {r: fresh_artifact_bytes({**configs["lora"], "scheme_options": {"rank": r}}, "int8") for r in (1, 2, 3)}
    target = fresh_artifact_bytes(configs["norm_gate"], "int8")
    assert m.rank == min(sizes, key=lambda r: abs(sizes[r] - target)) and m.target_bytes == target
    from recurnorm.errors import ConfigError

    with pytest.raises(ConfigError, match="add lora"):
        match_rank({k: v for k, v in configs.items() if k != "lora"}, "norm_gate", "int8")
    with pytest.raises(ConfigError, match="another scheme"):
        match_rank(configs, "norm", "int8")


def test_demo_points_to_the_results_at_three_lengths():
    from pathlib import Path

    from recurnorm.cli.roundtrip_cmd import DEMO_STEPS, RESULTS_DOC, demo_closing

    line = demo_closing(300.0)
    assert DEMO_STEPS == 150 and RESULTS_DOC in line and "150, 600 and 2,400 steps" in line
    doc = Path(__file__).resolve().parents[1] / RESULTS_DOC
    text = doc.read_text(encoding="utf-8")
    assert "--steps 150,600,2400" in text and "lengths.png" in text
    # The study ran at all three lengths: every paired table has a 2,400-step column.
    assert (
        text.count("| 150 steps | 600 steps | 2,400 steps |") == 2 and "not run" not in text.split("## The GPU part")[0]
    )


@pytest.mark.slow  # spawns worker processes that import torch
def test_parallel_jobs_report_a_failed_training_and_finish_the_others(small_corpus, tmp_path):
    from recurnorm.evaluate.parallel import TrainJob, train_parallel

    cfg = dict(vocab_size=256, scheme="shared", scheme_options={}, **TINY)
    jobs = [
        TrainJob("shared", 0, cfg, str(tmp_path / "ok"), steps=2),
        # Only the worker finds out: its config is refused when the model is built.
        TrainJob("shared", 1, {**cfg, "d_model": 33}, str(tmp_path / "bad"), steps=4),
    ]
    done = train_parallel(jobs, data=small_corpus, tokenizer=None, train_kw=FAST, n_jobs=2, keep_going=True)
    assert done[("shared", 0, 2)].error is None and (tmp_path / "ok" / "model.safetensors").is_file()
    bad = done[("shared", 1, 4)]
    assert bad.error.startswith("ConfigError: ") and "d_model" in bad.error
    with pytest.raises(Exception, match="d_model"):
        train_parallel(jobs[1:], data=small_corpus, tokenizer=None, train_kw=FAST, n_jobs=1)
