"""``plan --like CKPT``: any checkpoint's shapes scaled in width, depth and vocabulary, and the
artifact the scaled model would pack to under a policy.

The shapes, from the tensors alone (any names, grouped-query attention included):

- width ``d``: the token embedding's columns (else the commonest dimension of the matrices);
  every dimension that is a multiple of d/8 (d, 2d, 4d, the KV width d·kv/heads) scales with
  it, so heads keep their count and their width grows;
- vocabulary: the embedding's rows, in tensors named like embeddings (``tok_emb``,
  ``lm_head``, ``word_embeddings``, ...) only: the baseline's vocab of 1024 = 2d is no width;
- depth: the numbered blocks (``blocks.N.``, ``encoder.layer.N.``, ``h.N.``); block i of the
  scaled model copies block ``i·L/L'`` of the checkpoint, and a tensor outside the blocks whose
  first dimension is L or L/2 (the baseline's ``skip_weights``) follows the depth.

The sizes, from the checkpoint itself: it is packed under the policy (the artifact ``recurnorm
pack`` writes), and each scaled tensor takes its source tensor's measured code bytes per
element and side bytes per scale (per row, per group or per tensor); the manifest costs what
it cost per tensor. A tensor the policy gives another format at its new size (a vector grown
past the small-vector limit) is measured in that format by one more pack of its source.

One correction: a format with one scale per row codes a longer row more cheaply, since its
largest value (the scale) grows with the row's length while most values do not (weights are
heavy-tailed; on baseline-shaped weights at int6 a row of 512 costs ~6% fewer bits per code
than one of 256). The source's rows cut to a random half of their columns, and whole, give
the change of the codes' order-0 entropy per doubling of the row; it scales the measured
code bytes (a narrower model's rows are measured directly, on random column subsets).
And a larger tensor pays for its contexts' tables with more codes: packed bytes over order-0
fell 1-2% from 131K to 524K baseline-shaped codes. A quarter of each tensor (half its rows
and columns) is packed once; the change of that ratio from the quarter to the whole, per
doubling, is carried on to the grown tensor.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..budget.cap import Budget
from ..errors import ConfigError
from .plan import MAX_DEPTH, SizePlan, largest_fitting
from .policy import FIT_RULE, ExportPolicy, Rule, format_spec, name_matches

_NUMBERED = re.compile(r"^(.*?)(\d+)\.(.+)$")
MAX_WIDTH = 65_536
# Tensors this small are not cut to quarters: their tables, not their contexts, set the ratio.
QUARTER_MIN = 4096
# The packer's gain over order-0 per doubling of a tensor, at most (measured 0.5-1.8% on
# baseline-shaped tensors from 65K to 524K codes).
MAX_GAIN_PER_DOUBLING = 0.03
ROW_SAMPLE = 1 << 18  # values per row length drawn for the row-length correction (~0.1% noise)


@dataclass(frozen=True)
class Shape:
    """What --like scales: width, depth (and the blocks' name prefix), vocabulary."""

    d_model: int
    depth: int
    vocab_size: int | None
    prefix: str | None  # "blocks." — the numbered blocks; None when there are none

    def line(self) -> str:
        vocab = "no embedding" if self.vocab_size is None else f"vocab {self.vocab_size}"
        blocks = f"{self.prefix}N" if self.prefix else "no numbered blocks"
        return f"d_model {self.d_model}, depth {self.depth} ({blocks}), {vocab}"


def infer_shape(state: dict[str, Tensor], policy: ExportPolicy) -> Shape:
    """Width, depth and vocabulary of a state dict (see the module docstring)."""
    emb = [t for n, t in state.items() if t.dim() == 2 and name_matches(n, policy.embedding_names)]
    if emb and min(emb[0].shape) > 0:
        vocab, d = (int(x) for x in emb[0].shape)
    else:
        dims = Counter(int(x) for t in state.values() if t.dim() == 2 for x in t.shape if x > 0)
        if not dims:
            raise ConfigError("plan --like: the checkpoint holds no matrix to take a width from")
        vocab, d = None, dims.most_common(1)[0][0]
    indices: dict[str, set[int]] = {}
    for name in state:
        m = _NUMBERED.match(name)
        if m:
            indices.setdefault(m[1], set()).add(int(m[2]))
    prefix = max(indices, key=lambda p: (len(indices[p]), p), default=None)
    depth = max(indices[prefix]) + 1 if prefix is not None else 1
    return Shape(d, depth, vocab, prefix)


def _scale_dim(v: int, src: Shape, d: int) -> int:
    """A width-proportional dimension (a multiple of d/8) at the new width; others as they are."""
    if (8 * v) % src.d_model == 0:
        return v * d // src.d_model
    return v


def scaled_names(state: dict[str, Tensor], src: Shape, depth: int) -> dict[str, str]:
    """{scaled tensor name: the checkpoint tensor it copies}."""
    out: dict[str, str] = {}
    for name in state:
        m = _NUMBERED.match(name)
        if src.prefix is None or m is None or m[1] != src.prefix:
            out[name] = name
    if src.prefix is not None:
        for i in range(depth):
            j = i * src.depth // depth
            for name in state:
                m = _NUMBERED.match(name)
                if m is not None and m[1] == src.prefix and int(m[2]) == j:
                    out[f"{src.prefix}{i}.{m[3]}"] = name
    return out


def scaled_shape(name: str, t: Tensor, src: Shape, target: Shape, policy: ExportPolicy) -> tuple[int, ...]:
    """The shape a tensor takes in the scaled model."""
    shape = list(t.shape)
    is_embedding = t.dim() == 2 and name_matches(name, policy.embedding_names)
    in_blocks = src.prefix is not None and name.startswith(src.prefix) and _NUMBERED.match(name) is not None
    for j, v in enumerate(shape):
        if is_embedding and j == 0 and v == src.vocab_size and target.vocab_size is not None:
            shape[j] = target.vocab_size
        elif j == 0 and not in_blocks and t.dim() >= 2 and v in (src.depth, src.depth // 2) and v != src.d_model:
            shape[j] = target.depth if v == src.depth else target.depth // 2
        else:
            shape[j] = _scale_dim(v, src, target.d_model)
    return tuple(shape)


class LikePlanner:
    """A checkpoint measured once under a policy; predictions for any width, depth and vocabulary."""

    def __init__(self, state: dict[str, Tensor], policy: ExportPolicy, source: str = "checkpoint"):
        from .pack import _dedupe

        self.source = source
        self.policy = policy
        self.unique, self.aliases = _dedupe(state)
        self.shape = infer_shape(self.unique, policy)
        # the smallest width step that keeps every width-proportional dimension whole
        d0 = self.shape.d_model
        self.width_step = d0 // math.gcd(d0, *(v for t in self.unique.values() for v in t.shape if (8 * v) % d0 == 0))
        self._measured: dict[tuple[str, str], dict[str, Any]] = {}
        self._row_factor: dict[tuple[str, str, int], float] = {}
        self._measure(self.unique, policy, own=True)
        self._context_gain = self._measure_quarters()

    def _measure(self, state: dict[str, Tensor], policy: ExportPolicy, own: bool = False) -> None:
        """Pack state under policy; keep each tensor's code and side bytes (and, own, the overhead)."""
        from ..budget.api import read_artifact, tensor_stats
        from .pack import pack_state

        data = pack_state(state, policy, {"quant": policy.quantizer, "source": self.source})
        art = read_artifact(data)
        rows = tensor_stats(art.manifest, art.qtensors)
        plan = policy.plan(state)
        for row in rows:
            if "alias_of" in row:
                continue
            qt = art.qtensors[row["name"]]
            n_scales = 0 if qt.scales is None else int(qt.scales.size)
            key = (row["name"], format_spec(*plan[row["name"]][:2]))
            self._measured[key] = {**row, "n_scales": n_scales}
        if own:
            self.packed_bytes = len(data)
            stored = sum(r["bytes"] for r in rows)
            self.overhead_per_entry = (len(data) - stored) / max(len(rows), 1)

    def target(self, d_model: int | None = None, depth: int | None = None, vocab_size: int | None = None) -> Shape:
        """The scaled shape; ConfigError on a width the checkpoint's dimensions cannot follow."""
        s = self.shape
        d = s.d_model if d_model is None else d_model
        if not 1 <= d <= MAX_WIDTH:
            raise ConfigError(f"plan --like: width {d} out of range (1..{MAX_WIDTH})")
        if d % self.width_step:
            raise ConfigError(
                f"plan --like: width {d} would give the checkpoint's {s.d_model}-proportional dimensions "
                f"fractional sizes; use a multiple of {self.width_step}"
            )
        if depth is not None and s.prefix is None and depth != s.depth:
            raise ConfigError("plan --like: the checkpoint has no numbered blocks (blocks.N.) to change the depth of")
        if vocab_size is not None and s.vocab_size is None:
            raise ConfigError("plan --like: the checkpoint has no embedding to change the vocabulary of")
        return Shape(
            d, s.depth if depth is None else depth, s.vocab_size if vocab_size is None else vocab_size, s.prefix
        )

    def predict(self, target: Shape, budget: Budget | None = None) -> SizePlan:
        """The predicted artifact of the scaled checkpoint under the policy, code counted."""
        src = self.shape
        names = scaled_names(self.unique, src, target.depth)
        meta = {
            n: torch.empty(scaled_shape(s, t, src, target, self.policy), dtype=t.dtype, device="meta")
            for n, s in names.items()
            for t in [self.unique[s]]
        }
        plan = self.policy.plan(meta)
        self._measure_missing({n: (names[n], format_spec(*plan[n][:2]), plan[n]) for n in names})
        formats: dict[str, dict[str, Any]] = {}
        total = 0.0
        for n, s in names.items():
            spec = format_spec(*plan[n][:2])
            m = self._measured[(s, spec)]
            numel, old = meta[n].numel(), self.unique[s]
            grow = numel / max(old.numel(), 1)
            side = m.get("side_bytes", 0)
            if m["n_scales"] > 1 and old.dim() >= 1 and m["n_scales"] == old.shape[0]:
                side = side * meta[n].shape[0] / old.shape[0]  # one scale per row
            elif m["n_scales"] > 1:
                side = side * grow  # one per group
            codes = m.get("codes_bytes", m["bytes"]) * grow
            if m["n_scales"] > 1 and m["n_scales"] == old.shape[0] and old.dim() >= 2:
                codes *= self._row_length_factor(s, plan[n][:2], numel // meta[n].shape[0])
            if spec == format_spec(*self.policy.choose(s, old)[:2]):
                codes *= self._gain_factor(s, grow)
            nbytes = codes + side
            total += nbytes
            f = formats.setdefault(plan[n][0], {"weights": 0, "bytes": 0.0})
            f["weights"] += numel
            f["bytes"] += nbytes
        n_aliases = len(self.aliases) * (len(names) / max(len(self.unique), 1))
        total += self.overhead_per_entry * (len(names) + n_aliases)
        for f in formats.values():
            f["bytes"] = round(f["bytes"])
            f["bits_per_weight"] = f["bytes"] * 8 / max(f["weights"], 1)
        config = {
            "like": self.source,
            "d_model": target.d_model,
            "depth": target.depth,
            "vocab_size": target.vocab_size,
            "source": {"d_model": src.d_model, "depth": src.depth, "vocab_size": src.vocab_size},
        }
        weights = sum(t.numel() for t in meta.values())
        basis = (
            f"--like {self.source} ({src.line()}; {sum(t.numel() for t in self.unique.values()):,} parameters) "
            f"scaled to d_model {target.d_model}, depth {target.depth}, vocab {target.vocab_size}: "
            f"{weights:,} parameters"
        )
        result = SizePlan(
            config, self.policy.summary(plan), round(total), self.packed_bytes, formats=formats, basis=basis
        )
        return result.counted(budget or Budget())

    def _measure_quarters(self) -> dict[str, float]:
        """{tensor: packed/order-0 of its codes on a quarter of it (half its rows and columns,
        at random)}: with the whole tensor's ratio, how the packer's context gain grows with size."""
        import numpy as np

        rng = np.random.default_rng(1)
        own = self.policy.plan(self.unique)
        quarters, rules = {}, []
        for name, t in self.unique.items():
            spec = format_spec(*own[name][:2])
            m = self._measured.get((name, spec))
            if t.dim() != 2 or t.numel() < QUARTER_MIN or not m or not m.get("order0_bytes"):
                continue
            r, c = (torch.from_numpy(np.sort(rng.permutation(n)[: n // 2])) for n in t.shape)
            quarters[name] = t[r][:, c].contiguous()
            rules.append(Rule(name, *own[name][:2], FIT_RULE))
        if not quarters:
            return {}
        from ..budget.api import read_artifact, tensor_stats
        from .pack import pack_state

        pol = replace(self.policy, rules=tuple(rules) + self.policy.rules)
        art = read_artifact(pack_state(quarters, pol, {}))
        out = {}
        for row in tensor_stats(art.manifest, art.qtensors):
            whole = self._measured[(row["name"], format_spec(*own[row["name"]][:2]))]
            if row.get("order0_bytes"):
                out[row["name"]] = (
                    row["codes_bytes"] / row["order0_bytes"],
                    whole["codes_bytes"] / whole["order0_bytes"],
                )
        return out

    def _gain_factor(self, src: str, grow: float) -> float:
        """How much better the packer codes the tensor grown by `grow` than the tensor itself
        (relative to order-0): the change from a quarter to the whole, per doubling, carried on."""
        import math

        if grow <= 1.0 or src not in self._context_gain:
            return 1.0
        quarter, whole = self._context_gain[src]
        per_doubling = min(max((quarter - whole) / 2, 0.0), MAX_GAIN_PER_DOUBLING)
        return max(whole - per_doubling * math.log2(grow), 0.5 * whole) / whole

    def _row_length_factor(self, src: str, fmt_opts: tuple, new_len: int) -> float:
        """Code bits of rows new_len long / of the source's rows, under a per-row format:
        shorter rows are the source's own rows on a random subset of their columns; longer
        ones extrapolate the change from half rows to whole rows, per doubling."""
        import math

        import numpy as np

        from ..budget.rans import order0_bits
        from ..quant import get

        t = self.unique[src].detach().float().reshape(self.unique[src].shape[0], -1)
        old_len = t.shape[1]
        key = (src, format_spec(*fmt_opts), new_len)
        if new_len == old_len or old_len < 4:
            return 1.0
        if key not in self._row_factor:
            rng = np.random.default_rng(0)
            rows = t[torch.from_numpy(rng.permutation(t.shape[0])[: max(16, ROW_SAMPLE // old_len)])]
            quantizer = get(fmt_opts[0], **fmt_opts[1])

            def bits(length: int) -> float:
                cols = torch.from_numpy(rng.random(tuple(rows.shape)).argsort(axis=1)[:, :length].copy())
                x = rows if length == old_len else torch.gather(rows, 1, cols)
                return order0_bits(quantizer.quantize(x).codes) / max(x.numel(), 1)

            whole = bits(old_len)
            if new_len < old_len:
                new = bits(new_len)
            else:
                new = whole + (whole - bits(old_len // 2)) * math.log2(new_len / old_len)
            self._row_factor[key] = new / whole if whole > 0 else 1.0
        return self._row_factor[key]

    def _measure_missing(self, wanted: dict[str, tuple[str, str, tuple]]) -> None:
        """Pack the source tensors the scaled plan gives a format they were not measured in."""
        todo: dict[str, tuple] = {}
        for src, spec, (fmt, opts, _) in wanted.values():
            if (src, spec) not in self._measured and src not in todo:
                todo[src] = (fmt, opts)
        while todo:
            rules = tuple(Rule(n, f, o, FIT_RULE) for n, (f, o) in todo.items())
            pol = replace(self.policy, rules=rules + self.policy.rules)
            self._measure({n: self.unique[n] for n in todo}, pol)
            todo = {}
            for src, spec, (fmt, opts, _) in wanted.values():
                if (src, spec) not in self._measured and src not in todo:
                    todo[src] = (fmt, opts)

    def fit(self, budget: Budget, base: Shape, vary: str = "d_model", n_heads: int | None = None) -> SizePlan:
        """The largest width (a multiple of 8·n_heads, or of 64: head widths stay multiples of 8)
        or depth whose artifact + code fits, the other sizes as in ``base``."""
        sizes = {"d_model": base.d_model, "depth": base.depth, "vocab_size": base.vocab_size}

        def plan_of(v: int) -> SizePlan:
            return self.predict(self.target(**{**sizes, vary: v}), budget)

        if vary == "depth":
            if self.shape.prefix is None:
                raise ConfigError("plan --like --vary depth: the checkpoint has no numbered blocks")
            return largest_fitting(plan_of, budget, vary, 1, MAX_DEPTH)
        step = math.lcm(8 * n_heads if n_heads else 64, self.width_step)
        return largest_fitting(plan_of, budget, vary, step, MAX_WIDTH - MAX_WIDTH % step)


def plan_like(
    ckpt: str | Path,
    policy: ExportPolicy,
    budget: Budget | None = None,
    *,
    d_model: int | None = None,
    depth: int | None = None,
    vocab_size: int | None = None,
    fit: Budget | None = None,
    vary: str = "d_model",
    n_heads: int | None = None,
) -> tuple[SizePlan, list[str]]:
    """(plan, notes) for a checkpoint scaled as asked, or (``fit``) the largest that fits."""
    from .pack import load_state

    state, config, notes = load_state(ckpt)
    policy.check_rules(state, str(ckpt))
    planner = LikePlanner(state, policy, Path(ckpt).name)
    if n_heads is None and isinstance(config, dict):
        n_heads = next(
            (config[k] for k in ("n_heads", "num_attention_heads", "n_head") if isinstance(config.get(k), int)), None
        )
    if fit is not None:
        if (vary == "d_model" and d_model is not None) or (vary == "depth" and depth is not None):
            raise ConfigError(f"plan --like --fit finds the {vary}: give the other sizes only")
        base = Shape(d_model or planner.shape.d_model, depth or planner.shape.depth, vocab_size, planner.shape.prefix)
        return planner.fit(fit, base, vary, n_heads), notes
    return planner.predict(planner.target(d_model, depth, vocab_size), budget), notes
