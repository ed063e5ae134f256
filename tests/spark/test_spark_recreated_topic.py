"""A topic deleted and re-created under a running or stopped streaming query
(issue 13, item 1), through a real SparkSession against a real cluster.

Ported from apache/spark connector/kafka-0-10-sql/src/test: the recreation
cases of ``KafkaMicroBatchSourceSuite`` and ``KafkaDontFailOnDataLossSuite``.
The new topic always holds *more* records than the old offset, the case a
high-watermark check alone cannot see: only the topic id tells the topics apart.
"""
from __future__ import annotations

import time

import pytest
from spark_helpers import await_available_now

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def stream(spark, bootstrap, topic, **options):
    r = spark.readStream.format("replikafka").option("bootstrap.servers", bootstrap).option("subscribe", topic)
    for k, v in {"startingOffsets": "earliest", **options}.items():
        r = r.option(k, v)
    return r.load().selectExpr("partition", "offset", "CAST(value AS STRING) AS value")


def recreate(topics, t, partitions, counts):
    topics.admin.delete_topic(t)
    topics.admin.create_topic(t, partitions=partitions, replication_factor=3)
    topics.wait_leaders(t)
    topics.fill(t, counts)


class Collected:
    """A foreachBatch sink keeping every row delivered (in this process)."""

    def __init__(self):
        self.rows: list[tuple] = []

    def __call__(self, batch_df, batch_id):
        self.rows += [tuple(r) for r in batch_df.collect()]


def available_now(df, checkpoint, sink) -> str | None:
    """Run to the end; the query's error text, or None."""
    from pyspark.errors import StreamingQueryException
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    try:
        await_available_now(q)
    except StreamingQueryException as exc:
        return str(exc)
    assert not q.isActive
    return None


def test_recreated_while_stopped_fails_available_now(spark, bootstrap, topics, checkpoint):
    """KafkaMicroBatchSourceSuite "subscribe topic by pattern with topic recreation between batches"
    (failOnDataLoss=true) run with Trigger.AvailableNow: the restarted query fails with
    "offset was changed" instead of reading the new topic from the old offset."""
    t = topics.new(1)
    topics.fill(t, {0: 20})
    sink = Collected()
    assert available_now(stream(spark, bootstrap, t), checkpoint, sink) is None and len(sink.rows) == 20
    recreate(topics, t, 1, {0: 35})
    text = available_now(stream(spark, bootstrap, t), checkpoint, sink)
    assert text is not None
    assert f"Partition {t}-0's offset was changed from 20 to 0" in text and "re-created" in text, text
    assert "KAFKA_DATA_LOSS" in text and "INVALID_CONFIG" not in text, text
    assert len(sink.rows) == 20


@pytest.mark.long          # a running query waits for the cluster: 1-2 minutes on a busy machine
def test_recreated_between_batches_delivers_the_new_topic_without_fail_on_data_loss(spark, bootstrap, topics,
                                                                                   checkpoint):
    """KafkaDontFailOnDataLossSuite "failOnDataLoss=false should not return duplicated records:
    microbatch v2": the query keeps running through a delete + re-create and delivers every
    record of the new topic from its start, none twice; then an AvailableNow restart goes on."""
    t = topics.new(2)
    topics.fill(t, {0: 10, 1: 10})
    sink = Collected()
    q = (stream(spark, bootstrap, t, failOnDataLoss="false").writeStream.foreachBatch(sink)
         .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        assert len(sink.rows) == 20
        recreate(topics, t, 2, {0: 25, 1: 15})
        deadline = time.time() + 90
        while len(sink.rows) < 60 and time.time() < deadline and q.exception() is None:
            time.sleep(0.5)
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    old = [(p, i, f"{p}:{i}") for p in (0, 1) for i in range(10)]
    new = [(0, i, f"0:{i}") for i in range(25)] + [(1, i, f"1:{i}") for i in range(15)]
    assert sorted(sink.rows) == sorted(old + new)                       # every new record, none twice
    sink.rows.clear()
    topics.fill(t, {0: 5})
    assert available_now(stream(spark, bootstrap, t, failOnDataLoss="false"), checkpoint, sink) is None
    assert sorted(sink.rows) == [(0, i, f"0:{i}") for i in range(25, 30)]
