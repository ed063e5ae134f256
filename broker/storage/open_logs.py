"""A bound on the logs holding open files and memory maps at once.

No on-disk format. A log opens its active segment's file, its index files and
its mappings on first use and gives them back when idle for
`log.idle.release.ms` (`Log.release_if_idle`); that keeps a broker's descriptors
to its *busy* partitions, but a burst of writes to more partitions than the
process may open files for (a producer spraying 50,000 partitions, the first
writes after a failover) would run into EMFILE (or the kernel's map limit)
within the idle window. So every log registers here when it is used and was not
registered; past `max_logs` registered, the least recently used ones give their
files and maps back at once (they reopen on their next use, as after an idle
release).

A log's registration is a flag check on the hot path (`Log._mark_used`); the
set is sorted by last use only when it overflows, and then it drops to
`LOW_WATER` of the cap so that the next overflows are a while away.

Thread-safety: thread-safe. Releases run outside this object's lock and never
wait for a log's lock (a log busy in another thread is being used: it stays),
so two threads each holding their own log's lock cannot deadlock here. A
lock-free read racing with its log's release may map the segment again after
it: that log holds its mapping unregistered until its next use or idle release,
so the bound is `max_logs` plus the reads in flight at that moment.
"""
from __future__ import annotations

import errno
import logging
import resource
import threading

log = logging.getLogger(__name__)

#: An overflow releases least recently used logs until this fraction of the cap is left.
LOW_WATER = 0.9
#: Descriptors and mappings a used log holds, as the derived cap counts them: its active
#: segment's data file (written) or mapping (read). Its two index files hold descriptors
#: only once a flush or release wrote their entries (up to 3 then), so a cap counting 3
#: for every log was a third of what the limit allows: at 50,000 partitions on a 20,000
#: file limit it closed and reopened files through a failover's first writes (one
#: process, 8,333 new leaders written twice: 3.0 and 4.9 s against 2.4 and 3.0 s
#: uncapped). A limit reached anyway is a retriable error, not a failed disk.
RESOURCES_PER_LOG = 1
#: Descriptors kept for everything but logs (sockets, checkpoints, ZooKeeper, Flight) when
#: the cap is derived from the process's limits.
RESERVED_DESCRIPTORS = 2048
#: errnos that mean this process ran out of descriptors or mappings, not that a disk failed.
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def is_resource_exhaustion(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or the OSError it wraps) is the process out of descriptors or
    mappings: a limit to raise or a cap to lower, not a failed disk."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
            return True
        exc = exc.__cause__
    return False


def derived_max_logs(nofile_soft: int | None = None, max_map_count: int | None = None) -> int:
    """The cap for ``log.open.max.partitions=0``: what the process's open-file limit
    (after RESERVED_DESCRIPTORS) and the kernel's ``vm.max_map_count`` allow at
    RESOURCES_PER_LOG each, at least 16."""
    if nofile_soft is None:
        nofile_soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile_soft == resource.RLIM_INFINITY:
            nofile_soft = 1 << 20
    if max_map_count is None:
        try:
            with open("/proc/sys/vm/max_map_count") as f:
                max_map_count = int(f.read())
        except (OSError, ValueError):
            max_map_count = 65530       # Linux's default
    by_files = (nofile_soft - RESERVED_DESCRIPTORS) // RESOURCES_PER_LOG
    by_maps = (max_map_count - RESERVED_DESCRIPTORS) // RESOURCES_PER_LOG
    return max(16, min(by_files, by_maps))


class OpenLogs:
    """The logs that may hold files or maps (module doc). Thread-safe."""

    def __init__(self, max_logs: int):
        if max_logs < 1:
            raise ValueError(f"max_logs must be at least 1, got {max_logs}")
        self.max_logs = max_logs
        self._lock = threading.Lock()
        self._logs: dict = {}         # registered logs (insertion order is not use order)
        self.released = 0             # logs made to give back their files by the cap

    def __len__(self) -> int:
        return len(self._logs)

    def register(self, log_) -> None:
        """``log_`` is being used and was not registered: count it, and if that passes
        the cap, release the least recently used others down to LOW_WATER of it."""
        with self._lock:
            self._logs[log_] = None
            if len(self._logs) <= self.max_logs:
                return
            keep = max(1, int(self.max_logs * LOW_WATER))
            by_use = sorted((x for x in self._logs if x is not log_), key=lambda x: x.last_used_ms)
            victims = by_use[:len(self._logs) - keep]
            for v in victims:
                del self._logs[v]
        busy = []
        for v in victims:
            try:
                if not v.release_for_cap():
                    busy.append(v)
            except OSError:     # its pending index entries could not be written: the next use retries
                log.exception("%s: releasing its files for log.open.max.partitions failed", v.dir)
                busy.append(v)
        with self._lock:
            self.released += len(victims) - len(busy)
            for v in busy:          # still holding its files: counted again, without a new overflow
                self._logs[v] = None

    def forget(self, log_) -> None:
        """``log_`` gave its files and maps back (idle, closed or deleted)."""
        with self._lock:
            self._logs.pop(log_, None)
