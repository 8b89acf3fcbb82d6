"""RecurrentLM: a decoder-only causal LM whose block is applied `depth` times."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from . import schemes
from .config import ModelConfig
from .layers import PROJECTIONS, Block, Linear, RMSNorm, rope_tables


class RecurrentLM(nn.Module):
    """Token embedding -> `depth` steps of a (usually shared) block -> RMSNorm -> head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        config.validate()
        self.config = config
        scheme_cls = schemes.scheme_class(config.scheme)
        c = config

        # Construction order is fixed (embed, blocks, head, spec) so that one
        # seed gives every scheme the same initial embedding and shared block.
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList()
        for i in range(block_count(c)):
            self.blocks.append(
                Block(c.d_model, c.n_heads, c.d_mlp, c.norm, c.extra_norm, input_gains=not scheme_cls.owns_input_gains)
            )
            self._init_block(i)
        self.final_norm = RMSNorm(c.d_model)
        self.head = None
        if not c.tie_embeddings:
            self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
            nn.init.normal_(self.head.weight, std=0.02)
        self.spec = schemes.get(c.scheme, c)

        cos, sin = rope_tables(c.seq_len, c.d_head)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def _init_block(self, i: int) -> None:
        # nanoGPT init: N(0, 0.02), residual-output projections scaled down by depth.
        for p in PROJECTIONS:
            std = 0.02 / math.sqrt(2 * self.config.depth) if p in ("o", "down") else 0.02
            nn.init.normal_(self.get_submodule(projection_name(i, p)).weight, std=std)

    def forward(self, idx_BxT: Tensor) -> Tensor:
        """Logits [B, T, V] for token ids [B, T]."""
        T = idx_BxT.shape[1]
        cos, sin = self.rope_cos, self.rope_sin
        if T > cos.shape[0]:  # longer than trained: extend the rotary tables
            cos, sin = (t.to(idx_BxT.device) for t in rope_tables(T, self.config.d_head))
        cos, sin = cos[:T], sin[:T]
        x_BxTxD = self.embed(idx_BxT)
        for step in range(self.config.depth):
            layer = step if len(self.blocks) > 1 else 0
            x_BxTxD = self.blocks[layer](x_BxTxD, cos, sin, self.spec.for_step(step, layer))
        x_BxTxD = self.final_norm(x_BxTxD)
        if self.head is None:
            return F.linear(x_BxTxD, self.embed.weight)
        return self.head(x_BxTxD)

    # -- introspection used by train/, quant/ and the evaluator ---------------

    def projections(self) -> list[tuple[str, Linear]]:
        """Every q/k/v/o/up/down projection, named by its state-dict prefix."""
        names = [projection_name(i, p) for i in range(len(self.blocks)) for p in PROJECTIONS]
        return [(name, self.get_submodule(name)) for name in names]

    def step_specific_names(self) -> set[str]:
        """Parameters that belong to one step: `spec.*`, or whole blocks for `unique`."""
        prefixes = ("spec.", "blocks.") if self.spec.untied_blocks else ("spec.",)
        return {n for n, _ in self.named_parameters() if n.startswith(prefixes)}

    def control_names(self) -> set[str]:
        """Small control tensors (norm gains, gates, scalars) that exports keep in float."""
        names = {
            f"{mod_name}.weight"
            for mod_name, mod in self.named_modules()
            if isinstance(mod, RMSNorm) and mod.weight is not None
        }
        if self.spec.control:
            names |= {f"spec.{n}" for n, _ in self.spec.named_parameters()}
        return names

    def no_decay_names(self) -> set[str]:
        """Parameters that get no weight decay: control tensors and anything below 2-D."""
        return self.control_names() | {n for n, p in self.named_parameters() if p.dim() < 2}

    def param_counts(self) -> dict[str, int]:
        """Parameter counts: shared, step_specific, embedding (embed + untied head), total."""
        params = dict(self.named_parameters())  # tied weights appear once
        step = self.step_specific_names()
        embedding = {"embed.weight", "head.weight"} & params.keys()
        counts = {
            "step_specific": sum(params[n].numel() for n in step),
            "embedding": sum(params[n].numel() for n in embedding),
            "total": sum(p.numel() for p in params.values()),
        }
        counts["shared"] = counts["total"] - counts["step_specific"] - counts["embedding"]
        return {k: counts[k] for k in ("shared", "step_specific", "embedding", "total")}


def block_count(config: ModelConfig) -> int:
    """Blocks a model of this config holds: one per step for untied schemes, else one shared."""
    return config.depth if schemes.scheme_class(config.scheme).untied_blocks else 1


def projection_name(block: int, proj: str) -> str:
    """State-dict prefix of projection ``proj`` (q, k, v, o, up, down) of a block: blocks.0.attn.q."""
    return f"blocks.{block}.{'attn' if proj in ('q', 'k', 'v', 'o') else 'mlp'}.{proj}"


def projection_block(name: str) -> int:
    """The block index of a ``projection_name``."""
    return int(name.split(".")[1])


@torch.no_grad()
def relax_from_unique(
    unique_model: RecurrentLM, rank: int, init: str = "svd", shared_init: str = "average"
) -> RecurrentLM:
    """A `lora` model from a trained `unique` one (Relaxed Recursive Transformers).

    The shared block is the average of the unique blocks ("average") or block 0
    ("stepwise": with one shared block, stepwise selection keeps the first).
    With init="svd" each step's adapter is the rank-r truncated SVD of
    W_s − W′ (B = UΣ, A = Vᵀ), so at full rank the projections reproduce the
    unique model exactly; norm gains are averaged and are exact only where the
    unique blocks agree on them. init="zero" keeps the LoRA default (B = 0).
    """
    if unique_model.config.scheme != "unique":
        raise ConfigError(f"relax_from_unique needs a 'unique' model, got scheme {unique_model.config.scheme!r}")
    if init not in ("svd", "zero"):
        raise ConfigError(f"init must be 'svd' or 'zero', got {init!r}")
    if shared_init not in ("average", "stepwise"):
        raise ConfigError(f"shared_init must be 'average' or 'stepwise', got {shared_init!r}")
    config = replace(unique_model.config, scheme="lora", scheme_options={"rank": rank})
    model = RecurrentLM(config)

    block_states = [b.state_dict() for b in unique_model.blocks]
    if shared_init == "average":
        shared = {k: torch.stack([s[k] for s in block_states]).mean(0) for k in block_states[0]}
    else:
        shared = block_states[0]
    model.blocks[0].load_state_dict(shared)
    model.embed.load_state_dict(unique_model.embed.state_dict())
    model.final_norm.load_state_dict(unique_model.final_norm.state_dict())
    if model.head is not None:
        model.head.load_state_dict(unique_model.head.state_dict())

    if init == "svd":
        for s in range(len(unique_model.blocks)):
            for p in PROJECTIONS:
                shared_weight = model.get_submodule(projection_name(0, p)).weight
                residual = unique_model.get_submodule(projection_name(s, p)).weight - shared_weight
                U, sigma, Vh = torch.linalg.svd(residual, full_matrices=False)
                r = min(rank, sigma.numel())
                pair = model.spec.steps[s][p]
                pair.B.zero_()
                pair.A.zero_()
                pair.B[:, :r] = U[:, :r] * sigma[:r]
                pair.A[:r] = Vh[:r]
    return model
