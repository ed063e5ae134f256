"""Arrow Flight reads from real brokers: the same records as Fetch, Fetch's HW and
error semantics, projection, discovery (GetFlightInfo / ListFlights), refusals
of bad tickets, the in-flight memory bound, and reads across a leader kill."""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request

import pyarrow as pa
import pyarrow.flight as fl
import pytest

import replikafka
from replikafka import errors as E
from replikafka import records as R
from replikafka.client.connection import ConnectionPool, parse_bootstrap
from replikafka.client.flight_reader import FlightReader
from replikafka.client.metadata import ClusterMetadata
from replikafka.protocol.flight_ticket import PartitionTicket

from cluster_helpers import wait_until

SCHEMA = "key BINARY, value BINARY, score DOUBLE, tags ARRAY<STRING>"
README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def _batch(first: int, n: int) -> pa.RecordBatch:
    rows = range(first, first + n)
    return pa.record_batch([
        pa.array([None if r % 7 == 0 else b"k%d" % r for r in rows], pa.binary()),
        pa.array([b"value-%08d" % r + b"x" * (r % 50) for r in rows], pa.binary()),
        pa.array([None if r % 3 == 0 else r * 0.5 for r in rows], pa.float64()),
        pa.array([None if r % 5 == 0 else [f"t{r}", None] for r in rows], pa.list_(pa.string())),
    ], names=["key", "value", "score", "tags"])


def _produce(bs: str, topic: str, partition: int, sizes, acks="all", **producer) -> int:
    n = 0
    with replikafka.Producer(bs, acks=acks, linger_ms=0, **producer) as p:
        futs = []
        for size in sizes:
            futs.append(p.send(topic, _batch(n, size), partition=partition))
            n += size
        for f in futs:
            f.result(timeout=60)
    return n


class Cluster:
    """Where each partition leads and each broker serves Flight, from Metadata."""

    def __init__(self, bs: str):
        self.pool = ConnectionPool()
        self.meta = ClusterMetadata(self.pool, parse_bootstrap(bs), request_timeout_ms=10_000, retry_backoff_ms=100)

    def flight(self, broker_id: int) -> str:
        self.meta.refresh(all_topics=True)
        return self.meta.broker(broker_id).listener("FLIGHT")

    def leader(self, topic: str, partition: int) -> tuple[int, str, int]:
        self.meta.refresh([topic])
        info = self.meta.partition(topic, partition)
        b = self.meta.leader_for(topic, partition)
        return b.id, b.listener("FLIGHT"), info.leader_epoch

    def close(self):
        self.pool.close()


def _fetch_read(bs: str, topic: str, partition: int, start: int, end: int, columns=None) -> pa.Table:
    c = replikafka.Consumer(bs, use_flight=False, columns=columns, max_partition_fetch_bytes=64 << 10)
    c.assign([(topic, partition)])
    c.seek((topic, partition), start)
    parts = []
    got = start
    deadline = time.time() + 60
    while got < end and time.time() < deadline:
        t = c.poll(timeout_ms=2000)
        parts.append(t)
        got += t.num_rows
    c.close()
    t = pa.concat_tables(parts)
    return t.slice(0, end - start)


def test_flight_read_equals_fetch_read_with_and_without_projection(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("same", partitions=2, replication_factor=3, schema=SCHEMA)
    n = _produce(bs, "same", 1, [1, 37, 500, 3, 1000, 250, 9])
    cl = Cluster(bs)
    _, where, epoch = cl.leader("same", 1)
    reader = FlightReader()
    for start, end in ((0, n), (0, 1), (5, 38), (37, 38), (38, 1500), (1000, n), (n - 1, n)):
        for columns in (None, ("value",), ("tags", "key", "timestamp")):
            read = reader.read(where, PartitionTicket("same", 1, start, end, current_leader_epoch=epoch,
                                                      columns=columns), 30)
            assert read.record_count == end - start
            assert read.offsets().tolist() == list(range(start, end))
            got = pa.Table.from_batches(read.batches)
            want = _fetch_read(bs, "same", 1, start, end, columns=list(columns) if columns else None)
            names = list(columns) if columns else ["key", "value", "score", "tags", "timestamp"]
            assert got.schema.names == names
            assert got.equals(want.select(names)), (start, end, columns)
            assert want.column("offset").to_pylist() == list(range(start, end))
    # The default consumer reads through Flight: the same table as through Fetch.
    c = replikafka.Consumer(bs)
    flight_reads = []
    read = c._flight.read
    c._flight.read = lambda *a: (flight_reads.append(a[0]), read(*a))[1]
    c.assign([("same", 1)])
    c.seek(("same", 1), 0)
    parts, got = [], 0
    while got < n:
        t = c.poll(timeout_ms=5000)
        assert t.num_rows, "no progress"
        parts.append(t)
        got += t.num_rows
    c.close()
    assert flight_reads, "the default consumer reads through Flight"
    assert pa.concat_tables(parts).equals(_fetch_read(bs, "same", 1, 0, n))
    reader.close()
    cl.close()
    admin.close()


def test_hw_boundary_empty_stream_in_hw_leo_and_through_a_leader_change(cluster_factory):
    # Paused followers stay in the ISR (and registered) for the whole check: the HW stays below the LEO.
    cluster3 = cluster_factory(3, replica_lag_time_max_ms=60_000, zookeeper_session_timeout_ms=30_000)
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("hw", partitions=1, replication_factor=3, schema=SCHEMA,
                       config={"min.insync.replicas": "1"})
    committed = _produce(bs, "hw", 0, [100, 100])
    cl = Cluster(bs)
    leader, where, epoch = cl.leader("hw", 0)
    followers = [b for b in cluster3.ids if b != leader]
    reader = FlightReader()
    for b in followers:                    # the followers stop fetching: the HW stays, the LEO moves
        cluster3.pause(b)
    try:
        with replikafka.Producer(cluster3.address(leader), acks=1, linger_ms=0) as p:
            p.send("hw", _batch(committed, 50), partition=0).result(timeout=30)
        leo = committed + 50
        whole = reader.read(where, PartitionTicket("hw", 0, 0, leo, current_leader_epoch=epoch), 30)
        assert whole.record_count == committed, "only below the HW"
        for start in (committed, committed + 10, leo):
            empty = reader.read(where, PartitionTicket("hw", 0, start, max_bytes=1 << 20,
                                                       current_leader_epoch=epoch), 30)
            assert empty.record_count == 0, f"a start in [HW, LEO] is an empty stream ({start})"
        with pytest.raises(E.OffsetOutOfRangeError, match="outside"):
            reader.read(where, PartitionTicket("hw", 0, leo + 1, max_bytes=100, current_leader_epoch=epoch), 30)
        with pytest.raises(E.UnknownLeaderEpochError):
            reader.read(where, PartitionTicket("hw", 0, 0, 10, current_leader_epoch=epoch + 1), 30)
    finally:
        for b in followers:
            cluster3.resume(b)
    wait_until(lambda: reader.read(where, PartitionTicket("hw", 0, 0, leo, current_leader_epoch=epoch),
                                   30).record_count == leo, what="the HW to reach the LEO")
    # A leader change (a controlled shutdown: the long ZooKeeper session would make a kill slow
    # to notice): the old leader is gone; the new one serves exactly what is committed.
    cluster3.stop_broker(leader)
    wait_until(lambda: cl.leader("hw", 0)[0] != leader, what="a new leader")
    with pytest.raises((E.BrokerNotAvailableError, E.NotLeaderOrFollowerError)):
        reader.read(where, PartitionTicket("hw", 0, 0, 10, current_leader_epoch=epoch), 5)
    new_leader, new_where, new_epoch = cl.leader("hw", 0)
    assert new_epoch > epoch
    with pytest.raises(E.FencedLeaderEpochError) as fenced:      # KIP-320: the caller's epoch is old
        reader.read(new_where, PartitionTicket("hw", 0, 0, 10, current_leader_epoch=epoch), 30)
    assert fenced.value.retriable

    def new_leader_read():
        try:
            return reader.read(new_where, PartitionTicket("hw", 0, 0, leo, current_leader_epoch=new_epoch), 30)
        except E.ReplikafkaError as exc:
            assert exc.retriable, exc
            return None
    # Until the new leader knows its HW the stream is empty (never a shorter HW than a reader saw).
    read = wait_until(lambda: (r := new_leader_read()) is not None and r.record_count == leo and r,
                      what="the new leader to serve the committed records")
    assert pa.Table.from_batches(read.batches).column("value").to_pylist() == \
        pa.Table.from_batches(whole.batches).column("value").to_pylist() + \
        [b"value-%08d" % r + b"x" * (r % 50) for r in range(committed, leo)]
    reader.close()
    cl.close()
    admin.close()


def test_bad_tickets_are_refused_naming_what_was_wrong_and_the_broker_keeps_serving(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("strict", partitions=1, replication_factor=1, schema=SCHEMA)
    n = _produce(bs, "strict", 0, [10, 10])
    cl = Cluster(bs)
    _, where, epoch = cl.leader("strict", 0)
    client = fl.connect(f"grpc+tcp://{where}")

    def refused(ticket: bytes) -> fl.FlightError:
        with pytest.raises(fl.FlightError) as info:
            client.do_get(fl.Ticket(ticket)).read_all()
        return info.value

    def ticket(**kw) -> bytes:
        d = {"v": 1, "topic": "strict", "partition": 0, "start_offset": 0, "end_offset": n}
        d.update(kw)
        return json.dumps(d).encode()

    cases = [
        (b"\x00\x01garbage", "INVALID_REQUEST", "not UTF-8 JSON"),
        (ticket(topic="nope"), "UNKNOWN_TOPIC_OR_PARTITION", "'nope' does not exist"),
        (ticket(partition=7), "UNKNOWN_TOPIC_OR_PARTITION", "no partition 7"),
        (ticket(start_offset=-1), "INVALID_REQUEST", "'start_offset' must be an integer in [0, "),
        (ticket(start_offset=10**15, end_offset=10**15 + 1), "OFFSET_OUT_OF_RANGE", "offset 1000000000000000"),
        (ticket(start_offset=2**63), "INVALID_REQUEST", "'start_offset'"),
        (ticket(max_bytes=2**40), "INVALID_REQUEST", "'max_bytes' must be an integer in [0, 2147483647]"),
        (ticket(columns=["value", "nope"]), "INVALID_REQUEST", "unknown column(s) ['nope']"),
        (ticket(current_leader_epoch=epoch + 5), "UNKNOWN_LEADER_EPOCH", "request epoch"),
    ]
    for raw, code, named in cases:
        err = refused(raw)
        assert err.extra_info == code.encode(), (raw, err)
        assert named in str(err), (raw, str(err))
    mapped = E.error_for_code("UNKNOWN_TOPIC_OR_PARTITION")
    with pytest.raises(type(mapped)) as info:
        FlightReader().read(where, PartitionTicket("nope", 0, 0, 1), 10)
    assert info.value.retriable
    # Unknown descriptors are refused too; then everyone is still served.
    with pytest.raises(fl.FlightError, match="UNKNOWN_TOPIC_OR_PARTITION"):
        client.get_flight_info(fl.FlightDescriptor.for_path("nope"))
    with pytest.raises(fl.FlightError, match="INVALID_REQUEST"):
        client.get_flight_info(fl.FlightDescriptor.for_command(b"select 1"))
    assert client.do_get(fl.Ticket(ticket())).read_all().num_rows == n
    client.close()
    cl.close()
    admin.close()


def test_flight_appends_check_the_producers_crcs_and_refuse_bad_input_storing_nothing(cluster3):
    """DoPut (the producer's default path): a batch whose body does not hash to the
    producer's CRC-32C and the wrong columns are refused in that append's result, a
    command that does not parse and batches and CRCs that do not pair up refuse the
    call, each naming what was wrong; nothing of them is stored, and the broker keeps
    serving."""
    from replikafka.broker.storage.batch_format import body_crc32c
    from replikafka.protocol import flight_produce
    from replikafka.protocol.flight_produce import Append, ProduceCommand
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("puts", partitions=1, replication_factor=3, schema=SCHEMA, config={"min.insync.replicas": "2"})
    n = _produce(bs, "puts", 0, [10, 5])
    cl = Cluster(bs)
    _, where, _ = cl.leader("puts", 0)
    client = fl.connect(f"grpc+tcp://{where}")
    stored = R.stored_schema(R.parse_schema(SCHEMA))
    good = R.to_record_batch(_batch(n, 4), R.parse_schema(SCHEMA))
    crc = body_crc32c([good], stored)[0]

    def put(command: bytes, batches, schema=stored) -> bytes:
        writer, reader = client.do_put(fl.FlightDescriptor.for_command(command), schema)
        try:
            for b in batches:
                writer.write_batch(b)
            writer.done_writing()
            return reader.read().to_pybytes()
        finally:
            writer.close()

    def refused(command: bytes, batches, code: str, named: str, schema=stored) -> None:
        with pytest.raises(fl.FlightError) as info:
            put(command, batches, schema)
        assert info.value.extra_info == code.encode(), info.value
        assert named in str(info.value), str(info.value)

    cmd = lambda crcs: ProduceCommand("puts", 0, -1, 10_000, (Append(-1, tuple(crcs)),)).encode()
    def result_error(command: bytes, batches, schema=stored) -> dict:
        (r,) = json.loads(put(command, batches, schema))["results"]
        return r

    r = result_error(cmd([crc ^ 0x10]), [good])
    assert r["error_code"] == "CORRUPT_MESSAGE" and "batch 0: CRC-32C mismatch" in r["error_message"], r
    refused(b'{"v":1,"topic":"puts"}', [good], "INVALID_REQUEST", "missing field(s)")
    refused(b"\x00garbage", [good], "INVALID_REQUEST", "not UTF-8 JSON")
    refused(cmd([crc, crc]), [good], "INVALID_REQUEST", "1 batches for the 2 CRC-32C values")
    other = pa.record_batch([pa.array([b"x"])], names=["value"])
    r = result_error(ProduceCommand("puts", 0, 1, 1000, (Append(-1, tuple(body_crc32c([other], other.schema))),)
                                    ).encode(), [other], schema=other.schema)
    assert r["error_code"] == "INVALID_RECORD" and "column 'key' is missing" in r["error_message"], r
    refused(ProduceCommand("nope", 0, 1, 1000, (Append(-1, (crc,)),)).encode(), [good],
            "UNKNOWN_TOPIC_OR_PARTITION", "'nope'")
    # Two appends in one call: the first stored, the second's CRC refused (nothing of it stored).
    two = ProduceCommand("puts", 0, -1, 10_000, (Append(-1, (crc,)), Append(-1, (crc ^ 1,)))).encode()
    answer = json.loads(put(two, [good, good]))["results"]
    assert (answer[0]["base_offset"], answer[0]["record_count"]) == (n, 4)    # nothing of the refused ones
    assert answer[1]["error_code"] == "CORRUPT_MESSAGE", answer
    got = _fetch_read(bs, "puts", 0, 0, n + 4)
    assert got.column("value").to_pylist() == [b"value-%08d" % r + b"x" * (r % 50) for r in range(n + 4)]
    # The call stays open for further appends, each announced by its first batch's
    # metadata and answered before the next is read: one more batch without it refuses
    # the call there (the command's own append, complete and answered, is stored).
    writer, reader = client.do_put(fl.FlightDescriptor.for_command(cmd([crc])), stored)
    writer.write_batch(good)
    assert json.loads(reader.read().to_pybytes())["results"][0]["base_offset"] == n + 4
    writer.write_with_metadata(good, pa.py_buffer(flight_produce.encode_next_appends((Append(-1, (crc,)),))))
    assert json.loads(reader.read().to_pybytes())["results"][0]["base_offset"] == n + 8
    writer.done_writing()
    writer.close()
    for meta, named in [(None, "more batches than the 1 CRC-32C values"),
                        (b'{"v":1,"appends":[{"base_sequence":-1}]}', "exactly ['base_sequence', 'batch_crc32c']"),
                        (flight_produce.encode_next_appends((Append(-1, (crc, crc)),)),
                         "1 batches for the 2 CRC-32C values")]:
        writer, reader = client.do_put(fl.FlightDescriptor.for_command(cmd([crc])), stored)
        writer.write_batch(good)
        reader.read()
        writer.write_batch(good) if meta is None else writer.write_with_metadata(good, pa.py_buffer(meta))
        writer.done_writing()
        with pytest.raises(fl.FlightError) as info:
            reader.read()       # the call's end (no answer), or its error
            writer.close()      # the call's error
        assert info.value.extra_info == b"INVALID_REQUEST" and named in str(info.value), info.value
    client.close()
    cl.close()
    admin.close()


def test_doget_long_poll_waits_for_the_hw_and_is_bounded_by_max_wait(cluster3):
    """A DoGet at the HW with max_wait_ms answers with the records committed while it
    waited (woken by the HW's advance, RF=3 acks=all: the followers' fetches move it),
    and with an empty stream when nothing comes within max_wait_ms."""
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("poll", partitions=1, replication_factor=3, schema=SCHEMA, config={"min.insync.replicas": "2"})
    n = _produce(bs, "poll", 0, [3])
    cl = Cluster(bs)
    _, where, epoch = cl.leader("poll", 0)
    reader = FlightReader()
    t = time.monotonic()
    assert reader.read(where, PartitionTicket("poll", 0, n, max_bytes=1 << 20, max_wait_ms=400), 30).batches == []
    assert time.monotonic() - t >= 0.35      # it waited (the bound is the ticket's, not an error)
    got = []
    waiter = threading.Thread(target=lambda: got.append(reader.read(
        where, PartitionTicket("poll", 0, n, max_bytes=1 << 20, current_leader_epoch=epoch, max_wait_ms=30_000), 60)))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive()                # held at the HW, not answered empty
    _produce(bs, "poll", 0, [4])
    waiter.join(30)
    assert not waiter.is_alive() and got[0].first_offsets[0] == n and got[0].record_count == 4
    # The consumer of one partition long-polls through Flight the same way.
    c = replikafka.Consumer(bs, fetch_max_wait_ms=20_000)
    c.assign([("poll", 0)])
    c.seek(("poll", 0), n + 4)
    threading.Timer(0.5, lambda: _produce(bs, "poll", 0, [2])).start()
    table = c.poll(timeout_ms=20_000)
    assert table.column("offset").to_pylist() == [n + 4, n + 5]
    c.close()
    reader.close()
    cl.close()
    admin.close()


def test_followers_fetch_over_flight_when_configured(cluster_factory):
    """replica.fetch.transport=flight: followers fetch with the leader's replica-fetch
    action (the same request and answer bytes as gRPC's ReplicaData/Fetch); acks=all
    with min.insync.replicas=3 completes only once both followers have the batches, and
    the followers' copies read back the same."""
    c = cluster_factory(3, replica_fetch_transport="flight")
    bs = c.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("viaflight", partitions=1, replication_factor=3, schema=SCHEMA,
                       config={"min.insync.replicas": "3"})
    n = _produce(bs, "viaflight", 0, [50, 7, 300])
    assert _fetch_read(bs, "viaflight", 0, 0, n).column("value").to_pylist() == \
        [b"value-%08d" % r + b"x" * (r % 50) for r in range(n)]
    leader = admin.describe_topic("viaflight").partitions[0].leader
    text = urllib.request.urlopen(c.metrics_url(leader) + "/metrics", timeout=10).read().decode()
    assert re.search(r'requests_total\{request="FlightDoAction"\} [1-9]', text), "no follower fetch over Flight"
    admin.close()


def test_memory_bound_in_broker_and_client(cluster_factory):
    limit = 300_000
    c = cluster_factory(1, flight_max_bytes_in_flight=limit)
    bs = c.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("big", partitions=1, replication_factor=1, schema=SCHEMA)
    n = _produce(bs, "big", 0, [1000] * 40, batch_size=120_000)    # ~75 KB stored batches, ~3 MB
    cl = Cluster(bs)
    _, where, epoch = cl.leader("big", 0)
    client = fl.connect(f"grpc+tcp://{where}")
    # Client side: a read holds at most its ticket's max_bytes (or one batch).
    reader = FlightReader()
    budget = 250_000
    pos = 0
    while pos < n:
        read = reader.read(where, PartitionTicket("big", 0, pos, max_bytes=budget), 30)
        assert read.record_count > 0
        assert read.nbytes <= budget or len(read.batches) == 1, (read.nbytes, len(read.batches))
        pos = read.end_offset
    # Broker side: six concurrent whole-partition streams, read slowly, never hold more than the limit.
    results = []

    def slow_reader():
        r = client.do_get(fl.Ticket(PartitionTicket("big", 0, 0, n).encode()))
        rows = 0
        for chunk in r:
            rows += chunk.data.num_rows
            time.sleep(0.01)
        results.append(rows)
    threads = [threading.Thread(target=slow_reader) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [n] * 6
    stats = json.loads(next(iter(client.do_action(fl.Action("in-flight-bytes", b"")))).body.to_pybytes())
    assert stats["max"] == limit
    assert 0 < stats["peak"] <= limit, stats
    assert stats["in_flight"] == 0, stats
    # Client side, streaming (Spark's range reads): a stalled stream holds what gRPC received
    # ahead of its reader, at most its window (measured: 0.13 MB; with gRPC's own growing
    # window, 3.4 MB, which fails this check).
    admin.create_topic("bigger", partitions=1, replication_factor=1, schema=SCHEMA)
    m = _produce(bs, "bigger", 0, [1000] * 400, batch_size=120_000)       # ~30 MB
    window = 256 << 10
    streamer = FlightReader(stream_window_bytes=window)
    assert sum(b.num_rows for b, _ in streamer.stream(where, PartitionTicket("bigger", 0, 0, 1000), 60)) == 1000
    before = _rss_bytes()
    stream = streamer.stream(where, PartitionTicket("bigger", 0, 1000, m), 60)
    first_rows = next(stream)[0].num_rows
    time.sleep(1.5)                        # the broker sends what the window lets through
    held = _rss_bytes() - before
    assert held < window + 4 * 75_000 + (1 << 20), held     # the window, a few batches, allocator slack
    assert first_rows + sum(b.num_rows for b, _ in stream) == m - 1000
    streamer.close()
    client.close()
    reader.close()
    cl.close()
    admin.close()


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_get_flight_info_list_flights_and_the_readme_example(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("events", partitions=3, replication_factor=2, schema="key STRING, value BINARY")
    admin.create_topic("other", partitions=1, replication_factor=1)
    with replikafka.Producer(bs, acks="all") as p:
        for i in range(3):
            p.send("events", pa.table({"key": [f"user-{j % 4}" for j in range(100)],
                                       "value": [b"payload-%d" % j for j in range(100)]}), partition=i)
        p.flush()
    cl = Cluster(bs)
    some = cl.flight(cluster3.ids[0])
    client = fl.connect(f"grpc+tcp://{some}")
    assert sorted(f.descriptor.path[0] for f in client.list_flights()) == [b"events", b"other"]
    info = client.get_flight_info(fl.FlightDescriptor.for_path("events"))
    assert len(info.endpoints) == 3 and info.total_records == 300
    for p, ep in enumerate(info.endpoints):
        t = json.loads(ep.ticket.ticket)
        assert (t["partition"], t["start_offset"], t["end_offset"]) == (p, 0, 100)
        _, where, _ = cl.leader("events", p)
        assert ep.locations[0].uri.decode() == f"grpc+tcp://{where}"
    assert client.get_schema(fl.FlightDescriptor.for_path("events")).schema.names == ["key", "value", "timestamp"]
    client.close()
    # The README's example, exactly as written there (only the address is this cluster's).
    text = open(README).read()
    code = re.search(r"<!-- flight-example -->\s*```python\n(.*?)```", text, re.S).group(1)
    assert 'FLIGHT = "grpc://127.0.0.1:9192"' in code
    scope: dict = {}
    exec(code.replace("grpc://127.0.0.1:9192", f"grpc://{some}"), scope)
    table, counts = scope["table"], scope["counts"]
    assert table.num_rows == 300
    assert sorted(counts.itertuples(index=False, name=None)) == [(f"user-{k}", 75) for k in range(4)]
    cl.close()
    admin.close()


@pytest.mark.parametrize("columns", [None, ("value",)])
def test_range_read_across_a_leader_kill_returns_exactly_the_range(cluster3, columns):
    from replikafka.spark.cluster_access import ClusterClient
    from replikafka.spark.offsets_planning import OffsetRange
    from replikafka.spark.range_fetcher import ClusterTransport, ReadStats, read_range
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("move", partitions=1, replication_factor=3, schema=SCHEMA)
    n = _produce(bs, "move", 0, [200] * 30, batch_size=24_000)      # ~16 KB stored batches
    cl = Cluster(bs)
    leader, _, _ = cl.leader("move", 0)
    client = ClusterClient(bs, stream_window_bytes=40_000)     # the kill lands before the range has arrived
    flight_reads = []
    stream = client.flight.stream
    client.flight.stream = lambda *a: (flight_reads.append(a[0]), stream(*a))[1]
    stats = ReadStats()
    got: list[pa.RecordBatch] = []
    firsts: list[int] = []
    killed = False
    for batch in read_range(ClusterTransport(client), OffsetRange("move", 0, 150, n - 77),
                            columns=list(columns or ()), convert=lambda b, first: (b, first),
                            fetch_timeout_s=60, fail_on_data_loss=True, max_bytes=40_000, stats=stats):
        got.append(batch[0])
        firsts.append(batch[1])
        if not killed and sum(b.num_rows for b in got) > 1000:
            cluster3.kill(leader)
            killed = True
    assert killed and len(stats.leaders) >= 2, stats
    # Flight from both leaders (the dead one's retries go to Fetch once its listener is unreachable).
    assert len(set(flight_reads)) >= 2 and len(flight_reads) >= stats.fetches - stats.retries, flight_reads
    table = pa.Table.from_batches(got)
    assert firsts[0] == 150 and table.num_rows == n - 77 - 150
    assert table.column("value").to_pylist() == [b"value-%08d" % r + b"x" * (r % 50) for r in range(150, n - 77)]
    if columns:
        assert table.schema.names == ["value"]
    client.close()
    cl.close()
    admin.close()


def test_a_producer_appends_through_one_open_call_per_partition(cluster3):
    """Sequential sends to a partition go as further appends on one open DoPut (opening a
    call per send was most of a small send's cost); each partition has its own; every
    record lands once, in order; closing the producer closes the calls."""
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("streams", partitions=2, replication_factor=3, schema=SCHEMA,
                       config={"min.insync.replicas": "2"})
    p = replikafka.Producer(bs, acks="all", linger_ms=0)
    try:
        p.send("streams", _batch(0, 3), partition=0).result(timeout=60)
        calls = p._put_streams._streams
        [(key, first)] = calls.items()
        assert key[1:] == ("streams", 0) and not first.reused
        assert [p.send("streams", _batch(n, 3), partition=0).result(timeout=60).base_offset for n in (3, 6)] == [3, 6]
        p.send("streams", _batch(0, 2), partition=1).result(timeout=60)
        assert calls[key] is first and first.reused
        assert sorted(k[1:] for k in calls) == [("streams", 0), ("streams", 1)]
    finally:
        p.close()
    assert p._put_streams._streams == {}
    got = _fetch_read(bs, "streams", 0, 0, 9)
    assert got.column("value").to_pylist() == [b"value-%08d" % r + b"x" * (r % 50) for r in range(9)]
    admin.close()


def test_a_request_to_many_partitions_goes_as_one_produce_and_kept_calls_stay_bounded(cluster3, monkeypatch):
    """Every DoPut of a request is open at once (each holds a thread on the leader): calls
    opened past the limit while the others were busy are closed once answered, and a
    request naming more than REQUEST_PARTITIONS_MAX partitions goes as one gRPC Produce
    (after a failover a producer opened 2,800 calls at once for 3,000 partitions)."""
    from replikafka.client import producer as producer_module
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("wide", partitions=12, replication_factor=3, schema=SCHEMA,
                       config={"min.insync.replicas": "2"})
    p = replikafka.Producer(bs, acks="all", linger_ms=500)
    p._put_streams.max_streams = 3
    try:
        for rnd in range(2):
            futures = [p.send("wide", _batch(10 * rnd, 1), partition=q) for q in range(12)]   # one drain
            p.flush(60)
            assert [f.result().base_offset for f in futures] == [rnd] * 12
            assert len(p._put_streams._streams) <= 3
        monkeypatch.setattr(producer_module, "REQUEST_PARTITIONS_MAX", 2)
        opened = []
        real_append = p._put_streams.append
        monkeypatch.setattr(p._put_streams, "append", lambda *a: opened.append(a[3].partition) or real_append(*a))
        futures = [p.send("wide", _batch(20, 1), partition=q) for q in range(12)]
        p.flush(60)
        assert [f.result().base_offset for f in futures] == [2] * 12
        assert opened == []   # 4 partitions a leader: one Produce call each
    finally:
        p.close()
    for q in (0, 11):
        got = _fetch_read(bs, "wide", q, 0, 3)
        assert got.column("value").to_pylist() == [b"value-%08d" % r + b"x" * (r % 50) for r in (0, 10, 20)]
    admin.close()


def test_a_segment_the_broker_cannot_open_is_a_named_retriable_read_error_and_nothing_else_stops(cluster_factory):
    """A DoGet whose segment file cannot be opened (gone from under an idle, released log;
    or the process out of descriptors) is refused as that partition's KAFKA_STORAGE_ERROR,
    the retriable code Fetch gives, not an internal error with a traceback; the other
    partitions are served meanwhile, and the same read succeeds once the file is back."""
    cluster = cluster_factory(1, log_idle_release_ms=200)
    bs = cluster.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("moved", partitions=2, replication_factor=1, schema=SCHEMA)
    n = _produce(bs, "moved", 0, [10])
    _produce(bs, "moved", 1, [10])
    cl = Cluster(bs)
    client = fl.connect(f"grpc+tcp://{cl.flight(1)}")

    def read(partition: int) -> pa.Table:
        return client.do_get(fl.Ticket(json.dumps({"v": 1, "topic": "moved", "partition": partition,
                                                   "start_offset": 0, "end_offset": n}).encode())).read_all()

    segment = os.path.join(cluster.base_dir, "broker-1-logs", "moved-0", "00000000000000000000.arrows")
    time.sleep(2.5)                      # idle: the log gave its file and mapping back
    os.rename(segment, segment + ".away")
    try:
        with pytest.raises(fl.FlightError) as info:
            read(0)
        assert info.value.extra_info == b"KAFKA_STORAGE_ERROR", info.value
        assert "moved-0" in str(info.value) and "Traceback" not in str(info.value), info.value
        assert read(1).num_rows == n
    finally:
        os.rename(segment + ".away", segment)
    assert read(0).num_rows == n
    client.close()
    cl.close()
    admin.close()
