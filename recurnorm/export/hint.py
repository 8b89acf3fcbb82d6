"""What would fit instead when a pack lands over the cap, from what is already measured.

The tensors a uniform ``-q FORMAT`` would not change keep the bytes the refused artifact
measured; each tensor it would change is estimated from its codes' order-0 entropy plus
its side data stored raw (quantizing is the whole cost, where packing every format took
minutes). Formats go widest first; the first whose estimate fits is packed for real (with
the codes just made), so the hint names a format only once its measured bytes fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor

from ..budget.cap import Budget
from .fit import ROLE_CLIP, parse_formats
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


def estimate_bytes(qt) -> int:
    """Bytes a QTensor takes, about: its codes at their order-0 entropy, its side data raw."""
    from ..budget.rans import order0_bits

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
    ``metadata``: the refused artifact's (config, source), so the proof packs the same.

    Formats are tried widest first and each is quantized once (its QTensors serve the
    estimate and the proving pack), so a hint usually costs one quantization and one pack."""
    from ..quant import get
    from .pack import _dedupe, pack_state

    # uniform formats: --fit's role candidates (clip=record) are one clip per tensor, not a -q format
    specs = (
        tuple(s for s in parse_formats(None) if s[1].get("clip") != ROLE_CLIP) if formats is None else tuple(formats)
    )
    unique, _ = _dedupe(state)
    measured = {r["name"]: r["bytes"] for r in rows if "alias_of" not in r}
    overhead = artifact_bytes - sum(measured.values())
    current = policy.plan(unique)
    room, code = budget.artifact_room(), budget.code_total()
    kept = ", your rules kept" if any(r.text != FIT_RULE for r in policy.rules) else ""
    estimates: dict[str, int] = {}
    proved: dict[str, int] = {}
    miss, changed_any = 1.0, False
    for fmt, opts in specs:
        spec = format_spec(fmt, opts)
        pol = replace(policy, quantizer=fmt, options=dict(opts))
        qts = {}
        total = overhead
        for name, (f, o, _) in pol.plan(unique).items():
            if (f, o) == tuple(current[name][:2]):
                total += measured.get(name, 0)
            else:
                qts[name] = get(f, **o).quantize(unique[name], name=name)
                total += estimate_bytes(qts[name])
        estimates[spec] = total
        if not qts:  # the refused artifact itself
            continue
        changed_any = True
        if total * miss > room or len(proved) >= MAX_CONFIRMS:
            continue
        size = len(pack_state(state, pol, metadata, effort=effort, replace=qts))
        proved[spec] = size
        if size <= room:
            fit = f"--fit {budget.max_bytes} would choose a format per tensor to fill the cap"
            return Hint(f"hint: -q {spec} fits ({size + code:,} bytes with code{kept}); {fit}", estimates, proved)
        miss = max(miss, size / max(total, 1))
    if not changed_any and kept:
        return Hint("hint: your rules fix every weight's format; loosen a rule, or shrink the model", estimates, {})
    narrowest = format_spec(*specs[-1])
    return Hint(
        f"hint: even -q {narrowest} packs to about {estimates[narrowest] + code:,} bytes with code: no uniform "
        f"{format_spec(*specs[0])}..{narrowest} format and no --fit {budget.max_bytes} fits",
        estimates,
        proved,
    )
