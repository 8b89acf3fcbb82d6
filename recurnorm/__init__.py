"""recurnorm: ship shared-depth language models under a hard byte budget.

Data flows one way: train/ -> checkpoint -> quant/ (QTensor) -> budget/
(artifact bytes) -> unpack -> model/ -> evaluate/.

The public library is what ``__all__`` names: ``pack`` (a model or state dict to
artifact bytes; options as the ``-q`` string or typed, ``ExportOptions`` /
``Format``), ``load`` (an artifact back to tensors, or ``as_model=True`` to its
model), ``TrainConfig`` and ``ModelConfig`` / ``RecurrentLM``. Everything else is
internal: importable from its module, free to change (docs/DESIGN.md).
They are loaded lazily (torch imports slowly).
"""

from __future__ import annotations

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY = {
    "pack": "recurnorm.export.pack",
    "load": "recurnorm.export.load",
    "ExportOptions": "recurnorm.export.options",
    "Format": "recurnorm.export.options",
    "TrainConfig": "recurnorm.train.config",
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
