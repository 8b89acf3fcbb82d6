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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..budget.cap import DEFAULT_MAX_BYTES
from ..errors import ConfigError
from .policy import ExportPolicy

# Code bytes of trained weights / code bytes of the same config's fresh init, per format:
# median over shared, norm, norm_gate, unique at d=64 and 96 (depth 3, 200 steps), measured
# with `benchmarks/plan_calibration.py --steps 200`. Formats not listed: 1.0.
TRAINED_CODE_RATIO = {"int8": 1.0061, "int7": 1.0027, "int6": 1.0022, "int5": 1.0026, "int4": 0.9998, "ternary": 0.9902}
# Trained float controls (gains start at exactly 1.0 and compress to nothing) store at about
# this fraction of their raw bytes; measured by the same script (fp32 rows; fp16/bf16 assumed alike).
PASSTHROUGH_FILL = {"fp32": 0.79, "fp16": 0.79, "bf16": 0.79}
PASSTHROUGH_ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}
MAX_D_MODEL = 8192
MAX_DEPTH = 256


@dataclass
class SizePlan:
    """A config's predicted artifact: total, per format (weights, bytes, bits/weight), inputs."""

    config: dict
    policy: str
    predicted_bytes: int
    fresh_bytes: int  # the fresh init's artifact, as packed
    code_bytes: int = 0  # --code files counted with it
    formats: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """Predicted artifact plus code."""
        return self.predicted_bytes + self.code_bytes

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
        out = [
            f"plan: scheme {c['scheme']}, d_model {c['d_model']}, depth {c['depth']}, "
            f"vocab {c['vocab_size']}; {self.policy}",
            f"  {'format':<10} {'weights':>12} {'bytes':>12} {'bits/w':>7}",
        ]
        for fmt, row in sorted(self.formats.items(), key=lambda kv: -kv[1]["bytes"]):
            out.append(f"  {fmt:<10} {row['weights']:>12,} {row['bytes']:>12,} {row['bits_per_weight']:>7.3f}")
        out.append(
            f"predicted artifact {self.predicted_bytes:,} B (fresh init packs to "
            f"{self.fresh_bytes:,} B) + code {self.code_bytes:,} = {self.total_bytes:,} B"
        )
        return "\n".join(out)


def predict_size(config, policy, code_bytes: int = 0, seed: int = 0) -> SizePlan:
    """The predicted artifact of a model config (a ModelConfig or its dict) under a policy.

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
            grown = row["bytes"] + (TRAINED_CODE_RATIO.get(fmt, 1.0) - 1.0) * row["codes_bytes"]
        extra += grown - row["bytes"]
        f = formats.setdefault(row["format"], {"weights": 0, "bytes": 0.0})
        f["weights"] += row["numel"]
        f["bytes"] += grown
    for f in formats.values():
        f["bytes"] = round(f["bytes"])
        f["bits_per_weight"] = f["bytes"] * 8 / max(f["weights"], 1)
    return SizePlan(cfg.to_dict(), policy.summary(), round(len(data) + extra), len(data), code_bytes, formats)


def fit_size(config: dict, policy, max_bytes: int, *, vary: str = "d_model", code_bytes: int = 0) -> SizePlan:
    """The plan of the largest d_model (a multiple of 2·n_heads) or depth whose total fits max_bytes."""
    if vary not in ("d_model", "depth"):
        raise ConfigError(f"plan --vary must be d_model or depth, got {vary!r}")
    step = 2 * int(config.get("n_heads", 4)) if vary == "d_model" else 1
    limit = MAX_D_MODEL - MAX_D_MODEL % step if vary == "d_model" else MAX_DEPTH
    cache: dict[int, SizePlan] = {}

    def plan(v: int) -> SizePlan:
        if v not in cache:
            cache[v] = predict_size({**config, vary: v}, policy, code_bytes)
        return cache[v]

    if plan(step).total_bytes > max_bytes:
        raise ConfigError(f"plan --fit {max_bytes:,}: even {vary} {step} needs {plan(step).total_bytes:,} bytes")
    lo, hi = step, step * 2  # lo fits; search for a hi that does not
    while hi <= limit and plan(hi).total_bytes <= max_bytes:
        lo, hi = hi, hi * 2
    hi = min(hi, limit + step)
    while hi - lo > step:  # bytes grow with width and depth: bisect on the grid of steps
        mid = (lo + hi) // 2
        mid -= mid % step
        if mid <= lo:
            break
        lo, hi = (mid, hi) if plan(mid).total_bytes <= max_bytes else (lo, mid)
    return plan(lo)
