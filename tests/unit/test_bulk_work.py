"""broker/bulk_work.paused_gc: the collector is off while any thread is inside, back on
when the last leaves, and left alone if it was off to begin with."""
from __future__ import annotations

import gc
import threading

from replikafka.broker.bulk_work import paused_gc


def test_paused_inside_resumed_after_the_last_thread_leaves():
    assert gc.isenabled()
    entered, release = threading.Event(), threading.Event()

    def other():
        with paused_gc():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert entered.wait(10)
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()      # the other thread is still inside
    finally:
        release.set()
        t.join(10)
    assert gc.isenabled()


def test_resumed_after_an_exception():
    try:
        with paused_gc():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Cycle:
    def __init__(self):
        self.me = self


def _collections_during(work) -> list[int]:
    """The generations collected while `work` runs."""
    seen: list[int] = []

    def cb(phase, info):
        if phase == "stop":
            seen.append(info["generation"])
    gc.collect()
    gc.callbacks.append(cb)
    try:
        work()
    finally:
        gc.callbacks.remove(cb)
    return seen


def test_a_bulk_pause_ends_in_one_full_collection_and_a_small_one_in_none():
    made = []

    def bulk():
        with paused_gc():
            made.extend(_Cycle() for _ in range(max(20_000, len(gc.get_objects(generation=2)))))
        made.clear()                # garbage cycles: only a collection frees them
        assert gc.get_count()[0] < 1_000, "the young objects were collected on leaving"

    seen = _collections_during(bulk)
    # Left to the collector, the first collection after the pause is a generation-0
    # one walking every object the pause made (then a generation-1 and a full one).
    assert seen and seen[0] == 2, seen

    def small():
        with paused_gc():
            made.extend(_Cycle() for _ in range(100))

    assert _collections_during(small) == []


def test_the_old_generation_is_counted_again_only_for_a_pause_an_eighth_its_size(monkeypatch):
    """Counting the oldest generation is a pass over it (80-130 ms at 50,000 partitions):
    after one count, a pause that made fewer young objects than an eighth of it leaves
    without counting; a larger one counts again."""
    import replikafka.broker.bulk_work as bw
    counted = []
    real = gc.get_objects

    def get_objects(generation=None):
        counted.append(generation)
        return real(generation=generation)

    monkeypatch.setattr(bw.gc, "get_objects", get_objects)
    monkeypatch.setattr(bw, "_old_counted", 0)
    kept = []

    def pause(n):
        with paused_gc():
            kept.extend(object.__new__(_Cycle) for _ in range(n))

    held = [_Cycle() for _ in range(400_000)]    # an old generation a broker's size, in part
    gc.collect()
    old = len(real(generation=2))
    pause(old // 7)                                   # over an eighth: counted
    assert counted == [2] and bw._old_counted > old * 9 // 10   # (objects come and go meanwhile)
    pause(old // 10)                                  # under an eighth of that count
    assert counted == [2], "counted again for a small pause"
    pause(bw._old_counted // 6)                       # over an eighth again: counted again
    assert counted == [2, 2]
    kept.clear()
    held.clear()
