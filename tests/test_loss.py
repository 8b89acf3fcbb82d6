"""evaluate.loss: exact bits per byte, every target counted once."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from recurnorm.evaluate import LossResult, loss


class Uniform(nn.Module):
    """Zero logits over V symbols: exactly log2(V) bits per token."""

    def __init__(self, vocab: int = 256):
        super().__init__()
        self.vocab = vocab
        self.calls: list[tuple[int, int]] = []

    def forward(self, idx_BxT):
        self.calls.append(tuple(idx_BxT.shape))
        return torch.zeros(*idx_BxT.shape, self.vocab)


def test_uniform_is_exactly_8_bpb(default_corpus):
    result = loss(Uniform(), default_corpus, seq_len=128, batch_size=64)
    assert isinstance(result, LossResult)
    assert result.bits_per_byte == pytest.approx(8.0, rel=1e-6)
    assert result.nats_per_token == pytest.approx(math.log(256), rel=1e-6)
    assert result.tokens == len(default_corpus.val_tokens) - 1
    assert result.bytes == len(default_corpus.val_tokens) - 1


@pytest.mark.parametrize("n,seq_len,batch", [(2, 4, 3), (101, 10, 3), (100, 11, 2), (65, 64, 1)])
def test_every_target_once(n, seq_len, batch):
    model = Uniform()
    result = loss(model, np.arange(n) % 256, seq_len=seq_len, batch_size=batch)
    scored = sum(b * t for b, t in model.calls)
    assert scored == n - 1 == result.tokens
    assert all(t <= seq_len and b <= batch for b, t in model.calls)


def test_val_bytes_weighting():
    tokens = np.arange(9) % 256
    # Targets are tokens[1:]; their byte counts sum to 16, so bpb = 8 * 8 / 16.
    val_bytes = np.array([5, 2, 2, 2, 2, 2, 2, 2, 2])
    result = loss(Uniform(), tokens, seq_len=4, val_bytes=val_bytes)
    assert result.bytes == 16
    assert result.bits_per_byte == pytest.approx(4.0, rel=1e-6)


def test_restores_training_mode():
    model = Uniform().train()
    loss(model, np.arange(10), seq_len=4)
    assert model.training


def test_seq_len_required_without_config():
    from recurnorm.errors import ConfigError

    with pytest.raises(ConfigError, match="seq_len"):
        loss(Uniform(), np.arange(10))
