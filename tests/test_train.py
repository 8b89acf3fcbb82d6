"""Training loop: learning, reproducibility, resume, weight-decay groups; the train CLI."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from recurnorm.cli.main import main
from recurnorm.errors import CheckpointError, ConfigError, OutputExistsError
from recurnorm.evaluate import loss
from recurnorm.evaluate.train_run import TrainRequest, train_run
from recurnorm.model import ModelConfig, RecurrentLM, load_checkpoint
from recurnorm.train.config import DEFAULT, TrainConfig
from recurnorm.train.loop import build_model, read_log, train
from recurnorm.train.optim import parameter_groups
from recurnorm.train.presets import PRESETS, get_preset
from recurnorm.train.schedule import lr_at

# A model small enough that each run below takes a second or two.
SMALL = dict(d_model=32, n_heads=2, depth=2, seq_len=32)
FAST = TrainConfig(batch_size=8, lr=3e-3, warmup=5, log_every=5)


def fast(**kw) -> TrainConfig:
    return replace(FAST, **kw)


def small_config(scheme: str = "norm") -> ModelConfig:
    return ModelConfig(**SMALL, scheme=scheme)


def test_trained_tiny_learns(trained_tiny):
    model, corpus = trained_tiny
    trained = loss(model, corpus).bits_per_byte
    untrained = loss(build_model(model.config, seed=0), corpus).bits_per_byte
    assert trained < untrained - 1.0
    assert trained < 4.5


def test_same_seed_same_weights(default_corpus):
    runs = [train(small_config(), default_corpus, fast(steps=10, seed=3), progress=False) for _ in range(2)]
    a, b = (r.model.state_dict() for r in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = train(small_config(), default_corpus, fast(steps=10, seed=4), progress=False).model.state_dict()
    assert not all(torch.equal(a[k], other[k]) for k in a)


def test_batch_seed_separate_from_init(default_corpus):
    # Same init, different batches: the initial weights agree, the trained ones do not.
    a = train(small_config(), default_corpus, fast(steps=1, seed=0, batch_seed=1), progress=False)
    b = train(small_config(), default_corpus, fast(steps=1, seed=0, batch_seed=2), progress=False)
    assert a.log[0]["loss"] != b.log[0]["loss"]
    assert torch.equal(build_model(small_config(), 0).embed.weight, build_model(small_config(), 0).embed.weight)


def test_pair_init_shares_the_shared_block():
    shared = build_model(small_config("shared"), seed=5).state_dict()
    for scheme in ("norm", "unique", "lora"):
        other = build_model(small_config(scheme), seed=5).state_dict()
        for name in ("embed.weight", "blocks.0.attn.q.weight", "blocks.0.mlp.down.weight"):
            assert torch.equal(shared[name], other[name]), (scheme, name)


def test_resume_matches_uninterrupted(default_corpus, tmp_path):
    hp, kw = fast(steps=20, seed=1, save_every=10), dict(progress=False)
    full = train(small_config(), default_corpus, hp, out_dir=tmp_path / "full", **kw)

    class Interrupt(Exception):
        pass

    def stop_at_12(step, record):
        if step == 12:  # after the save at step 10: steps 11-12 are lost and redone
            raise Interrupt

    with pytest.raises(Interrupt):
        train(small_config(), default_corpus, hp, out_dir=tmp_path / "cut", on_step=stop_at_12, **kw)
    resumed = train(small_config(), default_corpus, hp, out_dir=tmp_path / "cut", resume=True, **kw)

    losses = [(r["step"], r["loss"]) for r in read_log(tmp_path / "full") if "loss" in r]
    assert [(r["step"], r["loss"]) for r in read_log(tmp_path / "cut") if "loss" in r] == losses
    assert [r["step"] for r in resumed.log] == [15, 20]
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    saved = load_checkpoint(tmp_path / "cut").state_dict()
    assert all(torch.equal(a[k], saved[k]) for k in a)


def test_resume_refuses_other_hparams_and_missing_state(default_corpus, tmp_path):
    hp = fast(steps=5)
    train(small_config(), default_corpus, hp, out_dir=tmp_path / "r", progress=False)
    with pytest.raises(ConfigError, match="lr"):
        train(small_config(), default_corpus, replace(hp, lr=1e-3), out_dir=tmp_path / "r", resume=True, progress=False)
    with pytest.raises(CheckpointError, match="resume"):
        train(small_config(), default_corpus, hp, out_dir=tmp_path / "x", resume=True, progress=False)
    with pytest.raises(OutputExistsError, match="--force"):
        train(small_config(), default_corpus, hp, out_dir=tmp_path / "r", progress=False)


def test_no_weight_decay_on_gains():
    model = RecurrentLM(ModelConfig(**SMALL, scheme="norm_gate"))
    groups = parameter_groups(model, weight_decay=0.1, control_lr_mult=2.0)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed, "matrices must be decayed"
    assert not decayed & model.control_names()
    assert all(model.state_dict()[n].ndim >= 2 for n in decayed)
    control = next(g for g in groups if g["name"] == "control")
    assert control["lr_scale"] == 2.0 and control["weight_decay"] == 0.0
    assert {names[id(p)] for p in control["params"]} == model.control_names()
    # every parameter is in exactly one group
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_schedule():
    kw = dict(lr=1.0, warmup=10, steps=110, min_lr_frac=0.1)
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(60, **kw) == pytest.approx(0.55)
    assert lr_at(110, **kw) == pytest.approx(0.1)


def test_presets():
    tiny = get_preset("tiny")
    assert tiny.model["d_model"] == 128 and tiny.model["depth"] == 6
    assert tiny.model["seq_len"] == 128 and tiny.hp.batch_size == 16
    for p in PRESETS.values():
        ModelConfig(**p.model).validate()
    with pytest.raises(ConfigError, match="tiny"):
        get_preset("huge")


def test_presets_are_named_train_configs_built_from_the_one_default():
    assert get_preset("tiny").hp is DEFAULT  # what `recurnorm train` with no options runs
    for name in ("small", "golf"):  # the GPU presets name Muon at 10x; a library call can take them whole
        hp = get_preset(name).hp
        assert (hp.optimizer, hp.muon_lr_mult) == ("muon", 10.0)
    with pytest.raises(ConfigError, match="unknown training field"):
        TrainConfig.from_dict({"lr": 1e-3, "learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="optimizer"):
        train(small_config(), None, replace(FAST, optimizer="sgd"))


def test_library_and_cli_defaults_are_one_object():
    from recurnorm.train.qat import train_qat

    assert inspect.signature(train).parameters["hp"].default is DEFAULT
    assert inspect.signature(train_qat).parameters["hp"].default is DEFAULT
    assert inspect.signature(TrainRequest).parameters["hp"].default is DEFAULT


class _Captured(Exception):
    pass


@pytest.mark.parametrize("preset", ["tiny", "small", "golf"])
def test_the_cli_runs_the_presets_train_config_and_nothing_else(preset, tmp_path, monkeypatch):
    """The command's options, when none are given, leave the preset's TrainConfig as it is."""
    import recurnorm.evaluate.train_run as train_run_mod

    seen = {}

    def capture(request, on_start=None):
        seen["request"] = request
        raise _Captured

    monkeypatch.setattr(train_run_mod, "train_run", capture)
    args = ["train", "--out", str(tmp_path / "r")] + (["--preset", preset] if preset != "tiny" else [])
    result = CliRunner().invoke(main, args)
    assert isinstance(result.exception, _Captured), result.output
    request = seen["request"]
    assert request.hp == get_preset(preset).hp and request.preset == preset
    # Options given replace only their own field.
    CliRunner().invoke(main, [*args, "--lr", "1e-4", "--seed", "7", "--compile"])
    assert seen["request"].hp == replace(get_preset(preset).hp, lr=1e-4, seed=7, compile=True)


def test_a_default_library_call_and_the_default_command_use_the_same_optimizer(default_corpus, tmp_path, monkeypatch):
    import recurnorm.train.loop as loop

    used = []
    real = loop.build_optimizer

    def recording(model, name, **kw):
        used.append((name, kw["muon_lr_mult"]))
        return real(model, name, **kw)

    monkeypatch.setattr(loop, "build_optimizer", recording)

    class Stop(Exception):
        pass

    def stop(step, record):
        raise Stop

    with pytest.raises(Stop):
        train(small_config("shared"), default_corpus, on_step=stop, progress=False)  # every default
    shape = ["--d-model", "32", "--heads", "2", "--depth", "2", "--seq-len", "32", "--steps", "1", "--no-progress"]
    result = CliRunner().invoke(main, ["train", *shape, "--out", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    assert used[0] == used[1] == (DEFAULT.optimizer, DEFAULT.muon_lr_mult)
    assert json.loads(result.stdout)["optimizer"] == DEFAULT.optimizer


def test_train_run_is_what_the_command_runs(tmp_path):
    """The library's one call for a `recurnorm train` run: outputs written, a summary returned."""
    request = TrainRequest(
        out=tmp_path / "run",
        hp=replace(DEFAULT, steps=3, batch_size=8),
        model_overrides=dict(SMALL),
        progress=False,
    )
    starts = []
    run = train_run(request, on_start=starts.append)
    assert starts[0].size.predicted_bytes == run.summary["estimated_artifact_bytes"] > 0
    assert run.summary["steps"] == 3 and run.summary["optimizer"] == "adamw"
    assert run.summary["val_bpb"] == run.final.bits_per_byte > 0
    assert load_checkpoint(tmp_path / "run").config.d_model == SMALL["d_model"]
    with pytest.raises(OutputExistsError, match="--force"):
        train_run(request)
    with pytest.raises(ConfigError, match="one process"):
        TrainRequest(out=tmp_path / "q", qat=object()).check(world=2)


# ------------------------------------------------------------------------ CLI

CLI_ARGS = [
    "train",
    "--scheme",
    "shared",
    "--steps",
    "20",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--depth",
    "2",
    "--seq-len",
    "32",
    "--batch-size",
    "8",
    "--no-progress",
]


def test_cli_train_writes_outputs_and_refuses_clobber(tmp_path):
    out = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(main, [*CLI_ARGS, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["steps"] == 20 and summary["val_bpb"] > 0
    assert set(summary["params"]) >= {"shared", "step_specific", "embedding", "total"}
    for name in ("model.safetensors", "config.json", "train_log.jsonl"):
        assert (out / name).is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["scheme"] == "shared" and config["depth"] == 2
    assert any("val_bpb" in r for r in read_log(out))

    again = runner.invoke(main, [*CLI_ARGS, "--out", str(out)])
    assert again.exit_code == 2
    assert "--force" in again.stderr
    forced = runner.invoke(main, [*CLI_ARGS, "--out", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    assert "val bpb" in forced.stdout


def test_cli_bad_scheme_option(tmp_path):
    result = CliRunner().invoke(
        main, [*CLI_ARGS, "--scheme", "lora", "--scheme-option", "nokey", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
