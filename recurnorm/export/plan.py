"""The size planner: what artifact a model config would pack to, before training it.

A freshly initialized model of the config is packed through the real packer
under the policy: that is exact for everything training does not change
(scales' layout, control tensors, codec side data, the manifest). Trained
weights code to a few percent more bytes than their init, so each quantized
tensor's *code* bytes are scaled by the ratio measured for its format on
trained checkpoints (``TRAINED_CODE_RATIO``), and float passthrough tensors
(controls initialized to exactly 1.0, which compress to nothing) are counted
at the fraction of their raw bytes trained ones take (``PASSTHROUGH_FILL``);
both from benchmarks/plan_calibration.py.
The result is bits per weight per format and the predicted artifact size;
``fit_size`` searches the largest width (or depth) whose prediction fits.
It is the one size estimate: ``recurnorm plan`` prints it, ``recurnorm train``
prints its one-line form when training starts, and ``--match-bytes`` matches on it.
``like.py`` predicts the same for any checkpoint's shapes scaled (``plan --like``).
Code is counted against the cap by the one count, ``budget.cap.Budget``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..budget.cap import DEFAULT_MAX_BYTES, Budget
from ..errors import ConfigError
from ..quant.passthrough import FLOAT_FORMATS
from ..quant.registry import ITEMSIZE
from .policy import ExportPolicy

# Code bytes of trained weights / code bytes of the same config's fresh init, per format:
# median over shared, norm, norm_gate, unique at d=64 and 96 (depth 3, 200 steps), measured
# with `benchmarks/plan_calibration.py --steps 200`. Formats not listed: 1.0.
TRAINED_CODE_RATIO = {"int8": 1.0020, "int7": 1.0022, "int6": 1.0021, "int5": 1.0024, "int4": 1.0004, "ternary": 0.9910}
# A byte-level token embedding apart (same script, vocab 256): the rows of bytes the corpus never
# shows (most of them, on English text) drift together in training, and the packer predicts each
# from the row above (budget/parents.py), so it codes well under its fresh init. A subword
# vocabulary's rows are nearly all trained: the ratio above (measured on byte vocabularies only).
TRAINED_EMBED_RATIO = {"int8": 0.9172}
EMBED = "embed.weight"
# Trained float controls (gains start at exactly 1.0 and compress to nothing) store at about
# this fraction of their raw bytes; measured by the same script (fp32 rows; fp16/bf16 assumed alike).
PASSTHROUGH_FILL = dict.fromkeys(FLOAT_FORMATS, 0.69)
PASSTHROUGH_ITEMSIZE = {name: ITEMSIZE[dtype] for name, (dtype, _) in FLOAT_FORMATS.items()}
MAX_D_MODEL = 8192
MAX_DEPTH = 256


@dataclass
class SizePlan:
    """A config's predicted artifact: total, per format (weights, bytes, bits/weight), inputs."""

    config: dict
    policy: str
    predicted_bytes: int
    fresh_bytes: int  # what the prediction grew from, as packed: the fresh init (or, --like, the checkpoint)
    code_bytes: int = 0  # --code files and --loader counted with it
    formats: dict[str, dict[str, Any]] = field(default_factory=dict)
    basis: str = ""  # what was planned, for people (the config, or the checkpoint and its scaling)
    cap: dict = field(default_factory=dict)  # Budget.report of the prediction (the one count)

    @property
    def total_bytes(self) -> int:
        """Predicted artifact plus code."""
        return self.predicted_bytes + self.code_bytes

    def counted(self, budget: Budget) -> SizePlan:
        """This plan with its code counted by the budget (the same count pack and verify use)."""
        self.cap = {k: v for k, v in budget.report(self.predicted_bytes).items() if k != "tensors"}
        self.code_bytes = self.cap["code_bytes"]
        return self

    @property
    def weights(self) -> int:
        """Elements stored, over every format."""
        return sum(row["weights"] for row in self.formats.values())

    def line(self, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
        """The plan in one line, as a share of the cap (what training prints when it starts)."""
        return (
            f"{self.weights:,} parameters; predicted artifact {self.total_bytes / 1e6:.2f} MB = "
            f"{100 * self.total_bytes / max_bytes:.1f}% of the {max_bytes:,}-byte cap "
            "(`recurnorm plan` details it; `recurnorm pack` gives the real size)"
        )

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {**asdict(self), "total_bytes": self.total_bytes}

    def lines(self) -> str:
        """The plan for people."""
        c = self.config
        basis = self.basis or (
            f"scheme {c['scheme']}, d_model {c['d_model']}, depth {c['depth']}, vocab {c['vocab_size']}"
        )
        out = [
            f"plan: {basis}",
            self.policy,
            f"  {'format':<10} {'weights':>12} {'bytes':>12} {'bits/w':>7}",
        ]
        for fmt, row in sorted(self.formats.items(), key=lambda kv: -kv[1]["bytes"]):
            out.append(f"  {fmt:<10} {row['weights']:>12,} {row['bytes']:>12,} {row['bits_per_weight']:>7.3f}")
        grew = "the checkpoint itself packs to" if self.basis else "fresh init packs to"
        out.append(
            f"predicted artifact {self.predicted_bytes:,} B ({grew} {self.fresh_bytes:,} B) "
            f"+ code {self.code_bytes:,} = {self.total_bytes:,} B"
            + (f" of {self.cap['max_bytes']:,}; headroom {self.cap['headroom_bytes']:,}" if self.cap else "")
        )
        return "\n".join(out)


def predict_size(config, policy, budget: Budget | None = None, seed: int = 0) -> SizePlan:
    """The predicted artifact of a model config (a ModelConfig or its dict) under a policy,
    with the budget's code counted.

    ``policy`` is an ExportPolicy or a function of the model giving one (the
    roundtrip's policy reads the model's own control names).
    """
    import torch

    from ..budget.api import read_artifact, tensor_stats
    from ..model import ModelConfig, RecurrentLM, state_dict_for_export
    from .pack import pack_state

    cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(dict(config))
    cfg.validate()
    torch.manual_seed(seed)
    model = RecurrentLM(cfg)
    if not isinstance(policy, ExportPolicy):
        policy = policy(model)
    data = pack_state(state_dict_for_export(model), policy, {"config": cfg.to_dict()})
    art = read_artifact(data)
    formats: dict[str, dict[str, Any]] = {}
    extra = 0.0
    for row in tensor_stats(art.manifest, art.qtensors):
        if "alias_of" in row:
            continue
        fmt = row["format"]
        if fmt in PASSTHROUGH_FILL:
            grown = max(row["bytes"], PASSTHROUGH_FILL[fmt] * PASSTHROUGH_ITEMSIZE[fmt] * row["numel"])
        else:
            ratio = TRAINED_EMBED_RATIO if row["name"] == EMBED and cfg.vocab_size <= 256 else TRAINED_CODE_RATIO
            grown = row["bytes"] + (ratio.get(fmt, 1.0) - 1.0) * row["codes_bytes"]
        extra += grown - row["bytes"]
        f = formats.setdefault(row["format"], {"weights": 0, "bytes": 0.0})
        f["weights"] += row["numel"]
        f["bytes"] += grown
    for f in formats.values():
        f["bytes"] = round(f["bytes"])
        f["bits_per_weight"] = f["bytes"] * 8 / max(f["weights"], 1)
    plan = SizePlan(cfg.to_dict(), policy.summary(), round(len(data) + extra), len(data), formats=formats)
    return plan.counted(budget or Budget())


def fit_size(config: dict, policy, budget: Budget, *, vary: str = "d_model") -> SizePlan:
    """The plan of the largest d_model (a multiple of 2·n_heads) or depth whose total fits the budget."""
    if vary not in ("d_model", "depth"):
        raise ConfigError(f"plan --vary must be d_model or depth, got {vary!r}")
    step = 2 * int(config.get("n_heads", 4)) if vary == "d_model" else 1
    limit = MAX_D_MODEL - MAX_D_MODEL % step if vary == "d_model" else MAX_DEPTH
    return largest_fitting(lambda v: predict_size({**config, vary: v}, policy, budget), budget, vary, step, limit)


def largest_fitting(plan_of: Callable[[int], SizePlan], budget: Budget, vary: str, step: int, limit: int) -> SizePlan:
    """The plan of the largest multiple of step (up to limit) whose artifact + code fits the budget;
    sizes grow with width and depth, so a doubling search then a bisection."""
    cache: dict[int, SizePlan] = {}

    def plan(v: int) -> SizePlan:
        if v not in cache:
            cache[v] = plan_of(v)
        return cache[v]

    def fits(v: int) -> bool:
        return not plan(v).cap["over_cap"]

    if not fits(step):
        raise ConfigError(
            f"plan --fit {budget.max_bytes:,}: even {vary} {step} needs {plan(step).total_bytes:,} bytes with code"
        )
    lo, hi = step, step * 2  # lo fits; search for a hi that does not
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + step)
    while hi - lo > step:
        mid = (lo + hi) // 2
        mid -= mid % step
        if mid <= lo:
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return plan(lo)
