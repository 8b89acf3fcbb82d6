"""roundtrip --lr-sweep: each scheme at its own rate, chosen on a split the comparison does not report."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import recurnorm.train.loop as loop
from recurnorm.cli.main import main
from recurnorm.evaluate.lrsweep import flatness, lr_study, lr_sweep, split_validation
from recurnorm.train.corpus import Corpus

loss_mod = importlib.import_module("recurnorm.evaluate.loss")  # the package re-exports a function of that name

TINY = dict(d_model=32, n_heads=2, depth=3, seq_len=32)
FAST = dict(batch_size=4, warmup=1)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class RecordingTokens(np.ndarray):
    """Training tokens that log the window starts of every batch the loop draws from them."""

    log: list | None = None

    def __getitem__(self, key):
        if isinstance(key, np.ndarray) and key.ndim == 2 and RecordingTokens.log is not None:
            RecordingTokens.log.append(key[:, 0].copy())
        return np.asarray(super().__getitem__(key))


@pytest.fixture()
def corpus(default_corpus) -> Corpus:
    c = default_corpus
    train = np.asarray(c.train_tokens[:60_000]).view(RecordingTokens)
    return Corpus(train, c.val_tokens[:2048], c.val_bytes[:2048], c.vocab_size, c.tokenizer, c.source)


def _spy_scoring(monkeypatch) -> list[np.ndarray]:
    """Record the validation tokens of every loss() call (the real loss still runs)."""
    scored = []
    real = loss_mod.loss

    def spy(model, corpus_or_tokens, **kw):
        scored.append(np.asarray(corpus_or_tokens.val_tokens).copy())
        return real(model, corpus_or_tokens, **kw)

    monkeypatch.setattr(loss_mod, "loss", spy)
    return scored


def test_the_rate_is_chosen_on_a_split_disjoint_from_the_reported_one(corpus, monkeypatch):
    split = split_validation(corpus)
    (a, b), (c, d) = split.select_range, split.report_range
    assert a == 0 and b == c and d == len(corpus.val_tokens)  # contiguous halves, covering the split
    assert set(range(a, b)).isdisjoint(range(c, d))
    assert np.array_equal(split.select.val_tokens, corpus.val_tokens[a:b])
    assert np.array_equal(split.report.val_tokens, corpus.val_tokens[c:d])
    assert split.select.train_tokens is corpus.train_tokens is split.report.train_tokens

    scored = _spy_scoring(monkeypatch)
    res = lr_sweep(
        "shared,norm", "3e-4,3e-3", control_mults="1,10", data=corpus, steps=3, progress=False,
        model_overrides=TINY, train_overrides=FAST,
    )  # fmt: skip
    # Every sweep score was taken on the selection half, and none on the report half.
    assert len(scored) == len(res.runs) == 2 + 4  # norm has step controls: two multipliers
    assert all(np.array_equal(t, corpus.val_tokens[a:b]) for t in scored)
    assert res.config["selection_split"]["val_tokens"] == [a, b]
    assert res.config["report_split"]["val_tokens"] == [c, d]
    # The choice is the lowest selection bpb of each scheme.
    for s in ("shared", "norm"):
        rows = [t for t in res.table if t["scheme"] == s]
        low = min(rows, key=lambda t: t["bpb_select"])
        assert (res.best[s]["lr"], res.best[s]["control_lr_mult"]) == (low["lr"], low["control_lr_mult"])
    assert res.config["control_lr_mults"] == {"shared": [1.0], "norm": [1.0, 10.0]}

    # The comparison that follows scores the report half only.
    scored.clear()
    study = lr_study(
        "shared,norm", "fp32", "3e-4,3e-3", data=corpus, steps=3, progress=False, write=False,
        model_overrides=TINY, train_overrides=FAST,
    )  # fmt: skip
    sweep_calls = len(study.sweep.runs)
    assert all(np.array_equal(t, corpus.val_tokens[a:b]) for t in scored[:sweep_calls])
    assert len(scored) > sweep_calls
    assert all(np.array_equal(t, corpus.val_tokens[c:d]) for t in scored[sweep_calls:])
    assert study.roundtrip.config["scheme_train"] == study.sweep.scheme_train()


def test_pairing_holds_across_schemes_at_different_rates(corpus, monkeypatch):
    trainings: list[dict] = []
    real_train, real_build = loop.train, loop.build_model

    def build(config, seed, *, pair_init=True):
        model = real_build(config, seed, pair_init=pair_init)
        trainings[-1]["init"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return model

    def train(config, corpus_, hp, **kw):
        trainings.append({"scheme": config.scheme, "lr": hp.lr, "seed": hp.seed, "batches": []})
        RecordingTokens.log = trainings[-1]["batches"]
        try:
            return real_train(config, corpus_, hp, **kw)
        finally:
            RecordingTokens.log = None

    monkeypatch.setattr(loop, "build_model", build)
    monkeypatch.setattr(loop, "train", train)
    # Each scheme forced to its own rate in the comparison, after a sweep over two rates.
    study = lr_study(
        "shared,norm_gate", "fp32", "1e-3,5e-3", data=corpus, steps=4, progress=False, write=False,
        model_overrides=TINY, train_overrides=FAST,
    )  # fmt: skip
    rates = {(t["scheme"], t["lr"]) for t in trainings}
    assert {("shared", 1e-3), ("shared", 5e-3), ("norm_gate", 1e-3), ("norm_gate", 5e-3)} <= rates
    assert len(trainings) == len(study.sweep.runs) + 2
    ref = trainings[0]
    assert ref["scheme"] == "shared" and len(ref["batches"]) == 4
    shared_names = set(ref["init"])
    for t in trainings[1:]:
        # Same batches in the same order, whatever the scheme and the rate.
        assert len(t["batches"]) == 4
        assert all(np.array_equal(x, y) for x, y in zip(ref["batches"], t["batches"], strict=True))
        # The parameters shared with `shared` start from the same values.
        common = shared_names & set(t["init"])
        assert "blocks.0.attn.qkv.weight" in common or len(common) > 5
        assert all(
            torch.equal(ref["init"][k], t["init"][k]) for k in common if ref["init"][k].shape == t["init"][k].shape
        )
    # And the comparison really ran each scheme at its chosen rate.
    last = {t["scheme"]: t["lr"] for t in trainings[-2:]}
    assert last == {s: b["lr"] for s, b in study.sweep.best.items()}


def test_flatness_is_the_range_of_rates_within_the_tolerance():
    pts = [(5e-4, 1.30), (1e-3, 1.215), (2e-3, 1.20), (4e-3, 1.219), (8e-3, None)]
    f = flatness(pts)
    assert (f["lo"], f["hi"], f["within"], f["of"], f["edge"]) == (1e-3, 4e-3, 3, 5, False)
    assert f["ratio"] == pytest.approx(4.0)
    assert flatness([(1e-3, 1.0), (2e-3, 1.5)])["edge"] is True
    assert flatness([(1e-3, None)])["lo"] is None


def test_cli_lr_sweep_end_to_end(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: a short line of text, number {i}. " * 6 for i in range(60)))
    base = ["roundtrip", "--schemes", "shared,norm", "--quants", "int8", "--data", str(text), "--preset", "sweep"]
    base += ["--steps", "3", "--no-progress", "--threads", "1"]
    sweep = ["--lr-sweep", "1e-3,4e-3", "--control-lr-mult", "1,10"]
    res = CliRunner().invoke(main, [*base, *sweep, "--out", str(tmp_path / "o"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    out = tmp_path / "o"
    assert {p.name for p in out.iterdir()} >= {
        "results.json", "results.csv", "results.md", "roundtrip.png", "lr_sweep.png", "lr_sweep.csv",
    }  # fmt: skip
    assert (out / "lr_sweep.png").read_bytes()[:8] == PNG_SIGNATURE
    best = doc["lr_sweep"]["best"]
    assert set(best) == {"shared", "norm"} and len(doc["lr_sweep"]["runs"]) == 2 + 4
    assert doc["config"]["scheme_train"] == {
        s: {"lr": b["lr"], "control_lr_mult": b["control_lr_mult"]} for s, b in best.items()
    }
    assert {(r["scheme"], r["quant"]) for r in doc["rows"]} == {("shared", "int8"), ("norm", "int8")}
    md = (out / "results.md").read_text()
    assert "## Learning-rate sweep (3 steps" in md and "| scheme | best lr |" in md
    assert "report half of the validation split" in md
    assert (out / "lr_sweep.csv").read_text().splitlines()[0].startswith("scheme,lr,control_lr_mult")

    res = CliRunner().invoke(main, [*base, *sweep, "--sweep-only", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "## Learning-rate sweep" in res.output
    assert (tmp_path / "s" / "results.csv").read_text() == (tmp_path / "s" / "lr_sweep.csv").read_text()
    assert not (tmp_path / "s" / "roundtrip.png").exists()

    # A later stage reuses that sweep's choices instead of sweeping again.
    swept = json.loads((tmp_path / "s" / "results.json").read_text())["lr_sweep"]
    reuse = ["--sweep-from", str(tmp_path / "s" / "results.json"), "--json"]
    res = CliRunner().invoke(main, [*base, *reuse, "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["lr_sweep"]["config"]["reused_from"].endswith("results.json")
    assert doc["config"]["scheme_train"] == {
        s: {"lr": b["lr"], "control_lr_mult": b["control_lr_mult"]} for s, b in swept["best"].items()
    }
    other = tmp_path / "other.txt"
    other.write_text(text.read_text().replace("short", "longer"))
    mismatch = [*base[: base.index("--data") + 1], str(other), *base[base.index("--data") + 2 :]]
    res = CliRunner().invoke(main, [*mismatch, *reuse[:2], "--out", str(tmp_path / "m")])
    assert res.exit_code == 2 and "its sweep ran with data" in res.output, res.output

    for bad, needle, code in (
        (["--sweep-only"], "only apply with --lr-sweep", 2),
        (["--lr-sweep", "1e-3,x"], "--lr-sweep", 2),
        (["--lr-sweep", "1e-3", "--checkpoints", str(tmp_path / "c")], "--checkpoints", 2),
        (["--lr-sweep", "1e-3", "--sweep-from", str(tmp_path / "s" / "results.json")], "not both", 2),
        (["--sweep-from", str(text)], "cannot read it as a results.json", 1),  # bad input file
    ):
        res = CliRunner().invoke(main, [*base, *bad, "--out", str(tmp_path / "bad")])
        assert res.exit_code == code and needle in res.output, res.output


def test_a_sweep_cut_short_resumes_from_its_runs_log(corpus, tmp_path, monkeypatch):
    from recurnorm.errors import ConfigError

    log = tmp_path / "runs.jsonl"
    kw = dict(data=corpus, steps=2, progress=False, model_overrides=TINY, train_overrides=FAST, runs_log=log)
    first = lr_sweep("shared", "1e-3", **kw)
    assert len(log.read_text().splitlines()) == 1 + 1  # the fingerprint, then the run
    trained = []
    real = loop.train
    monkeypatch.setattr(loop, "train", lambda *a, **k: trained.append(a[2].lr) or real(*a, **k))
    again = lr_sweep("shared", "1e-3,2e-3", **kw)  # only the new rate trains
    assert trained == [2e-3]
    assert again.runs[0] == first.runs[0] and len(log.read_text().splitlines()) == 1 + 2
    with pytest.raises(ConfigError, match="another configuration"):
        lr_sweep("shared", "1e-3", **{**kw, "steps": 3})
