"""Quantization-aware training: schedule, export exactness, the guard, QAT vs PTQ, CLI."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from recurnorm.errors import ConfigError
from recurnorm.export import load as export_load
from recurnorm.export import qat as qat_export
from recurnorm.export.pack import export_qat
from recurnorm.model import ModelConfig, RecurrentLM, save_checkpoint
from recurnorm.train import qat
from recurnorm.train.config import TrainConfig

VAL_TOKENS = 8192  # a slice of the validation split keeps the loss evaluations fast


def _bpb(model, corpus) -> float:
    from recurnorm.evaluate import loss

    return loss(model, corpus.val_tokens[:VAL_TOKENS]).bits_per_byte


def _roundtrip(model):
    """Export through real artifact bytes and rebuild a fresh model the way evaluation does."""
    from recurnorm.export.load import model_from_artifact

    data = export_qat(model)
    return export_load.prepare_exported(model_from_artifact(data)).eval(), data


def _assert_same_logits(a, b, x):
    with torch.no_grad():
        la, lb = a.eval()(x), b.eval()(x)
    scale = float(la.abs().max())
    assert torch.allclose(la, lb, rtol=0, atol=1e-4 * scale), float((la - lb).abs().max())


@pytest.fixture(scope="module")
def qat_ternary(trained_tiny):
    """(float model, QAT-ternary fine-tuned copy, train result): 60 steps, ramp 0.5."""
    model, corpus = trained_tiny
    ft = copy.deepcopy(model)
    result = qat.train_qat(
        ft,
        corpus,
        {"format": "ternary"},
        TrainConfig(steps=60, batch_size=16, lr=3e-3, warmup=5, log_every=20, eval_every=30),
        progress=False,
        eval_fn=lambda m: _bpb(m, corpus),
        float_eval=False,
    )
    return model, result.model.eval(), result


def test_schedule():
    assert qat.lam_at(0, 100, 0.5) == 0.0
    assert qat.lam_at(25, 100, 0.5) == 0.5
    assert qat.lam_at(50, 100, 0.5) == qat.lam_at(90, 100, 0.5) == 1.0
    assert qat.lam_at(0, 100, 0.0) == 1.0  # no ramp: quantized from the first step
    # stepwise: block 0 of 2 is done at 25, block 1 at 50
    assert qat.lam_at(25, 100, 0.5, index=0, count=2) == 1.0
    assert qat.lam_at(25, 100, 0.5, index=1, count=2) == 0.5


def test_spec_validation():
    with pytest.raises(ConfigError, match="ramp"):
        qat.QATSpec("ternary", ramp=1.5)
    with pytest.raises(ConfigError, match="unknown config.qat field"):
        qat.QATSpec.from_dict({"format": "int4", "bogus": 1})
    with pytest.raises(ConfigError, match="noise needs a grid format"):
        qat.QATSpec("nf4", noise=True)
    assert qat.QATSpec("ternary").extra_norm and not qat.QATSpec("int4").extra_norm


def test_qat_log_and_guard_records(qat_ternary):
    _, ft, result = qat_ternary
    assert ft.config.qat["format"] == "ternary" and ft.config.extra_norm
    lams = [r["qat_lambda"] for r in result.qat_log]
    assert lams == sorted(lams) and lams[-1] == 1.0
    assert all(r["logit_gap"] > 0 and "qat_val_bpb" in r for r in result.qat_log)
    assert result.qat_guard["qat_lambda"] == 1.0
    assert result.qat_guard["mismatch"] < 1e-5 < result.qat_guard["logit_gap"]


def test_qat_export_reproduces_logits(qat_ternary, trained_tiny):
    _, ft, _ = qat_ternary
    fresh, _ = _roundtrip(ft)
    x = qat.guard_batch(ft.config, batch_size=4, seq_len=64)
    _assert_same_logits(ft, fresh, x)
    assert fresh.config.qat["exported"] is True
    # The rebuilt weights are the exact grid values the QAT forward used.
    name, lin = ft.projections()[0]
    w_fresh = dict(fresh.projections())[name].weight
    assert torch.equal(lin.weight_transform(lin.weight).detach(), w_fresh)


@pytest.mark.parametrize(
    "spec, scheme",
    [
        ({"format": "int4", "options": {"group": 32}}, "norm_gate"),
        ({"format": "int6", "act_quant": True}, "shared"),
        ({"format": "ternary", "stepwise": True, "act_quant": True}, "unique"),
    ],
)
def test_export_exact_for_formats_and_schemes(spec, scheme):
    torch.manual_seed(0)
    model = RecurrentLM(ModelConfig(d_model=32, n_heads=2, depth=3, seq_len=32, scheme=scheme))
    qat.apply_qat(model, spec)
    qat.check_qat(model)
    fresh, _ = _roundtrip(model)
    _assert_same_logits(model, fresh, qat.guard_batch(model.config))


def test_policy_quantizes_exactly_the_projections(trained_tiny):
    from recurnorm.model import state_dict_for_export

    model = copy.deepcopy(trained_tiny[0])
    qat.apply_qat(model, {"format": "int4", "options": {"group": 32}})
    plan = qat_export.qat_policy(model.config).plan(state_dict_for_export(model))
    projected = {f"{n}.weight" for n, _ in model.projections()}
    assert set(qat_export.projection_weight_names(model.config)) == projected
    for name, (fmt, opts, _) in plan.items():
        if name in projected:
            assert (fmt, opts) == ("int4", {"group": 32})
        else:
            assert fmt != "int4"


def test_guard_fires_when_fake_quant_is_bypassed(trained_tiny, monkeypatch):
    model = copy.deepcopy(trained_tiny[0])
    qat.apply_qat(model, {"format": "ternary"})
    assert qat.check_qat(model)["logit_gap"] > 0
    lin = model.projections()[3][1]
    transform = lin.weight_transform

    lin.weight_transform = None  # removed
    with pytest.raises(qat.QATGuardError, match="did not use quantized weights.*missing"):
        qat.check_qat(model)
    lin.weight_transform = transform

    # A transform that is called but quantizes nothing (e.g. folded to identity).
    monkeypatch.setattr(qat.QATTransform, "__call__", lambda self, w: (setattr(self, "calls", self.calls + 1), w)[1])
    with pytest.raises(qat.QATGuardError, match="did not use quantized weights.*logits moved"):
        qat.check_qat(model)
    monkeypatch.undo()

    # A forward that never calls the transforms (a compiled/custom forward).
    for _, p in model.projections():
        p.weight_transform = transform
    with pytest.raises(qat.QATGuardError, match="missing or replaced"):
        qat.check_qat(model)
    qat.remove_qat(model)
    with pytest.raises(qat.QATGuardError, match="no QAT state"):
        qat.check_qat(model)


def test_guard_never_called(trained_tiny, monkeypatch):
    model = copy.deepcopy(trained_tiny[0])
    qat.apply_qat(model, {"format": "int4"})
    monkeypatch.setattr(
        type(model.blocks[0].attn.q),
        "forward",
        lambda self, x, gate=None, delta=None: torch.nn.functional.linear(x, self.weight),
    )
    with pytest.raises(qat.QATGuardError, match="never called"):
        qat.check_qat(model)


def test_noise_mode_is_one_step_wide_in_training_and_exact_in_eval(trained_tiny):
    model = copy.deepcopy(trained_tiny[0])
    state = qat.apply_qat(model, {"format": "int4", "options": {"group": 32}, "noise": True})
    name, lin = model.projections()[0]
    w = lin.weight
    lin.train()
    noisy = lin.weight_transform(w).detach() - w.detach()
    step = state.quantizer.fit_tensor(w.detach())[0].repeat_interleave(32)[: w.numel()].reshape(w.shape)
    assert (noisy.abs() <= step / 2 + 1e-7).all() and noisy.abs().max() > 0.25 * step.max()
    lin.eval()
    q = state.quantizer
    assert torch.equal(lin.weight_transform(w).detach(), q.dequantize(q.quantize(w.detach())))


def test_qat_beats_post_training_ternary(qat_ternary, trained_tiny):
    model, ft, _ = qat_ternary
    corpus = trained_tiny[1]
    ptq = copy.deepcopy(model)
    qat.apply_qat(ptq, {"format": "ternary", "extra_norm": False})  # PTQ: no training, no norm
    ptq_bpb, qat_bpb = _bpb(ptq, corpus), _bpb(ft, corpus)
    assert qat_bpb < ptq_bpb - 0.1, (qat_bpb, ptq_bpb)
    fresh, _ = _roundtrip(ft)
    assert abs(_bpb(fresh, corpus) - qat_bpb) < 0.01


def test_load_model_reapplies_qat_and_not_on_artifacts(qat_ternary, tmp_path):
    _, ft, _ = qat_ternary
    save_checkpoint(ft, tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["qat"]["format"] == "ternary"
    loaded = export_load.load_model(tmp_path / "ckpt")
    x = qat.guard_batch(ft.config)
    _assert_same_logits(ft, loaded, x)
    qat.check_qat(loaded)
    art = tmp_path / "m.rnpk"
    art.write_bytes(export_qat(ft))
    from_artifact = export_load.load_model(art)
    assert not from_artifact.qat_state.weights  # grid weights are not fake-quantized again
    _assert_same_logits(ft, from_artifact, x)


def test_cli_pack_of_a_qat_checkpoint_ships_the_training_codes(qat_ternary, tmp_path):
    """`recurnorm pack` uses the recorded QAT quantizer for projections, whatever -q says."""
    from click.testing import CliRunner

    from recurnorm.cli.main import main

    _, ft, _ = qat_ternary
    save_checkpoint(ft, tmp_path / "ckpt")
    art = tmp_path / "q.rnpk"
    res = CliRunner().invoke(main, ["pack", str(tmp_path / "ckpt"), "-q", "int8", "-o", str(art)])
    assert res.exit_code == 0, res.output
    from recurnorm import quant
    from recurnorm.budget.api import read_artifact

    artifact = read_artifact(art.read_bytes())
    spec = ft.config.qat
    projections = qat_export.projection_weight_names(ft.config)
    state = ft.state_dict()
    for name in projections:
        stored = artifact.qtensors[name]
        trained = quant.get(spec["format"], **spec["options"]).quantize(state[name], name=name)
        assert stored.format == spec["format"] and stored.equal(trained), name
    assert export_load.load_model(art).config.qat["exported"] is True


@pytest.mark.slow  # fine-tunes through the CLI
def test_cli_finetune(trained_tiny, tmp_path):
    from click.testing import CliRunner

    from recurnorm.cli.main import main

    save_checkpoint(trained_tiny[0], tmp_path / "ckpt")
    out = tmp_path / "ft"
    res = CliRunner().invoke(
        main,
        [
            "finetune",
            str(tmp_path / "ckpt"),
            "--quant",
            "ternary",
            "--steps",
            "4",
            "--out",
            str(out),
            "--export",
            str(tmp_path / "ft.rnpk"),
            "--json",
            "--no-progress",
            "--eval-every",
            "0",
        ],
    )
    assert res.exit_code == 0, res.output
    config = json.loads((out / "config.json").read_text())
    assert config["qat"]["format"] == "ternary" and config["extra_norm"] is True
    summary = json.loads(res.output)
    assert summary["artifact_bytes"] == (tmp_path / "ft.rnpk").stat().st_size
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert any("qat_lambda" in r and "logit_gap" in r for r in log)


def test_cli_train_qat(tmp_path):
    from click.testing import CliRunner

    from recurnorm.cli.main import main

    out = tmp_path / "tq"
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--qat",
            "ternary",
            "--steps",
            "3",
            "--d-model",
            "32",
            "--heads",
            "2",
            "--depth",
            "2",
            "--seq-len",
            "32",
            "--out",
            str(out),
            "--json",
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    config = json.loads((out / "config.json").read_text())
    assert config["qat"]["format"] == "ternary" and config["extra_norm"] is True


def test_roundtrip_qat_rows(default_corpus):
    from recurnorm.evaluate.roundtrip import roundtrip

    result = roundtrip(
        ["shared"],
        ["ternary"],
        data=default_corpus,
        qat=["ternary"],
        qat_steps=4,
        steps=4,
        write=False,
        progress=False,
        model_overrides=dict(d_model=32, n_heads=2, depth=2, seq_len=32),
        train_overrides=dict(batch_size=4, warmup=1),
    )
    rows = {r.quant: r for r in result.rows}
    assert set(rows) == {"ternary", "qat-ternary"}
    # Only int8 embeddings (the roundtrip policy's, not trained against) separate pre and post.
    assert abs(rows["qat-ternary"].delta_bpb) < 0.01
    assert result.config["qat"] == ["ternary"]
