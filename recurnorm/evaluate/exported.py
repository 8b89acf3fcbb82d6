"""One model through real artifact bytes and back: the roundtrip's export policy, the pack,
and the fresh model rebuilt from the bytes alone.

Below the roundtrip and the modules it runs (probes, matching), which all export this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..quant.passthrough import FLOAT_FORMATS


@dataclass
class Export:
    """One export roundtrip of a model: its artifact bytes and the fresh model rebuilt from them."""

    data: bytes
    model: Any  # RecurrentLM built from the artifact's metadata config, on CPU
    artifact_bytes: int
    tensor_bytes: dict[str, int]  # packed bytes per stored tensor (aliases 0)
    step_specific_bytes: int


# Passthrough formats export every tensor in that format: fp32 is the lossless reference.
PASSTHROUGH = tuple(FLOAT_FORMATS)


def export_policy(
    model,
    quant: str,
    *,
    quantize_controls: bool = False,
    quant_options: dict | None = None,
    keep_float_max_numel: int | None = None,
):
    """The ExportPolicy the roundtrip uses for one model and quantizer: the default policy.

    Every weight matrix gets the quantizer whatever its size (recurnorm.export's
    default). Control tensors are the model's own ``control_names()`` (gains,
    gates, scalars) plus the policy's name patterns except ``spec.*``: a LoRA
    adapter or any other step-specific *matrix* is a weight and is quantized like one.
    """
    from dataclasses import replace

    from ..export.policy import CONTROL_PATTERNS, ExportPolicy
    from ..export.spec import check_format

    check_format(quant, dict(quant_options or {}), "roundtrip quantizer")
    if quant in PASSTHROUGH:
        return ExportPolicy(quantizer=quant, overrides={"*": (quant, dict(quant_options or {}))})
    policy = ExportPolicy(
        quantizer=quant,
        options=dict(quant_options or {}),
        quantize_controls=quantize_controls,
        control_patterns=tuple(p for p in CONTROL_PATTERNS if p != "spec.*"),
        control_names=frozenset(model.control_names()),
    )
    if keep_float_max_numel is not None:
        policy = replace(policy, keep_float_max_numel=keep_float_max_numel)
    return policy


def pack_model(
    model, quant: str, *, quantize_controls: bool = False, quant_options: dict | None = None, policy=None
) -> bytes:
    """Artifact bytes of a model under a quantizer (the real export path); config in metadata."""
    from ..export.pack import pack_state
    from ..model import state_dict_for_export

    if policy is None:
        policy = export_policy(model, quant, quantize_controls=quantize_controls, quant_options=quant_options)
    return pack_state(state_dict_for_export(model), policy, {"config": model.config.to_dict(), "quant": quant})


def export_model(
    model, quant: str, *, quantize_controls: bool = False, quant_options: dict | None = None, policy=None
) -> Export:
    """Pack a model to bytes, read them back, and rebuild a fresh model from them (strict)."""
    from ..budget.api import read_artifact, tensor_stats
    from ..export.load import model_from_decoded

    data = pack_model(model, quant, quantize_controls=quantize_controls, quant_options=quant_options, policy=policy)
    art = read_artifact(data)
    tensor_bytes = {r["name"]: int(r["bytes"]) for r in tensor_stats(art.manifest)}
    fresh = model_from_decoded(art, source=f"{model.config.scheme} artifact ({quant})")
    step_names = model.step_specific_names()
    return Export(
        data=data,
        model=fresh,
        artifact_bytes=len(data),
        tensor_bytes=tensor_bytes,
        step_specific_bytes=sum(b for n, b in tensor_bytes.items() if n in step_names),
    )
