"""Checkpoints and artifacts back to models: the one place an artifact becomes a model.

A QAT checkpoint is loaded as the model it is (fake quant re-applied at λ = 1);
a model rebuilt from an artifact already holds the grid weights and gets only
the activation hooks (re-quantizing dequantized weights is not a fixed point).
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from ..errors import ArtifactError, CheckpointError, ConfigError


def prepare_exported(model: nn.Module) -> nn.Module:
    """Finish a model rebuilt from an artifact: activation hooks only, never weight fake quant."""
    from ..train.qat import apply_qat

    if getattr(model.config, "qat", None):
        apply_qat(model, {**model.config.qat, "exported": True})
    return model


def read_artifact_bytes(artifact: str | os.PathLike | bytes | bytearray) -> bytes:
    """The bytes of an artifact given as bytes or a path (budget's checked file reader)."""
    from ..budget.api import read_artifact_file

    if isinstance(artifact, (bytes, bytearray, memoryview)):
        return bytes(artifact)
    return read_artifact_file(artifact)


def model_from_decoded(art, source: str = "artifact") -> nn.Module:
    """A fresh RecurrentLM from a decoded budget Artifact (config in metadata, strict load)."""
    from ..model import model_from_state_dict
    from ..quant import dequantize_all

    config = art.metadata.get("config")
    if not isinstance(config, dict):
        raise ArtifactError(f"{source} has no model config in its metadata; cannot rebuild the model")
    try:
        # Grid weights are never fake-quantized again; a QAT model's activation hooks are restored.
        return prepare_exported(model_from_state_dict(config, dequantize_all(art.qtensors), source=source))
    except (CheckpointError, ConfigError) as exc:
        # Tensors (or a qat record) that disagree with the artifact's own config: the artifact is at fault.
        raise ArtifactError(f"{source}: {exc}") from None


def model_from_artifact(artifact: str | os.PathLike | bytes, source: str | None = None) -> nn.Module:
    """A fresh RecurrentLM rebuilt from an artifact (bytes or path) alone."""
    from ..budget.api import read_artifact

    if source is None:
        source = "artifact" if isinstance(artifact, (bytes, bytearray, memoryview)) else str(artifact)
    return model_from_decoded(read_artifact(read_artifact_bytes(artifact)), source)


def load_model(path: str | os.PathLike) -> nn.Module:
    """A checkpoint (dir or .safetensors) or artifact as the model it is: QAT re-applied at λ = 1."""
    from ..model import load_checkpoint
    from ..train.qat import QATSpec, apply_qat

    path = Path(path)
    if path.is_file() and path.suffix != ".safetensors":
        return model_from_artifact(path).eval()
    model = load_checkpoint(path)
    if model.config.qat:
        apply_qat(model, QATSpec.from_dict(model.config.qat))  # exported=True keeps weights
    return model.eval()
