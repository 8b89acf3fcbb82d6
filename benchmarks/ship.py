"""What shipping an artifact costs: counted bytes (artifact + loader) against the Parameter Golf
baseline and brotli-11, the loader's size, its decode time with numpy alone, and the price of
the portable profile.

Cases: a 17M-parameter model shaped like the challenge baseline (9 blocks, d=512, 4 KV heads,
MLP 1024, a tied 1024 x 512 embedding, its control tensors; heavy-tailed weights with row and
column scales like trained ones) at int8, and at int6 with an int8 embedding; and every trained
checkpoint under runs/ (or --ckpt) at int8, int4 and ternary. For each, side by side:

  recurnorm   the artifact (default, portable profile) + the compact loader's bytes
  baseline    the challenge's export: torch.save of int8 codes, fp16 scales and float
              passthrough tensors, then zlib-9 (its loader is in train_gpt.py: 0 extra bytes)
  brotli-11   the same codes and scales, codes as bytes and scales byte-shuffled, brotli-11
              (the records' recipe; brotli is installed where they run: 0 extra bytes)

then the decode time of the whole artifact through the loader (numpy, one thread) and through
recurnorm.load (compiled kernel), and portable bytes / bytes with zstd allowed for whole
streams (the profile's cost; side data and the manifest are portable in both).

    python benchmarks/ship.py [--ckpt DIR ...] [--repeats 3] [--quick]
    python benchmarks/ship.py --smoke    # a 2-block d=64 golf case and a tiny checkpoint: seconds
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one thread: the loader's time as shipped
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import brotli  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from recurnorm.budget import pack_qtensors, rnpk_load, unpack  # noqa: E402
from recurnorm.budget.loader import compact_loader, loader_source  # noqa: E402
from recurnorm.export.pack import export_qtensors  # noqa: E402
from recurnorm.export.policy import ExportPolicy  # noqa: E402

CONTROL = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weight")


SMOKE_SHAPE = {"n_layer": 2, "dim": 64, "vocab": 128}  # --smoke's golf case


def golf_state(seed: int = 0, **shape) -> dict[str, torch.Tensor]:
    """17,059,912 parameters with the baseline's names and shapes (tests/pg_model.py builds them;
    `shape`: its other sizes)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from pg_model import baseline_state

    return baseline_state(seed=seed, **shape)


def policy(fmt: str, embedding: str | None = None) -> ExportPolicy:
    """fmt on every matrix (whatever its size), controls in fp32, the embedding at `embedding`."""
    over = {"tok_emb.weight": (embedding, {})} if embedding else {}
    return ExportPolicy(quantizer=fmt, keep_float_max_numel=0, control_patterns=CONTROL, overrides=over)


def baseline_bytes(qts) -> int:
    """torch.save of codes, scales and passthrough tensors as the baseline lays them out, zlib-9."""
    obj = {"quantized": {}, "scales": {}, "passthrough": {}}
    for name, qt in qts.items():
        if qt.scales is None:
            obj["passthrough"][name] = torch.from_numpy(np.ascontiguousarray(qt.codes).view(np.int8).copy())
        else:
            obj["quantized"][name] = torch.from_numpy(np.ascontiguousarray(qt.codes).astype(np.int8))
            obj["scales"][name] = torch.from_numpy(np.asarray(qt.scales).astype(np.float16))
    buf = io.BytesIO()
    torch.save(obj, buf)
    return len(zlib.compress(buf.getvalue(), 9))


def brotli_bytes(qts) -> int:
    """brotli-11 over all codes (as bytes) then all scales and passthrough words byte-shuffled."""
    codes = b"".join(
        np.ascontiguousarray(qt.codes).astype(np.int8).tobytes() for qt in qts.values() if qt.scales is not None
    )
    words = []
    for qt in qts.values():
        for a in [qt.scales] if qt.scales is not None else [qt.codes]:
            a = np.ascontiguousarray(a)
            words.append(a.view(np.uint8).reshape(-1, a.itemsize)[:, ::-1].T.tobytes())
    return len(brotli.compress(codes + b"".join(words), quality=11))


def best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def cases(ckpts: list[str], quick: bool, smoke: bool = False):
    state = golf_state(**(SMOKE_SHAPE if smoke else {}))
    if quick and not smoke:  # three blocks: a smoke test of the script
        state = {k: v for k, v in state.items() if not k.startswith(tuple(f"blocks.{i}." for i in range(3, 9)))}
    golf = "golf tiny" if smoke else "golf 17M"
    yield f"{golf} int8", export_qtensors(state, "int8", policy("int8"))
    yield f"{golf} int6+int8 emb", export_qtensors(state, "int6", policy("int6", "int8"))
    for ckpt in ckpts:
        from recurnorm.export.load import load_checkpoint_state

        st, _ = load_checkpoint_state(ckpt)
        label = os.path.basename(os.path.normpath(ckpt))
        for fmt in ("int8", "int4", "ternary"):
            yield f"{label} {fmt}", export_qtensors(st, fmt, policy(fmt))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", action="append", default=[], help="trained checkpoint (default: runs/*)")
    ap.add_argument("--repeats", type=int, default=3, help="timed decodes per case (best counts)")
    ap.add_argument("--quick", action="store_true", help="smaller golf case, one repeat, no checkpoints")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.smoke:  # one timed run; a tiny stand-in for a trained checkpoint unless --ckpt
        args.quick, tmp = True, tempfile.TemporaryDirectory(prefix="ship-smoke-")
        args.ckpt = args.ckpt or [str(benchkit.tiny_real_checkpoint(Path(tmp.name)))]
    ckpts = args.ckpt or (
        [] if args.quick else [os.path.dirname(f) for f in sorted(glob.glob("runs/*/model.safetensors"))]
    )
    compact, readable = len(compact_loader()), len(loader_source().encode())
    print(f"loader: compact {compact:,} bytes (target <= 4,000), readable {readable:,} (target <= 16,000)")
    head = (
        f"{'case':<24} {'artifact':>11} {'+loader':>11} {'baseline':>11} {'brotli-11':>11} "
        f"{'vs base':>8} {'vs brotli':>9} {'loader s':>8} {'unpack s':>8} {'profile':>7}"
    )
    print(head)
    print("-" * len(head))
    worst = 0.0
    for name, qts in cases(ckpts, args.quick, args.smoke):
        data = pack_qtensors(qts)
        zstd = pack_qtensors(qts, codecs=("rans", "zstd", "raw"))
        counted = len(data) + compact
        base, brot = baseline_bytes(qts), brotli_bytes(qts)
        reps = 1 if args.quick else args.repeats
        t_loader = best_time(lambda d=data: rnpk_load.load(d), reps)
        t_lib = best_time(lambda d=data: unpack(d), reps)
        worst = max(worst, len(data) / len(zstd))
        print(
            f"{name:<24} {len(data):>11,} {counted:>11,} {base:>11,} {brot:>11,} "
            f"{counted - base:>+8,} {counted - brot:>+9,} {t_loader:>8.2f} {t_lib:>8.2f} "
            f"{len(data) / len(zstd):>7.4f}",
            flush=True,
        )
    print(
        "+loader = artifact + compact loader (the counted bytes); vs = counted minus the anchor "
        "(negative: recurnorm smaller); loader s = rnpk_load.load, numpy, one thread; unpack s = "
        f"recurnorm.load (compiled kernel); profile = portable / zstd allowed (worst {worst:.4f})"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
