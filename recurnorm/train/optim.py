"""Optimizers: AdamW for everything, or Muon for the weight matrices with AdamW for the rest.

Muon (``torch.optim.Muon``, the optimizer of the Parameter Golf records and the
modded-nanoGPT speedruns) orthogonalizes the momentum of each 2-D weight
matrix with Newton-Schulz iterations. It is wrong for embeddings and the
output head (rows are looked up, not mixed) and undefined for vectors, so
those, the gains, gates and scalars stay on AdamW. Muon runs with
``adjust_lr_fn="match_rms_adamw"``, which scales its update to AdamW's RMS:
one learning-rate schedule then serves both.

Every group carries ``lr_scale`` (the loop sets ``lr = lr_now * lr_scale``)
and ``name``; ``Optimizers`` steps a list of optimizers as one.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError

OPTIMIZERS = ("adamw", "muon")
BETAS = (0.9, 0.95)
MUON_MOMENTUM = 0.95


def parameter_groups(model: nn.Module, *, weight_decay: float, control_lr_mult: float = 1.0) -> list[dict]:
    """AdamW groups: decayed matrices; undecayed vectors; control tensors (own lr scale, no decay)."""
    control = set(model.control_names()) if hasattr(model, "control_names") else set()
    no_decay = set(model.no_decay_names()) if hasattr(model, "no_decay_names") else set()
    groups: dict[str, list] = {"decay": [], "no_decay": [], "control": []}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name in control:
            groups["control"].append(p)
        elif p.ndim < 2 or name in no_decay:
            groups["no_decay"].append(p)
        else:
            groups["decay"].append(p)
    settings = {
        "decay": (weight_decay, 1.0),
        "no_decay": (0.0, 1.0),
        "control": (0.0, control_lr_mult),
    }
    return [
        {"params": ps, "weight_decay": settings[k][0], "lr_scale": settings[k][1], "name": k}
        for k, ps in groups.items()
        if ps
    ]


def lookup_parameters(model: nn.Module) -> set[int]:
    """ids of embedding tables and the output head: matrices Muon must not touch."""
    ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    head = getattr(model, "head", None)
    if isinstance(head, nn.Module):
        ids |= {id(p) for p in head.parameters()}
    return ids


class Optimizers:
    """Several optimizers stepped as one; ``param_groups`` lists all their groups."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], name: str):
        self.optimizers = optimizers
        self.name = name

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()


def build_optimizer(
    model: nn.Module,
    name: str,
    *,
    lr: float,
    weight_decay: float,
    control_lr_mult: float = 1.0,
    muon_lr_mult: float = 1.0,
) -> Optimizers:
    """The optimizer called name ("adamw" or "muon") over model's parameter groups.

    ``muon_lr_mult`` scales the Muon matrices' learning rate over the schedule's
    (Muon tolerates, and in the speedruns uses, larger steps than AdamW).
    """
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    groups = parameter_groups(model, weight_decay=weight_decay, control_lr_mult=control_lr_mult)
    muon_groups = []
    if name == "muon":
        lookup = lookup_parameters(model)
        for g in groups:
            if g["name"] != "decay":
                continue
            matrices = [p for p in g["params"] if p.ndim == 2 and id(p) not in lookup]
            g["params"] = [p for p in g["params"] if not (p.ndim == 2 and id(p) not in lookup)]
            if matrices:
                muon_groups.append({**g, "params": matrices, "name": "muon", "lr_scale": g["lr_scale"] * muon_lr_mult})
        groups = [g for g in groups if g["params"]]
    opts: list[torch.optim.Optimizer] = []
    if groups:
        opts.append(torch.optim.AdamW(groups, lr=lr, betas=BETAS, eps=1e-8))
    if muon_groups:
        opts.append(
            torch.optim.Muon(
                muon_groups,
                lr=lr,
                weight_decay=weight_decay,
                momentum=MUON_MOMENTUM,
                nesterov=True,
                adjust_lr_fn="match_rms_adamw",
            )
        )
    return Optimizers(opts, name)
