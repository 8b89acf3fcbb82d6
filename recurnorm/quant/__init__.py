"""recurnorm.quant: float tensors -> QTensors (codes + scales), and back.

Importing the package registers every format (one class per format).
"""

from . import intn, nf4, passthrough, ternary  # noqa: F401  (registers the formats)
from .qtensor import QTensor
from .registry import (
    Quantizer,
    available,
    bits_per_weight,
    dequantize,
    dequantize_all,
    get,
    restore_dtype,
)

__all__ = [
    "QTensor",
    "Quantizer",
    "available",
    "bits_per_weight",
    "dequantize",
    "dequantize_all",
    "get",
    "restore_dtype",
]
