"""What would fit instead when a pack lands over the cap, from what is already measured.

The tensors a uniform ``-q FORMAT`` would not change keep the bytes the refused artifact
measured; each tensor it would change is estimated once per format from its codes'
order-0 entropy plus its side data stored raw (quantizing is the whole cost: seconds,
where packing every format took minutes). The widest format whose estimate fits is then
packed for real, so the hint names a format only once its measured bytes fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor

from ..budget.cap import Budget
from .fit import DEFAULT_FORMATS, parse_formats
from .policy import FIT_RULE, ExportPolicy, format_spec

# A confirming pack that misses (the estimate was low) scales the next estimates by the miss.
MAX_CONFIRMS = 3


@dataclass
class Hint:
    """The hint line, and what it rests on: estimates per format and the one measured pack."""

    text: str
    estimates: dict[str, int]
    measured: dict[str, int]

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"hint": self.text, "estimated_bytes": self.estimates, "measured_bytes": self.measured}


def estimate_bytes(t: Tensor, fmt: str, opts: dict) -> int:
    """Bytes one tensor takes in a format, about: codes at their order-0 entropy, side data raw."""
    from ..budget.rans import order0_bits
    from ..quant import get

    qt = get(fmt, **opts).quantize(t)
    side = sum(a.nbytes for a in (qt.scales, qt.zeros) if a is not None)
    return int(order0_bits(qt.codes) / 8) + side


def over_cap_hint(
    state: dict[str, Tensor],
    policy: ExportPolicy,
    budget: Budget,
    rows: list[dict],
    artifact_bytes: int,
    *,
    metadata: dict | None = None,
    effort: str = "normal",
    formats=None,
) -> Hint:
    """The widest uniform format (int8..int4 by default) that fits, proved by one real pack,
    and whether ``--fit`` would; estimates from the refused artifact's measured rows.
    ``metadata``: the refused artifact's (config, source), so the proof packs the same."""
    from .pack import _dedupe, pack_state

    specs = parse_formats(None) if formats is None else tuple(formats)
    unique, _ = _dedupe(state)
    measured = {r["name"]: r["bytes"] for r in rows if "alias_of" not in r}
    overhead = artifact_bytes - sum(measured.values())
    current = policy.plan(unique)
    room = budget.artifact_room()
    code = budget.code_total()
    cache: dict[tuple[str, str], int] = {}
    estimates: dict[str, int] = {}
    policies: dict[str, ExportPolicy] = {}
    for fmt, opts in specs:
        spec = format_spec(fmt, opts)
        pol = replace(policy, quantizer=fmt, options=dict(opts))
        total, changed = overhead, False
        for name, (f, o, _) in pol.plan(unique).items():
            if (f, o) == tuple(current[name][:2]):
                total += measured.get(name, 0)
                continue
            key, changed = (name, format_spec(f, o)), True
            if key not in cache:
                cache[key] = estimate_bytes(unique[name], f, o)
            total += cache[key]
        estimates[spec] = total
        if changed:  # else it is the refused artifact itself
            policies[spec] = pol
    if not policies and any(r.text != FIT_RULE for r in policy.rules):
        return Hint("hint: your rules fix every weight's format; loosen a rule, or shrink the model", estimates, {})
    kept = ", your rules kept" if policy.rules else ""
    proved: dict[str, int] = {}
    miss = 1.0
    for spec, pol in policies.items():
        if estimates[spec] * miss > room or len(proved) >= MAX_CONFIRMS:
            continue
        size = len(pack_state(state, pol, metadata, effort=effort))
        proved[spec] = size
        if size <= room:
            fit = f"--fit {budget.max_bytes} would choose a format per tensor to fill the cap"
            return Hint(f"hint: -q {spec} fits ({size + code:,} bytes with code{kept}); {fit}", estimates, proved)
        miss = max(miss, size / max(estimates[spec], 1))
    narrowest = format_spec(*specs[-1])
    return Hint(
        f"hint: even -q {narrowest} packs to about {estimates[narrowest] + code:,} bytes with code: no uniform "
        f"{format_spec(*specs[0])}..{narrowest} format and no --fit {budget.max_bytes} fits",
        estimates,
        proved,
    )


__all__ = ["DEFAULT_FORMATS", "Hint", "estimate_bytes", "over_cap_hint"]
