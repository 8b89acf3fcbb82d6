"""recurnorm.export: every rule of "which tensor gets which quantizer", in one stage.

The policy (`policy.ExportPolicy`, name conventions, the default), policies as
text (`spec`: -q, --policy TOML, --keep-float), the QAT policy (`qat`), GPTQ
export (`gptq`), the budget fitter (`fit`), the size planner (`plan`) and
artifact -> model loading (`load`). The CLI, `recurnorm.pack()`, the roundtrip
evaluator and the verify gate all go through it. It sits between quant/ and
budget/: it quantizes with quant/ and measures bytes with budget/'s packer.
"""

from __future__ import annotations

from .policy import ExportPolicy, Rule, state_dict_for_export
from .spec import build_policy, parse_format, parse_quant

_LAZY = {
    "pack_state": "pack", "pack_checkpoint": "pack", "quantize": "pack",
    "qat_policy": "qat", "export_qat": "qat", "export_config": "qat", "lossless_policy": "qat",
    "projection_weight_names": "qat", "load_model": "load", "prepare_exported": "load",
    "gptq_export": "gptq", "fit_budget": "fit",
}  # fmt: skip

__all__ = ["ExportPolicy", "Rule", "build_policy", "parse_format", "parse_quant",
           "state_dict_for_export", *_LAZY]  # fmt: skip


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
