"""Loss gate: an artifact's post-export bpb may not exceed its reference's by more than a delta."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ArtifactError, CheckpointError, ConfigError, DataError, LossRegressionError


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


def read_artifact_bytes(artifact: str | os.PathLike | bytes | bytearray) -> bytes:
    """The bytes of an artifact given as bytes or a path; ArtifactError when unreadable."""
    if isinstance(artifact, (bytes, bytearray, memoryview)):
        return bytes(artifact)
    path = Path(artifact)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read artifact {path}: {exc.strerror or exc}") from None


def model_from_decoded(art, source: str = "artifact"):
    """A fresh RecurrentLM from a decoded budget Artifact (config in metadata, strict load)."""
    from ..model import model_from_state_dict
    from ..quant import dequantize_all

    config = art.metadata.get("config")
    if not isinstance(config, dict):
        raise ArtifactError(f"{source} has no model config in its metadata; cannot rebuild the model")
    from ..export.load import prepare_exported

    try:
        # Grid weights are never fake-quantized again; a QAT model's activation hooks are restored.
        return prepare_exported(
            model_from_state_dict(config, dequantize_all(art.qtensors), source=source))
    except (CheckpointError, ConfigError) as exc:
        # Tensors that disagree with the artifact's own config: the artifact is at fault.
        raise ArtifactError(f"{source}: {exc}") from None


def model_from_artifact(artifact: str | os.PathLike | bytes, source: str | None = None):
    """A fresh RecurrentLM rebuilt from an artifact (bytes or path) alone."""
    from ..budget.api import read_artifact

    if source is None:
        source = "artifact" if isinstance(artifact, (bytes, bytearray)) else str(artifact)
    return model_from_decoded(read_artifact(read_artifact_bytes(artifact)), source)


def _load_reference(reference):
    """A reference model from a checkpoint path (a QAT one as what it is), or the model itself."""
    from ..export.load import load_model

    if isinstance(reference, (str, os.PathLike)):
        return load_model(reference)
    return reference


def _load_data(data, tokenizer: str | None):
    """A Corpus from a spec ("default", a path, "shards:GLOB") or the Corpus itself."""
    from ..train.data import load_corpus

    if isinstance(data, (str, os.PathLike)):
        return load_corpus(str(data), tokenizer=tokenizer)
    return data


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
    ``model_factory`` (``module:function`` or a callable, see evaluate.factory)
    builds both models for checkpoints that are not RecurrentLMs.
    """
    from . import factory as fac
    from .loss import loss

    if not max_loss_delta >= 0:
        raise ConfigError(f"max_loss_delta must be >= 0, got {max_loss_delta!r}")
    if model_factory is None:
        artifact_model = model_from_artifact(artifact_path_or_bytes)
        reference = _load_reference(reference_ckpt)
    else:
        build = fac.resolve(model_factory)
        artifact_model = fac.artifact_model(build, artifact_path_or_bytes)
        reference = (fac.reference_model(build, reference_ckpt)
                     if isinstance(reference_ckpt, (str, os.PathLike)) else reference_ckpt)
    corpus = _load_data(data, tokenizer)
    for name, model in (("artifact", artifact_model), ("reference", reference)):
        vocab = fac.vocab_size_of(model)  # a foreign module that does not say is probed once
        if vocab is not None and corpus.vocab_size > vocab:
            raise DataError(f"the {name} model has vocab_size {vocab}, the data "
                            f"{corpus.source} needs {corpus.vocab_size}; pass the tokenizer it "
                            "was trained with")
    ref = loss(reference, corpus, seq_len=fac.seq_len_of(reference))
    got = loss(artifact_model, corpus, seq_len=fac.seq_len_of(artifact_model))
    delta = got.bits_per_byte - ref.bits_per_byte
    report = GateReport(
        bpb_reference=ref.bits_per_byte, bpb_artifact=got.bits_per_byte, delta=delta,
        max_loss_delta=float(max_loss_delta), passed=delta <= max_loss_delta,
        data=str(corpus.source), val_bytes=ref.bytes,
    )
    if not report.passed and raise_on_fail:
        exc = LossRegressionError(
            f"post-export loss regressed: {got.bits_per_byte:.4f} bpb vs reference "
            f"{ref.bits_per_byte:.4f} (+{delta:.4f} > allowed {max_loss_delta:.4f})"
        )
        exc.report = report
        raise exc
    return report
