"""Checkpoints and artifacts back to models (moved here from train/qat.py).

A QAT checkpoint is loaded as the model it is (fake quant re-applied at λ = 1);
a model rebuilt from an artifact already holds the grid weights and gets only
the activation hooks (re-quantizing dequantized weights is not a fixed point).
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from ..errors import CheckpointError


def prepare_exported(model: nn.Module) -> nn.Module:
    """Finish a model rebuilt from an artifact: activation hooks only, never weight fake quant."""
    from ..train.qat import apply_qat

    if getattr(model.config, "qat", None):
        apply_qat(model, {**model.config.qat, "exported": True})
    return model


def load_model(path: str | os.PathLike) -> nn.Module:
    """A checkpoint (dir or .safetensors) or artifact as the model it is: QAT re-applied at λ = 1."""
    from ..model import load_checkpoint, model_from_state_dict
    from ..train.qat import QATSpec, apply_qat

    path = Path(path)
    is_artifact = path.is_file() and path.suffix != ".safetensors"
    if not is_artifact:
        model = load_checkpoint(path)
        if model.config.qat:
            apply_qat(model, QATSpec.from_dict(model.config.qat))  # exported=True keeps weights
        return model.eval()
    from ..budget.api import read_artifact
    from ..quant import dequantize_all

    try:
        art = read_artifact(path.read_bytes())
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    config = art.metadata.get("config")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} has no model config in its metadata; cannot rebuild the model")
    model = model_from_state_dict(config, dequantize_all(art.qtensors), source=str(path))
    return prepare_exported(model).eval()
