"""What each shortcut of the codec race (recurnorm/budget/race.py GATES) buys: pack CPU time and
artifact bytes with the gate on and off, on benchmarks/pack.py's cases of >= 1M codes.

A gate that saves under 10% of pack time on such a model and under 0.1% of bytes does not earn
its place (issue 23). One thread's CPU time (time.process_time), best of --repeats.

    python benchmarks/gates.py                        # every gate, every case
    python benchmarks/gates.py --gate codes_norep --only MiniLM
    python benchmarks/gates.py --smoke                # every gate on tiny cases: seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchkit  # noqa: E402
import pack as pack_bench  # noqa: E402
import ship as ship_bench  # noqa: E402

from recurnorm.budget import pack_qtensors, parents, race  # noqa: E402

ZSTD = ("rans", "zstd", "raw")
# The packer's other thresholds, as (module, constant, value that turns it off): every int8
# matrix's rows predicted from the row above (not only where sampled row pairs' order-0 bound is
# under parents.SMOOTH of the codes'); every int8 matrix's parents searched (not only those of
# parents.SEARCH_ROWS rows or more).
THRESHOLDS = {"SMOOTH": (parents, "SMOOTH", float("inf")), "SEARCH_ROWS": (parents, "SEARCH_ROWS", 0)}


def cases(only: list[str], smoke: bool = False):
    """(name, qtensors, codecs) of every case of >= 1M codes (--smoke: the same cases, tiny)."""
    qcases = pack_bench.synthetic(1 << 14 if smoke else 4_000_000)
    qcases.update(pack_bench.golf_shaped(shrink=8 if smoke else 1))
    reals = [] if smoke or not os.path.isdir(pack_bench.REAL_CACHE) else sorted(os.listdir(pack_bench.REAL_CACHE))
    for path in reals:
        if path.endswith(".safetensors") and (not only or any(o.split()[0] in path for o in only)):
            qcases.update(pack_bench.real(os.path.join(pack_bench.REAL_CACHE, path)))
    out = [(name, qts, None) for name, qts in qcases.items()]
    if not only or any("zstd" in o for o in only):
        out += [(f"{name} zstd", qts, ZSTD) for name, qts in ship_bench.cases([], quick=False, smoke=smoke)]
    return [c for c in out if not only or any(o in c[0] for o in only)]


def timed(qts, codecs, gate: str | None) -> tuple[float, int]:
    """CPU seconds and bytes of one pack, with `gate` (a GATES row or a THRESHOLDS name) off."""
    mod, key, off = THRESHOLDS.get(gate, (None, gate, None))
    table = vars(mod) if mod else race.GATES
    value = table.get(key)
    if gate:
        table[key] = off
    try:
        t = time.process_time()
        size = len(pack_qtensors(qts, codecs=codecs))
        return time.process_time() - t, size
    finally:
        if gate:
            table[key] = value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gate", action="append", default=[], help="only this gate (or THRESHOLDS name); repeatable")
    ap.add_argument("--only", action="append", default=[], help="only cases whose name contains this")
    ap.add_argument("--repeats", type=int, default=3, help="packs each way, interleaved (best counts)")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    for gate in set(args.gate) - {*race.GATES, *THRESHOLDS}:
        ap.error(f"unknown gate {gate!r}: one of {', '.join([*race.GATES, *THRESHOLDS])}")
    if args.smoke:
        args.repeats = 1
    todo = cases(args.only, args.smoke)
    for gate in args.gate or [*race.GATES, *THRESHOLDS]:
        for name, qts, codecs in todo:
            # On and off alternate, so that a slow spell of this shared machine hits both.
            runs = [[timed(qts, codecs, g) for g in (None, gate)] for _ in range(args.repeats)]
            (t0, size0), (t, size) = (min(r[i] for r in runs) for i in (0, 1))
            print(
                f"{gate:16s} {name:32s} on {t0:6.2f} s {size0:>11,} B  off {t:6.2f} s {size:>11,} B  "
                f"gate saves {1 - t0 / t:+6.1%} time, {size / size0 - 1:+.4%} bytes",
                flush=True,
            )


if __name__ == "__main__":
    main()
