"""A tiny model with the Parameter Golf baseline's tensor names (train_gpt.py), for export tests.

Names as the baseline has them: ``tok_emb.weight``, ``blocks.{i}.attn.c_q/c_k/c_v/proj.weight``,
``blocks.{i}.attn.q_gain``, ``blocks.{i}.attn_scale``, ``blocks.{i}.mlp_scale``,
``blocks.{i}.resid_mix``, ``blocks.{i}.mlp.fc/proj.weight``, ``skip_weights`` and an untied
``lm_head.weight``. Usable as a ``--model-factory`` (``tests/pg_model.py:build``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DEFAULTS = {"vocab_size": 256, "dim": 64, "n_layer": 4, "n_head": 2, "seq_len": 32}


def rms(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],))


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int):
        super().__init__()
        self.c_q, self.c_k, self.c_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.proj = nn.Linear(dim, dim, bias=False)
        self.q_gain = nn.Parameter(torch.full((n_head,), 1.5))
        self.n_head = n_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        h = self.n_head
        q, k, v = (lin(x).view(B, T, h, D // h).transpose(1, 2) for lin in (self.c_q, self.c_k, self.c_v))
        q = rms(q) * self.q_gain[None, :, None, None]
        y = F.scaled_dot_product_attention(q, rms(k), v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    def __init__(self, dim: int, n_head: int):
        super().__init__()
        self.attn = Attention(dim, n_head)
        self.mlp = nn.ModuleDict(
            {"fc": nn.Linear(dim, 2 * dim, bias=False), "proj": nn.Linear(2 * dim, dim, bias=False)}
        )
        self.attn_scale = nn.Parameter(torch.ones(dim))
        self.mlp_scale = nn.Parameter(torch.ones(dim))
        self.resid_mix = nn.Parameter(torch.stack([torch.ones(dim), torch.zeros(dim)]))

    def forward(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        x = self.resid_mix[0] * x + self.resid_mix[1] * x0
        x = x + self.attn_scale * self.attn(rms(x))
        return x + self.mlp_scale * self.mlp["proj"](F.relu(self.mlp["fc"](rms(x))).square())


class PGModel(nn.Module):
    def __init__(self, vocab_size: int, dim: int, n_layer: int, n_head: int, seq_len: int):
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(Block(dim, n_head) for _ in range(n_layer))
        self.skip_weights = nn.Parameter(torch.ones(n_layer // 2, dim))
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = x0 = rms(self.tok_emb(idx))
        half = len(self.blocks) // 2
        skips = []
        for i, block in enumerate(self.blocks):
            if i >= half and skips:
                x = x + self.skip_weights[i - half] * skips.pop()
            x = block(x, x0)
            if i < half:
                skips.append(x)
        return self.lm_head(rms(x))


def build(config: dict | None) -> PGModel:
    """The --model-factory entry point."""
    return PGModel(**{**DEFAULTS, **(config or {})})


def train_briefly(model: nn.Module, tokens, steps: int = 30, seed: int = 0) -> nn.Module:
    """A few Adam steps on byte windows, so that the weights are not at their init."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.as_tensor(tokens, dtype=torch.long)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    T = model.seq_len
    for _ in range(steps):
        starts = torch.randint(0, toks.numel() - T - 1, (8,), generator=g)
        x = torch.stack([toks[s : s + T + 1] for s in starts])
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def baseline_state(
    n_layer: int = 9, dim: int = 512, n_head: int = 8, n_kv_head: int = 4, vocab: int = 1024, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Synthetic weights with the challenge baseline's names and shapes (17,059,912 at the
    defaults: 9 blocks, d 512, 8 heads / 4 KV heads, MLP 2x, a tied 1024 x 512 ``tok_emb``,
    its control tensors). Heavy-tailed values with row and column scales, as trained weights
    have; the controls at their init."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def w(r: int, c: int) -> torch.Tensor:
        x = rng.standard_t(5, size=(r, c)) * np.exp(rng.normal(0, 0.3, (r, 1))) * np.exp(rng.normal(0, 0.5, (1, c)))
        return torch.from_numpy((0.02 * x).astype(np.float32))

    kv, mlp = dim // n_head * n_kv_head, 2 * dim
    state = {"tok_emb.weight": w(vocab, dim), "skip_weights": torch.ones(n_layer // 2, dim)}
    for i in range(n_layer):
        p = f"blocks.{i}."
        state.update(
            {
                p + "attn.c_q.weight": w(dim, dim),
                p + "attn.c_k.weight": w(kv, dim),
                p + "attn.c_v.weight": w(kv, dim),
                p + "attn.proj.weight": w(dim, dim),
                p + "mlp.fc.weight": w(mlp, dim),
                p + "mlp.proj.weight": w(dim, mlp),
                p + "attn_scale": torch.ones(dim),
                p + "mlp_scale": torch.ones(dim),
                p + "resid_mix": torch.stack([torch.ones(dim), torch.zeros(dim)]),
                p + "attn.q_gain": torch.full((n_head,), 1.5),
            }
        )
    return state


class LossPGModel(PGModel):
    """The same model with the baseline's contract: forward(idx, targets) -> mean cross entropy."""

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        logits = super().forward(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_loss(config: dict | None) -> LossPGModel:
    """--model-factory for a model whose forward returns the loss."""
    return LossPGModel(**{**DEFAULTS, **(config or {})})


def build_loss_without_length(config: dict | None) -> LossPGModel:
    """As build_loss, but the model does not say its context length."""
    model = build_loss(config)
    del model.seq_len
    return model
