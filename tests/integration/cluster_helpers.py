"""Helpers shared by the integration tests."""
from __future__ import annotations

import time


def wait_until(predicate, timeout_s=30.0, interval_s=0.05, what="condition"):
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")
