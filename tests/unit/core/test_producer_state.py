"""Idempotent producer deduplication (KIP-98)."""
import pytest

from replikafka.broker.replica.producer_state import Duplicate, ProducerStateManager
from replikafka.errors import InvalidProducerEpochError, OutOfOrderSequenceError


def test_retry_of_a_recent_batch_is_a_duplicate_with_its_original_offsets():
    m = ProducerStateManager()
    assert m.check(7, 0, 0, 10) is None
    m.update(7, 0, 0, 10, first_offset=100)
    m.update(7, 0, 10, 5, first_offset=110)
    assert m.check(7, 0, 0, 10) == Duplicate(100, 109)
    assert m.check(7, 0, 10, 5) == Duplicate(110, 114)
    assert m.check(7, 0, 15, 1) is None


def test_gaps_and_old_epochs_are_refused():
    m = ProducerStateManager()
    m.update(7, 1, 0, 10, first_offset=0)
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 10"):
        m.check(7, 1, 12, 1)
    with pytest.raises(InvalidProducerEpochError):
        m.check(7, 0, 10, 1)
    with pytest.raises(OutOfOrderSequenceError):
        m.check(7, 2, 5, 1)
    assert m.check(7, 2, 0, 1) is None


def test_only_the_last_five_batches_are_remembered_and_truncation_forgets():
    m = ProducerStateManager()
    for i in range(7):
        m.update(1, 0, i, 1, first_offset=i)
    assert m.check(1, 0, 2, 1) == Duplicate(2, 2)
    with pytest.raises(OutOfOrderSequenceError):
        m.check(1, 0, 1, 1)  # too old to recognise: refused, never silently re-appended
    m.truncate_to(5)
    assert m.check(1, 0, 5, 1) is None
    m.truncate_to(0)
    assert m.producers == {}


def test_non_idempotent_batches_are_never_checked():
    m = ProducerStateManager()
    assert m.check(-1, -1, -1, 100) is None
    m.update(-1, -1, -1, 100, first_offset=0)
    assert m.producers == {}


def test_producers_silent_past_the_expiration_are_forgotten():
    m = ProducerStateManager()
    m.update(1, 0, 0, 1, first_offset=0, now_ms=1_000)
    m.update(2, 0, 0, 1, first_offset=1, now_ms=50_000)
    m.expire(now_ms=60_000, expiration_ms=30_000)
    assert list(m.producers) == [2]


def test_a_partition_rebuilds_producer_state_from_its_log_on_first_use(tmp_path):
    """Not when created (a broker taking up 50,000 partitions would read every batch
    header of every log): a plain producer's appends and a follower's never build it;
    the first idempotent append does, from the log, and still sees a retry as one."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "storage"))
    from storage_testlib import T0, make_batch, open_log
    from replikafka.broker.replica.partition import Partition
    from replikafka.broker.storage import ManualClock

    clock = ManualClock(T0)
    log = open_log(tmp_path / "t-0", clock=clock)
    log.append([make_batch(0, 5)], leader_epoch=0, producer_id=7, producer_epoch=0, base_sequence=0)
    part = Partition("t", 0, 1, log, clock)
    assert part.producers_if_built is None
    assert part.make_leader(0, (1,), (1,), 0, 1)
    part.append_as_leader([make_batch(5, 5)], acks=1, min_insync=1)          # plain producer
    assert part.producers_if_built is None
    retry = part.append_as_leader([make_batch(0, 5)], acks=1, min_insync=1, producer_id=7, producer_epoch=0,
                                  base_sequence=0)
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (0, 4)
    assert part.producers_if_built is not None and log.log_end_offset == 10
