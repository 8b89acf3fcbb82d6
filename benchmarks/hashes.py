"""SHA-256 of the artifact of every benchmark case: proof that a refactor changed no byte.

Packs the cases of benchmarks/pack.py (synthetic, golf-shaped, each trained checkpoint under
runs/ and each cached real checkpoint, at int8 / int4 / ternary, with effort normal) and of
benchmarks/ship.py (the 17M baseline-shaped model, portable and zstd profiles), plus
`recurnorm pack` on each checkpoint for every quantizer and a few CPU steps of `recurnorm train`
(plain, Muon, LoRA, QAT), and prints one line per case:
sha256, bytes, name. Save the output before a change and compare after it:

    python benchmarks/hashes.py > before.txt
    ... change ...
    python benchmarks/hashes.py --check before.txt     # exit 1 and the differing cases if any
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pack as pack_bench  # noqa: E402
import ship as ship_bench  # noqa: E402

from recurnorm.budget import pack_qtensors  # noqa: E402

CLI_RUNS = {
    f"-q {q}": ["-q", q] for q in ("int8", "int8_pg", "int6", "int5", "int4", "int3", "nf4", "ternary", "fp16", "bf16")
}
CLI_RUNS.update(
    {
        "-q int6:clip=sigma:3 rules": ["-q", "tok_emb.weight=int8,*=int6:clip=sigma:3"],
        "--effort max": ["-q", "int8", "--effort", "max"],
        "--fit 150000 (proxy)": ["--fit", "150000"],
        "--gptq int6": ["-q", "int6", "--gptq", "--calib-data", "default", "--calib-tokens", "4096"],
    }
)
TRAIN_RUNS = {
    "shared": ["--scheme", "shared"],
    "norm_gate muon": ["--scheme", "norm_gate", "--optimizer", "muon"],
    "lora": ["--scheme", "lora"],
    "--qat int4": ["--qat", "int4"],
    "--qat ternary --act-quant": ["--qat", "ternary", "--act-quant"],
}


def cases(ckpts: list[str], reals: list[str]):
    """(name, artifact bytes) for every case."""
    qcases = pack_bench.synthetic(4_000_000)
    qcases.update(pack_bench.golf_shaped())
    for ckpt in ckpts:
        qcases.update(pack_bench.trained(ckpt, 0, os.path.basename(os.path.normpath(ckpt))))
    for path in reals:
        qcases.update(pack_bench.real(path))
    for name, qts in qcases.items():
        yield f"pack.py {name}", pack_qtensors(qts)
    for name, qts in ship_bench.cases([], quick=False):
        yield f"ship.py {name}", pack_qtensors(qts)
        yield f"ship.py {name} zstd", pack_qtensors(qts, codecs=("rans", "zstd", "raw"))
    cli = os.path.join(os.path.dirname(sys.executable), "recurnorm")
    with tempfile.TemporaryDirectory() as tmp:
        for ckpt in ckpts:
            for label, argv in CLI_RUNS.items():
                out = os.path.join(tmp, "a.rnpk")
                subprocess.run(
                    [cli, "pack", ckpt, "-o", out, *argv, "--force", "--json"], check=True, stdout=subprocess.DEVNULL
                )
                with open(out, "rb") as f:
                    yield f"cli pack {os.path.basename(os.path.normpath(ckpt))} {label}", f.read()
        # Training is held too: a few CPU steps of each path, the weights hashed.
        tiny = [
            "--preset",
            "tiny",
            "--steps",
            "6",
            "--seed",
            "0",
            "--no-progress",
            "--device",
            "cpu",
            "--eval-every",
            "0",
        ]
        for label, argv in TRAIN_RUNS.items():
            out = os.path.join(tmp, "run")
            subprocess.run(
                [cli, "train", *tiny, *argv, "--out", out, "--force", "--json"], check=True, stdout=subprocess.DEVNULL
            )
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                yield f"cli train tiny {label}", f.read()


HASH_LINE = re.compile(r"[0-9a-f]{64} ")


def _quiet(gen):
    """The case builders' progress lines go to stderr: stdout holds hash lines only."""
    while True:
        with contextlib.redirect_stdout(sys.stderr):
            item = next(gen, None)
        if item is None:
            return
        yield item


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", metavar="FILE", help="compare with an earlier run's output")
    args = ap.parse_args()
    ckpts = [os.path.dirname(f) for f in sorted(glob.glob("runs/*/model.safetensors"))]
    reals = sorted(glob.glob(os.path.join(pack_bench.REAL_CACHE, "*.safetensors")))
    lines = []
    for name, data in _quiet(cases(ckpts, reals)):
        line = f"{hashlib.sha256(data).hexdigest()} {len(data):>11} {name}"
        lines.append(line)
        print(line, flush=True)
    if args.check:
        with open(args.check) as f:
            before = {ln.split(None, 2)[2]: ln for ln in f.read().splitlines() if HASH_LINE.match(ln)}
        after = {ln.split(None, 2)[2]: ln for ln in lines}
        differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for k in differ:
            print(f"DIFFERS: {k}\n  before {before.get(k)}\n  after  {after.get(k)}")
        print(
            f"{len(after) - len(differ)} of {len(after)} cases identical"
            if not differ
            else f"{len(differ)} cases differ"
        )
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
