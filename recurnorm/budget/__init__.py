"""recurnorm.budget: entropy-coded artifacts (.rnpk) under a byte cap.

Names load on first use (PEP 562 module __getattr__), like recurnorm's own: the CLI
reads the cap and the magic bytes from budget.cap and budget.format at startup, and
importing those must not pull numpy and torch through budget.api.
"""

from __future__ import annotations

from ..lazy import package_getattr

_LAZY = {
    **dict.fromkeys(
        (
            "Artifact",
            "VerifyReport",
            "pack_qtensors",
            "read_artifact",
            "tensor_stats",
            "unpack",
            "verify_artifact",
            "verify_bytes",
        ),
        "api",
    ),
    **dict.fromkeys(("Budget", "DEFAULT_MAX_BYTES"), "cap"),
    "PackOptions": "options",
}

__all__ = sorted(_LAZY)

__getattr__ = package_getattr(__name__, _LAZY)
