"""A tiny LM whose linears are F.linear on slices of banks, as the 2026-04-27 Parameter Golf
record's GPT has them (``qo_bank``, ``kv_bank``, ``mlp_up_bank``, ``mlp_down_bank``), with a
tied head. ``build`` is a --model-factory."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

L, D, KV, H, V = 3, 64, 32, 128, 256


class BankedLM(nn.Module):
    """Linears as F.linear on slices of banks (the record's way), a tied head."""

    def __init__(self, matmul: bool = True):
        super().__init__()
        self.seq_len, self.matmul = 16, matmul
        self.tok_emb = nn.Embedding(V, D)
        self.qo_bank = nn.Parameter(torch.randn(2 * L, D, D) * 0.05)
        self.kv_bank = nn.Parameter(torch.randn(2 * L, KV, D) * 0.05)
        self.mlp_up_bank = nn.Parameter(torch.randn(L, H, D) * 0.05)
        self.mlp_down_bank = nn.Parameter(torch.randn(L, D, H) * 0.05)

    def forward(self, idx):
        x = self.tok_emb(idx)
        if not self.matmul:  # no matrix is ever multiplied: nothing for GPTQ to see
            return x.sum(-1, keepdim=True).expand(*idx.shape, V)
        for i in range(L):
            q = F.linear(x, self.qo_bank[i])
            k, v = F.linear(x, self.kv_bank[i]), x @ self.kv_bank[L + i].T
            a = torch.softmax(q[..., :KV] @ k.transpose(-1, -2) / 8, -1) @ v
            x = x + F.linear(torch.cat([a, a], -1), self.qo_bank[L + i])
            x = x + F.linear(F.relu(F.linear(x, self.mlp_up_bank[i])).square(), self.mlp_down_bank[i])
        return F.linear(F.rms_norm(x, (D,)), self.tok_emb.weight)


def build(config: dict | None) -> BankedLM:
    """The --model-factory entry point."""
    return BankedLM()


def build_blind(config: dict | None) -> BankedLM:
    """A model whose forward multiplies no matrix."""
    return BankedLM(matmul=False)
