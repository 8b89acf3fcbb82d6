"""Measure how many more code bytes trained weights take than a fresh init, per format (the planner's table).

recurnorm.export.plan predicts an artifact's size by packing a freshly
initialized model of the config (exact for scales, controls, manifest and codec
side data) and scaling each quantized tensor's *code* bytes by
TRAINED_CODE_RATIO[format]: trained weights code to slightly more bytes than
their init; and fp32 controls (gains initialized to exactly 1.0, which compress
to nothing) at PASSTHROUGH_FILL of their raw bytes. This script trains short runs of several schemes and prints
those ratios (median over runs), the numbers the tables hold.

    .venv/bin/python benchmarks/plan_calibration.py [--steps 300] [--d 64,96]
    .venv/bin/python benchmarks/plan_calibration.py --smoke   # d=32, 2 steps, two schemes: seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import torch  # noqa: E402

FORMATS = ("int8", "int7", "int6", "int5", "int4", "ternary")


def stats(model, fmt: str) -> list[dict]:
    from recurnorm.budget.api import read_artifact, tensor_stats
    from recurnorm.export.pack import pack_state
    from recurnorm.export.spec import build_policy
    from recurnorm.model import state_dict_for_export

    data = pack_state(state_dict_for_export(model), build_policy(fmt))
    art = read_artifact(data)
    return tensor_stats(art.manifest, art.qtensors)


EMBED = "embed.weight"  # the token embedding, calibrated apart (TRAINED_EMBED_RATIO)


def code_bytes(rows: list[dict], fmt: str, embed: bool = False) -> int:
    """Code bytes of the tensors in fmt: the embedding's alone, or every other's."""
    return sum(r["codes_bytes"] for r in rows if r.get("format") == fmt and (r["name"] == EMBED) == embed)


def fill(rows: list[dict], fmt: str, itemsize: int) -> float | None:
    """Stored bytes of a float passthrough format / its raw bytes (trained floats barely compress)."""
    raw = sum(r["numel"] * itemsize for r in rows if r.get("format") == fmt)
    return sum(r["bytes"] for r in rows if r.get("format") == fmt) / raw if raw else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--d", default="64,96")
    ap.add_argument("--schemes", default="shared,norm,norm_gate,unique")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.d, args.schemes = 2, "32", "shared,norm_gate"
    torch.set_num_threads(1)
    from recurnorm.model import ModelConfig, RecurrentLM
    from recurnorm.train.config import TrainConfig
    from recurnorm.train.data import load_corpus
    from recurnorm.train.loop import train

    corpus = load_corpus("default")
    ratios: dict[str, list[float]] = {f: [] for f in FORMATS}
    embeds: list[float] = []
    fills: list[float] = []
    for d in (int(x) for x in args.d.split(",")):
        for scheme in args.schemes.split(","):
            config = ModelConfig(d_model=d, n_heads=2, depth=3, seq_len=64, scheme=scheme)
            hp = TrainConfig(steps=args.steps, batch_size=16, lr=3e-3, warmup=20, seed=0)
            trained = train(config, corpus, hp, progress=False).model.eval()
            torch.manual_seed(0)
            fresh = RecurrentLM(ModelConfig.from_dict(config.to_dict()))
            row = []
            for f in FORMATS:
                t_rows, f_rows = stats(trained, f), stats(fresh, f)
                r = code_bytes(t_rows, f) / code_bytes(f_rows, f)
                ratios[f].append(r)
                row.append(f"{f} {r:.4f}")
                if f == "int8":  # the controls are fp32 under every format; the embedding int8 under most
                    fills.append(fill(t_rows, "fp32", 4))
                    embeds.append(code_bytes(t_rows, f, True) / code_bytes(f_rows, f, True))
            print(f"d={d} {scheme:<10} " + "  ".join(row) + f"  embed int8 {embeds[-1]:.4f}  fp32 fill {fills[-1]:.4f}")
    print("TRAINED_CODE_RATIO = {" + ", ".join(f'"{f}": {statistics.median(v):.4f}' for f, v in ratios.items()) + "}")
    print(f'TRAINED_EMBED_RATIO = {{"int8": {statistics.median(embeds):.4f}}}')
    print(f"PASSTHROUGH_FILL fp32 = {statistics.median(fills):.4f}")


if __name__ == "__main__":
    main()
