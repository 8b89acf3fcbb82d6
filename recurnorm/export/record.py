"""What an artifact records of its export, read back: each tensor's rows with the rule that chose
its format (``metadata["export"]``, written by pack.py). It needs no torch (inspect of an
artifact reads it as verify does, with numpy alone).
"""

from __future__ import annotations

from collections import Counter


def rows_with_rules(data: bytes, max_decoded_bytes: int | None = None, jobs: int = 1, *, hashed: bool = False):
    """(tensor_stats rows with each tensor's ``rule``, metadata) of artifact bytes (decoded in jobs;
    hashed: of an artifact as pack writes it, see api.iter_artifact)."""
    from ..budget.api import decoded_stats

    # Decode once: proves the round trip, gives bounds.
    manifest, rows = decoded_stats(data, max_decoded_bytes, jobs, hashed=hashed)
    metadata = manifest.get("metadata", {})
    export = metadata.get("export") or {}
    rules = dict(export.get("rules") or {})
    for bank, slices in (export.get("banks") or {}).items():  # a stack: its slices' rules, counted
        counts = Counter(rules.get(s, "unknown") for s in slices)
        rules[bank] = "slices: " + "; ".join(f"{r} x{n}" for r, n in counts.items())
    for row in rows:
        fallback = "alias" if "alias_of" in row else "unknown (no export record)"
        if "lowrank_of" in row:
            fallback = f"LQER factor of {row['lowrank_of']}"
        row["rule"] = rules.get(row["name"], fallback)
    return rows, metadata


def packed_rows(data: bytes, max_decoded_bytes: int | None = None, jobs: int = 1, *, hashed: bool = False):
    """rows_with_rules of an artifact just packed here, under verify's decoded-bytes rule. Its
    readers' refusal is then this input's limit, not a corrupt file: QuantError (exit 1), never
    ArtifactError (exit 4)."""
    from ..errors import ArtifactError, QuantError

    try:
        return rows_with_rules(data, max_decoded_bytes, jobs, hashed=hashed)
    except ArtifactError as exc:
        raise QuantError(f"the packed artifact would not pass verify: {exc}") from None


def rules_table(rows: list[dict]) -> str:
    """tensor, format and the rule that chose it, in manifest order (aliases included)."""
    from ..display import printable  # names come from strangers' files: never raw to a terminal

    names = [printable(r["name"]) for r in rows]
    width = max((len(n) for n in names), default=6)
    lines = [f"{'tensor':<{width}}  {'format':<8} rule"]
    for r, name in zip(rows, names, strict=True):
        fmt = f"= {printable(r['alias_of'])}" if "alias_of" in r else printable(r["format"])
        lines.append(f"{name:<{width}}  {fmt:<8} {printable(r.get('rule', ''))}")
    return "\n".join(lines)
