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
