"""Batch reads through Spark: spark.read.format("replikafka") with no register
call, against the shared 3-broker cluster and ONE local SparkSession."""
from __future__ import annotations

import json

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_helpers import SCORES_SCHEMA, scores_batch

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def read(spark, bootstrap, **options):
    r = spark.read.format("replikafka").option("bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


@pytest.fixture
def pushdown(spark):
    key = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(key)

    def set_(on: bool):
        spark.conf.set(key, "true" if on else "false")

    yield set_
    spark.conf.set(key, before)


def test_batch_read_equals_what_was_produced(spark, bootstrap, topics):
    t = topics.new(3)
    counts = {0: 3000, 1: 1500, 2: 7}
    topics.fill(t, counts, headers=True)
    df = read(spark, bootstrap, subscribe=t, includeHeaders="true")
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp,timestampType:int,"
                                        "headers:array<struct<key:string,value:binary>>>")
    rows = (df.groupBy("partition").agg(F.count("*").alias("n"), F.min("offset").alias("lo"),
                                        F.max("offset").alias("hi"), F.countDistinct("value").alias("distinct"),
                                        F.sum(F.col("offset")).alias("sum"))
            .orderBy("partition").collect())
    assert [(r.partition, r.n, r.lo, r.hi, r.distinct, r.sum) for r in rows] == [
        (p, n, 0, n - 1, n, n * (n - 1) // 2) for p, n in sorted(counts.items())]
    one = df.filter("partition = 2 and offset = 3").collect()[0]
    assert (one.key, one.value, one.topic, one.timestampType) == (b"k3", b"2:3", t, 0)
    assert one.headers[0].key == "i" and one.headers[0].value == b"3"
    assert df.rdd.getNumPartitions() == 3


def test_own_schema_topic_sums_and_projection(spark, bootstrap, topics):
    t = topics.new(2, schema=SCORES_SCHEMA)
    topics.produce(t, {0: scores_batch(0, 4000), 1: scores_batch(4000, 1000)})
    df = read(spark, bootstrap, subscribe=t)
    assert df.columns == ["id", "name", "amount", "topic", "partition", "offset", "timestamp"]
    agg = df.agg(F.count("*"), F.sum("id"), F.sum("amount"), F.countDistinct("name")).collect()[0]
    assert tuple(agg) == (5000, 5000 * 4999 // 2, 5000 * 4999 / 4, 5000)
    proj = read(spark, bootstrap, subscribe=t, columns="amount,offset")
    assert proj.columns == ["amount", "offset"]
    assert proj.agg(F.sum("amount")).collect()[0][0] == 5000 * 4999 / 4
    user = (spark.read.format("replikafka").option("bootstrap.servers", bootstrap).option("subscribe", t)
            .schema("id BIGINT, partition INT").load())
    assert user.columns == ["id", "partition"]
    assert user.filter("partition = 1").agg(F.min("id")).collect()[0][0] == 4000


def test_ranges_split_for_min_partitions_and_max_records(spark, bootstrap, topics):
    t = topics.new(2)
    topics.fill(t, {0: 1000, 1: 100})
    df = read(spark, bootstrap, subscribe=t, maxRecordsPerPartition="300")
    assert df.rdd.getNumPartitions() == 5
    assert df.count() == 1100 and df.select("partition", "offset").distinct().count() == 1100
    df = read(spark, bootstrap, subscribe=t, minPartitions="6")
    assert df.rdd.getNumPartitions() >= 6 and df.count() == 1100


def test_starting_and_ending_offsets(spark, bootstrap, topics):
    t = topics.new(2)
    topics.fill(t, {0: 100, 1: 100})
    df = read(spark, bootstrap, subscribe=t, startingOffsets=json.dumps({t: {"0": 10, "1": -2}}),
              endingOffsets=json.dumps({t: {"0": 20, "1": -1}}))
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(0, i) for i in range(10, 20)] + [(1, i) for i in range(100)]
    df = read(spark, bootstrap, assign=json.dumps({t: [1]}))
    assert df.count() == 100 and {r.partition for r in df.select("partition").collect()} == {1}


@pytest.mark.parametrize("on", [True, False])
def test_filters_with_pushdown_on_and_off_give_the_same_rows(spark, bootstrap, topics, pushdown, on):
    pushdown(on)
    t = topics.new(3)
    topics.fill(t, {0: 500, 1: 500, 2: 500})
    df = read(spark, bootstrap, subscribe=t)
    q = df.filter("partition = 1 and offset >= 100 and offset < 150 and value like '1:%'")
    assert sorted(r.offset for r in q.select("offset").collect()) == list(range(100, 150))
    # With pushdown the scan plans only the matching range; without, every partition.
    assert q.rdd.getNumPartitions() == (1 if on else 3)
    assert df.filter("partition in (0, 2)").count() == 1000
    assert df.filter("offset > 10000").count() == 0


def test_timestamp_filters(spark, bootstrap, topics, pushdown):
    pushdown(True)
    import time
    t = topics.new(1, config={"message.timestamp.type": "LogAppendTime"})
    topics.fill(t, {0: 200})
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    topics.fill(t, {0: 300})
    df = read(spark, bootstrap, subscribe=t)
    q = df.filter(F.col("timestamp") >= F.lit(middle / 1000).cast("timestamp"))
    assert q.count() == 300 and q.rdd.getNumPartitions() == 1
    assert read(spark, bootstrap, subscribe=t, startingTimestamp=str(middle)).count() == 300
    assert read(spark, bootstrap, subscribe=t, endingTimestamp=str(middle)).count() == 200


@pytest.mark.parametrize("options,named", [
    ({"subscribe": "x", "bootstrap.servers": ""}, "bootstrap.servers"),
    ({"subscribe": "{topic}", "startingOffset": "earliest"}, "startingOffset"),
    ({"subscribe": "{topic}", "assign": '{{"{topic}":[0]}}'}, "assign"),
    ({"subscribe": "{topic}", "columns": "value,nope"}, "columns"),
    ({"subscribe": "{topic}-missing"}, "subscribe"),
    ({"subscribe": "{topic}", "includeHeaders": "maybe"}, "includeHeaders"),
])
def test_bad_options_fail_at_load_naming_the_option(spark, bootstrap, topics, options, named):
    t = topics.new(1)
    r = spark.read.format("replikafka").option("bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v.format(topic=t))
    with pytest.raises(Exception) as info:
        r.load().collect()
    assert f"option '{named}'".lower() in str(info.value).lower()      # Spark lower-cases option keys


@pytest.mark.parametrize("options,named", [
    ({"startingOffsets": "latest"}, "startingOffsets"),
    ({"endingOffsets": '{{"{topic}":{{"0":999}}}}'}, "endingOffsets"),
    ({"maxOffsetsPerTrigger": "5"}, "maxOffsetsPerTrigger"),
])
def test_options_wrong_for_a_batch_read_fail_at_planning_naming_the_option(spark, bootstrap, topics, options, named):
    t = topics.new(1)
    topics.fill(t, {0: 10})
    r = spark.read.format("replikafka").option("bootstrap.servers", bootstrap).option("subscribe", t)
    for k, v in options.items():
        r = r.option(k, v.format(topic=t))
    with pytest.raises(Exception) as info:
        r.load().count()
    assert f"option '{named}'" in str(info.value)


def test_a_dataframe_is_a_snapshot_planned_once(spark, bootstrap, topics):
    t = topics.new(1)
    topics.fill(t, {0: 100})
    df = read(spark, bootstrap, subscribe=t)
    assert df.count() == 100
    topics.fill(t, {0: 25})
    assert df.count() == 100                                        # its ranges were fixed when planned
    assert df.agg(F.max("offset")).collect()[0][0] == 99
    assert read(spark, bootstrap, subscribe=t).count() == 125       # a new read plans up to the new HW
