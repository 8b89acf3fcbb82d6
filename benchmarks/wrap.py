"""Counted code: `recurnorm wrap --loader` against each Parameter Golf record's own recipe.

Inputs, none of them made here: the train_gpt.py of the top five records of
openai/parameter-golf's track_10min_16mb leaderboard and the challenge's baseline train_gpt.py
(MIT licensed), cached outside git as DIR/*.py (default ~/.cache/recurnorm-bench/pg-scripts;
nothing is downloaded: fetch them once from the repository's records/track_10min_16mb/*/ and
its root). For each script, side by side:

  record      the script's own `_compressed_code_size` recipe, run as written (pyminify with
              its flags, brotli-11 or lzma, base85, an exec wrapper); the baseline has none and
              counts its raw code
  lzma+b85    the raw source, lzma -9e, base85, exec: the plain wrapper
  +loader     what shipping recurnorm's loader beside it adds the old way: the minified
              loader in its own lzma + base85 wrapper (3,936 B when this benchmark was written)
  wrap        `recurnorm wrap --loader`: program and loader in one payload; line numbers kept
  -r          the same with --rename-locals (functions' own locals get short names)
  -j -a       with --join-lines --remove-asserts (what the #1 record's recipe drops)
  -j -a -r    all three

ratio = wrap bytes / (record + loader the old way); the target is <= 0.80. Then the seconds
`wrap` takes (the self-check included; target <= 5 s), for the default and for -j -a -r
(the slowest), and the wrapped file's start-up cost over the source's: decompress + compile
of the payload against compile of the source (what `python train_gpt.py` does on every
start; target <= 0.2 s more). Medians of --repeats.

Needs python-minifier (the records' pyminify), in this run only:
    .venv/bin/pip install python-minifier
    python benchmarks/wrap.py [--scripts DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import ast
import base64
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from recurnorm.budget.loader import MODULE, compact_loader, minified_loader
from recurnorm.codewrap import wrap
from recurnorm.codewrap.selfextract import decompress, read

DEFAULT_DIR = Path.home() / ".cache" / "recurnorm-bench" / "pg-scripts"
OLD_WRAPPER = "import lzma,base64\nexec(lzma.decompress(base64.b85decode('{}')))\n"  # the loader's before wrap
OLD_FILTERS = [{"id": lzma.FILTER_LZMA1, "preset": 9 | lzma.PRESET_EXTREME, "pb": 0, "lc": 1, "lp": 0}]


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


def plain_lzma_b85(source: str) -> int:
    packed = lzma.compress(source.encode(), preset=9 | lzma.PRESET_EXTREME)
    return len(f"import lzma,base64\nexec(lzma.decompress(base64.b85decode('{base64.b85encode(packed).decode()}')))\n")


def old_compact_loader() -> int:
    packed = lzma.compress(minified_loader().encode(), format=lzma.FORMAT_ALONE, filters=OLD_FILTERS)
    return len(OLD_WRAPPER.format(base64.b85encode(packed).decode()))


def startup_overhead(source: str, data: bytes, repeats: int) -> float:
    """Seconds the wrapped file spends before the program runs, beyond compiling the source."""
    payload, blob = read(data)

    def wrapped():
        parts = decompress(blob, payload.codec).decode().split("\0")
        for name, text in zip(parts[::2], parts[1::2], strict=True):
            compile(text, name, "exec")

    def plain():
        compile(source, "train_gpt.py", "exec")

    times = {}
    for f in (wrapped, plain) * repeats:
        t0 = time.perf_counter()
        f()
        times.setdefault(f, []).append(time.perf_counter() - t0)
    return statistics.median(times[wrapped]) - statistics.median(times[plain])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", type=Path, default=DEFAULT_DIR, help="folder of the cached train_gpt.py files")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    scripts = sorted(args.scripts.glob("*.py")) if args.scripts.is_dir() else []
    if not scripts:
        print(f"skipped: no scripts in {args.scripts} (see this file's docstring for what to cache there)")
        return
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    if shutil.which("pyminify") is None:
        print("skipped: pyminify not found (pip install python-minifier into this venv, for this benchmark only)")
        return
    loader_old = old_compact_loader()
    print(f"loader: the old way (minified, lzma + base85) {loader_old:,} B; `recurnorm loader --compact` now ", end="")
    print(f"{len(compact_loader()):,} B")
    variants = {
        "wrap": {},
        "-r": {"rename_locals": True},
        "-j -a": {"keep_lines": False, "remove_asserts": True},
        "-j -a -r": {"keep_lines": False, "remove_asserts": True, "rename_locals": True},
    }
    head = f"{'script':<24} {'source':>8} {'record':>7} {'lzma+b85':>8} " + " ".join(f"{k:>8}" for k in variants)
    print(
        head
        + " "
        + " ".join(f"{'ratio ' + k:>14}" for k in variants)
        + f" {'wrap s':>6} {'-j-a-r s':>8} {'start +s':>8}"
    )
    worst = dict.fromkeys(variants, 0.0)
    for path in scripts:
        source = path.read_text(encoding="utf-8")
        record = record_recipe(source)
        anchor = (record if record is not None else len(source.encode())) + loader_old
        modules = [(MODULE, minified_loader())]
        seconds, sizes = {k: [] for k in variants}, {}
        for _ in range(args.repeats):
            for key, opts in variants.items():
                t0 = time.perf_counter()
                sizes[key] = wrap(source, "train_gpt.py", modules=modules, **opts).data
                seconds[key].append(time.perf_counter() - t0)
        start = startup_overhead(source, sizes["wrap"], args.repeats)
        ratios = {k: len(sizes[k]) / anchor for k in variants}
        worst = {k: max(worst[k], ratios[k]) for k in variants}
        print(
            f"{path.stem[:24]:<24} {len(source.encode()):>8,} "
            f"{record if record is not None else len(source.encode()):>7,}{'' if record else '*'}"
            f"{plain_lzma_b85(source):>{8 if record else 7},} "
            + " ".join(f"{len(sizes[k]):>8,}" for k in variants)
            + " "
            + " ".join(f"{ratios[k]:>14.3f}" for k in variants)
            + f" {statistics.median(seconds['wrap']):>6.2f} {statistics.median(seconds['-j -a -r']):>8.2f} {start:>+8.3f}"
        )
    print(
        "record = the script's own recipe (* none: the raw code it counts); ratio = wrap / (record + the loader "
        f"the old way, {loader_old:,} B); target <= 0.80. Worst: "
        + ", ".join(f"{k} {v:.3f}" for k, v in worst.items())
        + ". wrap s includes its self-check; start +s = decompress and compile beyond compiling the source."
    )


if __name__ == "__main__":
    main()
