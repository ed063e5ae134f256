"""Injectable time source for the storage engine.

No on-disk format. Every storage class that needs "now" (segment roll by age,
time-based flush, retention) asks a clock object with one method,
``time_ms() -> int`` (milliseconds since the epoch), so tests can drive time.

Thread-safety: ``SystemClock`` is stateless and thread-safe; ``ManualClock``
is thread-safe (a lock guards its value).
"""
from __future__ import annotations

import threading
import time


class SystemClock:
    """The wall clock (``time.time()``), in milliseconds. Thread-safe."""

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that only moves when told to; for tests. Thread-safe."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self._now = int(start_ms)
        self._lock = threading.Lock()

    def time_ms(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> int:
        with self._lock:
            self._now += int(ms)
            return self._now

    def set(self, now_ms: int) -> None:
        with self._lock:
            self._now = int(now_ms)


SYSTEM_CLOCK = SystemClock()
