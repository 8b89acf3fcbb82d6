"""``pack --fit BYTES``: choose a format per tensor that minimizes predicted Δloss under a byte budget.

1. Candidates: every weight matrix the policy would quantize with its main format
   (embeddings, controls, vectors, user rules and QAT projections stay as the policy
   says: the embedding keeps its int8, as the records do, since it is the input and,
   tied, the output too; a rule for it fixes another format, and ``embeddings=True``,
   ``pack --fit-embeddings``, makes it a candidate like the others).
2. Bytes: the whole model is packed once per candidate format and each
   tensor's bytes are read from the artifact's manifest (the packer's measured
   stream lengths, not estimates); everything else (controls, manifest) is the
   fixed part.
3. Sensitivity of each tensor to each format: Δloss on calibration batches of
   the *training* split with that tensor alone quantized (direct; the loss is
   what the knapsack adds up). A checkpoint recurnorm cannot evaluate falls
   back to a weight-space proxy (relative reconstruction error times size),
   and the result says so.
4. A multiple-choice knapsack (dynamic programming over bytes in fine units,
   each tensor's bytes rounded *up*, so the prediction never undershoots)
   minimizes the summed Δloss subject to the budget.
5. The choice is packed for real; if the measured artifact lands over the
   budget (codecs are not exactly additive), the budget is tightened by the
   miss and the knapsack solved again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..budget.cap import Budget
from ..errors import ConfigError, OverCapError
from ..quant.qtensor import QTensor
from .policy import FIT_RULE, ExportPolicy, Plan, Rule, format_spec

# Candidate formats, widest first. Ternary only where asked (--fit-formats): a model
# not trained for it loses far more than the bytes are worth.
# ``int6:clip=record``: int6 with the clip the 2026-04-27 Parameter Golf record gives the
# tensor's role (std:13 attention, std:11.5 MLP, std:12.85 other matrices, std:14 an
# embedding): a uniform int6 pack of it is that record's export (without its LQER), and int5
# with the same clips is narrower still, so that a budget the record's own export meets is met
# with the default candidates even where the policy keeps the embedding in int8 (the record: int7).
ROLE_CLIP = "record"
DEFAULT_FORMATS = ("int8", "int7", f"int6:clip={ROLE_CLIP}", "int6", f"int5:clip={ROLE_CLIP}", "int5", "int4")
# The policy's own weights, and @pg-record's matrices (-q @pg-record --fit starts from the record);
# (+ "embedding" where the user asks: embeddings=True)
CANDIDATE_REASONS = ("weight", "@pg-record attention", "@pg-record mlp", "@pg-record matrix")


def resolve(name: str, fmt: str, opts: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(format, options) of a candidate for one tensor: ``clip=record`` becomes the clip the
    record gives the tensor's role."""
    if opts.get("clip") != ROLE_CLIP:
        return fmt, opts
    from .policy import EMBEDDING_NAMES, name_matches
    from .recipes import RECORD, role

    kind = "embedding" if name_matches(name, EMBEDDING_NAMES) else role(name)
    return fmt, {**opts, "clip": RECORD[kind][1]["clip"]}


def _grid(bits_clips: dict[int, tuple[float, ...]], lqer: tuple[str, ...], rdo: tuple[str, ...] = ()) -> tuple:
    """Candidate specs: each width with its default clip and each std:K clip, then variants."""
    out = []
    for bits, clips in bits_clips.items():
        row = "" if bits > 4 else ":group=none"  # one scale per row: the std clip is per row
        out.append(f"int{bits}{row}")
        out += [f"int{bits}:clip=std:{k:g}{row}" for k in clips]
    return tuple(out) + lqer + rdo


# Named candidate sets for --fit-formats: bits x SDClip k (std:K, the records' clip) x LQER
# rank x rate-aware rounding. On benchmarks/frontier.py's LM every std:K of "all" was on
# the lower convex hull of (bytes, predicted Δloss) of some of its 37 tensors; plain absmax
# grids rarely were (int6 on 6, int5 on 4).
FORMAT_SETS: dict[str, tuple[str, ...]] = {
    "all": _grid(
        {8: (5, 6, 8, 12), 7: (5, 8, 12), 6: (4, 5, 6, 8, 12), 5: (4, 5, 8, 12), 4: (4, 5, 6, 8, 12)},
        ("int6:clip=std:8:lqer=4", "int5:clip=std:6:lqer=4"),
        ("int6:clip=std:8:rdo=0.1", "int5:clip=std:6:rdo=0.1"),
    ),
    "quick": _grid(
        {8: (6,), 6: (5, 8, 12), 5: (5, 8), 4: (5, 8, 12)},
        ("int6:clip=std:8:lqer=4",),
        ("int5:clip=std:6:rdo=0.1",),
    ),
}
DP_UNITS = 100_000  # knapsack resolution: each tensor's bytes are rounded up to budget / DP_UNITS
MAX_REPAIRS = 6
# A landing this far under the budget is filled: the knapsack runs again with the shortfall
# added (the first landing of the frontier LM's fit was 0.58% under the record's bytes).
FILL_SLACK = 0.002

# (state, policy) -> (qtensors, plan): how the export quantizes (RTN, or GPTQ for the grid formats)
Quantize = Callable[[dict[str, Tensor], ExportPolicy], tuple[dict[str, QTensor], Plan]]
# {name: replacement float tensor} -> loss on the calibration batches
LossFn = Callable[[dict[str, Tensor]], float]


@dataclass
class FitResult:
    """What --fit chose, what it predicted and what the packer measured."""

    policy: ExportPolicy
    data: bytes
    allocation: dict[str, str]  # candidate tensor -> format spec
    predicted_bytes: int
    measured_bytes: int
    budget_bytes: int  # for the artifact alone (the fit's cap minus code and loader)
    predicted_dloss: float
    method: str
    formats: tuple[str, ...]
    bytes_table: dict[str, dict[str, int]] = field(default_factory=dict)
    sensitivity: dict[str, dict[str, float]] = field(default_factory=dict)
    uniform_bytes: dict[str, int] = field(default_factory=dict)  # whole artifact per format

    @property
    def direct(self) -> bool:
        """True when the sensitivities estimate Δloss (direct or Fisher), not the weight-space proxy."""
        return not self.method.startswith("weight-space")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (allocation, predicted vs measured, the method)."""
        return {
            "allocation": self.allocation,
            "predicted_bytes": self.predicted_bytes,
            "measured_bytes": self.measured_bytes,
            "budget_bytes": self.budget_bytes,
            "predicted_dloss": self.predicted_dloss,
            "method": self.method,
            "formats": list(self.formats),
            "uniform_bytes": self.uniform_bytes,
        }

    def lines(self) -> str:
        """The allocation and predicted vs measured size, for people."""
        counts: dict[str, int] = {}
        for spec in self.allocation.values():
            counts[spec] = counts.get(spec, 0) + 1
        width = max((len(n) for n in self.allocation), default=6)
        out = [f"fit: {self.method}"]
        out += [
            f"  {n:<{width}}  {spec:<10} {self.bytes_table[n][spec]:>11,} B  "
            f"{'Δloss' if self.direct else 'proxy'} {self.sensitivity[n][spec]:+.2e}"
            for n, spec in self.allocation.items()
        ]
        out.append(
            "fit: "
            + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
            + f"; predicted {self.predicted_bytes:,} B, measured {self.measured_bytes:,} B "
            f"({(self.measured_bytes / max(self.predicted_bytes, 1) - 1) * 100:+.2f}%), "
            f"budget {self.budget_bytes:,} B for the artifact; "
            + (
                f"predicted Δloss {self.predicted_dloss:+.4f} nats/token"
                if self.direct
                else f"proxy error {self.predicted_dloss:.4g} (weight-space units)"
            )
        )
        return "\n".join(out)


def parse_formats(text: str | None) -> tuple[tuple[str, dict[str, Any]], ...]:
    """``int8,int6,int4:group=128`` -> validated (format, options), widest first as given; a
    name of FORMAT_SETS (``all``, ``quick``) stands for its candidates; ``clip=record`` is
    the record's clip of each tensor's role (ROLE_CLIP)."""
    items = DEFAULT_FORMATS if not text else tuple(s.strip() for s in text.split(","))
    items = tuple(dict.fromkeys(x for item in items for x in FORMAT_SETS.get(item, (item,))))
    specs = tuple(_parse_candidate(s) for s in items)
    if len(specs) < 1:
        raise ConfigError("--fit-formats needs at least one format")
    return specs


def _parse_candidate(text: str) -> tuple[str, dict[str, Any]]:
    """parse_format, with ``clip=record`` (the record's clip of each tensor's role) allowed."""
    from .spec import parse_format

    marker = f":clip={ROLE_CLIP}"
    if marker not in text:
        return parse_format(text, "--fit-formats")
    fmt, opts = parse_format(text.replace(marker, ":clip=std:1"), "--fit-formats")  # the rest validated
    return fmt, {**opts, "clip": ROLE_CLIP}


def _uniform_policy(policy: ExportPolicy, names: list[str], fmt: str, opts: dict) -> ExportPolicy:
    from dataclasses import replace

    fit_rules = tuple(Rule(n, *resolve(n, fmt, opts), FIT_RULE) for n in names)
    return replace(policy, rules=fit_rules + policy.rules)


def _alloc_policy(policy: ExportPolicy, alloc: dict[str, tuple[str, dict]], plan: Plan) -> ExportPolicy:
    """The policy plus one exact rule per tensor whose chosen format differs from the policy's own
    (so that a fit which changes nothing writes the very artifact the policy alone writes)."""
    from dataclasses import replace

    alloc = {n: resolve(n, f, o) for n, (f, o) in alloc.items()}
    fit_rules = tuple(Rule(n, f, o, FIT_RULE) for n, (f, o) in alloc.items() if (f, o) != tuple(plan[n][:2]))
    return replace(policy, rules=fit_rules + policy.rules)


def _pack(
    qts: dict[str, QTensor], plan: Plan, policy: ExportPolicy, metadata: dict, effort: str, state: dict | None = None
) -> tuple[bytes, dict[str, int]]:
    """(artifact bytes, packed bytes per stored tensor) through the real packer; with the
    (unbanked) state, its stacks put back together as the artifact stores them (without it,
    each slice is measured as a tensor of its own)."""
    from ..budget.api import pack_qtensors, read_artifact, tensor_stats
    from .pack import pack_plan

    if state is not None:
        data = pack_plan(state, qts, plan, policy, metadata, effort=effort)
    else:
        data = pack_qtensors(qts, {**metadata, "export": _export(policy, plan)}, effort=effort)
    per: dict[str, int] = {}
    for r in tensor_stats(read_artifact(data).manifest):  # an LQER factor's bytes are its tensor's
        owner = r.get("lowrank_of", r["name"])
        per[owner] = per.get(owner, 0) + int(r["bytes"])
    return data, per


def _export(policy: ExportPolicy, plan: Plan) -> dict:
    from .pack import export_metadata

    return export_metadata(policy, plan)


def default_quantize(state: dict[str, Tensor], policy: ExportPolicy):
    from .pack import quantize

    return quantize(state, policy)


def solve(costs: np.ndarray, losses: np.ndarray, capacity: int) -> list[int] | None:
    """Multiple-choice knapsack: one column per row minimizing Σ losses with Σ costs <= capacity.

    costs, losses: [n, k]; costs are non-negative ints. None when nothing fits.
    """
    n, k = costs.shape
    if capacity < 0 or int(costs.min(axis=1).sum()) > capacity:
        return None
    dp = np.zeros(capacity + 1)
    choice = np.zeros((n, capacity + 1), dtype=np.int16)
    for i in range(n):
        new = np.full(capacity + 1, np.inf)
        for j in range(k):
            c = int(costs[i, j])
            if c > capacity:
                continue
            cand = np.full(capacity + 1, np.inf)
            cand[c:] = dp[: capacity + 1 - c] + losses[i, j]
            better = cand < new
            new[better] = cand[better]
            choice[i, better] = j
        dp = new
    if not np.isfinite(dp[capacity]):
        return None
    picks, b = [0] * n, capacity
    for i in range(n - 1, -1, -1):
        j = int(choice[i, b])
        picks[i] = j
        b -= int(costs[i, j])
    return picks


def calibration_loss_fn(model: nn.Module, batches: list[Tensor]) -> LossFn:
    """Mean next-token cross entropy on training-split windows with some weights swapped in."""
    from ..model.run import summed_loss
    from .banks import unbank

    params = unbank(dict(model.state_dict(keep_vars=False)))  # a stack's slices are views: written in place

    @torch.no_grad()
    def fn(replace: dict[str, Tensor]) -> float:
        saved = {n: params[n].detach().clone() for n in replace}
        try:
            for n, t in replace.items():
                params[n].copy_(t.to(params[n].dtype))
            total, count = 0.0, 0
            for x in batches:
                total += float(summed_loss(model, x[:, :-1], x[:, 1:]))
                count += x[:, 1:].numel()
            return total / max(count, 1)
        finally:
            for n, t in saved.items():
                params[n].copy_(t)

    return fn


def fisher_diagonal(model: nn.Module, batches: list[Tensor], micro: int = 1) -> dict[str, Tensor]:
    """{state-dict name: E[g²]}: squared gradients of the next-token loss over micro-batches.

    The diagonal Fisher estimate of the loss curvature: Δloss of a perturbation δ is
    about ½ Σ F δ². One backward per micro-batch of ``micro`` windows (training split).
    """
    from ..model.run import summed_loss

    named = model.state_dict(keep_vars=True)  # tied weights under each of their names
    params = {n: p for n, p in named.items() if isinstance(p, nn.Parameter) and p.requires_grad}
    acc = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    was_training = model.training
    model.eval()
    count = 0
    try:
        for batch in batches:
            for x in batch.split(micro):
                model.zero_grad(set_to_none=True)
                (summed_loss(model, x[:, :-1], x[:, 1:]) / x[:, 1:].numel()).backward()
                for n, p in params.items():
                    if p.grad is not None:
                        acc[n] += p.grad.detach().float().square()
                count += 1
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    from .banks import unbank

    return unbank({n: a / max(count, 1) for n, a in acc.items()})  # a stack's slices by their names


def fisher_proxy(fisher: Tensor, original: Tensor, approx: Tensor) -> float:
    """½ Σ F (W − Ŵ)²: the second-order estimate of the Δloss of one quantized tensor."""
    d = original.detach().float() - approx.float()
    return 0.5 * float((fisher.reshape(d.shape) * d.square()).sum())


def output_proxy(original: Tensor, approx: Tensor, H: Tensor | None = None) -> float:
    """tr(δ H δᵀ) with δ = W − Ŵ as [rows, cols] and H = Σ xxᵀ of the inputs: the squared error
    of the layer's outputs on the calibration batches; Σ δ² where no H fits."""
    d = (original.detach().float() - approx.float()).reshape(original.shape[0], -1) if original.dim() else None
    if d is None:
        return float((original.detach().float() - approx.float()).square().sum())
    if H is None or H.shape != (d.shape[1], d.shape[1]):
        return float(d.square().sum())
    d = d.double()
    return float(((d @ H.double()) * d).sum())


def weight_proxy(original: Tensor, approx: Tensor) -> float:
    """Relative reconstruction error weighted by size: Σ(W − Ŵ)² / mean(W²)."""
    w = original.detach().float()
    ms = float(w.square().mean())
    return float((w - approx.float()).square().sum()) / ms if ms > 0 else 0.0


@dataclass
class Measured:
    """Steps 1-3 of a fit (candidates, measured bytes, sensitivities): what every budget shares."""

    state: dict[str, Tensor]
    policy: ExportPolicy
    plan: Plan
    formats: tuple
    specs: list[str]
    names: list[str]
    aliases: dict[str, str]
    bytes_table: dict[str, dict[str, int]]
    sensitivity: dict[str, dict[str, float]]
    uniform: dict[str, int]
    fixed_bytes: int
    method: str
    mode: str
    quantize_fn: Quantize
    metadata: dict
    effort: str


def measure(
    state: dict[str, Tensor],
    policy: ExportPolicy,
    *,
    formats=None,
    loss_fn: LossFn | None = None,
    fisher: dict[str, Tensor] | None = None,
    hessians: dict[str, Tensor] | None = None,
    method: str = "",
    quantize_fn: Quantize | None = None,
    metadata: dict | None = None,
    effort: str = "normal",
    embeddings: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Measured:
    """Bytes of every candidate tensor in every format (real packs) and its sensitivity to each.

    ``fisher`` (diagonal Fisher per tensor) gives the second-order sensitivity;
    ``hessians`` ({tensor name: Σ xxᵀ of its inputs}) with ``loss_fn`` give the Hessian
    proxy: tr(δHδᵀ) per candidate, scaled to Δloss by one direct measurement per tensor
    (at its largest proxy), so many candidates (bits x clip x LQER rank) cost one loss
    pass per tensor; else ``loss_fn`` measures the calibration loss with each tensor and
    format swapped in (direct sensitivity); none falls back to the weight-space proxy.
    ``embeddings``: the embeddings are candidates too (they keep the policy's format otherwise).
    """
    from ..quant import dequantize
    from .banks import unbank

    state = unbank(state)  # a stack's slices are candidates of their own
    formats = parse_formats(None) if formats is None else tuple(formats)
    quantize_fn = quantize_fn or default_quantize
    metadata = dict(metadata or {})
    say = progress or (lambda _msg: None)
    plan = policy.plan(state)
    reasons = CANDIDATE_REASONS + ("embedding",) * embeddings
    names = sorted(n for n, (_, _, why) in plan.items() if why in reasons)
    if not names:
        raise ConfigError("--fit: the policy leaves no weight matrix to choose a format for (rules fix them all)")

    # 2. measured bytes of every candidate under every format (one real pack per format), and
    # 3. each tensor's sensitivity to it, measured as the pack is at hand (nothing dequantized
    # is kept beyond one candidate per tensor: 40 candidates of a 22.7M-weight model would be GBs)
    specs = [format_spec(f, o) for f, o in formats]
    uniform: dict[str, int] = {}
    fixed: list[int] = []
    aliases: dict[str, str] = {}  # tied tensors: one QTensor, one choice (the first name's)
    all_names = names
    sens: dict[str, dict[str, float]] = {}
    mode = (
        "fisher"
        if fisher is not None
        else "hessian"
        if hessians is not None and loss_fn is not None
        else "direct"
        if loss_fn is not None
        else "weight"
    )
    base = loss_fn({}) if mode in ("direct", "hessian") else 0.0
    ref: dict[str, tuple[float, Tensor]] = {}  # hessian: each tensor's candidate of largest proxy
    for (fmt, opts), spec in zip(formats, specs, strict=True):
        say(f"fit: packing every candidate as {spec}")
        pol = _uniform_policy(policy, all_names, fmt, opts)
        qts, pplan = quantize_fn(state, pol)
        if names is all_names:  # the first pack: find the tied tensors
            first: dict[int, str] = {}
            for n in all_names:
                aliases.update({n: first[id(qts[n])]} if id(qts[n]) in first else {})
                first.setdefault(id(qts[n]), n)
            names = [n for n in all_names if n not in aliases]
            bytes_table: dict[str, dict[str, int]] = {n: {} for n in names}
            sens = {n: {} for n in names}
        data, per_tensor = _pack(qts, pplan, pol, metadata, effort)
        uniform[spec] = len(data)
        for n in names:
            bytes_table[n][spec] = per_tensor.get(n, 0)
            d = dequantize(qts[n], original_dtype=True)
            if mode == "fisher":
                sens[n][spec] = fisher_proxy(fisher[n], state[n], d)
            elif mode == "hessian":
                sens[n][spec] = output_proxy(state[n], d, hessians.get(n))
                if n not in ref or sens[n][spec] > ref[n][0]:
                    ref[n] = (sens[n][spec], d)
            elif mode == "direct":
                sens[n][spec] = loss_fn({n: d}) - base
            else:
                sens[n][spec] = weight_proxy(state[n], d)
        fixed.append(len(data) - sum(bytes_table[n][spec] for n in names))
    if mode == "hessian":  # proxies to Δloss: one direct measurement per tensor, at its largest proxy
        for i, n in enumerate(names):
            say(f"fit: sensitivity {i + 1}/{len(names)} {n}")
            top, d = ref.pop(n)
            scale = max(loss_fn({n: d}) - base, 0.0) / top if top > 0 else 0.0
            sens[n] = {spec: scale * v for spec, v in sens[n].items()}
    method = (
        method
        or {
            "fisher": "Fisher (½ Σ F δ²) per tensor on training-split calibration batches",
            "hessian": "Hessian proxy tr(δHδᵀ) per tensor and format, scaled by one direct Δloss per tensor "
            "on training-split calibration batches",
            "direct": "direct Δloss per tensor on training-split calibration batches",
            "weight": "weight-space proxy (relative reconstruction error x size): recurnorm cannot evaluate this checkpoint",
        }[mode]
    )
    return Measured(
        state,
        policy,
        plan,
        formats,
        specs,
        names,
        aliases,
        bytes_table,
        sens,
        uniform,
        max(fixed),
        method,
        mode,
        quantize_fn,
        metadata,
        effort,
    )


def fit_budget(
    state: dict[str, Tensor],
    policy: ExportPolicy,
    budget: Budget | int,
    *,
    progress: Callable[[str], None] | None = None,
    measured: Measured | None = None,
    **measure_kw,
) -> FitResult:
    """Choose formats for the candidate tensors so that the artifact fits the budget (a cap
    with its code and loader counted, or a bare number of bytes).

    The candidates are measured first (`measure`, which takes the other keywords) unless
    ``measured`` comes from an earlier fit of the same state and policy: several budgets then
    cost one measurement. OverCapError names the smallest achievable size when even the
    narrowest format is too big.
    """
    m = measured or measure(state, policy, progress=progress, **measure_kw)
    return fit_measured(m, budget, progress=progress)


def fit_measured(m: Measured, budget: Budget | int, *, progress: Callable[[str], None] | None = None) -> FitResult:
    """Steps 4-5 on a measurement: the knapsack under the budget, packed for real."""
    say = progress or (lambda _msg: None)
    budget = budget if isinstance(budget, Budget) else Budget(max_bytes=budget)  # (a bare cap: no code counted)
    avail, code_bytes = budget.artifact_room(), budget.code_total()
    state, policy, plan, formats, specs, names = m.state, m.policy, m.plan, m.formats, m.specs, m.names
    aliases, bytes_table, sens, uniform, fixed_bytes = m.aliases, m.bytes_table, m.sensitivity, m.uniform, m.fixed_bytes
    quantize_fn, metadata, effort, mode, method = m.quantize_fn, m.metadata, m.effort, m.mode, m.method
    smallest = min(uniform.values())
    if smallest > avail:
        narrow = min(uniform, key=uniform.get)
        kept = sorted(n for n, (_, _, why) in plan.items() if why == "embedding")
        raise OverCapError(
            f"--fit {budget.max_bytes:,} is impossible: the smallest achievable artifact is "
            f"{smallest:,} bytes (every candidate tensor at {narrow}) + code {code_bytes:,} = "
            f"{smallest + code_bytes:,} bytes"
            + (
                f"; the embedding keeps {format_spec(*plan[kept[0]][:2])} ({kept[0]}): a rule "
                f"such as -q '{kept[0]}=int6' lets it shrink"
                if kept
                else ""
            ),
            {"smallest_bytes": smallest, "code_bytes": code_bytes},
        )
    # Wider is never predicted worse than narrower (measurement noise), and ties go to the wider.
    order = sorted(range(len(specs)), key=lambda j: -np.mean([bytes_table[n][specs[j]] for n in names]))
    losses = np.zeros((len(names), len(specs)))
    costs_b = np.zeros((len(names), len(specs)), dtype=np.int64)
    for i, n in enumerate(names):
        run = 0.0
        scale = max(abs(v) for v in sens[n].values()) or 1.0
        for rank, j in enumerate(order):
            # Direct measurements are noisy: a narrower format is never predicted better than a
            # wider one. The proxies are smooth and their candidates differ in more than width
            # (a clip or a correction can make a smaller candidate better): taken as they are.
            run = max(run, sens[n][specs[j]], 0.0) if mode == "direct" else max(sens[n][specs[j]], 0.0)
            losses[i, j] = run + 1e-9 * scale * rank
            costs_b[i, j] = bytes_table[n][specs[j]]

    # 4.-5. knapsack, real pack; tighten on a miss, and fill on a landing well under the budget
    # (the fixed part is the largest any measuring pack saw, so the first landing is short)
    target = avail - fixed_bytes
    # The widest everywhere is optimal when it fits: try it first when it is about the budget
    # (metadata differs by a few bytes between the measuring packs and the final one).
    try_widest = uniform[specs[order[0]]] <= avail * 1.005
    best = None  # (predicted loss, data, picks, alloc, policy, predicted bytes) of the best landing
    under = over = None  # the largest target that landed under, the smallest that missed
    for _attempt in range(MAX_REPAIRS + 1):
        unit = max(1, math.ceil(max(target, 1) / DP_UNITS))
        picks = [order[0]] * len(names) if try_widest else solve(-(-costs_b // unit), losses, target // unit)
        if picks is None:
            picks = [order[-1]] * len(names)  # the narrowest everywhere: known to fit
        alloc = {n: formats[j] for n, j in zip(names, picks, strict=True)}
        pol = _alloc_policy(policy, {**alloc, **{a: alloc[t] for a, t in aliases.items()}}, plan)
        qts, pplan = quantize_fn(state, pol)
        data, _ = _pack(qts, pplan, pol, metadata, effort, state)
        predicted = fixed_bytes + int(sum(costs_b[i, j] for i, j in enumerate(picks)))
        say(f"fit: predicted {predicted:,} B, measured {len(data):,} B")
        loss = float(sum(losses[i, j] for i, j in enumerate(picks)))
        if len(data) <= avail and (best is None or loss < best[0]):
            best = (loss, data, picks, alloc, pol, predicted)
        if try_widest:
            if len(data) <= avail:
                break
            try_widest = False
            continue
        if len(data) <= avail:
            if len(data) >= avail * (1 - FILL_SLACK) or picks == [order[0]] * len(names):
                break
            under = target
            step = avail - len(data)
            nxt = target + step if over is None else (target + over) // 2
        else:
            over = target
            miss = len(data) - avail + max(64, len(data) // 5000)
            nxt = target - miss if under is None else (target + under) // 2
        if nxt == target:
            break
        target = nxt
    if best is None:
        raise OverCapError(
            f"--fit {budget.max_bytes:,}: could not land under the budget after "
            f"{MAX_REPAIRS} tries (last {len(data) + code_bytes:,} bytes)"
        )
    _, data, picks, alloc, pol, predicted = best
    return FitResult(
        policy=pol,
        data=data,
        allocation={n: format_spec(*alloc[n]) for n in names},
        predicted_bytes=predicted,
        measured_bytes=len(data),
        budget_bytes=avail,
        predicted_dloss=float(sum(sens[n][specs[j]] for n, j in zip(names, picks, strict=True))),
        method=method,
        formats=tuple(specs),
        bytes_table=bytes_table,
        sensitivity=sens,
        uniform_bytes=uniform,
    )
