"""Loss gate: exit-5 semantics on a damaged artifact, a pass on a good one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recurnorm.budget.api import pack_qtensors
from recurnorm.cli.exitcodes import LOSS_REGRESSION, for_error
from recurnorm.errors import ArtifactError, ConfigError, LossRegressionError
from recurnorm.evaluate.exported import export_policy, pack_model
from recurnorm.evaluate.gate import loss_gate
from recurnorm.export.load import model_from_artifact
from recurnorm.model import save_checkpoint, state_dict_for_export
from recurnorm.train.corpus import Corpus


@pytest.fixture(scope="module")
def setup(trained_tiny, tmp_path_factory):
    model, corpus = trained_tiny
    ckpt = save_checkpoint(model, tmp_path_factory.mktemp("ref") / "ckpt")
    small = Corpus(
        corpus.train_tokens,
        corpus.val_tokens[:4096],
        corpus.val_bytes[:4096],
        corpus.vocab_size,
        corpus.tokenizer,
        corpus.source,
    )
    return model, ckpt, small


def test_good_artifacts_pass(setup, tmp_path):
    model, ckpt, corpus = setup
    exact = loss_gate(pack_model(model, "fp32"), ckpt, corpus, max_loss_delta=0.0)
    assert exact.passed and exact.delta == 0.0
    path = tmp_path / "m.rnpk"
    path.write_bytes(pack_model(model, "int8"))
    report = loss_gate(path, ckpt, corpus, max_loss_delta=0.05)
    assert report.passed and abs(report.delta) < 0.05
    assert report.delta == pytest.approx(report.bpb_artifact - report.bpb_reference, abs=1e-12)
    # int8 is lossy: a zero delta would mean the gate measured the reference twice.
    assert report.delta != 0.0 and report.bpb_reference == pytest.approx(exact.bpb_reference)
    assert json.loads(json.dumps(report.to_dict()))["passed"] is True


def test_ternary_regresses_with_exit_5(setup):
    model, ckpt, corpus = setup
    with pytest.raises(LossRegressionError, match="regressed") as info:
        loss_gate(pack_model(model, "ternary"), ckpt, corpus, max_loss_delta=0.01)
    assert for_error(info.value) == LOSS_REGRESSION == 5
    assert info.value.report.passed is False and info.value.report.delta > 0.01
    report = loss_gate(pack_model(model, "ternary"), model, corpus, max_loss_delta=0.01, raise_on_fail=False)
    assert not report.passed


def test_corrupted_scales_are_caught(setup):
    model, ckpt, corpus = setup
    qts = export_policy(model, "int8").export(state_dict_for_export(model))
    for name, qt in qts.items():
        if qt.scales is not None and name.startswith("blocks."):
            qt.scales = (np.asarray(qt.scales) * 3).astype(np.asarray(qt.scales).dtype)
    data = pack_qtensors(qts, {"config": model.config.to_dict()})
    with pytest.raises(LossRegressionError):
        loss_gate(data, ckpt, corpus, max_loss_delta=0.05)


def test_bad_inputs(setup, tmp_path):
    model, ckpt, corpus = setup
    no_config = pack_qtensors(export_policy(model, "int8").export(state_dict_for_export(model)))
    with pytest.raises(ArtifactError, match="no model config"):
        model_from_artifact(no_config)
    with pytest.raises(ArtifactError, match="cannot read"):
        loss_gate(tmp_path / "missing.rnpk", ckpt, corpus)
    with pytest.raises(ConfigError):
        loss_gate(pack_model(model, "fp32"), ckpt, corpus, max_loss_delta=-1)
