"""Byte matching: pick each scheme's width so its artifact lands near a byte target.

Comparing schemes at equal width favours the ones that spend more bytes
(unique stores S blocks). With ``--match-bytes N`` each scheme gets the width
d (a multiple of 2·n_heads, so heads stay even for rotary positions) whose
artifact under the first quantizer is closest to N. The estimate is the
size planner's (recurnorm.export.plan: a freshly initialized model through the
real packer, which counts scales, codec side data and the manifest, with the
growth training brings measured on trained checkpoints), and the roundtrip
then checks the trained model's artifact against the same ±3% band.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import ConfigError

TOLERANCE = 0.03
MAX_D_MODEL = 8192


@dataclass
class WidthMatch:
    """The width chosen for one scheme and how close its fresh artifact lands."""

    scheme: str
    d_model: int
    estimated_bytes: int
    target_bytes: int
    within_tolerance: bool
    actual_bytes: int | None = None  # the trained model's artifact, filled in by the roundtrip

    @property
    def deviation(self) -> float:
        """(bytes − target) / target, from the actual artifact when known."""
        got = self.actual_bytes if self.actual_bytes is not None else self.estimated_bytes
        return (got - self.target_bytes) / self.target_bytes

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return {**asdict(self), "deviation": self.deviation}


def fresh_artifact_bytes(config: dict, quant: str, seed: int = 0, quant_options: dict | None = None) -> int:
    """The planner's predicted artifact bytes for this config after training (recurnorm.export.plan)."""
    from ..export.plan import predict_size
    from .exported import export_policy

    return predict_size(
        config, lambda m: export_policy(m, quant, quant_options=quant_options), seed=seed
    ).predicted_bytes


def match_width(
    config: dict, quant: str, target_bytes: int, tolerance: float = TOLERANCE, quant_options: dict | None = None
) -> WidthMatch:
    """The width (multiple of 2·n_heads) whose fresh artifact is closest to target_bytes."""
    if not isinstance(target_bytes, int) or target_bytes < 1:
        raise ConfigError(f"match_bytes must be a positive int, got {target_bytes!r}")
    step = 2 * int(config.get("n_heads", 4))
    cache: dict[int, int] = {}

    def size(d: int) -> int:
        if d not in cache:
            cache[d] = fresh_artifact_bytes({**config, "d_model": d}, quant, quant_options=quant_options)
        return cache[d]

    # Exponential search for an upper bound, then bisection: bytes grow with d.
    lo, hi = step, step
    while size(hi) < target_bytes:
        lo, hi = hi, hi * 2
        if hi > MAX_D_MODEL:
            hi = MAX_D_MODEL - MAX_D_MODEL % step
            if size(hi) < target_bytes:
                raise ConfigError(
                    f"scheme {config.get('scheme')!r} needs d_model > {hi} to reach "
                    f"{target_bytes:,} bytes under {quant}"
                )
            break
    while hi - lo > step:
        mid = (lo + hi) // 2
        mid -= mid % step
        if size(mid) < target_bytes:
            lo = mid
        else:
            hi = mid
    best = min((lo, hi), key=lambda d: abs(size(d) - target_bytes))
    est = size(best)
    return WidthMatch(
        scheme=str(config.get("scheme")),
        d_model=best,
        estimated_bytes=est,
        target_bytes=target_bytes,
        within_tolerance=abs(est - target_bytes) <= tolerance * target_bytes,
    )


def match_widths(
    configs: dict[str, dict], quant: str, target_bytes: int, quant_options: dict | None = None
) -> dict[str, WidthMatch]:
    """match_width for every scheme's base config."""
    return {s: match_width(c, quant, target_bytes, quant_options=quant_options) for s, c in configs.items()}


# A lora adapter of rank d is no longer low rank; the search stops there.
MAX_RANK = 256


@dataclass
class RankMatch:
    """lora's rank chosen so its artifact lands nearest another scheme's (question 1 at equal bytes)."""

    target_scheme: str
    rank: int
    estimated_bytes: int  # planner's lora artifact at that rank
    target_bytes: int  # planner's artifact of target_scheme
    within_tolerance: bool
    # Per training length: the trained models' mean artifact bytes, filled in by the roundtrip.
    actual: dict[str, dict] | None = None

    @property
    def deviation(self) -> float:
        """(lora − target) / target from the planner's estimates."""
        return (self.estimated_bytes - self.target_bytes) / self.target_bytes

    def fill_actual(self, rows, quant: str) -> None:
        """The trained artifacts' bytes of lora and the target under quant, per training length."""
        self.actual = {}
        for steps in sorted({r.steps for r in rows if r.steps is not None}):

            def mean(scheme, steps=steps):
                got = [r.artifact_bytes for r in rows if r.scheme == scheme and r.quant == quant and r.steps == steps]
                return round(sum(got) / len(got)) if got else None

            lora, target = mean("lora"), mean(self.target_scheme)
            dev = (lora - target) / target if lora is not None and target else None
            self.actual[str(steps)] = {"lora": lora, self.target_scheme: target, "deviation": dev}
        # The trained artifacts decide: a fresh adapter (B = 0) packs smaller than a trained one.
        devs = [a["deviation"] for a in self.actual.values() if a["deviation"] is not None]
        if devs:
            self.within_tolerance = all(abs(d) <= TOLERANCE for d in devs)

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return {**asdict(self), "deviation": self.deviation}


def match_rank(
    configs: dict[str, dict], target_scheme: str, quant: str, quant_options: dict | None = None
) -> RankMatch:
    """The lora rank whose artifact under quant is closest to target_scheme's (same width and depth).

    Ranks are whole numbers, so the match is as close as one rank's bytes allow
    (``within_tolerance`` says whether that is within ±3%).
    """
    if "lora" not in configs:
        raise ConfigError("--match-bytes SCHEME sets lora's rank: add lora to --schemes")
    if target_scheme not in configs or target_scheme == "lora":
        raise ConfigError(
            f"--match-bytes {target_scheme!r}: expected a byte count or another scheme of this run "
            f"({', '.join(s for s in configs if s != 'lora')})"
        )
    target = fresh_artifact_bytes(configs[target_scheme], quant, quant_options=quant_options)
    lora = configs["lora"]

    def size(rank: int) -> int:
        cfg = {**lora, "scheme_options": {**lora.get("scheme_options", {}), "rank": rank}}
        return fresh_artifact_bytes(cfg, quant, quant_options=quant_options)

    # Bytes grow with the rank: walk up until past the target, keep the closer of the last two.
    best, best_size = 1, size(1)
    rank = 1
    while best_size < target and rank < min(MAX_RANK, int(lora.get("d_model", MAX_RANK))):
        rank += 1
        got = size(rank)
        if abs(got - target) < abs(best_size - target):
            best, best_size = rank, got
        if got >= target:
            break
    return RankMatch(
        target_scheme=target_scheme,
        rank=best,
        estimated_bytes=best_size,
        target_bytes=target,
        within_tolerance=abs(best_size - target) <= TOLERANCE * target,
    )
