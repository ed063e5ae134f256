"""Which of a producer's sends failed without anyone looking: no silent drops.

A send's future is a :class:`SendFuture`, which remembers whether its outcome
was read (``result()``/``exception()``, also from a done-callback). A failed
send nobody read is raised by the producer's next ``flush()`` or ``close()``,
so a script that never looks at its futures still learns that records were
lost. Thread-safety: one lock guards the sets; the sender thread completes
futures, user threads call ``flush``/``close``.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future

from replikafka import errors as E

log = logging.getLogger("replikafka.producer")

# Failed futures kept for flush/close to report; beyond this only counted.
MAX_FAILED_KEPT = 10_000


class SendFuture(Future):
    """``Future[RecordMetadata]`` that notes whether its outcome was read."""

    def __init__(self):
        super().__init__()
        self.observed = False

    def result(self, timeout=None):
        self.observed = True
        return super().result(timeout)

    def exception(self, timeout=None):
        self.observed = True
        return super().exception(timeout)


def _error_of(f: Future) -> BaseException | None:
    """The future's error without marking it read."""
    return Future.exception(f, 0)


class DeliveryOutcomes:
    """Futures of sends not yet complete, and failures not yet reported."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: set[SendFuture] = set()
        self._failed: list[SendFuture] = []
        self._failed_uncounted = 0

    def new_future(self) -> SendFuture:
        f = SendFuture()
        f.set_running_or_notify_cancel()
        with self._lock:
            self._pending.add(f)
        f.add_done_callback(self._done)
        return f

    def discard(self, f: SendFuture) -> None:
        """``send`` raised instead of returning ``f``: its failure is not a drop."""
        f.observed = True
        with self._lock:
            self._pending.discard(f)

    def outstanding(self) -> list[SendFuture]:
        with self._lock:
            return list(self._pending)

    def _done(self, f: Future) -> None:
        failed = _error_of(f) is not None
        with self._lock:
            self._pending.discard(f)
            if failed:
                if len(self._failed) < MAX_FAILED_KEPT:
                    self._failed.append(f)
                else:
                    self._failed_uncounted += 1

    def raise_unobserved(self, where: str) -> None:
        """Raise (and log) the failures of sends whose futures nobody read."""
        with self._lock:
            failed, self._failed = self._failed, []
            extra, self._failed_uncounted = self._failed_uncounted, 0
        errors = [_error_of(f) for f in failed if not f.observed]
        if not errors and not extra:
            return
        first = errors[0] if errors else None
        count = len(errors) + extra
        summary = (f"{count} send(s) failed and their futures were not read; "
                   f"the first: {first}" if first else f"{count} send(s) failed and their futures were not read")
        log.error("producer %s: %s", where, summary)
        code = getattr(first, "code", E.ReplikafkaError.code)
        raise E.error_for_code(code, summary)
