"""Probes that ask *why* a scheme wins or loses: control fragility and step shuffling.

- ``fragility``: export once with the control tensors (gains, gates, LayerRoPE
  scalars: ``model.control_names()``) quantized like the weights and once with
  them kept in float; the bpb difference is what keeping them float buys.
- ``shuffle``: permute the step-specific parameters across steps with a fixed
  non-identity permutation (a cyclic shift) and measure the damage. If the
  steps really specialized, putting step s's parameters at step s+1 hurts;
  ``shared`` has nothing to shuffle and is unchanged exactly.
"""

from __future__ import annotations

import re

from torch import Tensor

from ..errors import ConfigError
from ..model.run import device_of

PROBES = ("fragility", "shuffle")

# Per-step modules carry the step in their name: lora's spec.steps.{s}.*, unique's blocks.{s}.*
_STEP_IN_NAME = re.compile(r"^(spec\.steps|blocks)\.(\d+)\.(.*)$")


def check_probes(probes) -> tuple[str, ...]:
    """Validate probe names; ConfigError listing the known ones."""
    probes = tuple(dict.fromkeys(probes or ()))
    for p in probes:
        if p not in PROBES:
            raise ConfigError(f"unknown probe {p!r}; available: {', '.join(PROBES)}")
    return probes


def step_permutation(depth: int) -> list[int]:
    """The fixed non-identity permutation: step s gets the parameters of step (s + 1) mod S."""
    return [(s + 1) % depth for s in range(depth)]


def shuffled_state(model) -> tuple[dict[str, Tensor], list[str]]:
    """The model's state dict with every step-specific tensor permuted across steps.

    A tensor is permuted along its first axis when that axis has one entry per
    step; per-step modules (``spec.steps.{s}``, unique's ``blocks.{s}``) swap by
    name. Tensors without a step axis (LayerRoPE's shared γ and scalars, rank-1
    gates' shared b) are left alone. Returns the state and the permuted names.
    """
    depth = model.config.depth
    perm = step_permutation(depth)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if depth < 2:
        return state, []
    original = model.state_dict()
    changed = []
    for name in sorted(model.step_specific_names()):
        m = _STEP_IN_NAME.match(name)
        if m and len(model.blocks if m.group(1) == "blocks" else model.spec.steps) == depth:
            prefix, step, rest = m.group(1), int(m.group(2)), m.group(3)
            state[name] = original[f"{prefix}.{perm[step]}.{rest}"].detach().clone()
            changed.append(name)
        elif original[name].dim() >= 1 and original[name].shape[0] == depth:
            state[name] = original[name].detach()[perm].clone()
            changed.append(name)
    return state, changed


def shuffle_probe(model, corpus, bpb_before: float | None = None) -> dict:
    """bpb of the model with its step-specific parameters shifted by one step, and the damage."""
    from ..model import RecurrentLM
    from .loss import loss

    if bpb_before is None:
        bpb_before = loss(model, corpus).bits_per_byte
    state, changed = shuffled_state(model)
    if not changed:  # nothing per step: the model is the same function, exactly
        return {"bpb": bpb_before, "delta": 0.0, "tensors": 0}
    device = device_of(model)
    shuffled = RecurrentLM(model.config).to(device)
    shuffled.load_state_dict(state, strict=True)
    bpb = loss(shuffled, corpus).bits_per_byte
    return {"bpb": bpb, "delta": bpb - bpb_before, "tensors": len(changed)}


def fragility_probe(
    model, corpus, quant: str, bpb_controls_float: float | None = None, quant_options: dict | None = None
) -> dict:
    """bpb with controls quantized like the weights minus bpb with controls kept in float."""
    from .exported import export_model
    from .loss import loss

    device = device_of(model)
    if bpb_controls_float is None:
        kept = export_model(model, quant, quantize_controls=False, quant_options=quant_options)
        bpb_controls_float = loss(kept.model.to(device), corpus).bits_per_byte
    quantized = export_model(model, quant, quantize_controls=True, quant_options=quant_options)
    bpb_q = loss(quantized.model.to(device), corpus).bits_per_byte
    return {
        "bpb_controls_quantized": bpb_q,
        "bpb_controls_float": bpb_controls_float,
        "delta": bpb_q - bpb_controls_float,
        "artifact_bytes_controls_quantized": quantized.artifact_bytes,
    }
