"""Running any causal LM the same way: recurnorm's own or a --model-factory module.

Export (GPTQ's Hessians, --fit's Δloss) and evaluation (the loss, the gate) both run
models through these, so they sit in model/, below both. A model's forward is either
``forward(idx_BxT) -> logits_BxTxV`` or, as the Parameter Golf baseline's ``GPT``,
``forward(idx_BxT, targets_BxT) -> mean cross entropy`` (a forward with two required
arguments is called so).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError


def device_of(module: nn.Module) -> torch.device:
    """Device of the module's first parameter or buffer; CPU for a parameterless module."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


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
    if takes_targets(model):  # no logits to look at: the token embedding says it
        emb = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
        return None if emb is None else int(emb.num_embeddings)

    # One forward on one token: cheaper than letting cross-entropy fail on an out-of-range id.
    with torch.no_grad():
        logits = model(torch.zeros(1, 1, dtype=torch.long, device=device_of(model)))
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3:
        raise ConfigError(
            f"the factory's model must map idx_BxT to logits_BxTxV, got "
            f"{getattr(logits, 'shape', type(logits).__name__)} for a 1x1 input"
        )
    return int(logits.shape[-1])
