"""ExportPolicy: which tensor gets which format, and why — data in one visible place.

Decision order for each tensor (first rule that applies wins):

1. non-float tensor                      -> ``raw`` (exact)
2. name matches an ``overrides`` glob    -> that (format, options)
3. control tensor (norm gains, gates,    -> ``fp32``, or the main quantizer when
   scalars, LayerRoPE, ``spec.``,           ``quantize_controls`` (fragility probe)
   ``.input_norm.``) up to
   ``control_max_numel`` elements
4. embedding (``embed.weight``, ``head.weight``) -> ``embedding_format`` (int8 or fp16)
5. ≤ ``keep_float_max_numel`` elements   -> ``small_float_format`` (fp16)
6. everything else                       -> ``quantizer`` with ``options``
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..errors import QuantError
from .qtensor import QTensor
from .registry import available, get

# The defaults, as Parameter Golf keeps them: one block of constants.
DEFAULT_QUANTIZER = "int8"
KEEP_FLOAT_MAX_NUMEL = 65_536  # small float tensors cost little: keep them fp16
CONTROL_PATTERNS = (
    "*norm*.weight",  # RMSNorm gains, including final_norm and <proj>.input_norm
    "*.input_norm.*",
    "spec.*",  # step-specific controls: per-step gains, gates, scalars, LayerRoPE
    "*gate*",
    "*gain*",
    "*scale*",
    "*scalar*",
    "*rope*",
    "*alpha*",
    "*beta*",
)
# Step-specific *matrices* (LoRA adapters, unique blocks) are weights, not controls.
CONTROL_MAX_NUMEL = 65_536
EMBEDDING_NAMES = ("embed.weight", "head.weight")

Plan = dict[str, tuple[str, dict[str, Any], str]]


@dataclass
class ExportPolicy:
    """Which format each tensor of a state dict is exported with (see the module docstring)."""

    quantizer: str = DEFAULT_QUANTIZER
    options: dict[str, Any] = field(default_factory=dict)
    keep_float_max_numel: int = KEEP_FLOAT_MAX_NUMEL
    small_float_format: str = "fp16"
    control_patterns: tuple[str, ...] = CONTROL_PATTERNS
    control_max_numel: int = CONTROL_MAX_NUMEL
    control_format: str = "fp32"
    embedding_names: tuple[str, ...] = EMBEDDING_NAMES
    embedding_format: str = "int8"  # "int8" or "fp16": higher precision than the main quantizer
    overrides: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    quantize_controls: bool = False
    control_names: frozenset[str] = frozenset()  # e.g. model.control_names(), on top of patterns

    def __post_init__(self) -> None:
        self.control_names = frozenset(self.control_names)
        for fmt, opts, where in self._choices():
            if fmt not in available():
                raise QuantError(f"export policy {where}: unknown format {fmt!r}; available: {', '.join(available())}")
            get(fmt, **opts)  # QuantError on a bad option, before any tensor is touched
        if self.embedding_format not in ("int8", "fp16"):
            raise QuantError(f"embedding_format must be 'int8' or 'fp16', got {self.embedding_format!r}")

    def _choices(self) -> list[tuple[str, dict[str, Any], str]]:
        out = [
            (self.quantizer, self.options, "quantizer"),
            (self.small_float_format, {}, "small_float_format"),
            (self.control_format, {}, "control_format"),
            (self.embedding_format, {}, "embedding_format"),
        ]
        for pattern, spec in self.overrides.items():
            if not (isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[1], dict)):
                raise QuantError(f"override {pattern!r} must be (format, options dict), got {spec!r}")
            out.append((spec[0], spec[1], f"override {pattern!r}"))
        return out

    def is_control(self, name: str, t: Tensor) -> bool:
        """A small control tensor: listed in control_names or matching a control pattern."""
        if t.numel() > self.control_max_numel:
            return False
        return name in self.control_names or any(
            fnmatch.fnmatchcase(name, p) for p in self.control_patterns
        )

    def choose(self, name: str, t: Tensor) -> tuple[str, dict[str, Any], str]:
        """(format, options, reason) for one tensor."""
        if not t.is_floating_point():
            return "raw", {}, f"non-float ({str(t.dtype).removeprefix('torch.')})"
        for pattern, (fmt, opts) in self.overrides.items():
            if fnmatch.fnmatchcase(name, pattern):
                return fmt, dict(opts), f"override {pattern}"
        if self.is_control(name, t):
            if self.quantize_controls:
                return self.quantizer, dict(self.options), "control (quantize_controls)"
            return self.control_format, {}, "control"
        if name in self.embedding_names:
            return self.embedding_format, {}, "embedding"
        if t.numel() <= self.keep_float_max_numel:
            return self.small_float_format, {}, f"small (<= {self.keep_float_max_numel} elements)"
        return self.quantizer, dict(self.options), "weight"

    def plan(self, state_dict: dict[str, Tensor]) -> Plan:
        """{name: (format, options, reason)} for every tensor of the state dict."""
        return {name: self.choose(name, t) for name, t in state_dict.items()}

    def export(self, state_dict: dict[str, Tensor]) -> dict[str, QTensor]:
        """Quantize a whole state dict according to the plan."""
        out: dict[str, QTensor] = {}
        for name, (fmt, opts, _) in self.plan(state_dict).items():
            out[name] = get(fmt, **opts).quantize(state_dict[name], name=name)
        return out

    def describe(self, state_dict: dict[str, Tensor] | None = None) -> str:
        """A printable table: the rules, and the plan of a state dict if given."""
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        lines = [
            f"export policy: {self.quantizer}({opts})",
            f"  controls -> {self.quantizer if self.quantize_controls else self.control_format}"
            f" (patterns {', '.join(self.control_patterns)}; <= {self.control_max_numel} elements)",
            f"  embeddings {', '.join(self.embedding_names)} -> {self.embedding_format}",
            f"  float tensors <= {self.keep_float_max_numel} elements -> {self.small_float_format}",
            "  non-float -> raw",
        ]
        lines += [f"  override {p} -> {f}({o})" for p, (f, o) in self.overrides.items()]
        if state_dict is not None:
            plan = self.plan(state_dict)
            width = max((len(n) for n in plan), default=4)
            lines.append(f"{'tensor':<{width}}  {'shape':<14} {'format':<10} reason")
            for name, (fmt, o, reason) in plan.items():
                shape = "x".join(map(str, state_dict[name].shape)) or "scalar"
                extra = f"({', '.join(f'{k}={v}' for k, v in o.items())})" if o else ""
                lines.append(f"{name:<{width}}  {shape:<14} {fmt + extra:<10} {reason}")
        return "\n".join(lines)


def state_dict_for_export(model: torch.nn.Module) -> dict[str, Tensor]:
    """The model's state dict, detached on CPU (tied weights appear under each name)."""
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}
