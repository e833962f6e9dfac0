"""Process tuning for the daemon process only (`veil serve`, the benchmarks that measure it):
glibc's malloc keeps freed memory for reuse, and the startup heap leaves the cyclic garbage
collector's sight. An application embedding an Aggregator keeps its allocator and collector as
they are.

    keep_freed_memory()      # before the Aggregator is made
    aggregator = Aggregator(config)
    aggregator.start()
    freeze_startup_heap()    # once it serves
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["freeze_startup_heap", "keep_freed_memory"]


# glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_FREED_BYTES = 64 << 20  # a cold 720-bucket read at k = 1024 frees some 30 MB at a time
_MMAP_FROM_BYTES = 32 << 20  # glibc's largest dynamic threshold on 64-bit systems


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep up to 64 MB of freed memory for reuse instead of handing it back
    to the system at once, for a daemon that has just started; False where the C library is not
    glibc. An estimate of a long series allocates several matrices of megabytes (720 buckets at
    k = 1024: 5.9 MB each) and frees them soon after; by default glibc maps such blocks afresh
    or trims them off the heap, so every call faults their pages in again, zeroed by the
    kernel: a quarter of a cold 720-bucket read (bench/bench_series.py). For the daemon process
    only: an embedding application keeps its allocator as it is."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # Both at once: setting either turns off glibc's own raising of them as large blocks are freed.
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_FREED_BYTES))


def freeze_startup_heap() -> None:
    """Move every object alive now (modules, compiled kernels, config, caches: some 10^5 objects)
    out of the cyclic garbage collector's sight, for a daemon that has just started. Each fresh
    estimate allocates thousands of objects, so full collections come often, and without this
    each one walks the whole startup heap (tens of ms under load, in some Get's latency).
    For the daemon process only: an embedding application keeps its collector as it is."""
    gc.collect()
    gc.freeze()
