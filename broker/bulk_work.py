"""Work on every partition at once (loading 50,000 logs, a LeaderAndIsr or
UpdateMetadata naming all of them) without Python's cyclic garbage collector.

Such work allocates hundreds of thousands of long-lived objects; each
allocation burst triggers collections, and the full ones walk every object
the broker holds (at 50,000 partitions about a fifth of a restart went there).
Inside ``paused_gc()`` the collector does not run; reference counting still
frees what is not in a cycle, and the first collection after the work finds
the cycles made meanwhile. The pause lasts one bulk operation, so the garbage
it can hold is bounded by what that operation allocates.

When the last thread leaves after a bulk operation made at least a quarter as
many objects as the oldest generation holds (loading every log at start-up,
a first LeaderAndIsr naming every partition), one full collection runs there
and then. Left to itself the collector would walk those young objects three
times: a generation-0 collection, a generation-1 one soon after, and a full
one (which the quarter rule makes due). Each walk holds the GIL throughout:
after loading 5,000 logs from their files the three took 1.6, 0.5 and 0.9 s
(load 20), and at 50,000 such pauses starved the ZooKeeper heartbeats of a
restarting broker until its connection dropped.

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
#: Young objects below which leaving a pause never collects (counting the old
#: generation costs a pass over it: not worth it after a small operation).
BULK_COLLECT_MIN_OBJECTS = 10_000


#: The oldest generation's size when it was last counted (under ``_lock``). Counting
#: is a pass over it: 80-130 ms at 1.6 million objects (a broker with 50,000
#: partitions), paid after each of a failover's LeaderAndIsr and UpdateMetadata to
#: find their 33,000-58,000 young objects were not worth a collection.
_old_counted = 0


def _collect_if_bulk() -> bool:
    """One full collection if the young objects are at least a quarter of the oldest
    generation (module doc); True if it ran. The oldest generation is counted again
    only when the young ones reach an eighth of its last count: it would have to
    have halved since for the quarter to be reached below that (it shrinks only as
    partitions go, and a wrong guess costs what the collector's own passes would)."""
    global _old_counted
    young = gc.get_count()[0]
    if young < BULK_COLLECT_MIN_OBJECTS or young * 8 < _old_counted:
        return False
    _old_counted = len(gc.get_objects(generation=2))
    if young * 4 < _old_counted:
        return False
    gc.collect()
    _old_counted += young   # what survived was promoted there (a guess until the next count)
    return True


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
                _collect_if_bulk()
                gc.enable()
