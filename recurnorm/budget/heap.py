"""Where glibc's malloc serves the packer's temporary arrays from.

glibc returns the free top of its heap to the system once it exceeds a trim threshold (twice
the largest block freed so far, up to 64 MB), and each later touch of those pages is a page
fault. A search that frees temporaries of a few hundred KB over and over has them faulted in
again each time (packing golf-shaped int8/int6/int5 and Gaussian 4M codes: 18-30% slower
without settle(), measured in fresh processes).

`settle()` puts malloc, once per process, where it ends up by itself after packing any model
of a few million weights: the largest mmap threshold of its own adjustment (32 MB) and a trim
threshold twice that. Nothing changes off glibc.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for its own adjustment (64-bit)


@functools.cache  # (once per process)
def settle() -> None:
    """Set glibc's mmap and trim thresholds where its own adjustment ends up."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if sys.platform != "linux" or not libc.startswith("glibc"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
