"""Where the packer's temporary arrays (and its jobs') come from: glibc's heap, in pages of the usual size.

glibc returns the free top of its heap to the system past a trim threshold, and maps blocks past
its mmap threshold afresh each time; each later touch of those pages is a page fault (a search's
temporaries: 18-30% slower without settle(); a checkpoint's tensors: 31.2 s against 34.2 s for
a 1.1B-weight bf16 pack). `settle()` sets, once per process, the trim threshold where glibc's
own adjustment ends up (64 MB) and no mmap (a freed tensor's block serves the next), and numpy
asks for no huge pages (docs/SCALE.md); `give_back()` returns the free pages below the top too.
Nothing changes off Linux; malloc's, off glibc."""

from __future__ import annotations

import ctypes
import functools
import os
import sys

import numpy as np

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters
TRIM_THRESHOLD = 64 << 20  # where glibc's own adjustment ends up: twice its largest mmap threshold (64-bit)


@functools.cache  # (once per process)
def settle() -> None:
    """glibc's trim threshold where its own adjustment ends up, no mmap; no huge pages for numpy (Linux)."""
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
