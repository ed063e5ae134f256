"""The producer's accumulator: batching by size and linger, draining, sequence
numbers and in-order retries. Pure logic, driven with explicit clock values."""
from concurrent.futures import Future

import pyarrow as pa
import pytest

from replikafka import errors as E
from replikafka.client.accumulator import Accumulator, SendHandle, ipc_size

TP = ("t", 0)
TP1 = ("t", 1)


def rows(n, width=10):
    return pa.record_batch({"v": pa.array([b"x" * width] * n, pa.binary())})


def acc(**kw):
    args = dict(batch_size=1000, linger_s=0.005, max_in_flight=2, idempotent=True, delivery_timeout_s=10,
                retry_backoff_s=0.1)
    args.update(kw)
    a = Accumulator(**args)
    if a.idempotent:
        a.set_producer_id(7, 0)
    return a


def send(a, tp, batch, now=0.0, cap=1000):
    f = Future()
    f.set_running_or_notify_cancel()
    h = SendHandle(f, tp[0], tp[1], 1, batch.num_rows)
    a.append(tp, batch, h, 0, cap, now)
    return f


def drain(a, now, flushing=False, leaders=None):
    leaders = leaders or {}
    return a.drain(now, flushing=flushing, leader_of=lambda tp: leaders.get(tp, "b1"), cap_of=lambda tp: 1000)


def test_batches_roll_over_at_the_size_cap():
    a = acc()
    per_batch = 1000 // ipc_size(rows(20))
    assert per_batch >= 2
    for _ in range(per_batch + 1):
        send(a, TP, rows(20))
    queue = a.parts[TP].queue
    assert [b.rows for b in queue] == [20 * per_batch, 20]  # the piece that does not fit starts a new batch
    assert all(b.size <= 1000 for b in queue)
    assert a.buffer_used == sum(b.size for b in queue)


def test_a_batch_waits_for_linger_unless_full_or_flushing():
    a = acc()
    send(a, TP, rows(1), now=0.0)
    plan, wake, _ = drain(a, 0.001)
    assert plan == {} and wake == pytest.approx(0.005)
    plan, _, _ = drain(a, 0.001, flushing=True)
    assert list(plan) == ["b1"]
    b = acc()
    per_batch = 1000 // ipc_size(rows(20))
    for _ in range(per_batch + 1):
        send(b, TP, rows(20), now=0.0)  # the first batch is full (another one follows)
    plan, _, _ = drain(b, 0.0)
    assert [x.rows for x in plan["b1"]] == [20 * per_batch]
    plan, _, _ = drain(b, 0.01)
    assert plan == {}  # one batch per partition in flight


def test_one_request_per_broker_groups_partitions_and_respects_max_in_flight():
    a = acc(max_in_flight=1)
    send(a, TP, rows(1))
    send(a, TP1, rows(1))
    plan, _, _ = drain(a, 1.0)
    assert [b.tp for b in plan["b1"]] == [TP, TP1]
    send(a, ("u", 0), rows(1))
    plan, _, _ = drain(a, 2.0)
    assert plan == {}  # the broker has max_in_flight requests already
    a.request_done("b1")
    plan, _, _ = drain(a, 2.0)
    assert [b.tp for b in plan["b1"]] == [("u", 0)]


def test_leaderless_partitions_wait_and_ask_for_metadata():
    a = acc()
    send(a, TP, rows(1))
    plan, _, leaderless = a.drain(1.0, flushing=False, leader_of=lambda tp: None, cap_of=lambda tp: 1000)
    assert plan == {} and leaderless


def test_sequences_advance_by_record_count_and_survive_retries():
    a = acc()
    f1 = send(a, TP, rows(3))
    plan, _, _ = drain(a, 1.0)
    b1 = plan["b1"][0]
    assert (b1.sequence, b1.producer_id, b1.producer_epoch) == (0, 7, 0)
    a.request_done("b1")
    f2 = send(a, TP, rows(4), now=1.0)
    retrying, actions = a.failed(b1, E.NotLeaderOrFollowerError("moved"), 1.0)
    assert retrying and actions == []
    # The retry goes first, alone, after its backoff, with the same sequence.
    plan, wake, _ = drain(a, 1.05)
    assert plan == {} and wake == pytest.approx(1.1)
    plan, _, _ = drain(a, 1.2)
    assert plan["b1"] == [b1] and b1.sequence == 0 and b1.attempts == 1
    for action in a.completed(b1, 100):
        action()
    assert f1.result().base_offset == 100
    a.request_done("b1")
    plan, _, _ = drain(a, 1.3)
    b2 = plan["b1"][0]
    assert b2.sequence == 3
    for action in a.completed(b2, 103):
        action()
    assert f2.result().base_offset == 103
    assert a.buffer_used == 0 and not a.incomplete


def test_pieces_of_a_batch_get_their_own_offsets():
    a = acc()
    fs = [send(a, TP, rows(n)) for n in (2, 5, 1)]
    plan, _, _ = drain(a, 1.0)
    for action in a.completed(plan["b1"][0], 40):
        action()
    assert [(f.result().base_offset, f.result().record_count) for f in fs] == [(40, 2), (42, 5), (47, 1)]


def test_permanent_failure_of_a_sequenced_batch_asks_for_a_new_producer_id():
    a = acc()
    f = send(a, TP, rows(2))
    plan, _, _ = drain(a, 1.0)
    b = plan["b1"][0]
    a.request_done("b1")
    send(a, TP, rows(1), now=1.0)
    retrying, actions = a.failed(b, E.RecordTooLargeError("too big"), 1.0)
    assert not retrying
    for action in actions:
        action()
    assert isinstance(f.exception(), E.RecordTooLargeError)
    assert a.needs_producer_id
    assert drain(a, 2.0)[0] == {}  # nothing is sent until a new producer id arrives
    a.set_producer_id(8, 0)
    plan, _, _ = drain(a, 2.0)
    nxt = plan["b1"][0]
    assert (nxt.producer_id, nxt.sequence) == (8, 0)  # renumbered under the new id


def test_out_of_order_is_retried_only_behind_an_unacknowledged_earlier_batch():
    a = acc()
    send(a, TP, rows(2))
    first = drain(a, 1.0)[0]["b1"][0]
    a.request_done("b1")
    send(a, TP, rows(2), now=1.0)
    assert a.failed(first, E.NotLeaderOrFollowerError("moved"), 1.0)[0]  # first goes back to the queue
    # A later batch that was numbered and sent before (as after a lost connection):
    second = a.parts[TP].queue.pop()
    second.sequence, second.generation, second.sealed = 2, a.generation, True
    a.parts[TP].inflight.append(second)
    retrying, _ = a.failed(second, E.OutOfOrderSequenceError("gap"), 1.0)
    assert retrying  # the earlier batch is not acknowledged yet
    assert list(a.parts[TP].queue) == [first, second]  # retries in sequence order
    plan, _, _ = drain(a, 5.0)
    assert plan["b1"] == [first]
    a.request_done("b1")
    for action in a.completed(first, 0):
        action()
    plan, _, _ = drain(a, 5.0)
    assert plan["b1"] == [second] and second.sequence == 2
    retrying, actions = a.failed(second, E.OutOfOrderSequenceError("gap"), 5.0)
    assert not retrying and actions  # nothing earlier is outstanding: a real gap
    assert a.needs_producer_id


def test_retriable_errors_stop_at_the_delivery_deadline():
    a = acc(delivery_timeout_s=2.0)
    f = send(a, TP, rows(1), now=0.0)
    plan, _, _ = drain(a, 0.01)
    b = plan["b1"][0]
    retrying, actions = a.failed(b, E.NotEnoughReplicasError("isr"), 2.5)
    assert not retrying
    for action in actions:
        action()
    exc = f.exception()
    assert isinstance(exc, E.KafkaTimeoutError) and "NOT_ENOUGH_REPLICAS" in str(exc)


def test_queued_batches_expire():
    a = acc(delivery_timeout_s=1.0)
    f = send(a, TP, rows(1), now=0.0)
    assert a.expire(0.5) == []
    for action in a.expire(1.0):
        action()
    assert isinstance(f.exception(), E.KafkaTimeoutError)
    assert a.buffer_used == 0


def test_non_idempotent_batches_have_no_sequence():
    a = acc(idempotent=False)
    send(a, TP, rows(1))
    plan, _, _ = drain(a, 1.0)
    assert plan["b1"][0].sequence is None


def test_abort_all_fails_queued_and_in_flight():
    a = acc()
    f1 = send(a, TP, rows(1))
    drain(a, 1.0)
    f2 = send(a, TP, rows(1), now=1.0)
    for action in a.abort_all(E.KafkaTimeoutError("closed")):
        action()
    assert isinstance(f1.exception(), E.KafkaTimeoutError) and isinstance(f2.exception(), E.KafkaTimeoutError)
    assert not a.incomplete and a.buffer_used == 0


def test_a_partitions_full_batches_go_together_in_order_in_one_request(monkeypatch):
    import replikafka.client.accumulator as A
    a = acc()
    for _ in range(12):
        send(a, TP, rows(30))
    queued = list(a.parts[TP].queue)
    assert len(queued) >= 4 and queued[-1].size < 1000
    # The last batch is still open (lingering): the full ones before it go, in order.
    monkeypatch.setattr(A, "PARTITION_REQUEST_BYTES", 10_000)
    plan, _, _ = drain(a, 0.001)
    assert plan["b1"] == queued[:-1]
    seqs = [b.sequence for b in plan["b1"]]
    assert seqs == [sum(b.rows for b in queued[:i]) for i in range(len(queued) - 1)]
    assert list(a.parts[TP].queue) == queued[-1:]
    # Capped per partition: with room for two, two go.
    b = acc()
    for _ in range(12):
        send(b, TP, rows(30))
    two = list(b.parts[TP].queue)[:2]
    monkeypatch.setattr(A, "PARTITION_REQUEST_BYTES", two[0].size + two[1].size)
    plan, _, _ = drain(b, 0.001)
    assert plan["b1"] == two
