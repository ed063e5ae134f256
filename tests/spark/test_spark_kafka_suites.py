"""Cases of Spark's own Kafka suites (apache/spark connector/kafka-0-10-sql/src/test)
through a real SparkSession against a real cluster: topics that do not exist
yet, Complete output mode, sink column types, headers, re-running a DataFrame
(issue 13, items 4, 6, 7, 8, 11). Each test names the Spark test it ports."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from replikafka.records import HEADER_TYPE
from spark_helpers import await_available_now, kafka_batch

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def read(spark, bootstrap, topic, **options):
    r = spark.read.format("replikafka").option("bootstrap.servers", bootstrap).option("subscribe", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


class Collected:
    def __init__(self):
        self.rows: list[tuple] = []

    def __call__(self, batch_df, batch_id):
        self.rows += [tuple(r) for r in batch_df.collect()]


@pytest.mark.long          # a running query waits for the cluster: 1-2 minutes on a busy machine
def test_stream_subscribed_to_a_topic_that_does_not_exist_yet_reads_it_when_it_appears(
        spark, bootstrap, topics, checkpoint):
    """KafkaMicroBatchSourceSuite "subscribing topic by pattern with topic deletions" (a topic
    that matches after the query started is read from its start) and Spark's source starting
    on a topic not yet created: load() and start() succeed, the records arrive once it exists."""
    name = f"{topics.label}-later"
    sink = Collected()
    df = (spark.readStream.format("replikafka").option("bootstrap.servers", bootstrap)
          .option("subscribe", name).option("startingOffsets", "earliest")
          .option("kafka.group.id", "ignored-here").load())
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    q = (df.selectExpr("partition", "offset", "CAST(value AS STRING)").writeStream.foreachBatch(sink)
         .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.time() + 60
        while not q.recentProgress and time.time() < deadline:      # the query ran a trigger: no topic yet
            time.sleep(0.2)
        assert q.exception() is None and sink.rows == []
        topics.admin.create_topic(name, partitions=2, replication_factor=3)
        topics.wait_leaders(name)
        topics.fill(name, {0: 7, 1: 3})
        deadline = time.time() + 90
        while len(sink.rows) < 10 and time.time() < deadline and q.exception() is None:
            time.sleep(0.5)
    finally:
        q.stop()
    assert q.exception() is None
    assert sorted(sink.rows) == [(0, i, f"0:{i}") for i in range(7)] + [(1, i, f"1:{i}") for i in range(3)]


@pytest.mark.long          # two stateful aggregation queries: ~1.5 minutes on a busy machine
def test_complete_mode_aggregation_is_appended_once_per_batch(spark, bootstrap, topics, checkpoint):
    """KafkaSinkSuite "streaming - write aggregation w/o topic field, with topic option": Complete
    output mode writes each batch's whole result to the topic (a log of updates), exactly once
    per batch, even when a batch is replayed."""
    src, out = topics.new(1), topics.new(1)
    topics.produce(src, {0: pa.record_batch([pa.array([b"a", b"b", b"a"])], names=["value"])})

    def run():
        agg = (spark.readStream.format("replikafka").option("bootstrap.servers", bootstrap).option("subscribe", src)
               .option("startingOffsets", "earliest").load()
               .groupBy("value").count().select(F.col("value").alias("key"),
                                                F.col("count").cast("string").alias("value")))
        q = (agg.writeStream.format("replikafka").outputMode("complete").option("bootstrap.servers", bootstrap)
             .option("topic", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        await_available_now(q)
        assert q.exception() is None

    run()
    topics.produce(src, {0: pa.record_batch([pa.array([b"b", b"c"])], names=["value"])})
    run()
    rows = [(r.key, r.value.decode(), r.offset) for r in read(spark, bootstrap, out).collect()]
    first = sorted((k, v) for k, v, o in rows if o < 2)
    second = sorted((k, v) for k, v, o in rows if o >= 2)
    assert first == [(b"a", "2"), (b"b", "1")]
    assert second == [(b"a", "2"), (b"b", "2"), (b"c", "1")]


def test_sink_key_of_another_type_is_refused_naming_the_column(spark, bootstrap, topics):
    """KafkaSinkSuite "batch - write data with bad schema" / "streaming - write data with valid
    schema but wrong types": key and value must be string or binary; the error names the column
    (it used to fail with "buffer is smaller than requested size")."""
    t = topics.new(1)
    df = spark.createDataFrame([(1, "x")], "key INT, value STRING")
    with pytest.raises(Exception) as info:
        df.write.format("replikafka").mode("append").option("bootstrap.servers", bootstrap).option("topic", t).save()
    text = str(info.value)
    assert "column 'key': key attribute type must be a string or binary" in text and "got int" in text, text
    assert "option 'topic'" not in text
    df.selectExpr("CAST(key AS STRING) AS key", "value").write.format("replikafka").mode("append") \
        .option("bootstrap.servers", bootstrap).option("topic", t).save()
    assert [(r.key, r.value) for r in read(spark, bootstrap, t).collect()] == [(b"1", b"x")]


def test_empty_headers_read_as_null_and_rerun_needs_a_new_load(spark, bootstrap, topics):
    """KafkaRelationSuite "default starting and ending offsets with headers": a record with no
    headers reads back with null headers. And KafkaRelationSuite's re-reads: Spark's source
    resolves "latest" on every action; pyspark 4.3 plans a Python data source's read once per
    DataFrame (PythonDataSourceV2.getOrCreateReadInfo), so a re-run needs load() again."""
    t = topics.new(1)
    empty = pa.array([[], [{"key": "h", "value": b"1"}]], HEADER_TYPE)
    batch = kafka_batch(0, 0, 2).set_column(2, "headers", empty)
    topics.produce(t, {0: batch})
    df = read(spark, bootstrap, t, includeHeaders="true")
    assert [r.headers for r in df.orderBy("offset").collect()] == [None, [("h", b"1")]]
    topics.fill(t, {0: 3})
    assert df.count() == 2                                  # the same DataFrame: pyspark kept its first plan
    assert read(spark, bootstrap, t).count() == 5           # load() again: planned anew, as Spark's source does
