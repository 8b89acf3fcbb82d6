"""heap.settle: the packer's same-size temporaries stop costing fresh pages on glibc."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

GLIBC = sys.platform == "linux" and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")

PROBE = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from recurnorm import heap
    if sys.argv[1] == "settle":
        heap.settle()
        heap.settle()  # once is enough; again is harmless
    a = np.ones(1 << 20)  # a long-lived array above the working set, as a model's codes are
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(200):  # a search's temporaries: a few of 600 KB at once, again and again
        ts = [np.zeros(75_000) for _ in range(4)]
        for t in ts:
            t += 1
        del ts, t
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_settled_heap_serves_repeated_temporaries_without_page_faults():
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
        return int(out.stdout)

    assert faults("default") > 200 * 200  # freed to the system and faulted back: ~147 pages a temporary
    assert faults("settle") < 5000  # the first touches only


BIG = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from recurnorm import heap
    if sys.argv[1] == "settle":
        heap.settle()
    core = getattr(np, "_core", None) or np.core
    huge = core.multiarray._set_madvise_hugepage(False)  # (returns what it was)
    faults = []
    for _ in range(3):  # a checkpoint's tensors: blocks past the mmap threshold, one after another
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = np.ones(48 << 17)  # 48 MiB
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del a
    print(int(huge), faults[0], faults[-1])
""")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_settled_heap_serves_a_tensor_sized_block_again_and_numpy_asks_no_huge_pages():
    """Past 32 MB malloc maps each block afresh; settled, a freed 48 MiB block serves the next
    (its pages touched once), and numpy no longer advises huge pages (heap.py: both cost a
    virtual machine system time)."""

    def probe(mode: str) -> list[int]:
        out = subprocess.run([sys.executable, "-c", BIG, mode], capture_output=True, text=True, check=True)
        return [int(v) for v in out.stdout.split()]

    huge, first, last = probe("default")
    assert last > 1000 or huge  # unsettled: mapped afresh each time (or fewer faults: huge pages)
    huge, first, last = probe("settle")
    assert huge == 0 and first > 1000 and last < 100


TRIM_PROBE = """
import numpy as np
from recurnorm import heap
heap.settle()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
big = np.ones(1 << 25)  # 256 MiB from the heap (no mmap)
later = np.ones(1 << 20)  # 8 MiB above it: the heap's top is not free
del big
before = rss()
heap.give_back()
print(before - rss())
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc_trim")
def test_giving_back_free_memory_returns_a_freed_block_below_the_top():
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 200 << 20


WORKING_SET = textwrap.dedent("""
    import resource
    import numpy as np
    from recurnorm import heap
    heap.settle()
    faults = []
    for _ in range(3):  # a large tensor's temporaries, 192 MiB at once, freed, then the next's
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        parts = [np.ones(8 << 20) for _ in range(3)]  # 64 MiB each
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del parts
    print(faults[0], faults[-1])
""")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_a_large_tensors_freed_working_set_serves_the_next_tensor():
    """A settled heap keeps a freed top of 192 MiB (a large tensor's temporaries, each over the
    mmap threshold) for the next tensor: at glibc's own trim threshold (64 MB) it went back to
    the system after each tensor, and each next one faulted all of its pages in again."""
    out = subprocess.run([sys.executable, "-c", WORKING_SET], capture_output=True, text=True, check=True)
    first, last = (int(v) for v in out.stdout.split())
    assert first > 40_000 and last < 1000
