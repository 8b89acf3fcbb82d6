"""A tiny GPT with nanoGPT-style names, not a RecurrentLM: the --model-factory test's foreign baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DEFAULTS = {"vocab_size": 256, "n_embd": 32, "n_layer": 2, "n_head": 2, "block_size": 32}


class Block(nn.Module):
    """Pre-norm causal attention + MLP."""

    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.ModuleDict({"c_attn": nn.Linear(d, 3 * d), "c_proj": nn.Linear(d, d)})
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(d, 4 * d), "c_proj": nn.Linear(4 * d, d)})
        self.n_head = n_head

    def forward(self, x_BxTxD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BxTxD.shape
        q, k, v = self.attn["c_attn"](self.ln_1(x_BxTxD)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x_BxTxD = x_BxTxD + self.attn["c_proj"](y)
        return x_BxTxD + self.mlp["c_proj"](F.gelu(self.mlp["c_fc"](self.ln_2(x_BxTxD))))


class TinyGPT(nn.Module):
    """idx_BxT -> logits_BxTxV; the head is tied to the token embedding."""

    def __init__(self, vocab_size: int, n_embd: int, n_layer: int, n_head: int, block_size: int):
        super().__init__()
        self.block_size = block_size  # the loss gate's evaluation window
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab_size, n_embd),
                "wpe": nn.Embedding(block_size, n_embd),
                "h": nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)),
                "ln_f": nn.LayerNorm(n_embd),
            }
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer["wte"].weight

    def forward(self, idx_BxT: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        x = t["wte"](idx_BxT) + t["wpe"](torch.arange(idx_BxT.shape[1], device=idx_BxT.device))
        for block in t["h"]:
            x = block(x)
        return self.lm_head(t["ln_f"](x))


def build(config: dict | None) -> TinyGPT:
    """The --model-factory entry point: config from the checkpoint/artifact, or None for defaults."""
    return TinyGPT(**{**DEFAULTS, **(config or {})})
