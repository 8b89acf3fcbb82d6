"""Hostile-input fuzzing: re-signed mutations and the hand-made corpus against verify and unpack.

Two sets, every artifact re-signed (header and payload hashes recomputed, so that the
validation pass and the codecs are what stands in the way):

- corpus: tests/hostile_corpus.py, each case through the real CLI (`recurnorm verify`,
  then `recurnorm unpack` where verify says valid) in a forked child whose address
  space may grow by at most 1 GiB, with a 10 s alarm; peak memory is per case.
- mutations: --mutations random edits of five base artifacts (every format family, each
  codec and zstd layout, rans with none/col/grid contexts and 1-4 lanes) (manifest fields
  replaced, tweaked, deleted, copied; payload bytes flipped, inserted, deleted), run by the
  library in --workers forked children (the same limits, the alarm per case). A
  non-ArtifactError exception is a traceback the CLI would print; when verify says
  valid, unpack (read, dequantize, serialize) must succeed. Peak memory is the largest
  growth of a worker over all its cases (an upper bound for each).

    python benchmarks/fuzz.py [--mutations 10000] [--seed 0] [--workers 2] [--json OUT] [--big]

--big adds honest artifacts at the decode limit (one-symbol rans codes of 2^26-2^28
int8 weights, float32: 256 MB-1 GiB decoded) through verify and unpack, printing their
peak memory against 2 x decoded bytes + 64 MB (needs ~4 GB of free memory).

Targets (issue 13): 0 tracebacks, 0 cases over 1 GiB or 10 s, 0 cases where verify says
valid and unpack fails. The exit status is 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import hostile_corpus as hc  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from recurnorm.budget import pack_qtensors, verify_bytes  # noqa: E402
from recurnorm.errors import ArtifactError  # noqa: E402
from recurnorm.quant.qtensor import QTensor  # noqa: E402

MEM = 1 << 30
ALARM = 10
MB = 1 << 20


def bases() -> dict[str, bytes]:
    """Artifacts to mutate: every format family, each codec, and a grid-context rans stream."""
    from test_search import _embedding_like

    qts = hc.base_qtensors()
    grid = {
        "e": QTensor("ternary", (256, 128), "float32", _embedding_like().reshape(1, -1), np.array([0.5], np.float32))
    }
    # Rows and columns of different spread: the packer picks col and grid contexts, 2-4 lanes.
    rng = np.random.default_rng(1)
    R, C = 256, 512
    w = rng.normal(size=(R, C)) * np.exp(rng.normal(size=(R, 1))) * np.exp(rng.normal(size=(1, C)))
    s = np.abs(w).max(1) / 7
    col = rng.normal(size=(R, C)) * np.exp(2 * rng.normal(size=(1, C)))
    cs = np.abs(col).max() / 7
    tern = (rng.random((1, 1 << 18)) < 0.3).astype(np.int8) * rng.choice([-1, 1], size=(1, 1 << 18)).astype(np.int8)
    contexts = {
        "grid": QTensor(
            "int4", (R, C), "float32", np.clip(np.round(w / s[:, None]), -7, 7).astype(np.int8), s.astype(np.float16)
        ),
        "col": QTensor(
            "int4",
            (R, C),
            "float32",
            np.clip(np.round(col / cs), -7, 7).astype(np.int8).reshape(1, -1),
            np.array([cs], np.float32),
        ),
        "lanes": QTensor("ternary", (512, 512), "float32", tern, np.array([0.1], np.float32)),
    }
    return {
        "mixed": hc.BASE,
        "zstd": pack_qtensors(qts, {"config": {}}, codecs=["zstd"]),
        "raw": pack_qtensors(qts, codecs=["raw"]),
        "grid": pack_qtensors(grid),
        "contexts": pack_qtensors(contexts),
    }


# ------------------------------------------------------------------ the corpus, through the CLI


def run_corpus(out_dir: Path) -> list[dict]:
    rows = []
    for path in hc.write(out_dir):
        r = hc.run_cli(["verify", str(path)], MEM, ALARM)
        row = {
            "case": path.stem,
            "verify": r["code"],
            "seconds": r["seconds"],
            "peak": r["peak_bytes"],
            "traceback": "Traceback" in r["stderr"] or r["code"] == 71,
            "lines": len(r["stderr"].strip().splitlines()),
            "unpack_failed": False,
        }
        if r["code"] == 0:
            u = hc.run_cli(["unpack", str(path), "-o", str(path.with_suffix(".safetensors")), "--force"], MEM, ALARM)
            row["unpack_failed"] = u["code"] != 0
            row["seconds"] += u["seconds"]
            row["peak"] = max(row["peak"], u["peak_bytes"])
        rows.append(row)
    return rows


# ------------------------------------------------------------------ mutations, in forked workers


class Alarm(Exception):
    pass


def _on_alarm(signum, frame):
    raise Alarm()


def _worker(seeds: list[int], base_list: list[tuple[str, bytes]], out_path: str) -> None:
    """Run mutation cases; write one JSON line per case and the worker's peak growth."""
    size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + MEM, resource.RLIM_INFINITY))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    signal.signal(signal.SIGALRM, _on_alarm)
    with open(out_path, "w") as out:
        for seed in seeds:
            rng = random.Random(seed)
            base_name, base = base_list[seed % len(base_list)]
            data = hc.mutated(rng, base)
            row = {
                "case": f"{base_name}/{seed}",
                "verify": None,
                "traceback": None,
                "unpack_failed": None,
                "timeout": False,
                "memory": False,
            }
            start = time.perf_counter()
            signal.alarm(ALARM)
            try:
                rep = verify_bytes(data)
                row["verify"] = rep.exit_code
                if rep.ok:
                    try:
                        hc.unpack_in_memory(data)
                        row["unpack_failed"] = False
                    except Exception as exc:  # noqa: BLE001
                        row["unpack_failed"] = f"{type(exc).__name__}: {exc}"[:300]
            except Alarm:
                row["timeout"] = True
            except MemoryError:
                row["memory"] = True
            except ArtifactError:  # verify_bytes reports these; it should never raise them
                row["traceback"] = "ArtifactError escaped verify_bytes"
            except Exception as exc:  # noqa: BLE001
                row["traceback"] = "".join(traceback.format_exception_only(exc)).strip()[:300]
            finally:
                signal.alarm(0)
            row["seconds"] = time.perf_counter() - start
            out.write(json.dumps(row) + "\n")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
        out.write(json.dumps({"worker_peak": peak}) + "\n")


def run_mutations(n: int, seed: int, workers: int, tmp: Path) -> tuple[list[dict], int]:
    base_list = sorted(bases().items())
    seeds = list(range(seed, seed + n))
    pids = []
    for w in range(workers):
        path = tmp / f"worker{w}.jsonl"
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _worker(seeds[w::workers], base_list, str(path))
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        pids.append((pid, path))
    rows, peak = [], 0
    for pid, path in pids:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"worker {pid} exited {os.waitstatus_to_exitcode(status)}", file=sys.stderr)
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "worker_peak" in rec:
                peak = max(peak, rec["worker_peak"])
            else:
                rows.append(rec)
    return rows, peak


# ------------------------------------------------------------------ report


def summarize(name: str, rows: list[dict], peak: int) -> dict:
    slow = max(rows, key=lambda r: r["seconds"])
    return {
        "set": name,
        "cases": len(rows),
        "exit_codes": dict(sorted(collections.Counter(str(r["verify"]) for r in rows).items())),
        "tracebacks": sum(bool(r["traceback"]) for r in rows),
        "verify_ok_unpack_failed": sum(bool(r["unpack_failed"]) for r in rows),
        "over_10s": sum(bool(r.get("timeout")) or r["seconds"] > ALARM for r in rows),
        "over_1GiB": sum(bool(r.get("memory")) or r.get("peak", 0) > MEM for r in rows) + (peak > MEM),
        "multi_line_errors": sum(r.get("lines", 1) > 1 for r in rows),
        "peak_mb": peak / MB,
        "slowest_s": slow["seconds"],
        "slowest_case": slow["case"],
    }


def run_big(out_dir: Path) -> None:
    """Valid artifacts at the limit: verify's and unpack's time and peak growth."""
    out_dir.mkdir(parents=True, exist_ok=True)
    print("| decoded MB | command | exit | seconds | peak MB | 2 x decoded + 64 MB |")
    print("|---:|---|---:|---:|---:|---:|")
    for rows in (1 << 12, 1 << 13, 1 << 14):
        shape = [rows, (1 << 14) - 1]
        decoded = shape[0] * shape[1] * 4
        path = out_dir / f"big{rows}.rnpk"
        path.write_bytes(hc._bomb(shape, "float32", valid=True))
        for cmd in (["verify", str(path)], ["unpack", str(path), "-o", str(path) + ".safetensors", "--force"]):
            r = hc.run_cli(cmd, 8 << 30, 120)
            print(
                f"| {decoded / MB:.0f} | {cmd[0]} | {r['code']} | {r['seconds']:.1f} | "
                f"{r['peak_bytes'] / MB:.0f} | {(2 * decoded + 64 * MB) / MB:.0f} |"
            )
        path.unlink()
        Path(str(path) + ".safetensors").unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutations", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the summary and the failing cases here")
    ap.add_argument("--big", action="store_true", help="also valid artifacts at the 1 GiB limit")
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = run_corpus(tmp / "corpus")
        mutations, worker_peak = run_mutations(args.mutations, args.seed, args.workers, tmp)
    summaries = [
        summarize("corpus (CLI)", corpus, max(r["peak"] for r in corpus)),
        summarize("mutations (library)", mutations, worker_peak),
    ]
    head = (
        f"| {'set':<20} | {'cases':>6} | {'exit codes':<22} | tracebacks | verify ok, unpack failed | "
        "> 10 s | > 1 GiB | peak MB | slowest |"
    )
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for s in summaries:
        codes = " ".join(f"{k}:{v}" for k, v in s["exit_codes"].items())
        print(
            f"| {s['set']:<20} | {s['cases']:>6} | {codes:<22} | {s['tracebacks']:>10} | "
            f"{s['verify_ok_unpack_failed']:>24} | {s['over_10s']:>6} | {s['over_1GiB']:>7} | "
            f"{s['peak_mb']:>7.1f} | {s['slowest_s']:.2f} s ({s['slowest_case']}) |"
        )
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.big:
        with tempfile.TemporaryDirectory() as tmp:
            run_big(Path(tmp))
    bad = [
        r
        for r in corpus + mutations
        if r["traceback"]
        or r["unpack_failed"]
        or r.get("timeout")
        or r.get("memory")
        or r.get("lines", 1) > 1
        or (r.get("verify") not in (0, 4) and "/" in r["case"])
    ]
    for r in bad[:20]:
        print("FAIL", json.dumps(r), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"summary": summaries, "failures": bad}, indent=2) + "\n")
    missed = any(
        s["tracebacks"] or s["verify_ok_unpack_failed"] or s["over_10s"] or s["over_1GiB"] or s["multi_line_errors"]
        for s in summaries
    )
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
