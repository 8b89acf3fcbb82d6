"""Typed export options: what ``recurnorm.pack`` takes beside the ``-q`` string spelling.

``ExportOptions(Format("int6", {"clip": "std:12"}))`` is ``-q int6:clip=std:12``;
``ExportOptions("int6", rules=(("embed.weight", "int8"),))`` is
``-q embed.weight=int8,int6``. Each is checked and turned into an ExportPolicy by
``spec.build_policy`` through its ``-q`` spelling, so the typed and the string
form give the same policy, the same export record and the same artifact bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .policy import ExportPolicy, format_spec


@dataclass(frozen=True)
class Format:
    """One format and its options: ``Format("int4", {"group": 128})`` is ``int4:group=128``.
    A recipe is a format too: ``Format("@pg-record")``."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def spelling(self) -> str:
        return format_spec(self.name, self.options)


def _spelling(fmt: Format | str) -> str:
    return fmt.spelling if isinstance(fmt, Format) else str(fmt)


@dataclass(frozen=True)
class ExportOptions:
    """How ``recurnorm.pack`` quantizes and packs: the ``-q`` format and rules, --keep-float,
    --quantize-controls, --keep-float-max-numel and --effort of ``recurnorm pack``."""

    format: Format | str = "int8"  # the main format (or a recipe, "@pg-record")
    rules: tuple[tuple[str, Format | str], ...] = ()  # (tensor pattern, format): first match wins
    keep_float: tuple[str, ...] = ()  # these stay fp32 (checked before the rules)
    quantize_controls: bool = False  # gains, gates and scalars take the main format too
    keep_float_max_numel: int | None = None  # None: the policy's default
    effort: str = "normal"  # "normal" or "max" (the packer's search)

    @property
    def quant(self) -> str:
        """The ``-q`` spelling: the rules in order, then the main format."""
        return ",".join([f"{pattern}={_spelling(fmt)}" for pattern, fmt in self.rules] + [_spelling(self.format)])

    def policy(self) -> ExportPolicy:
        """The ExportPolicy these options mean; ConfigError on an unknown format or option."""
        from .spec import build_policy

        return build_policy(
            self.quant,
            keep_float=tuple(self.keep_float),
            quantize_controls=self.quantize_controls,
            keep_float_max_numel=self.keep_float_max_numel,
        )

    @classmethod
    def parse(cls, quant: str, **kw: Any) -> ExportOptions:
        """The options of a ``-q`` string (checked: ConfigError on anything unknown), each format
        kept as written; ``kw`` sets the other fields."""
        from .spec import _is_rule, build_policy

        build_policy(quant)
        items = [s.strip() for s in quant.split(",")]
        rules = tuple((s.split("=", 1)[0].strip(), s.split("=", 1)[1].strip()) for s in items if _is_rule(s))
        main = [s for s in items if not _is_rule(s)]
        return cls(format=main[0] if main else "int8", rules=rules, **kw)
