"""Quantizer registry: one class per format, registered by subclassing.

A format is a `Quantizer` subclass declared as ``class Int4(IntN, name="int4")``.
Its options are constructor keyword arguments listed in ``defaults``; every
option (defaults included) is written to ``qt.params`` so that
``dequantize(qt)`` can rebuild the very quantizer from ``qt.format`` and
``qt.params`` even if a default changes later.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import QuantError
from ..lazy import torch
from ..registry import Registry, resolve_options
from . import lowrank
from .qtensor import QTensor

if TYPE_CHECKING:
    from torch import Tensor

_REGISTRY: Registry[Quantizer] = Registry("format", QuantError)

# The dtype names QTensor.dtype stores ("float32", "bfloat16", "int64", ...; torch's, which
# numpy lacks for bfloat16) and each one's bytes: what a reader checks needs no torch.
ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "bool": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,  # raw buffers: artifact streams can hold them
}


def dtype_name(dtype: torch.dtype) -> str:
    """The name QTensor.dtype stores for a torch dtype ("float32", "int64", ...)."""
    return str(dtype).removeprefix("torch.")


def itemsize(dtype) -> int:
    """Bytes an element of a dtype takes (a torch dtype or its name; numpy has no bfloat16)."""
    name = dtype_name(dtype)
    return ITEMSIZE.get(name) or np.dtype(name).itemsize


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a QTensor.dtype name; QuantError if unknown."""
    return getattr(torch, known_dtype(name))


def known_dtype(name: str) -> str:
    """name, if an artifact can hold that dtype; QuantError if not."""
    if name not in ITEMSIZE:
        raise QuantError(f"unknown dtype {name!r}; known: {', '.join(sorted(ITEMSIZE))}")
    return name


# The largest finite value of each float dtype a tensor is restored to. Quantized formats
# compute in float32 first, so a float64 output holds no more than float32's range.
_F32_MAX = float(np.finfo(np.float32).max)
OUTPUT_MAX = {
    "float32": _F32_MAX,
    "float64": _F32_MAX,
    "float16": float(np.finfo(np.float16).max),
    "bfloat16": float(np.array([0x7F7F0000], np.uint32).view(np.float32)[0]),  # (float32's top 16 bits)
}


def range_problem(peak, dtype: str) -> str | None:
    """Why dequantized values of magnitude up to `peak` (exact: float64 products of float32s)
    would not all be finite once stored as `dtype`, or None. Rounding to the nearest value
    never passes the largest finite one, so peak <= it is exactly what keeps them finite."""
    limit = OUTPUT_MAX.get(dtype)
    peak = float(np.max(peak, initial=0.0))
    if limit is None or peak <= limit:
        return None
    return f"dequantizes to values up to {peak:.4g}, beyond {dtype}'s largest finite {limit:.4g} (NaN/Inf weights)"


def restore_dtype(t: Tensor, qt: QTensor) -> Tensor:
    """Cast a dequantized tensor back to the dtype the original tensor had."""
    return t.to(torch_dtype(qt.dtype))


def check_finite(t: Tensor, name: str) -> None:
    """QuantError naming the tensor and the first index holding NaN or Inf."""
    if not t.is_floating_point() or t.numel() == 0:
        return
    # The extremes first (NaN propagates, Inf is one): one pass with no temporary, 12x quicker
    # than isfinite's mask on 11.5M bf16 weights; the mask only to name the index.
    if all(bool(torch.isfinite(x)) for x in torch.aminmax(t)):
        return
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        flat = int(torch.nonzero(bad.reshape(-1))[0])
        index = tuple(int(i) for i in np.unravel_index(flat, tuple(t.shape))) if t.dim() else ()
        value = t.reshape(-1)[flat].item()
        what = "NaN" if math.isnan(value) else "Inf"
        raise QuantError(f"tensor {name} has {what} at index {index}")


class Quantizer:
    """Base class: `quantize(tensor) -> QTensor`, `dequantize(qt) -> float32 Tensor`."""

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    # One line per option, for --help and docs/POLICY.md (a test checks every option has one).
    # The class that sets it heads a family of formats in the help: its docstring's first line.
    option_help: ClassVar[dict[str, str]] = {}
    nullable: ClassVar[frozenset[str]] = frozenset()  # options that may be None despite a default
    float_only: ClassVar[bool] = True  # raw is the one format that takes integers

    def __init_subclass__(cls, name: str | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if name is not None:
            _REGISTRY.register(name, cls)
            cls.name = name

    def __init__(self, **options: Any) -> None:
        self.params: dict[str, Any] = resolve_options(
            f"format {self.name!r}", self.defaults, options, QuantError, self.nullable
        )
        self.check_options()

    def check_options(self) -> None:
        """Check option values beyond their types; QuantError naming the bad one."""

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({opts})"

    # -- public API -------------------------------------------------------

    def quantize(self, tensor: Tensor | np.ndarray, name: str = "tensor") -> QTensor:
        """Quantize one tensor; QuantError naming `name` on NaN/Inf or a bad dtype."""
        t = torch.as_tensor(tensor).detach().cpu()
        if self.float_only and not t.is_floating_point():
            raise QuantError(
                f"tensor {name} has dtype {dtype_name(t.dtype)}; {self.name!r} takes float "
                "tensors (use 'raw' for integer and bool tensors)"
            )
        check_finite(t, name)
        return self._quantize(t.contiguous(), name)

    def dequantize(self, qt: QTensor) -> Tensor:
        """The float32 tensor (original shape) a QTensor stands for."""
        return self._dequantize(self._checked(qt))

    def dequantize_to(self, qt: QTensor, dtype: torch.dtype) -> Tensor:
        """The tensor a QTensor stands for, in dtype."""
        return self.dequantize(qt).to(dtype)

    @classmethod
    def makes_words(cls, dtype: str) -> bool:
        """Whether word_blocks makes a QTensor of this format restored to dtype (one without
        LQER factors): unpack writes it with numpy alone."""
        return False

    def word_blocks(self, qt: QTensor) -> Iterator[np.ndarray]:
        """The words (flat, a bool's as uint8) of dequantize(qt, original_dtype=True), piece by
        piece in order, made with numpy alone; for the dtypes it makes_words."""
        raise NotImplementedError(f"format {self.name!r} dequantizes with torch")

    def _checked(self, qt: QTensor) -> QTensor:
        if qt.format != self.name:
            raise QuantError(f"QTensor has format {qt.format!r}, not {self.name!r}")
        return qt

    def code_bits(self) -> float:
        """Bits one code needs before entropy coding (for bits-per-weight reports)."""
        raise NotImplementedError

    # -- what a stored QTensor must hold (artifacts are untrusted: budget/validate.py asks) --

    # scales/zeros: kind -> required; kinds not listed must be absent.
    side_streams: ClassVar[dict[str, bool]] = {}

    def code_range(self) -> tuple[int, int] | None:
        """(lowest, highest) code `dequantize` accepts, or None when any value of the dtype is."""
        return None

    def check_streams(self, dtypes: dict[str, str]) -> str | None:
        """Why streams of these numpy dtype names ({"codes": "int8", ...}) cannot be dequantized
        by this format, or None. Checked before anything is decoded."""
        if np.dtype(dtypes["codes"]).kind not in "iu":
            return f"{self.name} codes must be integers, not {dtypes['codes']}"
        for kind in ("scales", "zeros"):
            if kind not in self.side_streams and kind in dtypes:
                return f"format {self.name} has no {kind}"
            if self.side_streams.get(kind) and kind not in dtypes:
                return f"format {self.name} needs {kind}"
            if kind in dtypes and np.dtype(dtypes[kind]).kind != "f":
                return f"{kind} must be floats, not {dtypes[kind]}"
        return None

    def check_values(self, qt: QTensor) -> str | None:
        """Why decoded codes/scales would not dequantize to finite weights, or None."""
        rng = self.code_range()
        if rng is not None and qt.codes.size:
            lo, hi = int(qt.codes.min()), int(qt.codes.max())
            if lo < rng[0] or hi > rng[1]:
                return f"{self.name} codes span [{lo}, {hi}], outside [{rng[0]}, {rng[1]}]"
        for kind in ("scales", "zeros"):
            arr = getattr(qt, kind)
            if arr is not None and arr.dtype.kind == "f" and not np.isfinite(arr).all():
                return f"{kind} hold NaN or Inf"
        return self.range_problem(qt) if qt.codes.size else None

    def range_problem(self, qt: QTensor) -> str | None:
        """Why finite codes, scales and zeros would still dequantize past the output dtype's
        range (registry.range_problem), or None; asked after the checks above."""
        return None

    # -- what a format implements ------------------------------------------

    def _quantize(self, t: Tensor, name: str) -> QTensor:
        raise NotImplementedError

    def _dequantize(self, qt: QTensor) -> Tensor:
        raise NotImplementedError


def available() -> list[str]:
    """Names of every registered format."""
    return _REGISTRY.names()


def _value_text(v: Any) -> str:
    return "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def format_families() -> list[dict[str, Any]]:
    """The registered formats grouped as --help lists them: names, what they do, and each
    option with its help and default (``defaults`` maps a format to its own where it differs)."""
    import inspect

    families: dict[type, dict[str, Any]] = {}
    for name in available():
        cls = _REGISTRY.type_of(name)
        owner = next(c for c in cls.__mro__ if "option_help" in c.__dict__)
        fam = families.setdefault(owner, {"names": [], "doc": (inspect.getdoc(owner) or "").splitlines()[0]})
        fam["names"].append(name)
    out = []
    for owner, fam in families.items():
        fam["names"].sort(key=lambda n: (len(n), n))
        first = _REGISTRY.type_of(fam["names"][0])
        options = []
        for key, text in owner.option_help.items():
            values = {n: _REGISTRY.type_of(n).defaults[key] for n in fam["names"]}
            common = max(values.values(), key=list(values.values()).count)
            differ = {n: _value_text(v) for n, v in values.items() if v != common}
            options.append({"option": key, "help": text, "default": _value_text(common), "differs": differ})
        out.append({"names": fam["names"], "doc": fam["doc"], "options": options, "first": first.name})
    return out


def formats_help() -> str:
    """Every format and every option, generated from the registry (pack/inspect/plan --help)."""
    lines = []
    for fam in format_families():
        lines.append(f"{', '.join(fam['names'])}: {fam['doc'].rstrip('.')}")
        for o in fam["options"]:
            differ = "; ".join(f"{n}: {v}" for n, v in o["differs"].items())
            lines.append(f"    {o['option']}={o['default']}{f' ({differ})' if differ else ''}  {o['help']}")
    return "\n".join(lines)


def formats_markdown() -> str:
    """The same as a Markdown table (docs/POLICY.md holds it; a test keeps the two equal)."""
    rows = ["| formats | what they store | options [default] |", "|---|---|---|"]
    for fam in format_families():
        opts = "<br>".join(
            f"`{o['option']}={o['default']}`"
            + (f" ({'; '.join(f'{n}: {v}' for n, v in o['differs'].items())})" if o["differs"] else "")
            + f": {o['help']}"
            for o in fam["options"]
        )
        cells = (", ".join(f"`{n}`" for n in fam["names"]), fam["doc"].rstrip("."), opts or "none")
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def get(name: str, **options: Any) -> Quantizer:
    """The quantizer `name` with options; QuantError listing the formats if unknown."""
    return _REGISTRY.get(name, **options)


def makes_words(fmt: str, dtype: str) -> bool:
    """Whether word_blocks makes the tensor of a stored entry (format, original dtype; without
    LQER factors), from its manifest: no torch needed to write it."""
    return fmt in _REGISTRY and _REGISTRY.type_of(fmt).makes_words(dtype)


def word_blocks(qt: QTensor) -> Iterator[np.ndarray]:
    """The words of dequantize(qt, original_dtype=True), piece by piece (Quantizer.word_blocks)."""
    return get(qt.format, **qt.params).word_blocks(qt)


def dequantize(qt: QTensor, *, original_dtype: bool = False) -> Tensor:
    """Dequantize any QTensor by rebuilding its quantizer from format and params (plus its LQER
    correction, when it has one)."""
    quantizer = get(qt.format, **qt.params)
    if original_dtype and qt.lowrank is None:
        return quantizer.dequantize_to(qt, torch_dtype(qt.dtype))
    t = quantizer.dequantize(qt)
    if qt.lowrank is not None:
        t = lowrank.add_to(t, qt, *(dequantize(f) for f in qt.lowrank))
    return restore_dtype(t, qt) if original_dtype else t


def dequantize_all(qtensors: dict[str, QTensor]) -> dict[str, Tensor]:
    """Dequantize a whole exported state dict, restoring each tensor's original dtype.

    Names that share one QTensor (tied weights) share one tensor, as they did before export.
    """
    done: dict[int, Tensor] = {}
    for qt in qtensors.values():
        if id(qt) not in done:
            done[id(qt)] = dequantize(qt, original_dtype=True)
    return {name: done[id(qt)] for name, qt in qtensors.items()}


def bits_per_weight(qt: QTensor) -> float:
    """Stored bits per weight before entropy coding: codes plus scales and zeros."""
    if qt.numel == 0:
        return 0.0
    bits = get(qt.format, **qt.params).code_bits() * qt.numel
    for side in (qt.scales, qt.zeros):
        if side is not None:
            bits += side.size * side.dtype.itemsize * 8
    return bits / qt.numel
