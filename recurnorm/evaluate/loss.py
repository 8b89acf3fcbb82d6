"""Validation loss in nats per token and bits per byte over a whole token stream.

Deterministic and complete: the stream is cut into non-overlapping windows of
``seq_len`` inputs, the last partial window included, so every target token
(``tokens[1:]``) is scored exactly once. Then

    bpb = sum(cross-entropy of targets, nats) / ln 2 / sum(val_bytes of targets)

which is reference §1's formula, with the byte count taken per token so that a
SentencePiece tokenizer is measured honestly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, DataError
from ..train.corpus import Corpus


@dataclass(frozen=True)
class LossResult:
    """Loss over every target of a token stream."""

    nats_per_token: float
    bits_per_byte: float
    tokens: int  # target tokens scored
    bytes: int  # bytes those targets stand for

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return asdict(self)


def loss(
    model: nn.Module,
    corpus_or_tokens: Corpus | np.ndarray | torch.Tensor,
    *,
    batch_size: int = 32,
    seq_len: int | None = None,
    val_bytes: np.ndarray | None = None,
) -> LossResult:
    """Loss of model (idx_BxT -> logits_BxTxV) over the whole validation split or token stream."""
    if isinstance(corpus_or_tokens, Corpus):
        tokens = corpus_or_tokens.val_tokens
        if val_bytes is None:
            val_bytes = corpus_or_tokens.val_bytes
    else:
        tokens = corpus_or_tokens
    tokens_N = torch.as_tensor(np.asarray(tokens), dtype=torch.long).reshape(-1)
    n = tokens_N.numel()
    if n < 2:
        raise DataError(f"need at least 2 tokens to score, got {n}")
    if val_bytes is None:
        bytes_N = torch.ones(n, dtype=torch.float64)
    else:
        bytes_N = torch.as_tensor(np.asarray(val_bytes), dtype=torch.float64).reshape(-1)
        if bytes_N.numel() != n:
            raise DataError(f"val_bytes has {bytes_N.numel()} entries for {n} tokens")
    if seq_len is None:
        seq_len = getattr(getattr(model, "config", None), "seq_len", None)
        if seq_len is None:
            raise ConfigError("seq_len is required for a model without config.seq_len")
    if seq_len < 1 or batch_size < 1:
        raise ConfigError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")

    device = _device_of(model)
    was_training = model.training
    model.eval()
    total_nats = 0.0
    try:
        with torch.no_grad():
            for inp_BxT, tgt_BxT in _windows(tokens_N, seq_len, batch_size):
                logits = model(inp_BxT.to(device))
                ce = F.cross_entropy(
                    logits.float().reshape(-1, logits.shape[-1]),
                    tgt_BxT.to(device).reshape(-1),
                    reduction="none",
                )
                # Summed in float64 so the result does not depend on batch order.
                total_nats += ce.double().sum().item()
    finally:
        model.train(was_training)

    n_targets = n - 1
    n_bytes = float(bytes_N[1:].sum().item())
    if n_bytes <= 0:
        raise DataError("the target tokens stand for zero bytes; bits per byte is undefined")
    return LossResult(
        nats_per_token=total_nats / n_targets,
        bits_per_byte=total_nats / math.log(2) / n_bytes,
        tokens=n_targets,
        bytes=int(round(n_bytes)),
    )


def _windows(tokens_N: torch.Tensor, seq_len: int, batch_size: int):
    """Batches of (inputs, targets): full windows stacked, the partial tail on its own."""
    n_targets = tokens_N.numel() - 1
    n_full = n_targets // seq_len
    if n_full:
        inp = tokens_N[: n_full * seq_len].view(n_full, seq_len)
        tgt = tokens_N[1 : n_full * seq_len + 1].view(n_full, seq_len)
        for i in range(0, n_full, batch_size):
            yield inp[i : i + batch_size], tgt[i : i + batch_size]
    rest = n_targets - n_full * seq_len
    if rest:
        start = n_full * seq_len
        yield tokens_N[start : start + rest][None], tokens_N[start + 1 : start + rest + 1][None]


def _device_of(model: nn.Module) -> torch.device:
    """Device of the model's first parameter or buffer; CPU for a parameterless module."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")
