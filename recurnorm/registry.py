"""The one rule of every registry in recurnorm: schemes, quantizers and codecs.

A registered thing is a class declared with a name (``class Int4(IntN, name="int4")``).
Each registry keeps its table private, refuses a name registered twice, and answers
``get(name, ...)`` with an instance; ``type_of(name)`` gives the class where only
class-level facts are needed (a scheme's ``untied_blocks`` before any model exists).
Options are checked in one way too: `resolve_options` refuses unknown keys and values
whose type differs from the default's, then the class checks values it alone knows.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> class for one kind of thing; errors of the kind's own exception type."""

    def __init__(self, kind: str, error: type[Exception]) -> None:
        self.kind = kind
        self.error = error
        self._table: dict[str, type[T]] = {}

    def register(self, name: str, cls: type[T]) -> None:
        """Add cls under name; a second class under the same name is an error, not an override."""
        if name in self._table:
            raise self.error(f"{self.kind} {name!r} registered twice")
        self._table[name] = cls

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._table)

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def type_of(self, name: str) -> type[T]:
        """The class registered under name; the kind's error lists the choices."""
        try:
            return self._table[name]
        except (KeyError, TypeError):
            raise self.error(f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}") from None

    def get(self, name: str, *args: Any, **kwargs: Any) -> T:
        """An instance of the class registered under name."""
        return self.type_of(name)(*args, **kwargs)

    def unregister(self, name: str) -> None:
        """Remove name (tests that register a throwaway class clean up with this)."""
        self._table.pop(name, None)


def resolve_options(
    owner: str,
    defaults: dict[str, Any],
    options: dict[str, Any],
    error: type[Exception],
    nullable: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Defaults merged with options, after refusing unknown keys and ill-typed values.

    A value must have its default's type (an int stands for a float; a list or tuple for a
    list or tuple). None is accepted where the default is None or the key is `nullable`;
    a default of None leaves the type to the owner's own value checks.
    """
    for key, value in options.items():
        if key not in defaults:
            known = ", ".join(sorted(defaults)) or "none"
            raise error(f"unknown option {key!r} for {owner}; known options: {known}")
        default = defaults[key]
        if default is None or (value is None and key in nullable):
            continue
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif isinstance(default, (list, tuple)):
            ok = isinstance(value, (list, tuple))
        else:
            ok = isinstance(value, type(default)) and not isinstance(value, bool)
        if not ok:
            raise error(f"option {key!r} of {owner} must be a {type(default).__name__}, got {_shown(value)}")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT_OPTION:
            raise error(f"option {key!r} of {owner} is out of range: {_shown(value)} (at most {MAX_INT_OPTION:,})")
    return {**defaults, **options}


# Integer options are sizes and counts: none needs more than 2^53 (exact as a float), and a
# larger one reaches torch or numpy as an overflow, not as an error naming the option.
MAX_INT_OPTION = 1 << 53


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"
