"""stream_ticket: a DoGet's batches from a real log, in read steps, against the
ticket's end offset, byte budget and projection (no server: the pure loop)."""
from __future__ import annotations

import pyarrow as pa

from replikafka.broker.flight_server import InFlightBudget, stream_ticket
from replikafka.broker.storage import Log, LogConfig, ManualClock
from replikafka.protocol.flight_ticket import PartitionTicket

TS = pa.timestamp("ms", tz="UTC")
SCHEMA = pa.schema([("value", pa.binary()), ("timestamp", TS)])


def _log(tmp_path, sizes) -> Log:
    log = Log.open(str(tmp_path / "t-0"), LogConfig(segment_bytes=1 << 20), SCHEMA, clock=ManualClock(0))
    n = 0
    for size in sizes:
        log.append([pa.record_batch([pa.array([b"v%05d" % i + b"x" * 90 for i in range(n, n + size)]),
                                     pa.array(range(n, n + size), pa.int64()).view(TS)], schema=SCHEMA)],
                   leader_epoch=0)
        n += size
    return log


def _run(log, ticket, hw=None, step=None):
    hw = log.log_end_offset if hw is None else hw

    def read(offset, max_bytes, end):
        return None if offset >= hw else log.read_stored(offset, max_bytes, min(end, hw))
    kw = {"step_bytes": step} if step else {}
    return list(stream_ticket(ticket, read, **kw))


def test_exact_range_in_small_steps_and_batches_larger_than_a_step(tmp_path):
    log = _log(tmp_path, [10, 300, 5, 1000, 20])
    out = _run(log, PartitionTicket("t", 0, 3, 1320), step=500)       # steps far below one batch
    assert [first for _, first, _ in out] == [3, 10, 310, 315, 1315]
    assert sum(b.num_rows for b, _, _ in out) == 1317
    values = pa.Table.from_batches([b for b, _, _ in out]).column("value").to_pylist()
    assert values == [b"v%05d" % i + b"x" * 90 for i in range(3, 1320)]


def test_stops_at_the_hw_and_at_the_byte_budget(tmp_path):
    log = _log(tmp_path, [100] * 10)
    assert sum(b.num_rows for b, _, _ in _run(log, PartitionTicket("t", 0, 0, 1000), hw=450)) == 450
    assert _run(log, PartitionTicket("t", 0, 450, max_bytes=1 << 20), hw=450) == []
    one = log.read_stored(0, 1).size_bytes
    out = _run(log, PartitionTicket("t", 0, 0, max_bytes=int(one * 3.5)))
    assert [first for _, first, _ in out] == [0, 100, 200]
    assert sum(size for _, _, size in out) <= one * 3.5
    tiny = _run(log, PartitionTicket("t", 0, 150, max_bytes=1))
    assert [(b.num_rows, first) for b, first, _ in tiny] == [(50, 150)], "the first batch always goes"


def test_projection_keeps_only_the_columns(tmp_path):
    log = _log(tmp_path, [100] * 3)
    out = _run(log, PartitionTicket("t", 0, 50, 250, columns=("timestamp",)))
    assert all(b.schema.names == ["timestamp"] for b, _, _ in out)
    assert pa.Table.from_batches([b for b, _, _ in out]).column(0).cast(pa.int64()).to_pylist() == list(range(50, 250))


def test_in_flight_budget_waits_then_times_out():
    import pytest
    from replikafka.errors import RequestTimedOutError
    b = InFlightBudget(100)
    assert b.acquire(500, 0.01) == 500, "alone, a batch larger than the budget goes"
    with pytest.raises(RequestTimedOutError, match="flight.max.bytes.in.flight=100"):
        b.acquire(10, 0.05)
    b.release(500)
    b.acquire(60, 0.01)
    b.acquire(40, 0.01)
    assert (b.in_flight, b.peak) == (100, 500)
