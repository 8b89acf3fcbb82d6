"""Where the packer's temporaries (and its jobs') come from: glibc's heap, in pages of the usual size.

glibc returns the free top of its heap to the system past a trim threshold, and maps blocks past
its mmap threshold afresh each time; each later touch of those pages is a page fault. On the
virtual machines we measure on, a fault costs ~3 us (clearing a page the host had taken back:
1.1 GB of them was a fifth of a 1.1B-weight int8 unpack). `settle()` sets, once per process, a
trim threshold above a large tensor's working set and no mmap, so that a freed tensor's blocks
serve the next; and numpy asks for no huge pages (docs/SCALE.md). `give_back()` returns the
free pages, wherever they lie. Nothing changes off Linux; malloc's, off glibc."""

from __future__ import annotations

import ctypes
import functools
import os
import sys

import numpy as np

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters
# Above a large tensor's working set (a 32000x2048 bf16 matrix's decode: ~600 MB), where glibc's own
# adjustment ends at 64 MB (twice its largest mmap threshold): with that, each tensor over ~64 MB
# of temporaries gave its top back and faulted it in again. A 1.1B-weight bf16 model: verify
# 1.27M -> 0.15M page faults, 12.2-12.6 -> 9.9-10.6 s (one job); pack with two jobs 1.86M ->
# 0.81M, 18.3-23.1 -> 18.0-20.4 s; peak RSS unchanged or +64-140 MB. What a job holds past a
# large tensor it gives back (parallel.LARGE_SHARE).
TRIM_THRESHOLD = 512 << 20


@functools.cache  # (once per process)
def settle() -> None:
    """glibc's trim threshold above a tensor's working set, no mmap; no huge pages for numpy (Linux)."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if sys.platform != "linux":
        return
    core = getattr(np, "_core", None) or np.core  # (numpy 2 / 1)
    getattr(core.multiarray, "_set_madvise_hugepage", lambda on: None)(False)
    if not libc.startswith("glibc"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    mallopt(M_MMAP_MAX, 0)


def give_back() -> None:
    """glibc's malloc_trim: the heap's free pages, wherever they lie, back to the system (its trim
    threshold only returns a free top, and a large tensor's blocks lie below later ones). A --jobs
    worker calls it after a large item (parallel.LARGE_SHARE)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # (not glibc)
        pass
