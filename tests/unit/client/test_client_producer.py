"""The producer against the in-process fake broker: routing, batching into
one append per partition, per-send offsets, retries with the same sequence,
errors raised by send() or as future exceptions, never dropped silently."""
import time

import pyarrow as pa
import pytest

import replikafka
from replikafka import errors as E
from replikafka.client.partitioner import partition_for_key
from replikafka.records import HEADER_TYPE


def kafka_rows(values):
    n = len(values)
    return pa.record_batch([pa.nulls(n, pa.binary()), pa.array(values, pa.binary()), pa.nulls(n, HEADER_TYPE)],
                           names=["key", "value", "headers"])


def values(fake, topic, p):
    return fake.rows(topic, p).column("value").to_pylist()


def test_sends_get_their_own_offsets_and_share_appends(fake):
    fake.add_topic("t", 2)
    with replikafka.Producer(fake.bootstrap, linger_ms=50) as p:
        futs = [p.send("t", kafka_rows([b"a%d" % i] * 3), partition=0) for i in range(10)]
        metas = [f.result(10) for f in futs]
    assert [m.base_offset for m in metas] == list(range(0, 30, 3))
    assert all(m.record_count == 3 and m.partition == 0 and m.topic == "t" for m in metas)
    assert len(fake.produce_requests) < 10  # lingering batched several sends per append
    assert values(fake, "t", 0) == [b"a%d" % i for i in range(10) for _ in range(3)]


def test_bytes_values_keys_and_dicts(fake):
    fake.add_topic("t", 4)
    fake.add_topic("s", 1, pa.schema([("id", pa.int64()), ("name", pa.string())]))
    with replikafka.Producer(fake.bootstrap) as p:
        m = p.send("t", b"v", key=b"user-1").result(10)
        assert m.partition == partition_for_key(b"user-1", 4)
        assert fake.rows("t", m.partition).column("key").to_pylist() == [b"user-1"]
        m = p.send("s", [{"id": 1, "name": "a"}, {"id": 2, "name": None}], timestamp_ms=5000).result(10)
        assert m.record_count == 2
    rows = fake.rows("s", 0)
    assert rows.column("id").to_pylist() == [1, 2]
    assert rows.column("timestamp").cast(pa.int64()).to_pylist() == [5000, 5000]


def test_sticky_partitioning_spreads_batches_over_partitions(fake):
    fake.add_topic("t", 3)
    with replikafka.Producer(fake.bootstrap, linger_ms=0) as p:
        for i in range(30):
            p.send("t", kafka_rows([b"x"])).result(10)
    counts = [len(values(fake, "t", i)) for i in range(3)]
    assert sum(counts) == 30 and all(c > 0 for c in counts)


def test_big_input_is_split_under_max_message_bytes(fake):
    fake.add_topic("big", 1, config={"max.message.bytes": "100000"})
    data = kafka_rows([b"%06d" % i + b"x" * 94 for i in range(5_000)])  # ~600 KB
    with replikafka.Producer(fake.bootstrap) as p:
        meta = p.send("big", data).result(10)
    assert meta.base_offset == 0 and meta.record_count == 5_000
    sizes = [len(d.records) for r in fake.produce_requests for d in r.partitions]
    assert len(sizes) >= 6 and max(sizes) <= 100_000
    assert values(fake, "big", 0) == data.column("value").to_pylist()


def test_retriable_errors_are_retried_with_a_metadata_refresh(fake):
    fake.add_topic("t", 1)
    fake.faults += [("Produce", "t", 0, "NOT_LEADER_OR_FOLLOWER"), ("Produce", "t", 0, "LEADER_NOT_AVAILABLE")]
    with replikafka.Producer(fake.bootstrap, retry_backoff_ms=10) as p:
        assert p.send("t", kafka_rows([b"a"]), partition=0).result(10).base_offset == 0
    assert values(fake, "t", 0) == [b"a"]
    assert len(fake.produce_requests) == 3


def test_a_lost_acknowledgement_is_resent_with_the_same_sequence_and_not_duplicated(fake):
    fake.add_topic("t", 1)
    fake.faults.append(("Produce", "t", 0, "APPENDED_THEN_REQUEST_TIMED_OUT"))
    with replikafka.Producer(fake.bootstrap, retry_backoff_ms=10) as p:
        assert p.send("t", kafka_rows([b"a", b"b"]), partition=0).result(10).base_offset == 0
        assert p.send("t", kafka_rows([b"c"]), partition=0).result(10).base_offset == 2
    seqs = [(d.producer_id, d.base_sequence) for r in fake.produce_requests for d in r.partitions]
    assert seqs[0] == seqs[1] and seqs[2] == (seqs[0][0], 2)
    assert values(fake, "t", 0) == [b"a", b"b", b"c"]


def test_without_idempotence_no_producer_id_is_sent(fake):
    fake.add_topic("t", 1)
    with replikafka.Producer(fake.bootstrap, idempotent=False, acks=1) as p:
        p.send("t", b"a", partition=0).result(10)
    d = fake.produce_requests[0].partitions[0]
    assert (fake.produce_requests[0].acks, d.producer_id) == (1, -1)


def test_acks_zero_reports_no_offset(fake):
    fake.add_topic("t", 1)
    with replikafka.Producer(fake.bootstrap, acks=0) as p:
        assert p.send("t", b"a", partition=0).result(10).base_offset == -1


def test_errors_knowable_at_send_time_raise_from_send(fake):
    fake.add_topic("s", 1, pa.schema([("id", pa.int64())]))
    with replikafka.Producer(fake.bootstrap) as p:
        with pytest.raises(E.UnknownTopicOrPartitionError):
            p.send("nope", b"x")
        with pytest.raises(E.InvalidSchemaError, match="'id'"):
            p.send("s", [{"id": "zz"}])
        with pytest.raises(E.InvalidSchemaError):
            p.send("s", b"bytes")
        with pytest.raises(E.InvalidSchemaError, match="'extra' is not in the topic's schema"):
            p.send("s", pa.record_batch([pa.array([1]), pa.array([2])], names=["id", "extra"]))
        with pytest.raises(E.InvalidSchemaError, match="'id' is missing"):
            p.send("s", pa.record_batch([pa.array([1])], names=["other"]))
        with pytest.raises(E.UnknownTopicOrPartitionError):
            p.send("s", [{"id": 1}], partition=5)
        # a broker's refusal is a delivery error: the future's exception
        fake.faults.append(("Produce", "s", 0, "INVALID_RECORD"))
        assert isinstance(p.send("s", [{"id": 1}]).exception(10), E.InvalidSchemaError)
        # the producer goes on (with a fresh producer id after the sequence gap)
        assert p.send("s", [{"id": 2}]).result(10).base_offset == 0


def test_kafka_shaped_topic_takes_key_value_alone_or_value_alone(fake):
    fake.add_topic("t", 1)
    with replikafka.Producer(fake.bootstrap) as p:
        kv = pa.record_batch([pa.array([b"k1", b"k2"]), pa.array([b"v1", b"v2"])], names=["key", "value"])
        assert p.send("t", kv, partition=0).result(10).record_count == 2
        p.send("t", pa.table({"value": pa.array([b"v3"])}), partition=0).result(10)
    rows = fake.rows("t", 0)
    assert rows.column("key").to_pylist() == [b"k1", b"k2", None]
    assert rows.column("value").to_pylist() == [b"v1", b"v2", b"v3"]
    assert rows.column("headers").to_pylist() == [None, None, None]


def test_pandas_dataframe_is_accepted(fake):
    import pandas as pd
    fake.add_topic("s", 1, pa.schema([("id", pa.int64()), ("name", pa.string())]))
    with replikafka.Producer(fake.bootstrap) as p:
        p.send("s", pd.DataFrame({"id": [1, 2], "name": ["a", "b"]}), partition=0).result(10)
    assert fake.rows("s", 0).column("name").to_pylist() == ["a", "b"]


def test_failed_sends_nobody_read_are_raised_by_flush_and_close(fake, caplog):
    fake.add_topic("t", 1)
    fake.faults += [("Produce", "t", 0, "INVALID_RECORD")]
    p = replikafka.Producer(fake.bootstrap)
    p.send("t", b"lost", partition=0)  # the future is dropped on the floor
    with pytest.raises(E.InvalidSchemaError, match="1 send"):
        p.flush(timeout=10)
    p.flush(timeout=10)  # reported once
    fake.faults += [("Produce", "t", 0, "INVALID_RECORD")]
    read = p.send("t", b"seen", partition=0)
    assert isinstance(read.exception(10), E.InvalidSchemaError)
    p.flush(timeout=10)  # its error was read: not raised again
    fake.faults += [("Produce", "t", 0, "INVALID_RECORD")]
    p.send("t", b"lost again", partition=0)
    with pytest.raises(E.InvalidSchemaError, match="1 send"):
        p.close()
    assert "send(s) failed" in caplog.text


def test_a_kafka_style_config_dict_configures_each_client(fake, caplog):
    fake.add_topic("t", 1)
    conf = {"bootstrap.servers": fake.bootstrap, "acks": "1", "linger.ms": 0, "enable.idempotence": "false",
            "client.id": "mine", "compression.type": "none"}
    with replikafka.Producer(conf) as p:
        assert p.send("t", b"a", partition=0).result(10).base_offset == 0
    assert fake.produce_requests[0].acks == 1 and fake.produce_requests[0].partitions[0].producer_id == -1
    assert "ignoring Kafka client config keys that do not apply here: client.id, compression.type" in caplog.text
    c = replikafka.Consumer({"bootstrap.servers": fake.bootstrap, "auto.offset.reset": "earliest"})
    c.close()
    assert replikafka.Admin({"bootstrap.servers": fake.bootstrap}).list_topics() is not None
    with pytest.raises(E.InvalidConfigError, match="did you mean linger.ms"):
        replikafka.Producer({"bootstrap.servers": fake.bootstrap, "linger.mss": 5})
    with pytest.raises(E.InvalidConfigError, match="bootstrap.servers"):
        replikafka.Producer({"acks": "all"})
    with pytest.raises(E.InvalidConfigError, match="unknown security config 'ssl.bogus'"):  # reaches the TLS set-up
        replikafka.Producer({"bootstrap.servers": fake.bootstrap, "security.protocol": "SSL", "ssl.bogus": "x"})


def test_retriable_errors_give_up_at_the_delivery_timeout(fake):
    fake.add_topic("t", 1)
    fake.faults += [("Produce", "t", 0, "NOT_ENOUGH_REPLICAS")] * 100
    with replikafka.Producer(fake.bootstrap, delivery_timeout_ms=500, retry_backoff_ms=20) as p:
        t0 = time.monotonic()
        exc = p.send("t", b"a", partition=0).exception(10)
    assert isinstance(exc, E.KafkaTimeoutError) and "NOT_ENOUGH_REPLICAS" in str(exc)
    assert time.monotonic() - t0 < 3


def test_send_blocks_for_buffer_room_then_raises(fake):
    fake.add_topic("t", 1)
    fake.produce_gate.clear()  # the broker holds every Produce
    try:
        p = replikafka.Producer(fake.bootstrap, buffer_memory=50_000, max_block_ms=300, linger_ms=0)
        first = p.send("t", kafka_rows([b"x" * 100] * 300), partition=0)  # ~35 KB
        t0 = time.monotonic()
        with pytest.raises(E.KafkaTimeoutError):
            p.send("t", kafka_rows([b"y" * 100] * 300), partition=0)
        assert time.monotonic() - t0 >= 0.25
    finally:
        fake.produce_gate.set()
    assert first.result(10).base_offset == 0
    p.send("t", kafka_rows([b"z"] * 3), partition=0).result(10)  # room again
    p.close()


def test_flush_sends_lingering_batches_and_close_refuses_new_sends(fake):
    fake.add_topic("t", 1)
    p = replikafka.Producer(fake.bootstrap, linger_ms=60_000)
    fut = p.send("t", b"a", partition=0)
    time.sleep(0.1)
    assert not fut.done()
    p.flush(timeout=10)
    assert fut.done() and fut.result().base_offset == 0
    p.close()
    with pytest.raises(E.ReplikafkaError):
        p.send("t", b"b")


def test_close_delivers_what_is_queued(fake):
    fake.add_topic("t", 1)
    p = replikafka.Producer(fake.bootstrap, linger_ms=60_000)
    futs = [p.send("t", b"%d" % i, partition=0) for i in range(5)]
    p.close()
    assert [f.result(0).base_offset for f in futs] == [0, 1, 2, 3, 4]
