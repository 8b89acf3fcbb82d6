"""Plain-text tables of per-tensor packing statistics: what pack, verify and inspect print."""

from __future__ import annotations

from ..display import printable


def _fmt_ratio(row: dict) -> str:
    o = row.get("overhead")
    return "" if o is None else f"{o * 100:+.2f}%"


def tensor_table(rows: list[dict], limit: int | None = None) -> str:
    """Largest tensors first: name, shape, format, codec, bytes, bits/weight, order-0 bound, overhead."""
    rows = sorted((r for r in rows if "alias_of" not in r), key=lambda r: (-r["bytes"], r["name"]))
    if limit is not None:
        rows = rows[:limit]
    head = f"{'tensor':<40} {'shape':<16} {'format':<8} {'bytes':>11} {'bits/w':>7} {'order0':>11} {'over':>8}  codec"
    lines = [head, "-" * len(head)]
    for r in rows:
        bound = r.get("order0_bytes")
        lines.append(
            f"{printable(r['name'])[:40]:<40} {'x'.join(map(str, r['shape'])) or 'scalar':<16} "
            f"{printable(r['format'])[:8]:<8} "
            f"{r['bytes']:>11,} {r['bits_per_weight']:>7.3f} "
            f"{'' if bound is None else f'{bound:,.0f}':>11} {_fmt_ratio(r):>8}  {r['codec']}"
        )
    return "\n".join(lines)


def totals_lines(rows: list[dict], cap: dict | None = None) -> str:
    """Totals over tensors and, given a cap report, the headroom under the cap."""
    stored = [r for r in rows if "alias_of" not in r]
    nbytes = sum(r["bytes"] for r in stored)
    numel = sum(r["numel"] for r in stored)
    bound = sum(r.get("order0_bytes") or 0 for r in stored)
    codes = sum(r.get("codes_bytes") or 0 for r in stored if r.get("order0_bytes"))  # (what a bound was taken of)
    out = [
        f"tensors {len(stored)} (+{len(rows) - len(stored)} aliases), weights {numel:,}, "
        f"stream bytes {nbytes:,} ({nbytes * 8 / max(numel, 1):.3f} bits/weight)"
    ]
    if bound:
        out.append(f"codes {codes:,} bytes vs order-0 bound {bound:,.0f} ({(codes / bound - 1) * 100:+.2f}%)")
    if cap is not None:
        loader = cap.get("loader_bytes") or 0
        out.append(
            f"artifact {cap['artifact_bytes']:,} + code {cap['code_bytes']:,}"
            f"{f' (loader {loader:,})' if loader else ''} = {cap['total_bytes']:,} "
            f"of {cap['max_bytes']:,} bytes; headroom {cap['headroom_bytes']:,}"
        )
    return "\n".join(out)
