"""The bytes/bpb frontier: uniform formats, the record recipe and `pack --fit` at equal bytes, side by side.

For each checkpoint (trained here, or each --ckpt DIR): validation bpb after
export against artifact bytes for

- uniform int8 / int6 / int5 / int4 (the default policy: every weight matrix at
  that format, embeddings int8, controls fp32);
- the record recipe: GPTQ int6, int8 embeddings, fp32 controls;
- `--fit` at the byte size of each of those (direct Δloss sensitivities on
  training-split calibration batches; the fit lands at or under the size), and
  `--fit --gptq` at the recipe's size (GPTQ codes on both sides).

One run writes frontier.md (the table), frontier.json and frontier.png.

    .venv/bin/python benchmarks/frontier.py [--schemes shared,norm_gate,unique] [--d 64]
        [--steps 300] [--ckpt DIR ...] [--out frontier_out] [--calib-tokens 32768]

The default (three d=64 depth-3 models, 300 steps each) takes a few minutes on
two shared cores; --d 128 --steps 600 gives a model 4x larger.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

UNIFORM = ("int8", "int6", "int5", "int4")
RECIPE = "record (gptq int6)"


def train_checkpoint(scheme: str, d: int, steps: int, out: Path, corpus) -> Path:
    from recurnorm.model import ModelConfig, save_checkpoint
    from recurnorm.train.loop import train

    path = out / "ckpts" / f"{scheme}-d{d}"
    if (path / "model.safetensors").exists():
        return path
    config = ModelConfig(d_model=d, n_heads=2, depth=3, seq_len=64, scheme=scheme)
    result = train(config, corpus, steps=steps, batch_size=16, lr=3e-3, warmup=20, seed=0, progress=False)
    save_checkpoint(result.model, path)
    return path


def bpb_of(data: bytes, corpus) -> float:
    from recurnorm.evaluate.loss import loss
    from recurnorm.export.load import model_from_artifact

    return loss(model_from_artifact(data), corpus).bits_per_byte


def rows_for(ckpt: Path, corpus, calib_tokens: int) -> list[dict]:
    from recurnorm.export import ship
    from recurnorm.export.spec import build_policy

    rows = []

    def add(label: str, kind: str, packed, target: int | None = None, seconds: float = 0.0):
        rows.append(
            {
                "checkpoint": ckpt.name,
                "recipe": label,
                "kind": kind,
                "bytes": len(packed.data),
                "target_bytes": target,
                "bpb": bpb_of(packed.data, corpus),
                "seconds": round(seconds, 1),
                "allocation": None if packed.fit is None else _counts(packed.fit.allocation),
            }
        )
        r = rows[-1]
        print(f"{ckpt.name:<16} {label:<28} {r['bytes']:>9,} B  bpb {r['bpb']:.4f}", flush=True)

    baselines = []
    for fmt in UNIFORM:
        t = time.time()
        packed = ship.ship(ckpt, build_policy(fmt))
        add(f"uniform {fmt}", "uniform", packed, seconds=time.time() - t)
        baselines.append((f"uniform {fmt}", len(packed.data)))
    t = time.time()
    packed = ship.ship(ckpt, build_policy("int6"), gptq=True, calib_data="default")
    add(RECIPE, "recipe", packed, seconds=time.time() - t)
    baselines.append((RECIPE, len(packed.data)))
    for label, size in baselines:
        t = time.time()
        packed = ship.ship(ckpt, build_policy("int8"), fit_bytes=size, calib_data="default", calib_tokens=calib_tokens)
        add(f"fit @ {label}", "fit", packed, target=size, seconds=time.time() - t)
    # the recipe's GPTQ codes with --fit's formats: GPTQ against GPTQ at equal bytes
    t = time.time()
    packed = ship.ship(
        ckpt,
        build_policy("int8"),
        fit_bytes=baselines[-1][1],
        gptq=True,
        calib_data="default",
        calib_tokens=calib_tokens,
    )
    add(f"fit+gptq @ {RECIPE}", "fit", packed, target=baselines[-1][1], seconds=time.time() - t)
    return rows


def _counts(allocation: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for spec in allocation.values():
        counts[spec] = counts.get(spec, 0) + 1
    return " ".join(f"{k}x{v}" for k, v in sorted(counts.items()))


def table(rows: list[dict]) -> str:
    lines = [
        "| checkpoint | recipe | bytes | vs target | val bpb | Δbpb vs the recipe it matches | fit allocation |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    by_label = {(r["checkpoint"], r["recipe"]): r for r in rows}
    for r in rows:
        gap = under = ""
        if r["kind"] == "fit":
            base = by_label[(r["checkpoint"], r["recipe"].split(" @ ", 1)[1])]
            gap = f"{r['bpb'] - base['bpb']:+.4f}"
            under = f"{(r['bytes'] / r['target_bytes'] - 1) * 100:+.2f}%"
        lines.append(
            f"| {r['checkpoint']} | {r['recipe']} | {r['bytes']:,} | {under} | {r['bpb']:.4f} | "
            f"{gap} | {r['allocation'] or ''} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    markers = {"uniform": "o", "recipe": "s", "fit": "^"}
    cmap = plt.get_cmap("tab10")
    for i, ckpt in enumerate(dict.fromkeys(r["checkpoint"] for r in rows)):
        for kind, marker in markers.items():
            pts = sorted((r["bytes"], r["bpb"]) for r in rows if r["checkpoint"] == ckpt and r["kind"] == kind)
            if pts:
                ax.plot(
                    *zip(*pts, strict=True),
                    marker=marker,
                    color=cmap(i),
                    linestyle="-" if kind == "fit" else "none",
                    label=f"{ckpt} {kind}",
                )
    ax.set_xlabel("artifact bytes")
    ax.set_ylabel("validation bpb after export")
    ax.set_title("Frontier: uniform formats, the record recipe and --fit at equal bytes")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default="shared,norm_gate,unique")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ckpt", action="append", default=[], help="use this checkpoint (repeatable)")
    ap.add_argument("--out", default="frontier_out")
    ap.add_argument("--calib-tokens", type=int, default=32768)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from recurnorm.train.data import load_corpus

    corpus = load_corpus("default")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpts = [Path(c) for c in args.ckpt] or [
        train_checkpoint(s, args.d, args.steps, out, corpus) for s in args.schemes.split(",")
    ]
    rows = [r for c in ckpts for r in rows_for(c, corpus, args.calib_tokens)]
    (out / "frontier.json").write_text(json.dumps(rows, indent=2))
    md = table(rows)
    (out / "frontier.md").write_text(md + "\n")
    plot(rows, out / "frontier.png")
    print(md)


if __name__ == "__main__":
    main()
