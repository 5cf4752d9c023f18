"""A rank's heap keeps the memory its tensors free, for the next step's tensors (`runtime.keep_freed_memory`).

glibc's malloc gives a block of at least its mmap threshold pages of its own, unmapped again when freed, and hands
the heap's free top back to the kernel once it grows past the trim threshold (by default twice the largest block
freed so far, at most 64 MiB). A step on CPU allocates and frees the same tensors of a few MiB again and again, so
their pages keep going back, and each one comes again as a page fault the kernel zeroes: 2,000-9,000 faults in one
train step of the vs_trl game, 130-152 ms against 122-128 without them (docs/performance.md, "Freed memory kept in
each rank's heap"). Fixed thresholds keep them in the heap: blocks under MMAP_THRESHOLD from the heap, and up to
TRIM_THRESHOLD of free heap kept.

Either threshold set in the environment (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`) is the user's own
choice and is kept; another allocator preloaded (jemalloc, tcmalloc) makes these calls moot.
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Set both thresholds where the C library is glibc and the environment sets neither; whether it did. Setting
    one alone would be worse than none: glibc stops raising the mmap threshold once either is set by hand."""
    if not sys.platform.startswith("linux") or any(name in os.environ for name in USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no libc.so.6)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
