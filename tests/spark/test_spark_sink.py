"""The sink: df.write / writeStream to topics; a retried task or a replayed
micro-batch adds nothing."""
from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from replikafka.client.partitioner import partition_for_key
from replikafka.spark.cluster_access import ClusterClient
from replikafka.spark.options import parse_sink_options
from replikafka.spark.writer import plan_targets, write_task
from spark_helpers import await_available_now, SCORES_SCHEMA

pytestmark = [pytest.mark.integration]


def read_topic(spark, bootstrap, topic):
    return spark.read.format("replikafka").option("bootstrap.servers", bootstrap).option("subscribe", topic).load()


def test_attempts_that_died_midway_then_a_full_run_write_every_record_once(bootstrap, topics):
    """Plain Python: earlier attempts of one task (same identity, same rows) got
    part of the way; the attempt that completes leaves each record exactly once."""
    t = topics.new(3)
    opts = parse_sink_options({"bootstrap.servers": bootstrap, "topic": t, "sinkChunkRows": "100"})
    client = ClusterClient(bootstrap)
    try:
        targets = plan_targets(client, [t])
        n = 3000
        batch = pa.record_batch([pa.array([b"value-%d" % i for i in range(n)]),
                                 pa.array([i % 3 for i in range(n)], pa.int32())], names=["value", "partition"])
        # Attempt 1 delivered its first 1500 rows (5 whole chunks per partition) before it died.
        write_task(opts, targets, "test:q:0:7", 7, [batch.slice(0, 1500)], client=client)
        assert sum(topics.high_watermarks(t).values()) == 1500

        def dies_after(rows):
            yield batch.slice(0, rows)
            raise RuntimeError("executor lost")

        # Attempt 2 died after handing over 2600 rows, with chunks in flight.
        with pytest.raises(RuntimeError, match="executor lost"):
            write_task(opts, targets, "test:q:0:7", 7, dies_after(2600), client=client)
        # Attempt 3 completes.
        done = write_task(opts, targets, "test:q:0:7", 7, [batch.slice(0, 1000), batch.slice(1000)], client=client)
        assert sum(done.records.values()) == n
        assert topics.high_watermarks(t) == {0: 1000, 1: 1000, 2: 1000}
        assert sorted(read_values(bootstrap, t)) == sorted(b"value-%d" % i for i in range(n))
        # A different batch id is a different write.
        write_task(opts, targets, "test:q:1:7", 7, [batch], client=client)
        assert sum(topics.high_watermarks(t).values()) == 2 * n
    finally:
        client.close()


def test_a_replay_with_different_rows_is_refused_not_guessed(bootstrap, topics):
    t = topics.new(1)
    opts = parse_sink_options({"bootstrap.servers": bootstrap, "topic": t, "sinkChunkRows": "10"})
    client = ClusterClient(bootstrap)
    try:
        targets = plan_targets(client, [t])
        rows = pa.record_batch([pa.array([b"a%d" % i for i in range(25)])], names=["value"])
        write_task(opts, targets, "test:nd:0:0", 0, [rows], client=client)
        other = pa.record_batch([pa.array([b"b%d" % i for i in range(27)])], names=["value"])
        with pytest.raises(Exception, match="same rows in the same order"):
            write_task(opts, targets, "test:nd:0:0", 0, [other], client=client)
    finally:
        client.close()


def read_values(bootstrap, topic):
    from replikafka.spark.data_source import ReplikafkaDataSource
    ds = ReplikafkaDataSource({"bootstrap.servers": bootstrap, "subscribe": topic, "columns": "value"})
    reader = ds.reader(ds.schema())
    return [v for p in reader.partitions() for b in reader.read(p) for v in b.column("value").to_pylist()]


def test_a_task_replayed_in_full_adds_nothing(bootstrap, topics):
    t = topics.new(2)
    opts = parse_sink_options({"bootstrap.servers": bootstrap, "topic": t, "sinkChunkRows": "64"})
    client = ClusterClient(bootstrap)
    try:
        targets = plan_targets(client, [t])
        batch = pa.record_batch([pa.array([b"v%d" % i for i in range(1000)])], names=["value"])
        write_task(opts, targets, "replay:q:3:0", 0, [batch], client=client)
        hw = topics.high_watermarks(t)
        assert sum(hw.values()) == 1000
        write_task(opts, targets, "replay:q:3:0", 0, [batch.slice(0, 10), batch.slice(10)], client=client)
        assert topics.high_watermarks(t) == hw
    finally:
        client.close()


@pytest.mark.spark
def test_batch_write_kafka_shaped_partitions_by_key(spark, bootstrap, topics):
    t = topics.new(3)
    df = spark.range(5000).select(F.concat(F.lit("k"), (F.col("id") % 50).cast("string")).alias("key"),
                                  F.col("id").cast("string").cast("binary").alias("value"))
    # Spark lets Python data sources be written in Append or Overwrite mode only; a topic only appends.
    df.write.format("replikafka").mode("append").option("bootstrap.servers", bootstrap).option("topic", t).save()
    back = read_topic(spark, bootstrap, t)
    rows = back.select("key", "value", "partition").collect()
    assert len(rows) == 5000
    assert sorted(int(r.value) for r in rows) == list(range(5000))
    assert all(r.partition == partition_for_key(r.key, 3) for r in rows)     # Kafka's partitioner


@pytest.mark.spark
def test_batch_write_own_schema_and_bad_input_is_named(spark, bootstrap, topics):
    t = topics.new(2, schema=SCORES_SCHEMA)
    df = spark.range(300).select(F.col("id"), F.concat(F.lit("n"), F.col("id")).alias("name"),
                                 (F.col("id") * 0.5).alias("amount"), (F.col("id") % 2).cast("int").alias("partition"))
    df.write.format("replikafka").option("bootstrap.servers", bootstrap).option("topic", t).mode("append").save()
    back = read_topic(spark, bootstrap, t)
    assert back.agg(F.count("*"), F.sum("id"), F.sum("amount")).collect()[0][:] == (300, 300 * 299 // 2, 300 * 299 / 4)
    assert back.filter("partition = 1").agg(F.min("id")).collect()[0][0] == 1
    with pytest.raises(Exception, match="column 'oops': is not a column of topic"):      # names the column
        spark.range(3).withColumn("oops", F.lit(1)).write.format("replikafka").mode("append") \
            .option("bootstrap.servers", bootstrap).option("topic", t).save()
    with pytest.raises(Exception, match="(?i)option 'topic'.*does not exist"):
        df.write.format("replikafka").mode("append").option("bootstrap.servers", bootstrap) \
            .option("topic", t + "-nope").save()
    with pytest.raises(Exception, match="(?i)option 'mode'.*append-only"):
        df.write.format("replikafka").mode("overwrite").option("bootstrap.servers", bootstrap).option("topic", t).save()
    assert back.count() == 300


@pytest.mark.spark
def test_stream_sink_replayed_batch_adds_nothing(spark, bootstrap, topics, checkpoint):
    src, dst = topics.new(2), topics.new(3)
    topics.fill(src, {0: 2000, 1: 1000})

    def run():
        df = (spark.readStream.format("replikafka").option("bootstrap.servers", bootstrap).option("subscribe", src)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "1000").load())
        q = (df.select("key", "value").writeStream.format("replikafka").option("bootstrap.servers", bootstrap)
             .option("topic", dst).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        await_available_now(q)
        assert q.exception() is None
        return q

    q = run()
    assert sum(topics.high_watermarks(dst).values()) == 3000
    last = max(int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit())
    for name in (str(last), f".{last}.crc"):                 # the driver "died" before committing the last batch
        os.remove(os.path.join(checkpoint, "commits", name))
    q2 = run()
    replayed = [p for p in q2.recentProgress if p["batchId"] == last]
    assert replayed and replayed[0]["numInputRows"] > 0         # the batch really ran again
    assert sum(topics.high_watermarks(dst).values()) == 3000    # ...and added nothing
    back = read_topic(spark, bootstrap, dst)
    assert back.select("value").distinct().count() == 3000
