"""recurnorm.budget: entropy-coded artifacts (.rnpk) under a byte cap.

Names load on first use (PEP 562 module __getattr__), like recurnorm's own: the CLI
reads the cap and the magic bytes from budget.cap and budget.format at startup, and
importing those must not pull numpy and torch through budget.api.
"""

from __future__ import annotations

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


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
