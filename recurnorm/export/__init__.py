"""recurnorm.export: every rule of "which tensor gets which quantizer", in one stage.

The policy (`policy.ExportPolicy`, name conventions, the default), policies as
text (`spec`: -q, --policy TOML, --keep-float), the QAT policy (`qat`), GPTQ
export (`gptq`), the budget fitter (`fit`), the size planner (`plan`) and
artifact -> model loading (`load`). The CLI, `recurnorm.pack()`, the roundtrip
evaluator and the verify gate all go through it. It sits between quant/ and
budget/: it quantizes with quant/ and measures bytes with budget/'s packer.

Names load on first use (PEP 562 module __getattr__), like budget's: `inspect` of an
artifact reads `record` alone, which needs no torch.
"""

from __future__ import annotations

from ..lazy import package_getattr

_LAZY = {
    "fit_budget": "fit",
    "gptq_export": "gptq",
    **dict.fromkeys(("load_model", "model_from_artifact", "prepare_exported"), "load"),
    **dict.fromkeys(("export_qat", "pack_checkpoint", "pack_state", "quantize"), "pack"),
    **dict.fromkeys(("ExportPolicy", "Rule"), "policy"),
    **dict.fromkeys(("export_config", "lossless_policy", "projection_weight_names", "qat_policy"), "qat"),
    **dict.fromkeys(("build_policy", "parse_format", "parse_quant"), "spec"),
}

__all__ = sorted(_LAZY)

__getattr__ = package_getattr(__name__, _LAZY)
