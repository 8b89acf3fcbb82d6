"""Hostile-input fuzzing: the hand-made corpus and re-signed mutations against verify, unpack
and the standalone loader.

Every artifact is re-signed (header and payload hashes recomputed), so that the validation
pass, the codecs and the loader's own checks are what stands in the way. Three readers:
`verify`, `unpack` (read, dequantize, write the .safetensors, read that file back with the
safetensors library) and the standalone loader (`rnpk_load.load`).

- corpus: tests/hostile_corpus.py (round one, round two's classes, and the odd valid
  artifacts), each case through the real CLI (`recurnorm verify`, `recurnorm unpack`) and
  the loader, each in a forked child whose address space may grow by at most 1 GiB, with a
  10 s alarm; peak memory is per child.
- inputs: round three's classes (tests/hostile_corpus.py R3_CASES): tensor names, a config
  key and an output path holding every C0/C1 control, DEL and bidi character through pack,
  inspect (both tables), verify, unpack and plan; FIFOs, device nodes (as root), folders and
  links to them as -o/--report (never replaced) and as checkpoint, config.json, --policy,
  wrap source/--check and --calib-data (refused before reading); 20,000 tiny tensors, a
  1.2 MB wrap source, --threads/--jobs 10,000; non-string keys, sparse and meta tensors,
  `pack .`, empty tensors for plan --like, a 100,000-term expression for wrap; unpack's two
  files; -o '', a --max-decoded-bytes too small (exit 3), SIGINT (130). Each in a bounded
  child: a wrong exit code or a second error line counts as a traceback; a control character
  printed or a file touched that was not asked for, as a disagreement.
- mutations: --mutations random edits of the corpus's base artifacts (every format family,
  each codec and packed layout, rans with none/col/grid contexts and 1-4 lanes, uint64 codes
  past int64) (manifest fields replaced, tweaked, deleted, copied; payload bytes flipped,
  inserted, deleted), run by the library and the loader in --workers forked children (the
  same limits, the alarm per case). Peak memory is the largest growth of a worker over all
  its cases (an upper bound for each).

Counted, per set:
- tracebacks: an exception the CLI would print as one (verify raising at all; unpack raising
  anything but ArtifactError; a CLI exit that is neither 0 nor 4, or a multi-line error);
- loader non-ValueError: the loader raising anything but RnpkError (its one error type);
- disagreements: verify says valid and unpack fails, the file it writes does not read back
  equal, or (the artifact being portable) the loader fails or returns other bits; verify
  refusing and unpack writing;
- over 10 s / over 1 GiB: a reader killed by the alarm or out of memory (the loader reports
  a MemoryError inside RnpkError: counted here too);
- loader reads refused: informational, the loader returning a dict where verify refused (it
  checks what decoding needs, not names for unpack's file or code ranges).

    python benchmarks/fuzz.py [--mutations 3000] [--seed 0] [--workers 2] [--json OUT] [--big]
    python benchmarks/fuzz.py --smoke   # 2 corpus cases, 1 valid artifact, 2 input cases, 20 mutations

--big adds honest artifacts at the decode limit (one-symbol rans codes of 2^26-2^28
int8 weights, float32: 256 MB-1 GiB decoded) through verify, unpack and the loader,
printing their peak memory against 2 x decoded bytes + 64 MB (needs ~4 GB of free memory).

Targets (issues 13 and 25): 0 tracebacks, 0 non-ValueError loader exceptions, 0 cases over
1 GiB or 10 s, 0 disagreements. The exit status is 1 when a target is missed.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import hostile_corpus as hc  # noqa: E402
import torch  # noqa: E402

from recurnorm.budget import Budget, rnpk_load, validate, verify_bytes  # noqa: E402
from recurnorm.budget import format as fmt  # noqa: E402
from recurnorm.errors import ArtifactError  # noqa: E402

MEM = 1 << 30
ALARM = 10
MB = 1 << 20


# ------------------------------------------------------------------ the corpus, through the CLI


SMOKE = {"corpus": 2, "valid": 1, "inputs": 2, "mutations": 20}  # --smoke: how many of each


def run_corpus(out_dir: Path, smoke: bool = False) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = {**{k: v for k, v in hc.CASES.items()}, **hc.VALID}
    if smoke:  # the first hostile cases and the first valid artifact
        cases = dict([*list(hc.CASES.items())[: SMOKE["corpus"]], *list(hc.VALID.items())[: SMOKE["valid"]]])
    rows = []
    for name, make in cases.items():
        path = out_dir / (name.replace("/", "__").replace("=", "_").replace("^", "") + ".rnpk")
        data = make()
        path.write_bytes(data)
        out = path.with_suffix(".safetensors")
        v = hc.run_cli(["verify", str(path)], MEM, ALARM)
        u = hc.run_cli(["unpack", str(path), "-o", str(out), "--force"], MEM, ALARM)
        got = hc.run_loader(path, MEM, ALARM)
        runs = (v, u, got)
        row = {
            "case": name,
            "verify": v["code"],
            "seconds": max(r["seconds"] for r in runs),
            "peak": max(r.get("peak_bytes", r.get("peak", 0)) for r in runs),
            "traceback": any(r.get("code") not in (0, 4) or "Traceback" in r.get("stderr", "") for r in (v, u))
            or any(len(r["stderr"].strip().splitlines()) > 1 for r in (v, u) if r["code"] == 4),
            "timeout": any(r["code"] == -signal.SIGALRM for r in runs),
            "memory": any(r["code"] == -signal.SIGKILL for r in runs) or "MemoryError" in got.get("error", ""),
            "loader_not_value_error": not got["ok"] and not (got["type"] == "RnpkError" and got["value_error"]),
            "loader_reads_refused": v["code"] == 4 and got["ok"],
            "disagree": None,
        }
        if v["code"] == 0:
            from safetensors.torch import load_file

            try:
                written = hc.digests(load_file(str(out))) if u["code"] == 0 else None
            except Exception as exc:  # noqa: BLE001
                written = f"unreadable: {exc}"
            portable = verify_bytes(data, Budget(loader=4000)).ok
            if u["code"] != 0 or not isinstance(written, dict):
                row["disagree"] = f"verify ok, unpack {u['code']}: {str(written)[:100]} {u['stderr'][-200:]}"
            elif portable and (not got["ok"] or got["digests"] != written):
                row["disagree"] = f"verify ok, loader: {got.get('type')} {got.get('error', 'other bits')}"[:300]
        elif u["code"] == 0:
            row["disagree"] = "verify refused, unpack wrote"
        out.unlink(missing_ok=True)
        out.with_name("config.json").unlink(missing_ok=True)
        rows.append(row)
    return rows


def run_inputs(out_dir: Path, limit: int | None = None) -> list[dict]:
    """Round three's classes (hostile_corpus.R3_CASES): names with every control and bidi
    character, FIFOs and device nodes as inputs and outputs, limits, odd state dicts, half-done
    writes, exit codes; each through the CLI in a bounded child, in a folder of its own."""
    rows = []
    for i, name in enumerate(list(hc.R3_CASES)[:limit]):
        folder = out_dir / f"case{i}"
        folder.mkdir(parents=True)
        r = hc.run_input_case(name, folder, MEM, ALARM)
        rows.append(
            {
                "case": name,
                "verify": r["code"],
                "seconds": r["seconds"],
                "peak": r["peak"],
                # a wrong exit code or more than one error line counts as a traceback would
                "traceback": r["traceback"] or not r["one_line"] or r["code"] != r["expected"],
                "timeout": r["code"] == -signal.SIGALRM,
                "memory": r["code"] == -signal.SIGKILL,
                "loader_not_value_error": False,
                "loader_reads_refused": False,
                # a control character printed, or a file touched that was not asked for
                "disagree": (f"printed {r['controls']}" if r["controls"] else None)
                or (f"touched {r['changed']}" if r["changed"] else None),
            }
        )
    return rows


# ------------------------------------------------------------------ mutations, in forked workers


class Alarm(BaseException):  # not an Exception: the loader's catch-all must not swallow it
    pass


def _on_alarm(signum, frame):
    raise Alarm()


def _one(data: bytes) -> dict:
    """verify, unpack (its file read back) and the loader on one artifact."""
    row: dict = {"verify": None, "traceback": None, "disagree": None, "loader_not_value_error": None}
    try:
        rep = verify_bytes(data)
    except ArtifactError:  # verify_bytes reports these; it should never raise them
        row["traceback"] = "ArtifactError escaped verify_bytes"
        return row
    except (MemoryError, Alarm):
        raise
    except Exception as exc:  # noqa: BLE001
        row["traceback"] = "verify: " + "".join(traceback.format_exception_only(exc)).strip()[:300]
        return row
    row["verify"] = rep.exit_code
    written = None
    try:
        written = hc.digests(hc.unpack_read_back(data))
        unpack_error = None
    except ArtifactError as exc:
        unpack_error = f"ArtifactError: {exc}"
    except (MemoryError, Alarm):
        raise
    except Exception as exc:  # noqa: BLE001 - unpack would print a traceback
        unpack_error = f"{type(exc).__name__}: {exc}"
        if rep.ok or "ArtifactError" not in unpack_error:
            row["traceback"] = "unpack: " + unpack_error[:300]
    try:
        got = hc.digests(rnpk_load.load(data))
        loader_error = None
    except rnpk_load.RnpkError as exc:
        got, loader_error = None, str(exc)
        if "MemoryError" in loader_error:
            raise MemoryError(loader_error) from None
    except (MemoryError, Alarm):
        raise
    except Exception as exc:  # noqa: BLE001
        got, loader_error = None, f"{type(exc).__name__}: {exc}"
        row["loader_not_value_error"] = loader_error[:300]
    row["loader_reads_refused"] = not rep.ok and got is not None
    if rep.ok:
        if written is None:
            row["disagree"] = f"verify ok, unpack failed: {unpack_error}"[:300]
        elif verify_bytes(data, Budget(loader=4000)).ok and got != written:
            row["disagree"] = f"verify ok, loader {'failed: ' + loader_error if got is None else 'other bits'}"[:300]
    elif written is not None:
        row["disagree"] = "verify refused, unpack wrote"
    return row


def _worker(seeds: list[int], base_list: list[bytes], out_path: str) -> None:
    """Run mutation cases; write one JSON line per case and the worker's peak growth."""
    import warnings

    warnings.simplefilter("ignore", RuntimeWarning)  # numpy's overflow notes on forged scales: counted, not printed
    size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + MEM, resource.RLIM_INFINITY))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    signal.signal(signal.SIGALRM, _on_alarm)
    with open(out_path, "w") as out:
        for seed in seeds:
            rng = random.Random(seed)
            base = seed % len(base_list)
            data = hc.mutated(rng, base_list[base])
            row = {"case": f"base{base}/{seed}", "timeout": False, "memory": False}
            start = time.perf_counter()
            signal.alarm(ALARM)
            try:
                row.update(_one(data))
            except Alarm:
                row["timeout"] = True
            except MemoryError:
                row["memory"] = True
            finally:
                signal.alarm(0)
            row["seconds"] = time.perf_counter() - start
            out.write(json.dumps(row) + "\n")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
        out.write(json.dumps({"worker_peak": peak}) + "\n")


def run_mutations(n: int, seed: int, workers: int, tmp: Path) -> tuple[list[dict], int]:
    base_list = hc.bases()
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
        "loader_not_value_error": sum(bool(r["loader_not_value_error"]) for r in rows),
        "disagreements": sum(bool(r["disagree"]) for r in rows),
        "over_10s": sum(bool(r.get("timeout")) or r["seconds"] > ALARM for r in rows),
        "over_1GiB": sum(bool(r.get("memory")) or r.get("peak", 0) > MEM for r in rows) + (peak > MEM),
        "loader_reads_refused": sum(bool(r.get("loader_reads_refused")) for r in rows),
        "peak_mb": peak / MB,
        "slowest_s": slow["seconds"],
        "slowest_case": slow["case"],
    }


def print_table(summaries: list[dict]) -> None:
    cols = [
        ("set", "set", "<20"),
        ("cases", "cases", ">6"),
        ("exit codes", "exit_codes", "<14"),
        ("tracebacks", "tracebacks", ">10"),
        ("loader non-ValueError", "loader_not_value_error", ">21"),
        ("disagreements", "disagreements", ">13"),
        ("> 10 s", "over_10s", ">6"),
        ("> 1 GiB", "over_1GiB", ">7"),
        ("loader reads refused", "loader_reads_refused", ">20"),
        ("peak MB", "peak_mb", ">7"),
    ]
    print("| " + " | ".join(f"{h:{f}}" for h, _, f in cols) + " | slowest |")
    print(
        "|"
        + "|".join(("-" * (len(f"{h:{f}}") + 1) + ":") if ">" in f else "-" * (len(f"{h:{f}}") + 2) for h, _, f in cols)
        + "|---|"
    )
    for s in summaries:
        vals = []
        for _, key, f in cols:
            v = s[key]
            if key == "exit_codes":
                v = " ".join(f"{k}:{n}" for k, n in v.items())
            elif key == "peak_mb":
                v = f"{v:.0f}"
            vals.append(f"{v:{f}}")
        print("| " + " | ".join(vals) + f" | {s['slowest_s']:.2f} s ({s['slowest_case']}) |")


def run_big(out_dir: Path) -> None:
    """Valid artifacts at the limit: verify's, unpack's and the loader's time and peak growth."""
    out_dir.mkdir(parents=True, exist_ok=True)
    print("| decoded MB | reader | exit | seconds | peak MB | 2 x decoded + 64 MB |")
    print("|---:|---|---:|---:|---:|---:|")
    for rows, dtype in ((1 << 12, "float32"), (1 << 13, "float32"), (1 << 13, "bfloat16"), (1 << 14, "float32")):
        shape = [rows, (1 << 14) - 1]
        path = out_dir / f"big{rows}.rnpk"
        data = hc._bomb(shape, dtype, valid=True)
        path.write_bytes(data)
        decoded = validate.check_manifest(fmt.split_container(data)[0])
        bound = (2 * decoded + 64 * MB) / MB
        for cmd in (["verify", str(path)], ["unpack", str(path), "-o", str(path) + ".safetensors", "--force"]):
            r = hc.run_cli(cmd, 8 << 30, 120)
            print(
                f"| {decoded / MB:.0f} ({dtype}) | {cmd[0]} | {r['code']} | {r['seconds']:.1f} | "
                f"{r['peak_bytes'] / MB:.0f} | {bound:.0f} |"
            )
        Path(str(path) + ".safetensors").unlink(missing_ok=True)
        g = hc.run_loader(path, 8 << 30, 120)
        print(
            f"| {decoded / MB:.0f} ({dtype}) | loader | {'ok' if g['ok'] else g['type']} | {g['seconds']:.1f} | "
            f"{g['peak'] / MB:.0f} | {bound:.0f} |"
        )
        path.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutations", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the summary and the failing cases here")
    ap.add_argument("--big", action="store_true", help="also valid artifacts at the 1 GiB limit")
    ap.add_argument("--no-corpus", action="store_true", help="the mutations only")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.mutations, args.workers, args.big = SMOKE["mutations"], 1, False
    torch.set_num_threads(1)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = [] if args.no_corpus else run_corpus(tmp / "corpus", args.smoke)
        inputs = [] if args.no_corpus else run_inputs(tmp / "inputs", SMOKE["inputs"] if args.smoke else None)
        mutations, worker_peak = run_mutations(args.mutations, args.seed, args.workers, tmp)
    summaries = (
        ([summarize("corpus (CLI + loader)", corpus, max(r["peak"] for r in corpus))] if corpus else [])
        + ([summarize("inputs (CLI, round 3)", inputs, max(r["peak"] for r in inputs))] if inputs else [])
        + [summarize("mutations (library)", mutations, worker_peak)]
    )
    print_table(summaries)
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.big:
        with tempfile.TemporaryDirectory() as tmp:
            run_big(Path(tmp))
    bad = [
        r
        for r in corpus + inputs + mutations
        if r["traceback"] or r["disagree"] or r["loader_not_value_error"] or r.get("timeout") or r.get("memory")
    ]
    for r in bad[:20]:
        print("FAIL", json.dumps(r), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"summary": summaries, "failures": bad}, indent=2) + "\n")
    missed = any(
        s["tracebacks"] or s["disagreements"] or s["loader_not_value_error"] or s["over_10s"] or s["over_1GiB"]
        for s in summaries
    )
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
