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

from .lazy import package_getattr

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY = {
    "pack": "export.pack",
    "load": "export.load",
    "ExportOptions": "export.options",
    "Format": "export.options",
    "TrainConfig": "train.config",
    "ModelConfig": "model",
    "RecurrentLM": "model",
}

__all__ = ["__version__", *_LAZY]

# Lazy, not a compatibility alias: every submodule import (recurnorm.errors, the CLI's --help)
# runs this file first, and importing torch here would cost them seconds.
__getattr__ = package_getattr(__name__, _LAZY)
