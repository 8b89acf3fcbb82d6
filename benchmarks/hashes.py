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

--smoke hashes the same kinds of case, tiny (pack.py's and ship.py's smoke cases, one CLI train
run of 2 steps and one CLI pack of it): seconds; its hashes are not comparable with a full run's.
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

import benchkit  # noqa: E402
import pack as pack_bench  # noqa: E402
import ship as ship_bench  # noqa: E402

from recurnorm.budget import pack_qtensors  # noqa: E402

CLI_FORMATS = {
    f"-q {q}": ["-q", q] for q in ("int8", "int8_pg", "int6", "int5", "int4", "int3", "nf4", "ternary", "fp16", "bf16")
}
# The paths beyond one format (--smoke runs these too: each is a way the command can break).
CLI_PATHS = {
    "-q int6:clip=sigma:3 rules": ["-q", "embed.weight=int8,*=int6:clip=sigma:3"],  # (runs/: recurnorm's names)
    "--effort max": ["-q", "int8", "--effort", "max"],
    "--fit 150000 (proxy)": ["--fit", "150000"],
    "--gptq int6": ["-q", "int6", "--gptq", "--calib-data", "default", "--calib-tokens", "4096"],
}
CLI_RUNS = {**CLI_FORMATS, **CLI_PATHS}
TRAIN_RUNS = {
    "shared": ["--scheme", "shared"],
    "norm_gate muon": ["--scheme", "norm_gate", "--optimizer", "muon"],
    "lora": ["--scheme", "lora"],
    "--qat int4": ["--qat", "int4"],
    "--qat ternary --act-quant": ["--qat", "ternary", "--act-quant"],
}


def cases(ckpts: list[str], reals: list[str], smoke: bool = False):
    """(name, artifact bytes) for every case (--smoke: tiny ones, one CLI run of each kind)."""
    qcases = pack_bench.synthetic(1 << 14 if smoke else 4_000_000)
    qcases.update(pack_bench.golf_shaped(shrink=8 if smoke else 1))
    for ckpt in ckpts:
        qcases.update(pack_bench.trained(ckpt, 0, os.path.basename(os.path.normpath(ckpt))))
    for path in reals:
        qcases.update(pack_bench.real(path))
    for name, qts in qcases.items():
        yield f"pack.py {name}", pack_qtensors(qts)
    for name, qts in ship_bench.cases([], quick=False, smoke=smoke):
        yield f"ship.py {name}", pack_qtensors(qts)
        yield f"ship.py {name} zstd", pack_qtensors(qts, codecs=("rans", "zstd", "raw"))
    cli = os.path.join(os.path.dirname(sys.executable), "recurnorm")
    cli_runs = {**dict(list(CLI_FORMATS.items())[:1]), **CLI_PATHS} if smoke else CLI_RUNS
    train_runs = dict(list(TRAIN_RUNS.items())[:1]) if smoke else TRAIN_RUNS
    with tempfile.TemporaryDirectory() as tmp:
        if smoke:  # the one checkpoint the CLI packs: what the train run below makes
            ckpts = [os.path.join(tmp, "smoke-ckpt")]
            subprocess.run(
                [cli, "train", *_tiny(2), *TRAIN_RUNS["shared"], "--out", ckpts[0], "--json"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        for ckpt in ckpts:
            for label, argv in cli_runs.items():
                out = os.path.join(tmp, "a.rnpk")
                subprocess.run(
                    [cli, "pack", ckpt, "-o", out, *argv, "--force", "--json"], check=True, stdout=subprocess.DEVNULL
                )
                with open(out, "rb") as f:
                    yield f"cli pack {os.path.basename(os.path.normpath(ckpt))} {label}", f.read()
        # Training is held too: a few CPU steps of each path, the weights hashed.
        for label, argv in train_runs.items():
            out = os.path.join(tmp, "run")
            subprocess.run(
                [cli, "train", *_tiny(2 if smoke else 6), *argv, "--out", out, "--force", "--json"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                yield f"cli train tiny {label}", f.read()


def _tiny(steps: int) -> list[str]:
    """`recurnorm train` options of the held training runs: the tiny preset on CPU, no evaluation."""
    preset = ["--preset", "tiny", "--steps", str(steps), "--seed", "0"]
    return [*preset, "--no-progress", "--device", "cpu", "--eval-every", "0"]


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
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    ckpts = [] if args.smoke else [os.path.dirname(f) for f in sorted(glob.glob("runs/*/model.safetensors"))]
    reals = [] if args.smoke else sorted(glob.glob(os.path.join(pack_bench.REAL_CACHE, "*.safetensors")))
    lines = []
    for name, data in _quiet(cases(ckpts, reals, args.smoke)):
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
