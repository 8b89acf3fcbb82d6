"""The extra-RMSNorm transform (Steinmetz et al., 2025): an RMSNorm on every projection's input."""

from __future__ import annotations

import torch
from torch import nn


def add_extra_norm(model: nn.Module) -> nn.Module:
    """Give every projection an `input_norm` RMSNorm (gain 1) and set config.extra_norm; idempotent."""
    from ..model.layers import RMSNorm  # model/ is upstream of quant/: importing it is allowed

    model.config.extra_norm = True
    for _, lin in model.projections():
        if getattr(lin, "input_norm", None) is None:
            w = lin.weight
            lin.input_norm = RMSNorm(lin.in_features).to(device=w.device, dtype=w.dtype)
            with torch.no_grad():
                lin.input_norm.weight.fill_(1.0)
    return model
