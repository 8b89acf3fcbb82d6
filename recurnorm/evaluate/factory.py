"""--model-factory: any torch module for a state dict, so foreign models reach the loss gate,
GPTQ and a calibrated --fit.

A factory is ``function(config_dict_or_None) -> nn.Module``, named as
``module:function`` (an importable module) or ``path/to/file.py:function``.
The state dict is loaded with ``strict=True``: every tensor must fit.

The model's forward is either ``forward(idx_BxT) -> logits_BxTxV`` or, as the Parameter
Golf baseline's ``GPT``, ``forward(idx_BxT, targets_BxT) -> mean cross entropy`` (a
forward with two required arguments is called so). Its context length is read from
``seq_len``, ``block_size``, ``max_seq_len`` or ``train_seq_len`` on it or its
``config``: a factory whose model says none sets ``model.seq_len = N`` before returning it.

Importing the factory's module executes its code. That is the point (the user
names their own model code on the command line); artifacts themselves stay
data only and never execute anything.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

from torch import nn

from ..errors import ArtifactError, CheckpointError, ConfigError

Factory = Callable[[dict | None], nn.Module]


def load_factory(spec: str) -> Factory:
    """The callable named by ``module:function`` or ``file.py:function`` (ConfigError if absent)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--model-factory {spec!r}: expected module:function or path/to/file.py:function")
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        module = _import_file(Path(module_name), spec)
    else:
        # A console script's sys.path lacks the working directory; a user's own module usually lives there.
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"--model-factory {spec!r}: cannot import {module_name}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"--model-factory {spec!r}: {module_name} has no callable {attr!r}")
    return fn


def _import_file(path: Path, spec: str):
    """Import a .py file by path under a private module name."""
    if not path.is_file():
        raise ConfigError(f"--model-factory {spec!r}: {path} is not a file")
    name = f"_recurnorm_factory_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"--model-factory {spec!r}: cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling-free reflection look modules up here
    module_spec.loader.exec_module(module)
    return module


def resolve(factory: str | Factory) -> Factory:
    """A factory from a spec string or the callable itself."""
    return load_factory(factory) if isinstance(factory, str) else factory


def build_model(
    factory: Factory, config: dict | None, state_dict: dict, source: str, error: type[Exception] = CheckpointError
) -> nn.Module:
    """factory(config), then a strict load of state_dict; mismatches raise ``error`` naming source."""
    try:
        model = factory(config)
    except Exception as exc:  # user code: whatever it raises, name the source and the factory
        raise error(f"{source}: the model factory failed on its config: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"the model factory returned {type(model).__name__}, not a torch.nn.Module")
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as exc:
        # torch's message lists every missing/unexpected key; the first lines say enough.
        lines = str(exc).strip().splitlines()
        raise error(f"{source}: tensors do not fit the factory's model: {' '.join(lines[:3])}") from None
    return model.eval()


def reference_model(factory: str | Factory, path: str | os.PathLike) -> nn.Module:
    """The factory's model with a checkpoint's weights (dir, .safetensors, .pt/.pth/.bin)."""
    from ..export.load import load_checkpoint_state

    state, config = load_checkpoint_state(path)
    return build_model(resolve(factory), config, state, str(path))


def artifact_model(factory: str | Factory, artifact: str | os.PathLike | bytes) -> nn.Module:
    """The factory's model with an artifact's dequantized weights (config from its metadata, or None)."""
    from ..budget.api import read_artifact
    from ..export.load import read_artifact_bytes
    from ..quant import dequantize_all

    source = "artifact" if isinstance(artifact, (bytes, bytearray, memoryview)) else str(artifact)
    art = read_artifact(read_artifact_bytes(artifact))
    config = art.metadata.get("config")
    return build_model(
        resolve(factory),
        config if isinstance(config, dict) else None,
        dequantize_all(art.qtensors),
        source,
        error=ArtifactError,
    )


def _attr(model: nn.Module, *names: str) -> int | None:
    """The first int found as model.X or model.config.X for X in names."""
    config = getattr(model, "config", None)
    for name in names:
        for owner in (model, config):
            value = getattr(owner, name, None) if owner is not None else None
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def takes_targets(model: nn.Module) -> bool:
    """True when forward needs targets too (``forward(x, y) -> loss``, the baseline's GPT)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds and p.default is p.empty for p in params) >= 2


def run_forward(model: nn.Module, x_BxT):
    """One forward over token windows, as the model takes them: x alone, or inputs and targets."""
    return model(x_BxT[:, :-1], x_BxT[:, 1:]) if takes_targets(model) else model(x_BxT)


def summed_loss(model: nn.Module, inp_BxT, tgt_BxT):
    """Summed next-token cross entropy (nats, a float64 0-d tensor) of targets given inputs:
    from the logits, or from the mean loss a ``forward(x, y)`` returns."""
    import torch
    import torch.nn.functional as F

    if takes_targets(model):
        loss = model(inp_BxT, tgt_BxT)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            raise ConfigError(
                "the model's forward(x, y) must return the mean cross entropy (one number), got "
                f"{getattr(loss, 'shape', type(loss).__name__)}"
            )
        return loss.double().reshape(()) * tgt_BxT.numel()
    logits = model(inp_BxT)
    if not isinstance(logits, torch.Tensor) or logits.shape[:-1] != inp_BxT.shape:
        raise ConfigError(
            "the model's forward(x) must return logits_BxTxV (or take forward(x, y) and return the "
            f"mean loss), got {getattr(logits, 'shape', type(logits).__name__)} for input {tuple(inp_BxT.shape)}"
        )
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt_BxT.reshape(-1), reduction="none")
    return ce.double().sum()


def seq_len_of(model: nn.Module) -> int | None:
    """Evaluation window of a model: seq_len, block_size or max_seq_len, on it or its config."""
    return _attr(model, "seq_len", "block_size", "max_seq_len", "train_seq_len")


def vocab_size_of(model: nn.Module) -> int | None:
    """vocab_size on a model or its config, else the logits' last dimension for one token."""
    vocab = _attr(model, "vocab_size")
    if vocab is not None:
        return vocab
    import torch

    if takes_targets(model):  # no logits to look at: the token embedding says it
        emb = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
        return None if emb is None else int(emb.num_embeddings)

    from ..train.distributed import device_of

    # One forward on one token: cheaper than letting cross-entropy fail on an out-of-range id.
    with torch.no_grad():
        logits = model(torch.zeros(1, 1, dtype=torch.long, device=device_of(model)))
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise ConfigError(
            f"the factory's model must map idx_BxT to logits_BxTxV, got "
            f"{getattr(logits, 'shape', type(logits).__name__)} for a 1x1 input"
        )
    return int(logits.shape[-1])
