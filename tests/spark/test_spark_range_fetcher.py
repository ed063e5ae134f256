"""The executor loop that returns exactly a planned range, against a scripted
transport (leader changes, [HW, LEO) waits, retriable and fatal errors, data
loss) with a fake clock: deterministic and fast."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from replikafka import errors as E
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import to_pb
from replikafka.records import KAFKA_SCHEMA, TIMESTAMP_TYPE, encode_stream, stored_schema
from replikafka.spark.offsets_planning import DataLossError, OffsetRange
from replikafka.spark.range_fetcher import ReadStats, fetch_stream, read_range

TP = ("events", 0)
SCHEMA = stored_schema(KAFKA_SCHEMA)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


class Call:
    def __init__(self, fn):
        self.fn = fn
        self.cancelled = False

    def result(self):
        return self.fn()

    def cancel(self):
        self.cancelled = True


class Broker:
    """One replica's view: committed HW, log start; serves its slice of the log."""

    def __init__(self, name, hw, log_start=0):
        self.name, self.hw, self.log_start = name, hw, log_start


class FakeTransport:
    def __init__(self, n, per_fetch=100, clock=None):
        self.values = [b"v%d" % i for i in range(n)]
        self.leo = n
        self.brokers = {"b1": Broker("b1", n)}
        self.current = "b1"
        self.epoch = 3
        self.per_fetch = per_fetch
        self.script = []            # per fetch: None (serve) or an exception / "not_leader"
        self.after_refresh = None   # (new leader, new epoch) applied at the next refresh
        self.requests = []
        self.refreshes = 0
        self.clock = clock
        self.on_fetch = None

    # Transport
    def leader(self, tp):
        return (self.current, self.epoch) if self.current else None

    def refresh(self, topics):
        self.refreshes += 1
        if self.after_refresh:
            self.current, self.epoch = self.after_refresh
            self.after_refresh = None

    def log_start(self, tp):
        return self.brokers[self.current].log_start

    def open(self, target, ask):
        return fetch_stream(lambda request: self.fetch_async(target, request, ask.timeout_s), ask)

    def fetch_async(self, target, request, timeout_s):
        self.requests.append((target, request.partitions[0].fetch_offset, request.partitions[0].current_leader_epoch,
                              list(request.columns)))
        action = self.script.pop(0) if self.script else None
        return Call(lambda: self._answer(target, request, action))

    def _answer(self, target, request, action):
        if self.on_fetch:
            self.on_fetch(self)
        fp = request.partitions[0]
        if isinstance(action, Exception):
            raise action
        part = pb.FetchPartitionResponse(topic=fp.topic, partition=fp.partition)
        b = self.brokers[target]
        if action == "not_leader" or target != self.current:
            part.error.CopyFrom(to_pb(E.NotLeaderOrFollowerError(f"{target} does not lead")))
            return pb.FetchResponse(partitions=[part])
        if action is not None and action.startswith("error:"):
            part.error.CopyFrom(to_pb(E.error_for_code(action[6:], "scripted")))
            return pb.FetchResponse(partitions=[part])
        part.high_watermark, part.log_end_offset, part.log_start_offset = b.hw, self.leo, b.log_start
        off = fp.fetch_offset
        if off < b.log_start or off > self.leo:
            part.error.CopyFrom(to_pb(E.OffsetOutOfRangeError(f"{off} outside [{b.log_start}, {self.leo}]")))
            return pb.FetchResponse(partitions=[part])
        stop = min(b.hw, off + self.per_fetch)
        if off >= stop:
            return pb.FetchResponse(partitions=[part])
        base = off - 3 if action == "early_base" and off >= 3 else off
        if action == "late_base":
            base = off + 1
        vals = self.values[base:stop]
        n = len(vals)
        half = n // 2
        batches = [self._batch(vals[:half]), self._batch(vals[half:])] if half else [self._batch(vals)]
        part.records = encode_stream(SCHEMA, batches).to_pybytes()
        part.records_base_offset, part.record_count = base, n
        return pb.FetchResponse(partitions=[part])

    def _batch(self, vals):
        n = len(vals)
        return pa.RecordBatch.from_arrays(
            [pa.nulls(n, pa.binary()), pa.array(vals, pa.binary()), pa.nulls(n, KAFKA_SCHEMA.field("headers").type),
             pa.array(np.zeros(n, dtype=np.int64)).cast(TIMESTAMP_TYPE)], schema=SCHEMA)


def collect(transport, start, end, clock, timeout_s=30.0, fail_on_data_loss=True, stats=None):
    got = []

    def convert(batch, first):
        got.append((first, batch.column("value").to_pylist()))
        return batch.num_rows

    out = list(read_range(transport, OffsetRange(TP[0], TP[1], start, end), columns=("value", "timestamp"),
                          convert=convert, fetch_timeout_s=timeout_s, fail_on_data_loss=fail_on_data_loss,
                          max_bytes=1 << 20, stats=stats, clock=clock, sleep=clock.sleep))
    offsets = [first + i for first, vals in got for i in range(len(vals))]
    values = [v for _, vals in got for v in vals]
    assert sum(out) == len(values)
    return offsets, values


def test_reads_exactly_the_planned_range_across_many_fetches():
    clock = Clock()
    t = FakeTransport(1000, per_fetch=77)
    offsets, values = collect(t, 120, 860, clock)
    assert offsets == list(range(120, 860))
    assert values == [b"v%d" % i for i in range(120, 860)]
    assert t.requests[0] == ("b1", 120, 3, ["value", "timestamp"])      # projection and leader epoch sent
    assert clock.t == 0.0                                                # no waiting when all is well


def test_next_fetch_is_sent_before_the_batches_are_handed_on():
    clock = Clock()
    t = FakeTransport(300, per_fetch=100)
    stats = ReadStats()
    gen = read_range(t, OffsetRange("events", 0, 0, 300), columns=("value",), convert=lambda b, f: f,
                     fetch_timeout_s=5, fail_on_data_loss=True, max_bytes=1 << 20, stats=stats,
                     clock=clock, sleep=clock.sleep)
    assert next(gen) == 0
    assert [r[1] for r in t.requests] == [0, 100]                        # the prefetch is already out
    gen.close()


def test_follows_a_leader_change_and_waits_while_the_new_leader_is_behind():
    clock = Clock()
    t = FakeTransport(1000, per_fetch=100)
    t.brokers["b2"] = Broker("b2", hw=250)          # new leader: has the data, HW not yet advanced
    t.script = [None, None, None, "not_leader"]
    t.after_refresh = ("b2", 4)
    polls = {"n": 0}

    def catch_up(tr):
        if tr.current == "b2":
            polls["n"] += 1
            if polls["n"] > 3:
                tr.brokers["b2"].hw = 1000

    t.on_fetch = catch_up
    stats = ReadStats()
    offsets, _ = collect(t, 0, 1000, clock, stats=stats)
    assert offsets == list(range(1000))
    assert stats.leaders == {"b1", "b2"} and stats.waits >= 1 and stats.retries >= 1
    assert ("b2", 300, 4, ["value", "timestamp"]) in t.requests          # the new leader, with its epoch, below its HW


@pytest.mark.parametrize("failure", [E.BrokerNotAvailableError("down"), E.RequestTimedOutError("slow"),
                                     "error:FENCED_LEADER_EPOCH", "error:LEADER_NOT_AVAILABLE",
                                     "error:UNKNOWN_LEADER_EPOCH"])
def test_retriable_failures_are_retried(failure):
    clock = Clock()
    t = FakeTransport(500, per_fetch=100)
    t.script = [None, failure, failure]
    stats = ReadStats()
    offsets, _ = collect(t, 0, 500, clock, stats=stats)
    assert offsets == list(range(500)) and stats.retries == 2 and t.refreshes == 2


def test_no_live_leader_is_waited_out():
    clock = Clock()
    t = FakeTransport(200)
    t.current = None
    t.after_refresh = ("b1", 5)
    offsets, _ = collect(t, 0, 200, clock)
    assert offsets == list(range(200))


def test_data_that_never_becomes_readable_fails_loudly_instead_of_short():
    clock = Clock()
    t = FakeTransport(1000, per_fetch=100)
    t.brokers["b1"].hw = 400                        # the planned end (1000) never becomes readable
    with pytest.raises(E.KafkaTimeoutError) as info:
        collect(t, 0, 1000, clock, timeout_s=20)
    msg = str(info.value)
    assert "events-0 range [0, 1000)" in msg and "offset 400" in msg and "600 planned records" in msg
    assert 20 <= clock.t < 25


def test_a_leader_that_never_answers_fails_after_the_timeout():
    clock = Clock()
    t = FakeTransport(100)
    t.script = [E.BrokerNotAvailableError("down")] * 1000
    with pytest.raises(E.KafkaTimeoutError, match="BROKER_NOT_AVAILABLE"):
        collect(t, 0, 100, clock, timeout_s=10)


def test_non_retriable_errors_are_raised_at_once():
    clock = Clock()
    t = FakeTransport(100)
    t.script = ["error:INVALID_REQUEST"]
    with pytest.raises(E.InvalidRequestError, match="events-0 range"):
        collect(t, 0, 100, clock)
    assert clock.t == 0


def test_offsets_removed_by_retention_are_data_loss():
    clock = Clock()
    t = FakeTransport(1000, per_fetch=100)
    t.brokers["b1"].log_start = 300
    with pytest.raises(DataLossError, match=r"\[100, 300\)"):
        collect(t, 100, 1000, clock)
    stats = ReadStats()
    offsets, _ = collect(t, 100, 1000, clock, fail_on_data_loss=False, stats=stats)
    assert offsets == list(range(300, 1000)) and stats.skipped == 200


def test_an_answer_starting_before_the_asked_offset_is_trimmed():
    clock = Clock()
    t = FakeTransport(300, per_fetch=100)
    t.script = [None, "early_base"]
    offsets, values = collect(t, 0, 300, clock)
    assert offsets == list(range(300)) and values == [b"v%d" % i for i in range(300)]


def test_an_answer_skipping_offsets_is_refused():
    clock = Clock()
    t = FakeTransport(300, per_fetch=100)
    t.script = ["late_base"]
    with pytest.raises(E.CorruptRecordError):
        collect(t, 0, 300, clock)


def test_empty_range_fetches_nothing():
    clock = Clock()
    t = FakeTransport(10)
    assert collect(t, 5, 5, clock) == ([], [])
    assert t.requests == []


class StreamTransport(FakeTransport):
    """Flight-like: ``open`` streams the rest of the range in one go (batches of
    ``per_fetch`` records up to the leader's HW); the script's entry for a stream is
    None (serve), an exception raised at once, or ``(k, exception)``: raised after
    ``k`` batches, mid-stream, as a leader killed mid-read does."""

    def __init__(self, n, per_fetch=100, clock=None):
        super().__init__(n, per_fetch, clock)
        self.opened = []            # (target, offset, end, epoch, columns, max_wait_ms)
        self.closed = 0
        self.ended = 0

    def open(self, target, ask):
        self.opened.append((target, ask.offset, ask.end, ask.epoch, ask.columns, ask.max_wait_ms))
        action = self.script.pop(0) if self.script else None
        return self._stream(target, ask, action)

    def _stream(self, target, ask, action):
        try:
            if self.on_fetch:
                self.on_fetch(self)
            if isinstance(action, Exception):
                raise action
            after, failure = action if isinstance(action, tuple) else (None, None)
            if target != self.current:
                raise E.NotLeaderOrFollowerError(f"{target} does not lead")
            b = self.brokers[target]
            if ask.offset < b.log_start or ask.offset > self.leo:
                raise E.OffsetOutOfRangeError(f"{ask.offset} outside [{b.log_start}, {self.leo}]")
            off, stop, sent = ask.offset, min(b.hw, ask.end), 0
            while off < stop:
                if after is not None and sent == after:
                    raise failure
                k = min(self.per_fetch, stop - off)
                yield self._batch(self.values[off:off + k]), off
                off += k
                sent += 1
            self.ended += 1         # read to its end, not cancelled
        finally:
            self.closed += 1


def test_one_stream_reads_the_whole_range():
    clock = Clock()
    t = StreamTransport(1000, per_fetch=77)
    stats = ReadStats()
    offsets, values = collect(t, 120, 860, clock, stats=stats)
    assert offsets == list(range(120, 860)) and values == [b"v%d" % i for i in range(120, 860)]
    assert t.opened == [("b1", 120, 860, 3, ("value", "timestamp"), 500)] and stats.fetches == 1
    assert t.closed == t.ended == 1 and clock.t == 0.0      # the finished stream ended, not cancelled


def test_a_stream_failing_midway_resumes_exactly_at_the_new_leader():
    clock = Clock()
    t = StreamTransport(1000, per_fetch=100)
    t.brokers["b2"] = Broker("b2", hw=1000)
    t.script = [(4, E.BrokerNotAvailableError("killed mid-stream"))]
    t.after_refresh = ("b2", 4)
    stats = ReadStats()
    offsets, values = collect(t, 50, 950, clock, stats=stats)
    assert offsets == list(range(50, 950)) and values == [b"v%d" % i for i in range(50, 950)]
    assert [o[:4] for o in t.opened] == [("b1", 50, 950, 3), ("b2", 450, 950, 4)]
    assert stats.retries == 1 and stats.leaders == {"b1", "b2"} and t.closed == 2


def test_a_stream_ending_at_the_leaders_hw_is_opened_again_until_the_range_is_read():
    clock = Clock()
    t = StreamTransport(1000, per_fetch=100)
    t.brokers["b1"].hw = 330                     # committed at planning; this leader's HW lags behind
    polls = {"n": 0}

    def catch_up(tr):
        polls["n"] += 1
        if polls["n"] == 4:
            tr.brokers["b1"].hw = 1000
    t.on_fetch = catch_up
    stats = ReadStats()
    offsets, _ = collect(t, 0, 1000, clock, stats=stats)
    assert offsets == list(range(1000))
    assert [o[1] for o in t.opened] == [0, 330, 330, 330] and stats.waits == 2


def test_a_stream_that_stalls_at_the_hw_fails_loudly_after_the_timeout():
    clock = Clock()
    t = StreamTransport(1000, per_fetch=100)
    t.brokers["b1"].hw = 400
    with pytest.raises(E.KafkaTimeoutError, match=r"offset 400 \(600 planned records still unread\)"):
        collect(t, 0, 1000, clock, timeout_s=20)
    assert 20 <= clock.t < 25


def test_a_stream_left_early_is_closed():
    clock = Clock()
    t = StreamTransport(1000, per_fetch=100)
    gen = read_range(t, OffsetRange("events", 0, 0, 1000), columns=("value",), convert=lambda b, f: f,
                     fetch_timeout_s=5, fail_on_data_loss=True, max_bytes=1 << 20, clock=clock, sleep=clock.sleep)
    assert next(gen) == 0 and t.closed == 0
    gen.close()
    assert t.closed == 1


def test_a_stream_skipping_offsets_is_refused():
    clock = Clock()
    t = StreamTransport(300, per_fetch=100)
    real = t._stream

    def skipping(target, ask, action):
        for batch, first in real(target, ask, action):
            yield batch, (first + 1 if first >= 100 else first)
    t._stream = skipping
    with pytest.raises(E.CorruptRecordError, match="asked for offset 100, the broker answered from 101"):
        collect(t, 0, 300, clock)
