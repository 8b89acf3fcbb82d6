"""Loss gate: an artifact's post-export bpb may not exceed its reference's by more than a delta."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from ..errors import ConfigError, DataError, LossRegressionError


@dataclass
class GateReport:
    """Reference and artifact bpb on the same validation split, and the verdict."""

    bpb_reference: float
    bpb_artifact: float
    delta: float  # artifact − reference
    max_loss_delta: float
    passed: bool
    data: str
    val_bytes: int

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return asdict(self)


def _load_reference(reference):
    """A reference model from a checkpoint path (a QAT one as what it is), or the model itself."""
    from ..export.load import load_model

    if isinstance(reference, (str, os.PathLike)):
        return load_model(reference)
    return reference


def loss_gate(
    artifact_path_or_bytes: str | os.PathLike | bytes,
    reference_ckpt,
    data="default",
    max_loss_delta: float = 0.01,
    tokenizer: str | None = None,
    *,
    raise_on_fail: bool = True,
    model_factory=None,
) -> GateReport:
    """Compare artifact and reference bpb; LossRegressionError (exit 5) when delta > max_loss_delta.

    ``reference_ckpt`` is a checkpoint directory (or a model); ``data`` a corpus
    spec or a Corpus. The raised error carries the report as ``exc.report``.
    ``model_factory`` (``module:function`` or a callable, see model/factory.py)
    builds both models for checkpoints that are not RecurrentLMs.
    """
    from ..export.load import factory_model_from_artifact, factory_model_from_checkpoint, model_from_artifact
    from ..model.factory import resolve
    from ..model.run import seq_len_of, vocab_size_of
    from ..train.data import as_corpus
    from .loss import loss

    if not max_loss_delta >= 0:
        raise ConfigError(f"max_loss_delta must be >= 0, got {max_loss_delta!r}")
    if model_factory is None:
        artifact_model = model_from_artifact(artifact_path_or_bytes)
        reference = _load_reference(reference_ckpt)
    else:
        build = resolve(model_factory)
        artifact_model = factory_model_from_artifact(build, artifact_path_or_bytes)
        reference = (
            factory_model_from_checkpoint(build, reference_ckpt)
            if isinstance(reference_ckpt, (str, os.PathLike))
            else reference_ckpt
        )
    corpus = as_corpus(data, tokenizer)
    for name, model in (("artifact", artifact_model), ("reference", reference)):
        vocab = vocab_size_of(model)  # a foreign module that does not say is probed once
        if vocab is not None and corpus.vocab_size > vocab:
            raise DataError(
                f"the {name} model has vocab_size {vocab}, the data "
                f"{corpus.source} needs {corpus.vocab_size}; pass the tokenizer it "
                "was trained with"
            )
    ref = loss(reference, corpus, seq_len=seq_len_of(reference))
    got = loss(artifact_model, corpus, seq_len=seq_len_of(artifact_model))
    delta = got.bits_per_byte - ref.bits_per_byte
    report = GateReport(
        bpb_reference=ref.bits_per_byte,
        bpb_artifact=got.bits_per_byte,
        delta=delta,
        max_loss_delta=float(max_loss_delta),
        passed=delta <= max_loss_delta,
        data=str(corpus.source),
        val_bytes=ref.bytes,
    )
    if not report.passed and raise_on_fail:
        exc = LossRegressionError(
            f"post-export loss regressed: {got.bits_per_byte:.4f} bpb vs reference "
            f"{ref.bits_per_byte:.4f} (+{delta:.4f} > allowed {max_loss_delta:.4f})"
        )
        exc.report = report
        raise exc
    return report
