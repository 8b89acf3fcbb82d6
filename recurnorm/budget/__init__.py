"""recurnorm.budget: entropy-coded artifacts (.rnpk) under a byte cap."""

from .api import (
    Artifact,
    VerifyReport,
    dequantize_all,
    export_qtensors,
    load_checkpoint_state,
    pack,
    pack_qtensors,
    read_artifact,
    tensor_stats,
    unpack,
    verify_artifact,
    verify_bytes,
)
from .cap import DEFAULT_MAX_BYTES, Budget

__all__ = [
    "Artifact", "Budget", "DEFAULT_MAX_BYTES", "VerifyReport", "dequantize_all", "export_qtensors",
    "load_checkpoint_state", "pack", "pack_qtensors", "read_artifact", "tensor_stats", "unpack",
    "verify_artifact", "verify_bytes",
]
