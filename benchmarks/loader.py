"""The standalone loader's decode time and peak memory on a ~16 MB artifact: one thread, numpy only.

Packs a real checkpoint (default all-MiniLM-L6-v2: its 39 large matrices at int6,
clip=sigma:3, the rest fp32; 15.6 MB) with `pack_qtensors`, writes the compact loader (the
bytes `recurnorm loader --compact` writes, the form counted against the cap) beside it, and
decodes the artifact with the loader's `decode` (numpy arrays, no torch) in a fresh child
process with one BLAS/OpenMP thread. Each of --repeats runs is a new child; the best decode
time and the largest peak RSS count. Targets (issue 23): decode <= 5 s, peak RSS <= 2 x
decoded bytes + 64 MB, compact loader <= 4,000 bytes.

    python benchmarks/loader.py [--real FILE] [--repeats 3] [--effort max]
    python benchmarks/loader.py --smoke    # a tiny stand-in checkpoint, one child: seconds

(The embedding's rows are predicted from earlier rows, which the loader restores row by row;
--effort max: every matrix's.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import benchkit
from pack import REAL_CACHE, REAL_MIN_NUMEL

MINILM = os.path.join(REAL_CACHE, "all-MiniLM-L6-v2.safetensors")
THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
TARGET_S, TARGET_LOADER = 5.0, 4000

# The child: import the compact loader, decode, report. Peak RSS covers the interpreter,
# numpy and the loader too: that is what a submission's process pays. It is VmHWM, not
# getrusage's ru_maxrss: Linux carries the latter over exec from the forking parent (here
# torch and the checkpoint: 660 MiB before a byte was decoded).
CHILD = """
import json, sys, time
def hwm():
    with open("/proc/self/status") as f:
        return 1024 * int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
sys.path.insert(0, sys.argv[1])
import rnpk_load
base = hwm()
t0 = time.perf_counter()
arrays, _ = rnpk_load.decode(sys.argv[2])
took = time.perf_counter() - t0
decoded = sum(a.nbytes for a in {id(a): a for a in arrays.values()}.values())
print(json.dumps({"decode_s": took, "decoded": decoded, "peak": hwm(), "base": base}))
"""


def artifact(path: str, effort: str = "normal", min_numel: int = REAL_MIN_NUMEL) -> bytes:
    """The checkpoint's large 2-D matrices (min_numel values or more) at int6 (clip=sigma:3), its
    other floats fp32, packed."""
    from safetensors.torch import load_file

    from recurnorm import quant
    from recurnorm.budget import pack_qtensors

    qts = {}
    for name, t in load_file(path).items():
        large = t.is_floating_point() and t.dim() == 2 and t.numel() >= min_numel
        q = quant.get("int6", clip="sigma:3") if large else quant.get("fp32" if t.is_floating_point() else "raw")
        qts[name] = q.quantize(t.float() if t.is_floating_point() else t, name=name)
    return pack_qtensors(qts, effort=effort)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", default=MINILM, help="a .safetensors checkpoint (benchmarks/real_ckpt.py makes them)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh child processes (best time, largest peak)")
    ap.add_argument("--effort", choices=("normal", "max"), default="normal", help="the packer's effort")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    min_numel = REAL_MIN_NUMEL
    if args.smoke:  # a tiny stand-in for the real checkpoint unless --real names one; one child
        smoke_dir = tempfile.TemporaryDirectory(prefix="loader-smoke-")
        if args.real == MINILM:
            args.real, min_numel = str(benchkit.tiny_real_checkpoint(Path(smoke_dir.name))), benchkit.SMOKE_MIN_NUMEL
        args.repeats = 1
    if not os.path.exists(args.real):
        sys.exit(f"{args.real} not found: benchmarks/real_ckpt.py caches it (or pass --real FILE)")
    from recurnorm.budget.loader import compact_loader

    with tempfile.TemporaryDirectory() as tmp:
        data, loader = artifact(args.real, args.effort, min_numel), compact_loader()
        with open(os.path.join(tmp, "model.rnpk"), "wb") as f:
            f.write(data)
        with open(os.path.join(tmp, "rnpk_load.py"), "wb") as f:
            f.write(loader)
        runs = []
        for _ in range(args.repeats):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, tmp, os.path.join(tmp, "model.rnpk")],
                env={**os.environ, **THREADS},
                check=True,
                capture_output=True,
                text=True,
            )
            runs.append(json.loads(out.stdout))
    best, peak, decoded = min(r["decode_s"] for r in runs), max(r["peak"] for r in runs), runs[0]["decoded"]
    limit = 2 * decoded + (64 << 20)
    mb = 1 << 20
    print(
        f"artifact: {os.path.basename(args.real)}, int6 clip=sigma:3 large matrices, effort {args.effort}, {len(data):,} B"
    )
    print(f"compact loader: {len(loader):,} B (target <= {TARGET_LOADER:,}) {_ok(len(loader) <= TARGET_LOADER)}")
    print(
        f"decode, one thread, best of {len(runs)} fresh processes: {best:.2f} s "
        f"(target <= {TARGET_S:g} s) {_ok(best <= TARGET_S)}"
    )
    print(
        f"peak RSS {peak / mb:,.0f} MiB (interpreter + numpy + loader before decoding: "
        f"{max(r['base'] for r in runs) / mb:,.0f} MiB) for {decoded / mb:,.0f} MiB decoded; "
        f"target <= 2 x decoded + 64 MiB = {limit / mb:,.0f} MiB {_ok(peak <= limit)}"
    )


def _ok(ok: bool) -> str:
    return "ok" if ok else "MISSED"


if __name__ == "__main__":
    main()
