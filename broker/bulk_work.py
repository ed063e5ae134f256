"""Work on every partition at once (loading 50,000 logs, a LeaderAndIsr or
UpdateMetadata naming all of them) without Python's cyclic garbage collector.

Such work allocates hundreds of thousands of long-lived objects; each
allocation burst triggers collections, and the full ones walk every object
the broker holds (at 50,000 partitions about a fifth of a restart went there).
Inside ``paused_gc()`` the collector does not run; reference counting still
frees what is not in a cycle, and the first collection after the work finds
the cycles made meanwhile. The pause lasts one bulk operation, so the garbage
it can hold is bounded by what that operation allocates.

Thread-safety: thread-safe. The collector is process-wide: it is paused while
any thread is inside ``paused_gc()`` and resumed when the last one leaves (and
only if it was enabled when the first one entered).
"""
from __future__ import annotations

import contextlib
import gc
import threading

_lock = threading.Lock()
_inside = 0             # threads inside paused_gc()
_was_enabled = False    # the collector's state when the first of them entered


@contextlib.contextmanager
def paused_gc():
    global _inside, _was_enabled
    with _lock:
        if _inside == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _was_enabled:
                gc.enable()
