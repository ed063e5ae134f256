"""glibc malloc settings for a broker process: freed fetch-sized buffers stay mapped for reuse.

Every replicated MB passes through a few buffers of a fetch's size (the follower
fetch answer the leader joins, gRPC's send copy of it, the follower's receive
copy). glibc returns freed memory to the kernel once the free space at the top of
a heap passes its trim threshold, and its default thresholds adapt to the largest
buffer freed so far (a trim threshold of twice that), so buffers of varying sizes
(1 to 10 MB answers) keep giving pages back; the next buffer faults each page in
again and has it zeroed. On an acks=all RF=3 run those page faults cost the
leader more CPU than the copies did. With a fixed trim threshold (and the mmap
threshold raised with it, up to glibc's 32 MiB maximum, so buffers below it come
from the heaps and are reused) the pages stay mapped.

The price is memory: each malloc arena may keep up to ``malloc.trim.threshold.bytes``
free (glibc has up to 8 arenas per core). 0 leaves glibc's defaults. On a C library
that is not glibc nothing is changed. Called once, at start-up; process-wide.
"""
from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1       # mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX_BYTES = 32 << 20   # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def keep_freed_memory(trim_threshold_bytes: int) -> bool:
    """Set glibc's trim threshold to ``trim_threshold_bytes`` and its mmap threshold to
    the same (at most 32 MiB). True if both took effect; False when 0 was asked, the
    C library is not glibc, or glibc refused a value (logged)."""
    if trim_threshold_bytes <= 0 or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    trim = min(trim_threshold_bytes, 2**31 - 1)
    ok = mallopt(M_TRIM_THRESHOLD, trim) == 1 and \
        mallopt(M_MMAP_THRESHOLD, min(trim, MMAP_THRESHOLD_MAX_BYTES)) == 1
    if not ok:
        log.warning("glibc refused malloc.trim.threshold.bytes=%d; its defaults stay", trim_threshold_bytes)
    return ok
