"""recurnorm.export: every rule of "which tensor gets which quantizer", in one stage.

The policy (`policy.ExportPolicy`, name conventions, the default), policies as
text (`spec`: -q, --policy TOML, --keep-float), the QAT policy (`qat`), GPTQ
export (`gptq`), the budget fitter (`fit`), the size planner (`plan`) and
artifact -> model loading (`load`). The CLI, `recurnorm.pack()`, the roundtrip
evaluator and the verify gate all go through it. It sits between quant/ and
budget/: it quantizes with quant/ and measures bytes with budget/'s packer.
"""

from __future__ import annotations

from .fit import fit_budget
from .gptq import gptq_export
from .load import load_model, model_from_artifact, prepare_exported
from .pack import export_qat, pack_checkpoint, pack_state, quantize
from .policy import ExportPolicy, Rule
from .qat import export_config, lossless_policy, projection_weight_names, qat_policy
from .spec import build_policy, parse_format, parse_quant

__all__ = [
    "ExportPolicy",
    "Rule",
    "build_policy",
    "export_config",
    "export_qat",
    "fit_budget",
    "gptq_export",
    "load_model",
    "lossless_policy",
    "model_from_artifact",
    "pack_checkpoint",
    "pack_state",
    "parse_format",
    "parse_quant",
    "prepare_exported",
    "projection_weight_names",
    "qat_policy",
    "quantize",
]
