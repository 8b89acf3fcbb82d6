"""Where glibc's malloc serves the packer's temporary arrays from.

glibc returns the free top of its heap to the system once it exceeds a trim threshold, and
each later touch of the pages it takes back is a page fault. The threshold follows the
largest block freed so far (twice its size, up to 64 MB). A big model's packing frees big
arrays early, and its temporaries then stay in the heap; a small model's search frees
several temporaries of a few hundred KB at once, over and over, and each time the heap's top
goes back to the system and is faulted in again (the tiny int8 model: ~750 page faults a
pack, 10-25% of its packing time, depending on what the process allocated before).

`settle()` puts malloc, once per process, where it ends up by itself after packing any model
of a few million weights: the largest mmap threshold of its own adjustment (32 MB) and a trim
threshold twice that. Nothing changes off glibc.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for its own adjustment (64-bit)
_settled = False


def settle() -> None:
    """Set glibc's mmap and trim thresholds where its own adjustment ends up (once)."""
    global _settled
    if _settled:
        return
    _settled = True
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
