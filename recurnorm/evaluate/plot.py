"""roundtrip.png: bpb against artifact bytes, with an arrow from before to after export."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from ..io import atomic_write_bytes

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def plot_roundtrip(
    aggs: list[dict[str, Any]],
    path: str | os.PathLike,
    title: str = "Export roundtrip: bpb before → after, by artifact size",
    *,
    exclusive: bool = False,
) -> Path:
    """Scatter post-export bpb (y) against artifact bytes (x) per scheme × quantizer; write a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on CI or the device machine
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    schemes = list(dict.fromkeys(a["scheme"] for a in aggs))
    quants = list(dict.fromkeys(a["quant"] for a in aggs))
    cmap = plt.get_cmap("tab10")
    color = {s: cmap(i % 10) for i, s in enumerate(schemes)}
    marker = {q: MARKERS[i % len(MARKERS)] for i, q in enumerate(quants)}

    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    xs = []
    for a in aggs:
        x = a["artifact_bytes"]["mean"]
        pre, post = a["bpb_pre"]["mean"], a["bpb_post"]["mean"]
        if x is None or pre is None or post is None:
            continue
        xs.append(x)
        c, m = color[a["scheme"]], marker[a["quant"]]
        # Hollow marker = before export (same model size), filled = after the real roundtrip.
        ax.scatter([x], [pre], s=45, marker=m, facecolors="none", edgecolors=[c], linewidths=1.2, zorder=3)
        ax.scatter([x], [post], s=60, marker=m, color=c, edgecolors="black", linewidths=0.5, zorder=4)
        if abs(post - pre) > 1e-12:
            ax.annotate(
                "", xy=(x, post), xytext=(x, pre), arrowprops={"arrowstyle": "->", "color": c, "lw": 1.2}, zorder=2
            )
        std = a["bpb_post"].get("std")
        if std and a["bpb_post"]["n"] > 1:
            ax.errorbar([x], [post], yerr=[std], color=c, capsize=3, lw=0.8, zorder=2)
    if xs and max(xs) / max(min(xs), 1) > 8:
        ax.set_xscale("log")  # int8 vs ternary artifacts differ several-fold
    ax.set_xlabel("artifact bytes")
    ax.set_ylabel("validation bits per byte (lower is better)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    scheme_handles = [Line2D([], [], ls="", marker="o", color=color[s], label=s) for s in schemes]
    quant_handles = [Line2D([], [], ls="", marker=marker[q], color="gray", label=q) for q in quants]
    quant_handles += [
        Line2D([], [], ls="", marker="o", markerfacecolor="none", markeredgecolor="gray", label="before export"),
        Line2D([], [], ls="", marker="o", color="gray", markeredgecolor="black", label="after export"),
    ]
    leg = ax.legend(handles=scheme_handles, title="scheme", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    ax.add_artist(leg)
    ax.legend(handles=quant_handles, title="quantizer", loc="lower left", bbox_to_anchor=(1.01, 0.0), fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue(), exclusive=exclusive)


def plot_lengths(
    aggs: list[dict[str, Any]],
    path: str | os.PathLike,
    title: str = "Paired Δbpb vs shared against training length (bar: min..max over seeds; unique in the table)",
    *,
    exclusive: bool = False,
) -> Path:
    """One panel before export and one after each quantizer: each scheme's paired Δbpb vs shared
    (mean over seeds, bar = min..max of the per-seed differences) against training steps; a PNG.

    ``unique`` (the upper bound, a whole block per step) is left out: its gap is ten times the
    others' and would flatten them into one line; the report's table has it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quants = list(dict.fromkeys(a["quant"] for a in aggs))
    schemes = list(dict.fromkeys(a["scheme"] for a in aggs if "vs_shared" in a and a["scheme"] != "unique"))
    lengths = sorted({a["steps"] for a in aggs if a.get("steps") is not None})
    panels = [("before export", quants[0] if quants else None, "bpb_pre")]
    panels += [(f"after {q} export", q, "bpb_post") for q in quants]
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 1.6, 3.8), dpi=90, sharey=True, squeeze=False)
    # Schemes sit side by side at each length so their bars do not hide each other.
    spread = 0.06
    for ax, (label, q, key) in zip(axes[0], panels, strict=True):
        for i, scheme in enumerate(schemes):
            xs, ys, lo, hi = [], [], [], []
            for n in lengths:
                a = next((a for a in aggs if a["steps"] == n and a["quant"] == q and a["scheme"] == scheme), None)
                p = (a or {}).get("vs_shared", {}).get(key)
                if not p or not p.get("n"):
                    continue
                xs.append(n * 10 ** (spread * (i - (len(schemes) - 1) / 2) / len(schemes)))
                ys.append(p["mean"])
                lo.append(p["mean"] - p["min"])
                hi.append(p["max"] - p["mean"])
            if xs:
                ax.errorbar(
                    xs,
                    ys,
                    yerr=[lo, hi],
                    color=cmap(i % 10),
                    marker=MARKERS[i % len(MARKERS)],
                    ms=5,
                    capsize=3,
                    lw=1.2,
                    label=scheme,
                )
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xticks(lengths)
        ax.set_xticklabels([f"{n:,}" for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("training steps")
        ax.set_title(label, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("scheme − shared, bpb (lower is better)")
    axes[0][-1].legend(title="scheme", loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue(), exclusive=exclusive)
