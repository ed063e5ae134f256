"""The consumer against the in-process fake broker: positions, polling,
offset resets, leader errors, offsets queries, projection."""
import pyarrow as pa
import pytest

import replikafka
from replikafka import errors as E
from replikafka.records import HEADER_TYPE, TIMESTAMP_TYPE


def fill(fake, topic, partition, values, ts=None):
    p = fake.topics[topic].partitions[partition]
    n = len(values)
    b = pa.record_batch([pa.nulls(n, pa.binary()), pa.array(values, pa.binary()), pa.nulls(n, HEADER_TYPE),
                         pa.array(ts or [1000 + p.leo + i for i in range(n)], pa.int64()).cast(TIMESTAMP_TYPE)],
                        schema=fake.topics[topic].schema)
    p.batches.append((p.leo, b))
    p.leo += n


@pytest.fixture
def topic(fake):
    fake.add_topic("t", 2)
    fill(fake, "t", 0, [b"a", b"b", b"c"])
    fill(fake, "t", 0, [b"d"])
    fill(fake, "t", 1, [b"x", b"y"])
    return "t"


def test_poll_reads_every_assigned_partition_once(fake, topic):
    with replikafka.Consumer(fake.bootstrap) as c:
        c.assign([(topic, 0), (topic, 1)])
        assert c.assignment() == {(topic, 0), (topic, 1)}
        t = c.poll(2000)
        got = sorted(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                         t.column("value").to_pylist()))
        assert got == [(0, 0, b"a"), (0, 1, b"b"), (0, 2, b"c"), (0, 3, b"d"), (1, 0, b"x"), (1, 1, b"y")]
        assert c.position((topic, 0)) == 4 and c.position((topic, 1)) == 2
        assert c.highwater((topic, 0)) == 4
        empty = c.poll(50)
        assert empty.num_rows == 0 and empty.schema.equals(t.schema)
        fill(fake, topic, 1, [b"z"])
        t = c.poll(2000)
        assert t.column("value").to_pylist() == [b"z"] and t.column("offset").to_pylist() == [2]


def test_one_fetch_per_leader_per_poll(fake):
    fake.add_topic("t", 4)  # partitions alternate between brokers 1 and 2 (one address in the fake)
    for p in range(4):
        fill(fake, "t", p, [b"v"])
    with replikafka.Consumer(fake.bootstrap) as c:
        c.assign([("t", p) for p in range(4)])
        c.poll(2000)
    first = fake.fetch_requests[0]
    assert len(first.partitions) == 4 and first.replica_id == -1


def test_seek_and_seek_to(fake, topic):
    with replikafka.Consumer(fake.bootstrap) as c:
        c.assign([(topic, 0)])
        c.seek((topic, 0), 2)
        assert c.poll(2000).column("value").to_pylist() == [b"c", b"d"]
        c.seek_to_beginning()
        assert c.position((topic, 0)) == 0
        c.seek_to_end()
        assert c.position((topic, 0)) == 4
        with pytest.raises(E.InvalidOffsetError):
            c.seek((topic, 0), -1)
        with pytest.raises(E.InvalidRequestError):
            c.seek((topic, 1), 0)  # not assigned


def test_auto_offset_reset(fake, topic):
    with replikafka.Consumer(fake.bootstrap, auto_offset_reset="latest") as c:
        c.assign([(topic, 0)])
        assert c.position((topic, 0)) == 4
    with replikafka.Consumer(fake.bootstrap) as c:
        c.assign([(topic, 0)])
        c.seek((topic, 0), 99)  # beyond the log end: OFFSET_OUT_OF_RANGE, reset to earliest
        assert c.poll(2000).column("offset").to_pylist() == [0, 1, 2, 3]
    with replikafka.Consumer(fake.bootstrap, auto_offset_reset="none") as c:
        c.assign([(topic, 0)])
        with pytest.raises(E.InvalidOffsetError):
            c.poll(100)
        c.seek((topic, 0), 99)
        with pytest.raises(E.OffsetOutOfRangeError):
            c.poll(1000)
    with pytest.raises(E.InvalidConfigError):
        replikafka.Consumer(fake.bootstrap, auto_offset_reset="middle")


def test_leader_errors_are_retried_within_poll(fake, topic):
    fake.faults += [("Fetch", topic, 0, "NOT_LEADER_OR_FOLLOWER"), ("Fetch", topic, 0, "FENCED_LEADER_EPOCH")]
    with replikafka.Consumer(fake.bootstrap, retry_backoff_ms=10) as c:
        c.assign([(topic, 0)])
        c.seek((topic, 0), 0)
        assert c.poll(5000).num_rows == 4  # both errors were retried inside one poll
    assert not fake.faults


def test_offsets_queries(fake, topic):
    with replikafka.Consumer(fake.bootstrap) as c:
        tps = [(topic, 0), (topic, 1)]
        assert c.beginning_offsets(tps) == {(topic, 0): 0, (topic, 1): 0}
        assert c.end_offsets(tps) == {(topic, 0): 4, (topic, 1): 2}
        found = c.offsets_for_times({(topic, 0): 1002, (topic, 1): 10 ** 12})
        assert found[(topic, 0)] == (2, 1002) and found[(topic, 0)].offset == 2
        assert found[(topic, 1)] is None
        with pytest.raises(E.UnknownTopicOrPartitionError):
            c.end_offsets([(topic, 7)])


def test_projection_is_sent_to_the_broker(fake):
    fake.add_topic("s", 1, pa.schema([("id", pa.int64()), ("name", pa.string()), ("blob", pa.binary())]))
    with replikafka.Producer(fake.bootstrap) as p:
        p.send("s", [{"id": 1, "name": "a", "blob": b"zzz"}], timestamp_ms=7).result(10)
    with replikafka.Consumer(fake.bootstrap, columns=["name", "id"]) as c:
        c.assign([("s", 0)])
        t = c.poll(2000)
        assert t.column_names == ["name", "id", "topic", "partition", "offset", "timestamp"]
        assert t.to_pylist()[0]["name"] == "a" and t.column("timestamp").cast(pa.int64()).to_pylist() == [7]
        assert list(fake.fetch_requests[-1].columns) == ["name", "id", "timestamp"]
    with replikafka.Consumer(fake.bootstrap, columns=["nope"]) as c:
        with pytest.raises(E.InvalidSchemaError):
            c.assign([("s", 0)])


def test_assign_checks_topics_and_partitions(fake, topic):
    with replikafka.Consumer(fake.bootstrap) as c:
        with pytest.raises(E.UnknownTopicOrPartitionError):
            c.assign([("nope", 0)])
        with pytest.raises(E.UnknownTopicOrPartitionError):
            c.assign([(topic, 5)])
        with pytest.raises(E.InvalidRequestError):
            c.assign(["t0"])
        with pytest.raises(E.InvalidRequestError):
            c.poll(10)  # nothing assigned


def test_a_deleted_topic_stops_poll(fake, topic):
    with replikafka.Consumer(fake.bootstrap) as c:
        c.assign([(topic, 0)])
        c.poll(1000)
        del fake.topics[topic]
        with pytest.raises(E.UnknownTopicOrPartitionError):
            for _ in range(3):
                c.poll(500)


def test_an_answer_without_hw_keeps_the_last_hw_and_latest_is_retried(fake, topic):
    """KIP-207: a new leader reports no HW (-1) and answers ListOffsets latest with
    OFFSET_NOT_AVAILABLE until its HW reaches its epoch start; the HW a consumer
    sees never moves backwards and the latest offset is asked again."""
    with replikafka.Consumer(fake.bootstrap) as c:
        c.assign([(topic, 0)])
        assert c.poll(2000).num_rows == 4 and c.highwater((topic, 0)) == 4
        fake.topics[topic].partitions[0].hw_unknown = 1_000_000
        fill(fake, topic, 0, [b"e"])
        assert c.poll(200).num_rows == 0 and c.highwater((topic, 0)) == 4
        fake.topics[topic].partitions[0].hw_unknown = 0
        assert c.poll(2000).column("value").to_pylist() == [b"e"] and c.highwater((topic, 0)) == 5
        fake.faults += [("ListOffsets", topic, 0, "OFFSET_NOT_AVAILABLE")] * 2
        assert c.end_offsets([(topic, 0)]) == {(topic, 0): 5}
        assert not fake.faults
