"""The data source's reader as plain Python (no Spark session): partitions()
plans [log start, HW) per partition, read() returns exactly that, against a
real 3-broker cluster — including during a leader kill and with records
between the HW and the LEO."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

from replikafka.spark.arrow_convert import target_arrow_schema
from replikafka.spark.batch_reader import BatchReader, FilteringBatchReader, RangePartition, read_partition
from replikafka.spark.data_source import ReplikafkaDataSource
from replikafka.spark.offsets_planning import OffsetRange
from replikafka.spark.options import OptionError
from replikafka.spark.range_fetcher import ReadStats
from spark_helpers import SCORES_SCHEMA, kafka_batch, scores_batch

pytestmark = pytest.mark.integration


def reader_for(bootstrap, **options):
    ds = ReplikafkaDataSource({"bootstrap.servers": bootstrap, **options})
    return ds, ds.reader(ds.schema())


def read_all(reader, partitions):
    return [b for p in partitions for b in reader.read(p)]


def test_partitions_plan_log_start_to_high_watermark_and_read_returns_exactly_that(bootstrap, topics):
    t = topics.new(3)
    topics.fill(t, {0: 1000, 1: 10, 2: 0})
    ds, reader = reader_for(bootstrap, subscribe=t)
    assert isinstance(reader, FilteringBatchReader)            # plain Python: pushdown available
    parts = reader.partitions()
    assert [(p.topic, p.partition, p.start, p.end) for p in parts] == [(t, 0, 0, 1000), (t, 1, 0, 10)]
    batches = read_all(reader, parts)
    want = target_arrow_schema(ds.schema())
    assert all(b.schema.equals(want) for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.num_rows == 1010
    got = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist()))
    assert got == [(0, i) for i in range(1000)] + [(1, i) for i in range(10)]
    assert table.column("value").to_pylist()[:2] == [b"0:0", b"0:1"]


def test_the_end_is_fixed_when_planned(bootstrap, topics):
    t = topics.new(1)
    topics.fill(t, {0: 100})
    _, reader = reader_for(bootstrap, subscribe=t)
    parts = reader.partitions()
    topics.fill(t, {0: 50})                                   # committed after planning: not read
    assert sum(b.num_rows for b in read_all(reader, parts)) == 100
    assert sum(b.num_rows for b in read_all(reader, reader.partitions())) == 150


def test_nothing_at_or_beyond_the_high_watermark_is_returned(own_cluster):
    # Both followers die; until their sessions expire they stay in the ISR, so
    # records the leader alone acknowledges (acks=1) sit in [HW, LEO).
    cluster = own_cluster(**{"zookeeper.session.timeout.ms": "8000"})
    from spark_helpers import TopicTool
    tool = TopicTool(cluster, "hw")
    try:
        t = tool.new(1)
        tool.fill(t, {0: 100})
        desc = tool.describe(t)[0]
        for b in desc.replicas:
            if b != desc.leader:
                cluster.kill(b)
        bootstrap = cluster.address(desc.leader)
        from replikafka.client.producer import Producer
        with Producer(bootstrap, acks=1, idempotent=False, linger_ms=0) as p:
            p.send(t, kafka_batch(0, 100, 40), partition=0).result(timeout=5)
        _, reader = reader_for(bootstrap, subscribe=t)
        parts = reader.partitions()
        table = pa.Table.from_batches(read_all(reader, parts))
        # A range planned past the HW is refused, not read short or waited on.
        _, late = reader_for(bootstrap, subscribe=t, endingOffsets=f'{{"{t}":{{"0":120}}}}')
        with pytest.raises(OptionError, match="endingOffsets.*high watermark 100"):
            late.partitions()
        d = tool.describe(t)[0]
        assert d.log_end_offset == 140 and d.high_watermark == 100, "the window closed too early; test is void"
        assert [(p.start, p.end) for p in parts] == [(0, 100)]
        assert table.num_rows == 100 and max(table.column("offset").to_pylist()) == 99
    finally:
        tool.close()


def test_a_read_during_a_leader_kill_returns_exactly_the_planned_range(own_cluster):
    # Its own cluster: the killed broker is not restarted (the shared cluster stays whole).
    cluster = own_cluster()
    from spark_helpers import TopicTool
    tool = TopicTool(cluster, "kill")
    try:
        t = tool.new(1)
        tool.fill(t, {0: 20_000}, batch_rows=500)
        ds, reader = reader_for(cluster.bootstrap_servers, subscribe=t, fetchMaxBytes="16384")
        (part,) = reader.partitions()
        leader = tool.describe(t)[0].leader
        stats = ReadStats()
        got = []
        for batch in read_partition(reader.opts, reader.layout, part, stats=stats):
            got.append(batch)
            if len(got) == 1:
                cluster.kill(leader)                   # SIGKILL mid-read
        offsets = pa.Table.from_batches(got).column("offset").to_pylist()
        assert offsets == list(range(20_000))
        assert len(stats.leaders) >= 2 and stats.retries >= 1
    finally:
        tool.close()


def test_columns_projection_keeps_unrequested_columns_on_the_broker(bootstrap, topics):
    t = topics.new(1)
    topics.fill(t, {0: 2000}, value_bytes=500)
    full_stats, proj_stats = ReadStats(), ReadStats()
    _, full = reader_for(bootstrap, subscribe=t)
    _, proj = reader_for(bootstrap, subscribe=t, columns="partition,offset")
    for reader, stats in ((full, full_stats), (proj, proj_stats)):
        for p in reader.partitions():
            rows = list(read_partition(reader.opts, reader.layout, p, stats=stats))
    assert rows[0].schema.names == ["partition", "offset"]
    assert full_stats.records == proj_stats.records == 2000
    assert full_stats.bytes > 1_000_000 and proj_stats.bytes < full_stats.bytes / 20


def test_own_schema_topic_with_splitting_and_pushed_filters(bootstrap, topics):
    t = topics.new(2, schema=SCORES_SCHEMA)
    topics.produce(t, {0: scores_batch(0, 500), 1: scores_batch(500, 500)})
    _, reader = reader_for(bootstrap, subscribe=t, maxRecordsPerPartition="200")
    parts = reader.partitions()
    assert len(parts) == 6 and all(p.end - p.start <= 200 for p in parts)
    table = pa.Table.from_batches(read_all(reader, parts))
    assert table.schema.names == ["id", "name", "amount", "topic", "partition", "offset", "timestamp"]
    assert sorted(table.column("id").to_pylist()) == list(range(1000))
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual
    remaining = reader.pushFilters([EqualTo(("partition",), 1), GreaterThanOrEqual(("offset",), 450)])
    assert list(remaining) == []
    assert [(p.partition, p.start, p.end) for p in reader.partitions()] == [(1, 450, 500)]


def test_timestamp_bounds_use_the_brokers_time_index(bootstrap, topics):
    t = topics.new(1, config={"message.timestamp.type": "LogAppendTime"})
    topics.fill(t, {0: 100})
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    topics.fill(t, {0: 100})
    _, reader = reader_for(bootstrap, subscribe=t, startingTimestamp=str(middle))
    assert [(p.start, p.end) for p in reader.partitions()] == [(100, 200)]
    _, reader = reader_for(bootstrap, subscribe=t, endingTimestamp=str(middle))
    assert [(p.start, p.end) for p in reader.partitions()] == [(0, 100)]
    import datetime as dt
    from pyspark.sql.datasource import LessThan
    _, reader = reader_for(bootstrap, subscribe=t)
    f = LessThan(("timestamp",), dt.datetime.fromtimestamp(middle / 1000, dt.timezone.utc))
    assert list(reader.pushFilters([f])) == [f]                       # Spark still checks each row
    assert [(p.start, p.end) for p in reader.partitions()] == [(0, 100)]   # LogAppendTime: the end is cut too
    ts_type = pa.Table.from_batches(read_all(reader, reader.partitions())).column("timestampType")
    assert set(ts_type.to_pylist()) == {1}


def test_planning_errors_name_the_option(bootstrap, topics):
    t = topics.new(1)
    # A missing topic: load() gives the Kafka schema (a stream waits for the topic);
    # a batch read fails when it is planned, naming the option.
    missing = ReplikafkaDataSource({"bootstrap.servers": bootstrap, "subscribe": t + "-missing"})
    assert missing.schema().names[:2] == ["key", "value"]
    with pytest.raises(OptionError, match="'subscribe'.*does not exist"):
        missing.reader(missing.schema()).partitions()
    with pytest.raises(OptionError, match="'assign'.*no partition 5"):
        ReplikafkaDataSource({"bootstrap.servers": bootstrap, "assign": f'{{"{t}":[5]}}'}).schema()
    ds = ReplikafkaDataSource({"bootstrap.servers": bootstrap, "subscribe": t, "startingOffsets": "latest"})
    with pytest.raises(OptionError, match="'startingOffsets'"):
        ds.reader(ds.schema())


def test_placeholder_and_empty_partitions_read_nothing(bootstrap, topics):
    t = topics.new(1)
    _, reader = reader_for(bootstrap, subscribe=t)
    assert reader.partitions() == []
    from pyspark.sql.datasource import InputPartition
    assert list(reader.read(InputPartition(None))) == []
    assert list(reader.read(RangePartition(t, 0, 5, 5))) == []
