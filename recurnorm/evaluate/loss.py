"""Validation loss in nats per token and bits per byte over a whole token stream.

Deterministic and complete: the stream is cut into non-overlapping windows of
``seq_len`` inputs, the last partial window included, so every target token
(``tokens[1:]``) is scored exactly once. Then

    bpb = sum(cross-entropy of targets, nats) / ln 2 / sum(val_bytes of targets)

which is the Parameter Golf challenge's metric (https://github.com/openai/parameter-golf),
with the byte count taken per token so that a
SentencePiece tokenizer is measured honestly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError, DataError
from ..model.run import device_of, summed_loss
from ..train.corpus import Corpus
from ..train.tokens import TokenStream


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
    distributed: bool = False,
    bf16: bool = False,
) -> LossResult:
    """Loss of a model over the whole validation split or token stream (forward(idx_BxT) ->
    logits_BxTxV, or forward(idx, targets) -> mean loss: ``factory.summed_loss``).

    Streaming: each batch of ``batch_size`` windows is read from the token array
    (a memory-mapped shard stays on disk) only when it is scored, and the sum
    stays on the device until the end, so memory is one batch of logits whatever
    the length of the split. With ``distributed`` and a torch.distributed
    process group, rank r scores batches r, r + N, ... and the sums are added:
    every rank returns the same result. ``bf16`` runs the forward pass under
    bfloat16 autocast (GPU speed; the sum is still float64).
    """
    if isinstance(corpus_or_tokens, Corpus):
        tokens = corpus_or_tokens.val_tokens
        if val_bytes is None:
            val_bytes = corpus_or_tokens.val_bytes
    else:
        tokens = corpus_or_tokens
    if torch.is_tensor(tokens):
        tokens = tokens.detach().cpu().reshape(-1).numpy()
    if not isinstance(tokens, TokenStream):  # a TokenStream is read window by window
        tokens = (tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)).reshape(-1)
    n = len(tokens)
    if n < 2:
        raise DataError(f"need at least 2 tokens to score, got {n}")
    if val_bytes is None:
        n_bytes = float(n - 1)
    else:
        if torch.is_tensor(val_bytes):
            val_bytes = val_bytes.detach().cpu().numpy()
        val_bytes = np.asarray(val_bytes).reshape(-1)
        if len(val_bytes) != n:
            raise DataError(f"val_bytes has {len(val_bytes)} entries for {n} tokens")
        n_bytes = float(val_bytes[1:].sum(dtype=np.float64))
    if seq_len is None:
        seq_len = getattr(getattr(model, "config", None), "seq_len", None)
        if seq_len is None:
            raise ConfigError("seq_len is required for a model without config.seq_len")
    if seq_len < 1 or batch_size < 1:
        raise ConfigError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
    if n_bytes <= 0:
        raise DataError("the target tokens stand for zero bytes; bits per byte is undefined")

    rank, world = _rank_world(distributed)
    device = device_of(model)
    was_training = model.training
    model.eval()
    # Summed in float64 on the device (one sync at the end) so the result does not
    # depend on batch order or the number of ranks beyond float64 rounding.
    total_nats = torch.zeros((), dtype=torch.float64, device=device)
    try:
        with torch.no_grad():
            for j, (inp_BxT, tgt_BxT) in enumerate(_windows(tokens, seq_len, batch_size)):
                if j % world != rank:
                    continue
                inp_BxT = inp_BxT.to(device, non_blocking=True)
                tgt_BxT = tgt_BxT.to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    total_nats += summed_loss(model, inp_BxT, tgt_BxT)
    finally:
        model.train(was_training)
    if world > 1:
        import torch.distributed as dist

        reduce_on = (
            torch.device("cuda", torch.cuda.current_device()) if (dist.get_backend() == "nccl") else torch.device("cpu")
        )
        summed = total_nats.to(reduce_on)
        dist.all_reduce(summed)
        total_nats = summed
    nats = float(total_nats.item())

    n_targets = n - 1
    return LossResult(
        nats_per_token=nats / n_targets,
        bits_per_byte=nats / math.log(2) / n_bytes,
        tokens=n_targets,
        bytes=int(round(n_bytes)),
    )


def _rank_world(distributed: bool) -> tuple[int, int]:
    """(rank, world size) of the process group when asked for and present, else (0, 1)."""
    if distributed:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _windows(tokens: np.ndarray, seq_len: int, batch_size: int):
    """Batches of (inputs, targets): full windows stacked, the partial tail on its own.

    Each batch is read from ``tokens`` when it is yielded (one slice, one copy to int64).
    """
    n_targets = len(tokens) - 1
    n_full = n_targets // seq_len
    for i in range(0, n_full, batch_size):
        k = min(batch_size, n_full - i)
        chunk = torch.from_numpy(np.asarray(tokens[i * seq_len : (i + k) * seq_len + 1], dtype=np.int64))
        yield chunk[:-1].view(k, seq_len), chunk[1:].view(k, seq_len)
    rest = n_targets - n_full * seq_len
    if rest:
        start = n_full * seq_len
        chunk = torch.from_numpy(np.asarray(tokens[start : start + rest + 1], dtype=np.int64))
        yield chunk[:-1][None], chunk[1:][None]
