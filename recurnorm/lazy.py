"""torch, and a package's names, imported where first used, not where they are named.

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


def package_getattr(package: str, table: dict[str, str]):
    """A package's module __getattr__ (PEP 562): each name of table from its module (named
    within the package), imported when the name is first asked for. recurnorm, budget/ and
    export/ use it: every import of one of their modules runs the package's __init__ first, and
    the CLI's --help or a verify must not import torch through it."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{table[name]}"), name)

    return __getattr__
