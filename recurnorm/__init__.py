"""recurnorm: ship shared-depth language models under a hard byte budget.

Data flows one way: train/ -> checkpoint -> quant/ (QTensor) -> budget/
(artifact bytes) -> unpack -> model/ -> evaluate/.
The most used entry points are re-exported here lazily (torch imports slowly).
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "pack": "recurnorm.export.pack",
    "unpack": "recurnorm.budget.api",
    "ModelConfig": "recurnorm.model",
    "RecurrentLM": "recurnorm.model",
}

__all__ = ["__version__", *_LAZY]


# Lazy (PEP 562), not a compatibility alias: every submodule import (recurnorm.errors,
# the CLI's --help) runs this file first, and importing torch here would cost them seconds.
def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'recurnorm' has no attribute {name!r}")
