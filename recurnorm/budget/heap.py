"""Where the packer's temporary arrays come from: glibc's heap, in pages of the usual size.

glibc returns the free top of its heap to the system once it exceeds a trim threshold (twice
the largest block freed so far, up to 64 MB), and each later touch of those pages is a page
fault. A search that frees temporaries of a few hundred KB over and over has them faulted in
again each time (packing golf-shaped int8/int6/int5 and Gaussian 4M codes: 18-30% slower
without settle(), measured in fresh processes).

`settle()` puts malloc, once per process, where it ends up by itself after packing any model
of a few million weights: the largest mmap threshold of its own adjustment (32 MB) and a trim
threshold twice that. Past 32 MB (a checkpoint's tensors: 131 MB for a 32000 x 2048 bf16
embedding) malloc would map each block afresh and unmap it when freed; it takes them from the
heap instead (no mmap), where a freed one serves the next tensor: the 1.1B-weight bf16
checkpoint (docs/SCALE.md) packed in 31.2 s with 3.9 s of system time, against 34.2 s and 7.8 s
(one job; the peak RSS the same, 885 MB). Nothing changes off glibc.

It also stops numpy asking for transparent huge pages for its arrays (numpy >= 1.20 advises
them from 4 MB): a huge page needs 2 MB of contiguous free memory, which a virtual machine that
hands its free memory back to the host (free page reporting) must fetch again, zeroing it
slowly. A 614 MB bf16 checkpoint packed (with its self-check) in 9.2-9.9 s without them and
10.2-13.6 s with them (3 runs each, one job), the difference all system time.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for its own adjustment (64-bit)


@functools.cache  # (once per process)
def settle() -> None:
    """Set glibc's mmap and trim thresholds where its own adjustment ends up; no huge pages for numpy (Linux)."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if sys.platform != "linux":
        return
    _no_huge_pages()
    if not libc.startswith("glibc"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
    mallopt(M_MMAP_MAX, 0)


def _no_huge_pages() -> None:
    import numpy as np

    core = getattr(np, "_core", None) or np.core  # (numpy 2 / 1)
    setter = getattr(core.multiarray, "_set_madvise_hugepage", None)
    if setter is not None:
        setter(False)
