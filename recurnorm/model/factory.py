"""--model-factory: any torch module for a state dict, so foreign models reach the loss gate,
GPTQ and a calibrated --fit.

Below export/ and evaluate/ (both build foreign models through it); how such a model is
run is ``model/run.py``, its weights from a checkpoint or an artifact ``export/load.py``.

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

from ..errors import CheckpointError, ConfigError

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
