"""Counted code: `recurnorm wrap --loader` against each Parameter Golf record's own recipe.

Inputs, none of them made here: the train_gpt.py of the top five records of
openai/parameter-golf's track_10min_16mb leaderboard (by val_bpb in each submission.json) and
the challenge's baseline train_gpt.py (MIT licensed), cached outside git as DIR/*.py (default
pg-scripts/ in the benchmarks' cache folder, $RECURNORM_BENCH_CACHE or ~/.cache/recurnorm-bench). `--mirror REPO` copies them there from a local clone or
bare mirror of the repository (`git show`); nothing is downloaded. For each script, side by side:

  record      the script's own `_compressed_code_size` recipe, run as written (pyminify with
              its flags, brotli-11, base85, an exec wrapper); the baseline has none and counts
              its raw code
  +loader     record + the compact loader (`recurnorm loader --compact`): the anchor
  wrap        `recurnorm wrap --loader`, the defaults: UTF-8, locals renamed, lines kept
  keep-loc    --keep-locals (nothing renamed)
  ascii       --encoding ascii (pure ASCII)
  -j -a       --join-lines --remove-asserts (locals renamed, UTF-8)
  -j -a cm    every option: the same with --codec cm (context mixing; wrapped once, not
              --repeats times: its coder takes seconds each way)
  latin1      -j -a --encoding latin1 (not UTF-8: refused for these scripts, which read their
              own file; the size the opt-in would have)

ratio = bytes / (record + loader); targets: the defaults <= 0.88, every option <= 0.80. `runs`:
the default output, the every-option (cm) output and the source, each run as train_gpt.py on
this CPU (CUDA hidden) with stub
modules for flash_attn, flash_attn_interface and triton where the script imports them, end with
the same last line (the records: `RuntimeError: CUDA is required`). Then the seconds `wrap` takes
(its check included), and the wrapped file's start-up cost over the source's: the stub's work
(literal to bytes, decompress, words, compile) against compiling the source. Medians of --repeats.

Needs python-minifier (the records' pyminify) for this run only, e.g.
    pip install --target ~/.cache/recurnorm-bench/pyextra python-minifier
    PATH=~/.cache/recurnorm-bench/pyextra/bin:$PATH PYTHONPATH=~/.cache/recurnorm-bench/pyextra:. \\
        python benchmarks/wrap.py [--repeats 3]

--smoke: every variant and the run on a small stand-in script with no recipe of its own (as the
baseline), so neither the cached scripts nor pyminify are needed: seconds.
"""

from __future__ import annotations

import argparse
import ast
import base64
import json
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402

from recurnorm.budget.loader import MODULE, compact_loader, minified_loader  # noqa: E402
from recurnorm.codewrap import wrap  # noqa: E402
from recurnorm.codewrap.selfextract import decompress, read, unpack_text, words_in  # noqa: E402
from recurnorm.codewrap.selfextract import raw_bytes as payload_bytes  # noqa: E402
from recurnorm.errors import ConfigError  # noqa: E402

DEFAULT_DIR = benchkit.CACHE / "pg-scripts"
# --smoke's stand-in for a record: reads its settings, checks its own file, stops where a GPU is needed
SMOKE_SCRIPT = """import os
import sys


class Hyperparameters:
    data_path = os.environ.get("DATA_PATH", "./data/datasets/fineweb10B_sp1024")
    iterations = int(os.environ.get("ITERATIONS", 20000))


def main():
    args = Hyperparameters()
    code = open(__file__, encoding="utf-8").read()
    assert args.iterations > 0 and code
    total = sum(len(line) for line in code.splitlines())
    print(f"code {total} characters", file=sys.stderr)
    raise RuntimeError("CUDA is required")


if __name__ == "__main__":
    main()
"""
TRACK = "records/track_10min_16mb"
VARIANTS = {
    "wrap": {},
    "keep-loc": {"rename_locals": False},
    "ascii": {"encoding": "ascii"},
    "-j -a": {"keep_lines": False, "remove_asserts": True},
    "-j -a cm": {"keep_lines": False, "remove_asserts": True, "codec": "cm"},
    "latin1": {"keep_lines": False, "remove_asserts": True, "encoding": "latin1"},
}
STUBBED = ("flash_attn", "flash_attn_interface", "triton")
# Any attribute, call, subscript or decorator of a stub module gives a stand-in (a decorator
# returns the function): enough to import a script and run it to its first GPU call.
STUB = """class _Any:
    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and not k and callable(a[0]) else self
    def __getattr__(self, name):
        return self
    def __getitem__(self, key):
        return self
def __getattr__(name):
    return _Any()
"""
# torch imports triton's internals (triton.backends, triton.compiler, ...) once it can import
# triton: it probes with the stub hidden, at start-up, and keeps the answer (none).
HIDE_TRITON = """import sys

sys.modules["triton"] = None
try:
    import torch._dynamo
    import torch._inductor.runtime.triton_compat
    import torch.utils._triton

    torch.utils._triton.has_triton_package()
finally:
    del sys.modules["triton"]
"""


def fetch(mirror: Path, into: Path) -> None:
    """The top five records' train_gpt.py (lowest val_bpb first) and the baseline, from a git mirror."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(mirror), *args], capture_output=True, check=False)

    ranked = []
    for folder in git("ls-tree", "-z", "--name-only", f"HEAD:{TRACK}").stdout.decode().split("\0"):
        meta, code = git("show", f"HEAD:{TRACK}/{folder}/submission.json"), f"HEAD:{TRACK}/{folder}/train_gpt.py"
        try:
            bpb = json.loads(meta.stdout)["val_bpb"] if meta.returncode == 0 else None
        except (ValueError, KeyError, TypeError):
            bpb = None
        if isinstance(bpb, (int, float)) and git("cat-file", "-e", code).returncode == 0:
            ranked.append((bpb, folder, code))
    into.mkdir(parents=True, exist_ok=True)
    for rank, (bpb, folder, code) in enumerate(sorted(ranked)[:5], 1):
        (into / f"{rank}_{folder[:60]}.py").write_bytes(git("show", code).stdout)
        print(f"#{rank} val_bpb {bpb}: {folder}")
    (into / "9_baseline.py").write_bytes(git("show", "HEAD:train_gpt.py").stdout)


def record_recipe(source: str) -> int | None:
    """The wrapper bytes of the script's own `_compressed_code_size`, run as written (None
    when it has none)."""
    tree = ast.parse(source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_compressed_code_size"), None)
    if fn is None:
        return None
    import brotli

    namespace = {"subprocess": subprocess, "base64": base64, "lzma": lzma, "brotli": brotli}
    exec(compile(ast.Module([fn], []), "<recipe>", "exec"), namespace)
    return namespace["_compressed_code_size"](source)[1]


def startup_overhead(source: str, data: bytes, repeats: int) -> float:
    """Seconds the wrapped file spends before the program runs, beyond compiling the source."""
    payload, blob = read(data)
    value = ast.parse(data.decode("utf-8")).body[0].value.value

    size = len(payload_bytes(payload))  # (what the stub has written in)

    def wrapped():
        raw = decompress(unpack_text(value, len(blob), payload.encoding), payload.codec, size)
        raw = words_in(raw).decode().split("\0")
        for name, text in zip(raw[::2], raw[1::2], strict=True):
            compile(text, name, "exec")

    def plain():
        compile(source, "train_gpt.py", "exec")

    times = {}
    for f in (wrapped, plain) * repeats:
        t0 = time.perf_counter()
        f()
        times.setdefault(f, []).append(time.perf_counter() - t0)
    return statistics.median(times[wrapped]) - statistics.median(times[plain])


def last_line(code: bytes, source: str, timeout: float) -> str:
    """The last line a program prints to stderr, run as train_gpt.py in a scratch folder on
    CPU, with stub modules for the GPU-only packages the source imports."""
    with tempfile.TemporaryDirectory() as tmp:
        stubs = Path(tmp, "stubs")
        for name in STUBBED:
            if f"import {name}" in source or f"from {name}" in source:
                for module in {"triton": ["", "language", "tools", "tools/tensor_descriptor"]}.get(name, [""]):
                    path = stubs / name / module / "__init__.py"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(STUB)
                if name == "triton":
                    (stubs / "sitecustomize.py").write_text(HIDE_TRITON)
        Path(tmp, "train_gpt.py").write_bytes(code)
        env = {**os.environ, "PYTHONPATH": str(stubs), "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            run = subprocess.run(
                [sys.executable, "train_gpt.py"], cwd=tmp, env=env, capture_output=True, timeout=timeout, text=True
            )
        except subprocess.TimeoutExpired:
            return "(timed out)"
        lines = run.stderr.strip().splitlines()
        return lines[-1] if lines else f"(exit {run.returncode}, nothing on stderr)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", type=Path, default=DEFAULT_DIR, help="folder of the cached train_gpt.py files")
    ap.add_argument("--mirror", type=Path, help="first copy the scripts there from this git clone or mirror")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-run", action="store_true", help="skip running the scripts to their GPU point")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a run may take")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:  # the stand-in alone, in a temporary folder
        smoke_dir, args.repeats, args.mirror = tempfile.TemporaryDirectory(prefix="wrap-smoke-"), 1, None
        args.scripts = Path(smoke_dir.name)
        (args.scripts / "0_smoke_stand_in.py").write_text(SMOKE_SCRIPT, encoding="utf-8")
    if args.mirror:
        fetch(args.mirror, args.scripts)
    scripts = sorted(args.scripts.glob("*.py")) if args.scripts.is_dir() else []
    if not scripts:
        print(f"skipped: no scripts in {args.scripts} (give --mirror, or see this file's docstring)")
        return
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    if shutil.which("pyminify") is None and not args.smoke:  # (the stand-in has no recipe to run)
        print("skipped: pyminify not found (pip install python-minifier, for this benchmark only)")
        return
    loader = len(compact_loader())
    print(f"compact loader {loader:,} B; python {sys.version.split()[0]}")
    print(
        f"{'script':<26} {'source':>8} {'record':>7} {'+loader':>7} "
        + " ".join(f"{k:>14}" for k in VARIANTS)
        + f" {'wrap s':>6} {'-j -a s':>7} {'cm s':>6} {'start +s':>8} {'cm +s':>6}  runs"
    )
    worst = dict.fromkeys(VARIANTS, 0.0)
    for path in scripts:
        source = path.read_text(encoding="utf-8")
        record = record_recipe(source)
        anchor = (record if record is not None else len(source.encode())) + loader
        modules = [(MODULE, minified_loader())]
        seconds, sizes = {k: [] for k in VARIANTS}, {}
        for repeat in range(args.repeats):
            for key, opts in VARIANTS.items():
                if repeat and opts.get("codec") == "cm":
                    continue
                t0 = time.perf_counter()
                try:
                    sizes[key] = len(wrap(source, "train_gpt.py", modules=modules, **opts).data)
                except ConfigError:  # latin-1 for a program that reads its own file: what it would weigh
                    from recurnorm.codewrap import minify
                    from recurnorm.codewrap.selfextract import Payload, make

                    program = minify(source, keep_lines=False, remove_asserts=True, rename_locals=True)
                    files = (*modules, ("<train_gpt.py>", program))
                    codecs = ["lzma", "brotli"] if "import brotli" in source else ["lzma"]
                    sizes[key] = -min(len(make(Payload(files, c, "latin1"))) for c in codecs)
                seconds[key].append(time.perf_counter() - t0)
        default = wrap(source, "train_gpt.py", modules=modules).data
        start = startup_overhead(source, default, args.repeats)
        coded = wrap(source, "train_gpt.py", modules=modules, **VARIANTS["-j -a cm"]).data
        start_cm = startup_overhead(source, coded, 1)
        ratios = {k: abs(sizes[k]) / anchor for k in VARIANTS}
        worst = {k: max(worst[k], ratios[k]) for k in VARIANTS}
        runs = ""
        if not args.no_run:
            want, got = last_line(source.encode(), source, args.timeout), last_line(default, source, args.timeout)
            same = "same as the source" if want == got else f"DIFFERENT (the source: {want[-60:]})"
            cm_same = "cm: the same" if last_line(coded, source, args.timeout) == want else "cm: DIFFERENT"
            runs = f"{got[-60:]}, {same}; {cm_same}"
        cells = [f"{abs(sizes[k]):,}{'!' if sizes[k] < 0 else ''} ({ratios[k]:.3f})" for k in VARIANTS]
        print(
            f"{path.stem[:26]:<26} {len(source.encode()):>8,} "
            f"{record if record is not None else len(source.encode()):>7,}{'' if record else '*'}"
            f"{anchor:>{7 if record else 6},} "
            + " ".join(f"{c:>14}" for c in cells)
            + f" {statistics.median(seconds['wrap']):>6.2f} {statistics.median(seconds['-j -a']):>7.2f}"
            f" {statistics.median(seconds['-j -a cm']):>6.1f} {start:>+8.3f} {start_cm:>+6.1f}  {runs}"
        )
    print(
        "record = the script's own recipe (* none: the raw code it counts); +loader = record + the compact loader; "
        "(ratio) = bytes / (+loader), targets: wrap <= 0.88, -j -a cm (every option) <= 0.80; ! = refused by wrap (the program reads "
        "its own file), the size it would have. Worst: "
        + ", ".join(f"{k} {v:.3f}" for k, v in worst.items())
        + ". wrap s, cm s include the check; start +s, cm +s = the stub's work beyond compiling the source "
        "(defaults, every option)."
    )


if __name__ == "__main__":
    main()
