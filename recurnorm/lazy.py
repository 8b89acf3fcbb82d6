"""torch, imported where it is first used, not where it is named.

Reading and checking an artifact needs only numpy: `verify` (the CI size gate) of a 1.7 MB
artifact took 1.6 s, 1.2 s of it importing torch. The quantizers name torch at module level
(their classes must register for verify to check values by format); through this, only
quantizing and dequantizing import it. tests/test_lazy_torch.py checks that verify never does.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """A module, imported when one of its attributes is first asked for (each is the module's own
    at the time: a dictionary lookup in sys.modules once imported)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<{self._name}, imported when used>"


torch: Any = LazyModule("torch")
