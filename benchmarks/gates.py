"""What each shortcut of the codec race (recurnorm/budget/options.py Gates) and of the parents search
buys: pack CPU time and artifact bytes with it on and off (a PackOptions variant), on
benchmarks/pack.py's cases of >= 1M codes.

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
from dataclasses import fields, replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchkit  # noqa: E402
import pack as pack_bench  # noqa: E402
import ship as ship_bench  # noqa: E402

from recurnorm.budget import pack_qtensors  # noqa: E402
from recurnorm.budget.options import Gates, PackOptions  # noqa: E402

ZSTD = ("rans", "zstd", "raw")
NORMAL = PackOptions()
# Each shortcut off, as the options of effort normal but for it: every gate of the race; every
# int8 matrix's rows predicted from the row above (not only where sampled row pairs' order-0
# bound is under parents_smooth of the codes'); every int8 matrix's parents searched (not only
# those of parents_search_rows rows or more).
OFF = {g.name: replace(NORMAL, gates=replace(NORMAL.gates, **{g.name: None})) for g in fields(Gates)}
OFF.update(
    parents_smooth=replace(NORMAL, parents_smooth=float("inf")),
    parents_search_rows=replace(NORMAL, parents_search_rows=0),
)


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


def timed(qts, codecs, options: PackOptions) -> tuple[float, int]:
    """CPU seconds and bytes of one pack with these options."""
    t = time.process_time()
    size = len(pack_qtensors(qts, codecs=codecs, options=options))
    return time.process_time() - t, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gate", action="append", default=[], help="only this shortcut (an OFF name); repeatable")
    ap.add_argument("--only", action="append", default=[], help="only cases whose name contains this")
    ap.add_argument("--repeats", type=int, default=3, help="packs each way, interleaved (best counts)")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    for gate in set(args.gate) - set(OFF):
        ap.error(f"unknown gate {gate!r}: one of {', '.join(OFF)}")
    if args.smoke:
        args.repeats = 1
    todo = cases(args.only, args.smoke)
    for gate in args.gate or list(OFF):
        for name, qts, codecs in todo:
            # On and off alternate, so that a slow spell of this shared machine hits both.
            runs = [[timed(qts, codecs, o) for o in (NORMAL, OFF[gate])] for _ in range(args.repeats)]
            (t0, size0), (t, size) = (min(r[i] for r in runs) for i in (0, 1))
            print(
                f"{gate:20s} {name:32s} on {t0:6.2f} s {size0:>11,} B  off {t:6.2f} s {size:>11,} B  "
                f"gate saves {1 - t0 / t:+6.1%} time, {size / size0 - 1:+.4%} bytes",
                flush=True,
            )


if __name__ == "__main__":
    main()
