"""The export policy of a QAT model: exactly the codes its training saw (``pack.export_qat``
packs a QAT model with it).

``qat_policy(config)`` is an ExportPolicy whose overrides quantize exactly the
fake-quantized projection weights with the training quantizer and options;
every other tensor follows the base policy (fp32 by default, so the artifact
reproduces the QAT model's logits exactly).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import CheckpointError, ConfigError
from .policy import ExportPolicy


def projection_weight_names(config) -> list[str]:
    """State-dict names of the projection weights a model of this config fake-quantizes."""
    from ..model.layers import PROJECTIONS
    from ..model.lm import block_count, projection_name

    return [f"{projection_name(i, p)}.weight" for i in range(block_count(config)) for p in PROJECTIONS]


def lossless_policy() -> ExportPolicy:
    """The default base of qat_policy: every tensor QAT did not train against stays fp32."""
    return ExportPolicy(quantizer="fp32", small_float_format="fp32", overrides={"*": ("fp32", {})})


def is_qat_pending(config: dict | None, source: str = "checkpoint") -> bool:
    """True for a QAT checkpoint's config whose weights are still latent floats (not exported)."""
    qat = (config or {}).get("qat")
    if qat is not None and not isinstance(qat, dict):
        raise CheckpointError(f"{source}: config.json field qat must be an object, got {type(qat).__name__}")
    return bool(qat) and not qat.get("exported", False)


def qat_policy(config, base: ExportPolicy | None = None) -> ExportPolicy:
    """ExportPolicy quantizing exactly the projection weights with the QAT quantizer + options.

    Every other tensor follows ``base``. The default keeps them fp32, so the
    artifact reproduces the QAT model's logits exactly; a lossy base (e.g.
    int8 embeddings) costs fewer bytes but adds its own error on top, since
    QAT never saw those tensors quantized.
    """
    from ..train.qat import QATSpec

    if config.qat is None:
        raise ConfigError("qat_policy: the model config records no QAT (config.qat is null)")
    spec = QATSpec.from_dict(config.qat)
    base = lossless_policy() if base is None else base
    overrides = {name: (spec.format, dict(spec.options)) for name in projection_weight_names(config)}
    # Projection names first: the first matching override wins, so a base "*" cannot shadow them.
    return replace(base, overrides={**overrides, **base.overrides})


def export_config(config) -> dict:
    """The config dict an artifact of this QAT model carries (qat marked exported)."""
    d = config.to_dict()
    if d.get("qat") is not None:
        d["qat"] = {**d["qat"], "exported": True}
    return d
