"""ExportPolicy: which tensor gets which format, and why — every rule in one visible place.

Decision order for each tensor (first rule that applies wins):

1. non-float tensor                        -> ``raw`` (exact)
2. name matches an ``overrides`` glob      -> that (format, options); forced, reaches every
                                              tensor (the QAT projections, lossless exports)
3. user ``rules`` in order (``--keep-float``, ``-q 'PATTERN=FORMAT,...'``, ``--policy``):
   a pattern with wildcards reaches weights and embeddings only; a control tensor or a
   small vector is changed only by a rule that names it exactly, or by an ``fp32`` rule
   (``--keep-float``: it can only keep more bits)
4. control tensor (norm gains, gates,      -> ``fp32``, or the main quantizer when
   scalars, LayerRoPE, ``spec.``, the         ``quantize_controls`` (fragility probe)
   Parameter Golf records' ``attn_scale``,
   ``mlp_scale``, ``resid_mix``, ``q_gain``, ``skip_weight``, ``skip_gates``,
   ``parallel_*_lambdas``, ``attn_gate_*``, ``smear_*``) up to
   ``control_max_numel`` elements
5. embedding (recurnorm ``embed``/``head``, -> ``embedding_format`` (int8 unless the main
   Parameter Golf ``tok_emb``/``lm_head``,     format is a float passthrough)
   Hugging Face ``embed_tokens``/``wte``/...)
6. a *vector* of <= ``keep_float_max_numel`` -> ``small_float_format`` (fp16, or the main format
   elements                                    when that is a float one: ``-q fp32`` and
                                               ``-q bf16`` lose no bit a vector had)
7. everything else (every weight matrix,   -> ``quantizer`` with ``options``
   whatever its size)

Rule 6 is narrower than the Parameter Golf baseline's, which keeps every float
tensor of <= 65,536 elements in fp16: on recurnorm's tiny models every matrix
is that small, so ``-q ternary`` would export no ternary weight at all. Here
the requested format reaches every weight matrix.

The name conventions (controls, embeddings) match case-insensitively, as the
ecosystems write them (``LayerNorm``, ``layer_norm``, ``ln_f``); user rules match
case as written, and ``check_rules`` refuses a rule that changes no tensor.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, QuantError
from ..quant import extras
from ..quant.passthrough import FLOAT_FORMATS
from ..quant.qtensor import QTensor

if TYPE_CHECKING:
    from torch import Tensor

DEFAULT_QUANTIZER = "int8"
KEEP_FLOAT_MAX_NUMEL = 65_536  # small float *vectors* cost little: keep them fp16
PASSTHROUGH = tuple(FLOAT_FORMATS)

# Name conventions, one block per family. Globs, matched against state-dict names.
RECURNORM_CONTROLS = (
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
# The Parameter Golf records' CONTROL_TENSOR_NAME_PATTERNS (kept in float by their exports;
# the 2026-04-27 record's 16, plural spellings included by the globs).
PARAMETER_GOLF_CONTROLS = (
    "*attn_scale*",
    "*mlp_scale*",
    "*resid_mix*",
    "*q_gain*",
    "*skip_weight*",
    "*skip_gates*",
    "*parallel_post_lambdas*",
    "*parallel_resid_lambdas*",
    "*attn_gate_proj*",
    "*attn_gate_w*",
    "*smear_gate*",
    "*smear_lambda*",
)
HUGGING_FACE_CONTROLS = ("*layernorm*", "*layer_norm*", "*ln_f.*", "*ln_1.*", "*ln_2.*")
CONTROL_PATTERNS = RECURNORM_CONTROLS + PARAMETER_GOLF_CONTROLS + HUGGING_FACE_CONTROLS
# Step-specific *matrices* (LoRA adapters, unique blocks) are weights, not controls.
CONTROL_MAX_NUMEL = 65_536

RECURNORM_EMBEDDINGS = ("embed.weight", "head.weight")
PARAMETER_GOLF_EMBEDDINGS = ("tok_emb.weight", "lm_head.weight")
HUGGING_FACE_EMBEDDINGS = (
    "*embed_tokens.weight",
    "*.lm_head.weight",
    "*wte.weight",
    "*word_embeddings.weight",
    "embed_out.weight",
    "*.embed_out.weight",
)
EMBEDDING_NAMES = RECURNORM_EMBEDDINGS + PARAMETER_GOLF_EMBEDDINGS + HUGGING_FACE_EMBEDDINGS

WILDCARDS = frozenset("*?[")
FIT_RULE = "fit"  # the text of the exact-name rules pack --fit writes (the format is in the row)
GPTQ_MARK = " + GPTQ"  # appended to the rule of a tensor whose codes GPTQ chose
# torch.compile (`_orig_mod.`) and (Distributed)DataParallel (`module.`) prefix every name.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")

Plan = dict[str, tuple[str, dict[str, Any], str]]


@dataclass(frozen=True)
class Rule:
    """``pattern=format(options)``: one user rule; `text` is how the user wrote it."""

    pattern: str
    format: str
    options: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def exact(self) -> bool:
        """True when the pattern names one tensor (no wildcard): it may reach controls."""
        return not (WILDCARDS & set(self.pattern))

    def matches(self, name: str) -> bool:
        """The pattern matches the name (case as written)."""
        return name == self.pattern if self.exact else fnmatch.fnmatchcase(name, self.pattern)

    def reaches(self, name: str, protected: bool) -> bool:
        """This rule chooses the tensor's format: a wildcard spares controls and small vectors
        unless it keeps them in fp32 (``--keep-float``), which loses nothing."""
        return self.matches(name) and (self.exact or not protected or self.format == "fp32")

    def label(self) -> str:
        """How inspect names the rule."""
        return self.text or f"{self.pattern}={format_spec(self.format, self.options)}"


def format_spec(fmt: str, options: dict[str, Any]) -> str:
    """``int4:group=128`` — the -q spelling of a format and its options."""
    opts = "".join(f":{k}={_value_text(v)}" for k, v in options.items())
    return fmt + opts


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "none" if v is None else str(v)


def name_matches(name: str, patterns) -> bool:
    """A name convention: case-insensitive (``LayerNorm``, ``layer_norm`` and ``ln_f`` alike)."""
    low = name.lower()
    return any(low == p.lower() or fnmatch.fnmatchcase(low, p.lower()) for p in patterns)


def strip_wrapper_prefixes(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """(state with plain names, prefixes removed): a prefix every name carries is a wrapper's
    (``torch.compile``'s ``_orig_mod.``, DataParallel's ``module.``), not part of the model."""
    stripped: list[str] = []
    while state:
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in state)), None)
        if prefix is None:
            break
        state = {k[len(prefix) :]: v for k, v in state.items()}
        stripped.append(prefix)
    return state, stripped


def _template(name: str) -> str:
    """``blocks.3.mlp.fc.weight`` -> ``blocks.*.mlp.fc.weight``: how a rule names every layer."""
    return re.sub(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)", "*", name)


def closest_names(pattern: str, names) -> list[str]:
    """The three tensor names (or layer templates, for a wildcard pattern) nearest a pattern."""
    pool = set(names)
    if WILDCARDS & set(pattern):
        pool |= {_template(n) for n in names}
    score = {n: difflib.SequenceMatcher(None, pattern, n).ratio() for n in pool}
    return sorted(score, key=lambda n: (-score[n], n))[:3]


def _reason_class(reason: str) -> str:
    """How the policy line groups a plan's reasons: weights, --fit, rule X, controls, ..."""
    reason = reason.removesuffix(GPTQ_MARK)
    if reason == FIT_RULE:
        return "--fit"
    for prefix, label in (("control", "controls"), ("small vector", "vectors"), ("non-float", "non-float")):
        if reason.startswith(prefix):
            return label
    return {"weight": "weights", "embedding": "embeddings"}.get(reason, reason)


@dataclass
class ExportPolicy:
    """Which format each tensor of a state dict is exported with (see the module docstring)."""

    quantizer: str = DEFAULT_QUANTIZER
    options: dict[str, Any] = field(default_factory=dict)
    keep_float_max_numel: int = KEEP_FLOAT_MAX_NUMEL
    small_float_format: str | None = None  # None: fp16, or the main format when it is a float one
    control_patterns: tuple[str, ...] = CONTROL_PATTERNS
    control_max_numel: int = CONTROL_MAX_NUMEL
    control_format: str = "fp32"
    embedding_names: tuple[str, ...] = EMBEDDING_NAMES
    embedding_format: str | None = None  # None: int8, or the main format when it is a float one
    embedding_options: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    quantize_controls: bool = False
    control_names: frozenset[str] = frozenset()  # e.g. model.control_names(), on top of patterns

    def __post_init__(self) -> None:
        self.control_names = frozenset(self.control_names)
        self.rules = tuple(self.rules)
        for fmt, opts, where in self._choices():
            try:  # a bad format or option fails here, before any tensor is touched
                extras.split(fmt, opts)
            except QuantError as exc:
                raise QuantError(f"export policy {where}: {exc}") from None

    def _choices(self) -> list[tuple[str, dict[str, Any], str]]:
        out = [
            (self.quantizer, self.options, "quantizer"),
            (self.vector_format, {}, "small_float_format"),
            (self.control_format, {}, "control_format"),
            (*self.embedding, "embedding_format"),
        ]
        for pattern, spec in self.overrides.items():
            if not (isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[1], dict)):
                raise QuantError(f"override {pattern!r} must be (format, options dict), got {spec!r}")
            out.append((spec[0], spec[1], f"override {pattern!r}"))
        out += [(r.format, r.options, f"rule {r.label()!r}") for r in self.rules]
        return out

    # None fields follow the main format, also after dataclasses.replace(policy, quantizer=...).
    @property
    def vector_format(self) -> str:
        """Small float vectors' format: a float main format keeps them in it, else fp16."""
        if self.small_float_format is not None:
            return self.small_float_format
        return self.quantizer if self.quantizer in PASSTHROUGH else "fp16"

    @property
    def embedding(self) -> tuple[str, dict[str, Any]]:
        """(format, options) of the embeddings: int8, or the main format when it is a float one."""
        if self.embedding_format is not None:
            return self.embedding_format, dict(self.embedding_options)
        return (self.quantizer, {}) if self.quantizer in PASSTHROUGH else ("int8", {})

    def is_control(self, name: str, t: Tensor) -> bool:
        """A small control tensor: listed in control_names or matching a control pattern."""
        if t.numel() > self.control_max_numel:
            return False
        return name in self.control_names or name_matches(name, self.control_patterns)

    def is_small_vector(self, t: Tensor) -> bool:
        """A vector (or scalar) small enough to stay in float: biases, per-channel gains."""
        return t.dim() < 2 and t.numel() <= self.keep_float_max_numel

    def _protected(self, name: str, t: Tensor) -> bool:
        """Only an exact-name (or fp32) rule changes a control tensor or a small vector."""
        return self.is_control(name, t) or self.is_small_vector(t)

    def forced(self, name: str, t: Tensor) -> tuple[str, dict[str, Any], str] | None:
        """Rules 1-3: what a non-float tensor, an override or a user rule decides, or None."""
        if not t.is_floating_point():
            return "raw", {}, f"non-float ({str(t.dtype).removeprefix('torch.')})"
        if t.numel() == 0:  # nothing to quantize; a grid format would still lay out a scale a row
            return "fp32", {}, "empty (no values)"
        for pattern, (fmt, opts) in self.overrides.items():
            if fnmatch.fnmatchcase(name, pattern):
                return fmt, dict(opts), f"override {pattern}"
        protected = self._protected(name, t)
        for rule in self.rules:
            if rule.reaches(name, protected):
                return rule.format, dict(rule.options), rule.text if rule.text == FIT_RULE else f"rule {rule.label()}"
        return None

    def choose(self, name: str, t: Tensor) -> tuple[str, dict[str, Any], str]:
        """(format, options, reason) for one tensor; the reason names the rule that chose it."""
        chosen = self.forced(name, t)
        if chosen is not None:
            return chosen
        control = self.is_control(name, t)
        if control:
            if self.quantize_controls:
                return self.quantizer, dict(self.options), "control (quantize_controls)"
            return self.control_format, {}, "control"
        if name_matches(name, self.embedding_names):
            return *self.embedding, "embedding"
        if self.is_small_vector(t):
            return self.vector_format, {}, f"small vector (<= {self.keep_float_max_numel} elements)"
        return self.quantizer, dict(self.options), "weight"

    def plan(self, state_dict: dict[str, Tensor]) -> Plan:
        """{name: (format, options, reason)} for every tensor of the state dict."""
        return {name: self.choose(name, t) for name, t in state_dict.items()}

    def rule_problems(self, state_dict: dict[str, Tensor]) -> list[str]:
        """Why each user rule changes no tensor (matches none, only protected ones, or only
        tensors an earlier rule took), with the closest names; [] when every rule is used."""
        problems = []
        taken: dict[str, Rule] = {}  # tensor -> the first user rule that chose it
        for rule in self.rules:
            if rule.text == FIT_RULE:
                continue
            what = f"--keep-float {rule.pattern!r}" if rule.text.startswith("keep-float") else f"rule {rule.label()!r}"
            matched = [n for n, t in state_dict.items() if rule.matches(n) and t.is_floating_point()]
            reached = [n for n in matched if rule.reaches(n, self._protected(n, state_dict[n]))]
            if not matched:
                near = ", ".join(closest_names(rule.pattern, state_dict))
                problems.append(f"{what} matches no tensor (names are case-sensitive); closest: {near}")
            elif not reached:
                problems.append(
                    f"{what} matches only control tensors or small vectors ({matched[0]}, ...), "
                    "which a wildcard rule does not change: name each one exactly"
                )
            elif all(n in taken for n in reached):
                first = taken[reached[0]]
                problems.append(
                    f"{what} changes nothing: every tensor it matches is taken by the earlier rule "
                    f"{first.label()!r} (the first match wins: put it first)"
                )
            for n in reached:
                taken.setdefault(n, rule)
        return problems

    def check_rules(self, state_dict: dict[str, Tensor], source: str = "the checkpoint") -> None:
        """ConfigError (usage) naming each rule or --keep-float pattern that changes no tensor."""
        from .banks import unbank

        problems = self.rule_problems(unbank(state_dict))  # a rule may name a stack's slices
        if problems:
            raise ConfigError(f"{source}: " + "; ".join(problems))

    def export(self, state_dict: dict[str, Tensor], plan: Plan | None = None) -> dict[str, QTensor]:
        """Quantize a whole state dict according to the plan (this policy's unless given)."""
        plan = self.plan(state_dict) if plan is None else plan
        return {name: extras.quantize(state_dict[name], fmt, opts, name) for name, (fmt, opts, _) in plan.items()}

    def finish(self, state_dict: dict[str, Tensor], qtensors: dict[str, QTensor], plan: Plan):
        """(qtensors, plan) after decisions that need every tensor quantized (a recipe's LQER on
        its worst tensors); this policy has none."""
        return qtensors, plan

    def summary(self, plan: Plan | None = None, aliases=()) -> str:
        """One line. Without a plan: the main format and every rule that differs from the
        defaults. With one: what each rule chose, as format counts (tied names, listed in
        ``aliases``, once), so that the line and a tensor's row never disagree."""
        if plan is not None:
            order = [f"rule {r.label()}" for r in self.rules] + [f"override {p}" for p in self.overrides]
            return "export policy: " + "; ".join(_plan_parts(plan, set(aliases), order))
        fitted = any(r.text == FIT_RULE for r in self.rules)
        parts = ["--fit" if fitted else f"weights {format_spec(self.quantizer, self.options)}"]
        parts += [f"rule {r.label()}" for r in self.rules if r.text != FIT_RULE]
        parts += [f"override {p}={format_spec(f, o)}" for p, (f, o) in self.overrides.items()]
        controls = self.quantizer if self.quantize_controls else self.control_format
        parts += [
            f"embeddings {format_spec(*self.embedding)}",
            f"controls {controls}",
            f"vectors <= {self.keep_float_max_numel:,} {self.vector_format}",
            "non-float raw",
        ]
        return "export policy: " + "; ".join(parts)

    def describe(self, state_dict: dict[str, Tensor] | None = None) -> str:
        """A printable table: the rules, and the plan of a state dict if given."""
        plan = None if state_dict is None else self.plan(state_dict)
        lines = [self.summary(plan)]
        if plan is not None:
            width = max((len(n) for n in plan), default=4)
            lines.append(f"{'tensor':<{width}}  {'shape':<14} {'format':<10} reason")
            for name, (fmt, o, reason) in plan.items():
                shape = "x".join(map(str, state_dict[name].shape)) or "scalar"
                lines.append(f"{name:<{width}}  {shape:<14} {format_spec(fmt, o):<10} {reason}")
        return "\n".join(lines)


# The line's groups in this order; rules and overrides keep their own order between them.
_CLASS_ORDER = ("weights", "--fit", "embeddings", "controls", "vectors", "non-float")


def _plan_parts(plan: Plan, aliases: set[str], rule_order: list[str]) -> list[str]:
    """``weights int6 x54``, ``--fit int6 x30, int5 x24``, ``rule X x3``, ... for a plan."""
    groups: dict[str, Counter] = {}
    gptq = 0
    for name, (fmt, opts, reason) in plan.items():
        if name in aliases:
            continue
        groups.setdefault(_reason_class(reason), Counter())[format_spec(fmt, opts)] += 1
        gptq += reason.endswith(GPTQ_MARK)
    head = [c for c in _CLASS_ORDER[:2] if c in groups]  # the main format, or what --fit chose
    tail = [c for c in _CLASS_ORDER[2:] if c in groups]
    rank = {label: i for i, label in enumerate(rule_order)}
    rules = sorted((c for c in groups if c not in _CLASS_ORDER), key=lambda c: rank.get(c, len(rank)))
    order = head + rules + tail
    parts = []
    for c in order:
        counts = ", ".join(f"{spec} x{n}" for spec, n in groups[c].most_common())
        parts.append(f"{c} ({counts})" if c.startswith(("rule ", "override ")) else f"{c} {counts}")
    if gptq:
        parts.append(f"GPTQ x{gptq}")
    return parts
