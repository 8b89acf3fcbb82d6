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
    return atomic_write_bytes(path, buf.getvalue())
