"""Checkpoints: `model.safetensors` + `config.json` in one directory. No pickle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from ..errors import CheckpointError, ConfigError
from ..io import atomic_write_bytes, atomic_write_json, check_writable
from .config import ModelConfig
from .lm import RecurrentLM

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def state_dict_for_export(model: torch.nn.Module) -> dict[str, Tensor]:
    """The model's state dict, detached on CPU: what checkpoints and artifacts store.

    Nothing is copied, so a tensor tied under two names (a foreign model's embedding and
    head) appears under each name with one storage, and the packer stores it once.
    RecurrentLM ties by having no head: its state dict holds ``embed.weight`` only.
    """
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def save_checkpoint(model: RecurrentLM, out_dir: str | os.PathLike, force: bool = False) -> Path:
    """Write model.safetensors and config.json into out_dir (atomically, no clobber)."""
    out_dir = Path(out_dir)
    weights = check_writable(out_dir / WEIGHTS_FILE, force)
    config = check_writable(out_dir / CONFIG_FILE, force)
    atomic_write_bytes(weights, st_save(state_dict_for_export(model)), exclusive=not force)
    atomic_write_json(config, model.config.to_dict(), exclusive=not force)
    return out_dir


def model_from_state_dict(
    config: ModelConfig | dict, state_dict: dict[str, Tensor], source: str = "state dict"
) -> RecurrentLM:
    """Build a model from a config and tensors; disagreement raises CheckpointError."""
    if isinstance(config, dict):
        config = ModelConfig.from_dict(config)
    model = RecurrentLM(config)
    expected = model.state_dict()
    for name, tensor in expected.items():
        if name not in state_dict:
            raise CheckpointError(
                f"{source} is missing tensor {name!r} (shape {tuple(tensor.shape)}) that scheme {config.scheme!r} needs"
            )
        got = state_dict[name]
        if tuple(got.shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"tensor {name!r} in {source} has shape {tuple(got.shape)}, the config expects {tuple(tensor.shape)}"
            )
        if not torch.is_floating_point(got):
            raise CheckpointError(f"tensor {name!r} in {source} is {got.dtype}, not a float")
    unexpected = sorted(set(state_dict) - set(expected))
    if unexpected:
        raise CheckpointError(
            f"{source} has unexpected tensor {unexpected[0]!r} (not part of a {config.scheme!r} model with this config)"
        )
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state_dict.items()})
    return model


def load_checkpoint(path: str | os.PathLike) -> RecurrentLM:
    """Load a checkpoint directory, or a .safetensors file with config.json beside it."""
    path = Path(path)
    weights = path / WEIGHTS_FILE if path.is_dir() else path
    config_path = weights.parent / CONFIG_FILE
    if not weights.is_file():
        raise CheckpointError(f"no checkpoint weights at {weights}")
    if not config_path.is_file():
        raise CheckpointError(f"missing {config_path} (needed to rebuild the model of {weights})")
    try:
        config = ModelConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{config_path} is not valid JSON: {e}") from e
    except RecursionError:
        raise CheckpointError(f"{config_path} nests too deeply to read") from None
    except ConfigError as e:
        raise CheckpointError(f"{config_path}: {e}") from e
    try:
        tensors = st_load(weights.read_bytes())
    except (SafetensorError, ValueError, OSError) as e:
        raise CheckpointError(f"{weights} is not a readable safetensors file: {e}") from e
    return model_from_state_dict(config, tensors, source=str(weights))
