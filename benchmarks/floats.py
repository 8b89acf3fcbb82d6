"""Float tensors: recurnorm's `fields` coding vs ZipNN, bytes and MB/s side by side.

Cases: all-MiniLM-L6-v2's float tensors (all-MiniLM-L6-v2.safetensors in the benchmarks' cache
folder, $RECURNORM_BENCH_CACHE or ~/.cache/recurnorm-bench; 22.7M weights; benchmarks/real_ckpt.py makes it) cast to bf16 and kept in fp32, each tensor
through quant's bf16 / fp32 passthrough (what `recurnorm pack -q bf16 --keep-float-max-numel 0`
stores), and a golf-shaped state dict in bf16 and fp32 (one Parameter Golf sized block, d=512, MLP 1024,
and a 1024 x 512 embedding; heavy-tailed, rows and columns scaled like trained weights).

recurnorm = the whole artifact of `pack_qtensors` (manifest and headers included); ZipNN
(`pip install zipnn`; benchmarks only, never a dependency) compresses each tensor's bytes on
one thread and the sizes are summed (its whole-model buffer is a little larger). MB/s are of
float input on one thread, from CPU time (time.process_time: the machine is shared), best of
--repeats; unpack = `read_artifact` (library) and the standalone loader's `decode` (numpy).

    python benchmarks/floats.py [--real FILE] [--repeats 3] [--only TEXT ...]
    python benchmarks/floats.py --smoke   # golf-shaped 1/8 as wide, a tiny stand-in for MiniLM: seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from recurnorm import quant  # noqa: E402
from recurnorm.budget import rnpk_load  # noqa: E402
from recurnorm.budget.api import pack_qtensors, read_artifact  # noqa: E402

MINILM = str(benchkit.CACHE / "all-MiniLM-L6-v2.safetensors")


def golf_floats(seed: int = 0, shrink: int = 1) -> dict[str, torch.Tensor]:
    """benchmarks/pack.py's golf-shaped weights, as an fp32 state dict (every side `shrink`
    times smaller: --smoke)."""
    rng = np.random.default_rng(seed)
    shapes = {"embed": (1024, 512), "q": (512, 512), "k": (512, 512), "v": (512, 512), "o": (512, 512)}
    shapes |= {"up": (1024, 512), "down": (512, 1024), "norm": (512,)}
    shapes = {name: tuple(n // shrink for n in shape) for name, shape in shapes.items()}
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # a norm's gains: near 1
            out[name] = torch.from_numpy(1 + 0.1 * rng.standard_normal(shape).astype(np.float32))
            continue
        r, c = shape
        w = rng.standard_t(5, size=(r, c)) * np.exp(rng.normal(0, 0.3, size=(r, 1)))
        w *= np.exp(rng.normal(0, 0.5, size=(1, c))) * 0.02
        out[name] = torch.from_numpy(w.astype(np.float32))
    return out


def cases(path: str, shrink: int = 1) -> dict[str, tuple[str, dict[str, torch.Tensor]]]:
    """name -> (format, float state dict)."""
    golf = golf_floats(shrink=shrink)
    out = {"golf-shaped bf16": ("bf16", {k: v.bfloat16() for k, v in golf.items()}), "golf-shaped fp32": ("fp32", golf)}
    if os.path.exists(path):
        from safetensors.torch import load_file

        state = {k: v for k, v in load_file(path).items() if v.is_floating_point()}
        label = os.path.splitext(os.path.basename(path))[0]
        out[f"{label} bf16"] = ("bf16", {k: v.bfloat16() for k, v in state.items()})
        out[f"{label} fp32"] = ("fp32", {k: v.float() for k, v in state.items()})
    else:
        print(f"skipping MiniLM: {path} not found (benchmarks/real_ckpt.py makes it)")
    return out


def best_cpu(fn, repeats: int) -> tuple[float, object]:
    """Smallest CPU time of `repeats` calls, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        c0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - c0)
    return best, out


def zipnn_run(state: dict[str, torch.Tensor], repeats: int) -> tuple[int, float, float] | None:
    """(bytes, pack s, unpack s) of ZipNN per tensor, or None when it is not installed."""
    try:
        import zipnn
    except ImportError:
        return None
    dt = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}
    blobs = [(dt[v.dtype], v.contiguous().view(torch.uint8).numpy().tobytes()) for v in state.values()]
    zs = {name: zipnn.ZipNN(bytearray_dtype=name, threads=1) for name in set(d for d, _ in blobs)}
    # compress() rewrites its input in place: each call gets a fresh copy (copying is timed too,
    # a few ms)
    t_pack, packed = best_cpu(lambda: [(d, zs[d].compress(bytearray(b))) for d, b in blobs], repeats)
    t_unpack, back = best_cpu(lambda: [zs[d].decompress(c) for d, c in packed], repeats)
    assert all(bytes(x) == b for x, (_, b) in zip(back, blobs, strict=True)), "ZipNN round trip"
    return sum(len(c) for _, c in packed), t_pack, t_unpack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", default=MINILM)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--only", action="append", default=[], help="only the cases whose name contains this; repeatable (any)"
    )
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:  # one run each; a tiny stand-in for MiniLM unless --real names a file
        smoke_dir, args.repeats = tempfile.TemporaryDirectory(prefix="floats-smoke-"), 1
        if args.real == MINILM:
            args.real = str(benchkit.tiny_real_checkpoint(Path(smoke_dir.name)))
    todo = {
        k: v
        for k, v in cases(args.real, 8 if args.smoke else 1).items()
        if not args.only or any(o in k for o in args.only)
    }
    if not todo:
        ap.error(f"no case matches --only {' / '.join(args.only)}")
    torch.set_num_threads(1)
    try:
        import zipnn  # noqa: F401
    except ImportError:
        benchkit.skipped("ZipNN", "not importable; pip install zipnn")
    print(
        f"{'case':26} {'MB in':>7} {'recurnorm B':>12} {'ZipNN B':>12} {'ratio':>6}  "
        f"{'pack MB/s':>9} {'unpack':>7} {'loader':>7} {'ZipNN pack':>10} {'unpack':>7}  codecs"
    )
    for name, (fmt, state) in todo.items():
        mb = sum(v.numel() * v.element_size() for v in state.values()) / 1e6
        q = quant.get(fmt)
        qts = {k: q.quantize(v, name=k) for k, v in state.items()}
        t_pack, data = best_cpu(lambda qts=qts: pack_qtensors(qts), args.repeats)
        t_unpack, art = best_cpu(lambda data=data: read_artifact(data), args.repeats)
        t_load, _ = best_cpu(lambda data=data: rnpk_load.decode(data), 1)
        used = sorted({s["codec"] for t in art.manifest["tensors"] for s in t["streams"].values()})
        z = zipnn_run(state, args.repeats)
        zb, zr, zp, zu = (
            (f"{z[0]:,}", f"{len(data) / z[0]:.4f}", f"{mb / z[1]:.0f}", f"{mb / z[2]:.0f}") if z else "----"
        )
        print(
            f"{name:26} {mb:7.1f} {len(data):12,} {zb:>12} {zr:>6}  {mb / t_pack:9.0f} {mb / t_unpack:7.0f} "
            f"{mb / t_load:7.0f} {zp:>10} {zu:>7}  {','.join(used)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
