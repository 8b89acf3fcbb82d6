"""Quantizer error on a trained tiny model: weight error, bits per weight, val bpb; RTN vs GPTQ.

Only the projection weights (q/k/v/o/up/down) are quantized, everything else
stays float, so the table isolates each format. GPTQ calibrates on the
training split only. bitsandbytes' own NF4 round trip is the anchor for ours.

    python benchmarks/quant_error.py [--ckpt DIR] [--steps N] [--calib-tokens N]
    python benchmarks/quant_error.py --smoke   # a d=32 model trained 2 steps, 1K calibration tokens
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import torch  # noqa: E402

import recurnorm.quant as q  # noqa: E402
from recurnorm.evaluate.loss import loss  # noqa: E402
from recurnorm.quant.gptq import calibration_batches, collect_hessians, gptq_quantize  # noqa: E402
from recurnorm.train.data import load_corpus  # noqa: E402

FORMATS = [
    ("int8", "int8", {}),
    ("int8_pg", "int8_pg", {}),
    ("int6", "int6", {}),
    ("int5", "int5", {}),
    ("int4 g64", "int4", {}),
    ("int4 g64 asym", "int4", {"asymmetric": True}),
    ("int4 g64 clip", "int4", {"clip_search": True}),
    ("nf4 g64", "nf4", {}),
    ("ternary", "ternary", {}),
    ("ternary lsq", "ternary", {"lsq_rescale": True}),
]


def trained_model(args, corpus):
    """A tiny-preset model: from --ckpt, else trained here."""
    if args.ckpt:
        from recurnorm.model import load_checkpoint

        return load_checkpoint(args.ckpt).eval()
    from recurnorm.model import ModelConfig
    from recurnorm.train.loop import train
    from recurnorm.train.presets import get_preset

    preset = get_preset("tiny").with_overrides(steps=args.steps, seed=args.seed)
    model = {**preset.model, **(benchkit.SMOKE_MODEL if args.smoke else {})}
    result = train(ModelConfig(**model), corpus, preset.hp, progress=False)
    return result.model.eval()


def bnb_nf4_roundtrip(W: torch.Tensor) -> torch.Tensor:
    """bitsandbytes' own NF4 quantize -> dequantize (blocksize 64 <= row length here)."""
    import bitsandbytes.functional as bnbf

    packed, state = bnbf.quantize_4bit(W.float().contiguous(), blocksize=64, quant_type="nf4")
    return bnbf.dequantize_4bit(packed, state).float()


def evaluate(model, corpus, new_weights: dict[str, torch.Tensor]) -> float:
    """Validation bpb with the projection weights replaced."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for name, lin in m.projections():
            lin.weight.copy_(new_weights[name])
    return loss(m, corpus).bits_per_byte


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", help="checkpoint dir (else train the tiny preset)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calib-tokens", type=int, default=32768)
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:  # (one thread: tiny matrices on two contended threads ran 10x slower)
        args.steps, args.calib_tokens = 2, 1024
        torch.set_num_threads(1)

    corpus = load_corpus("default")
    t0 = time.time()
    model = trained_model(args, corpus)
    projs = model.projections()
    W = {n: lin.weight.detach().clone() for n, lin in projs}
    n_params = sum(w.numel() for w in W.values())
    print(f"model ready in {time.time() - t0:.0f}s; {len(projs)} projections, {n_params} weights")
    bpb_float = evaluate(model, corpus, W)
    H = collect_hessians(model, calibration_batches(corpus.train_tokens, model.config.seq_len, args.calib_tokens))

    def rel(new: dict[str, torch.Tensor]) -> float:
        num = sum(float((new[n] - W[n]).square().sum()) for n in W)
        return (num / sum(float(W[n].square().sum()) for n in W)) ** 0.5

    rows = []
    for label, fmt, opts in FORMATS:
        quant = q.get(fmt, **opts)
        qts = {n: quant.quantize(W[n], name=n) for n in W}
        rtn = {n: q.dequantize(qt) for n, qt in qts.items()}
        bpw = sum(q.bits_per_weight(qt) * qt.numel for qt in qts.values()) / n_params
        row = [label, bpw, rel(rtn), evaluate(model, corpus, rtn)]
        if fmt in ("nf4", "int8_pg"):
            row += [None, None]
        else:
            gq = {n: q.dequantize(gptq_quantize(W[n], H[n], quant, name=n)) for n in W}
            row += [rel(gq), evaluate(model, corpus, gq)]
        rows.append(row)
        print(f"  {label} done", flush=True)
    try:
        bnb = {n: bnb_nf4_roundtrip(W[n]) for n in W}
        rows.append(["bnb nf4 (anchor)", 4.5, rel(bnb), evaluate(model, corpus, bnb), None, None])
    except ImportError:
        print("bitsandbytes not installed: no NF4 anchor (skipped)")

    def f(x, spec):
        return "-" if x is None else format(x, spec)

    print(f"\nfloat model val bpb {bpb_float:.4f}  (projection weights only are quantized)")
    print(
        f"{'format':<18}{'bits/w':>8}{'rel err RTN':>13}{'bpb RTN':>9}{'gap':>8}"
        f"{'rel err GPTQ':>14}{'bpb GPTQ':>10}{'gap':>8}"
    )
    for label, bpw, e_r, b_r, e_g, b_g in rows:
        print(
            f"{label:<18}{bpw:>8.3f}{e_r:>13.4f}{b_r:>9.4f}{b_r - bpb_float:>+8.4f}"
            f"{f(e_g, '.4f'):>14}{f(b_g, '.4f'):>10}"
            f"{'-' if b_g is None else format(b_g - bpb_float, '+.4f'):>8}"
        )


if __name__ == "__main__":
    main()
