"""Offset planning, range splitting, admission control and filter pushdown
(pure: no cluster, no Spark)."""
from __future__ import annotations

import datetime as dt
import random

import pytest
from pyspark.sql.datasource import (EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, IsNull, LessThan,
                                    LessThanOrEqual, Not, StringStartsWith)

from replikafka.spark.filters import push
from replikafka.spark.offsets_planning import (DataLossError, OffsetRange, PartitionBounds, offsets_from_json,
                                               offsets_to_json, plan_batch_ranges, rate_limit, select_partitions,
                                               split_ranges, timestamp_queries)
from replikafka.spark.options import OptionError, parse_source_options

CLUSTER = {"events": [0, 1, 2], "clicks": [0], "events-b": [0, 1]}


def opts(streaming=False, **kw):
    return parse_source_options({"bootstrap.servers": "h:1", "subscribe": "events", **kw}, streaming=streaming)


def plan(o, bounds, start_ts=None, end_ts=None):
    tps = sorted(bounds)
    return plan_batch_ranges(tps, o.starting, o.ending, bounds, start_ts or {}, end_ts or {},
                             fail_on_data_loss=o.fail_on_data_loss, timestamp_strategy=o.timestamp_strategy)


B = {("events", 0): PartitionBounds(0, 100), ("events", 1): PartitionBounds(10, 50), ("events", 2): PartitionBounds(0, 0)}


# ---------------------------------------------------------------- partitions
def test_select_partitions_for_each_kind():
    o = parse_source_options({"bootstrap.servers": "h:1", "subscribePattern": "events.*"}, streaming=False)
    assert select_partitions(o.subscription, CLUSTER) == [("events", 0), ("events", 1), ("events", 2),
                                                          ("events-b", 0), ("events-b", 1)]
    o = parse_source_options({"bootstrap.servers": "h:1", "assign": '{"events":[2,0]}'}, streaming=False)
    assert select_partitions(o.subscription, CLUSTER) == [("events", 0), ("events", 2)]


def test_missing_topics_and_partitions_are_named():
    with pytest.raises(OptionError, match="'subscribe'.*'nope' does not exist"):
        select_partitions(opts(subscribe="nope").subscription, CLUSTER)
    o = parse_source_options({"bootstrap.servers": "h:1", "assign": '{"events":[7]}'}, streaming=False)
    with pytest.raises(OptionError, match="no partition 7"):
        select_partitions(o.subscription, CLUSTER)
    o = parse_source_options({"bootstrap.servers": "h:1", "subscribePattern": "zz.*"}, streaming=False)
    with pytest.raises(OptionError, match="subscribePattern"):
        select_partitions(o.subscription, CLUSTER)
    assert select_partitions(o.subscription, CLUSTER, require_topics=False) == []


# ---------------------------------------------------------------- batch ranges
def test_default_batch_range_is_log_start_to_high_watermark():
    assert plan(opts(), B) == [OffsetRange("events", 0, 0, 100), OffsetRange("events", 1, 10, 50),
                               OffsetRange("events", 2, 0, 0)]


def test_json_offsets_with_sentinels():
    o = opts(startingOffsets='{"events":{"0":5,"1":-2,"2":-2}}', endingOffsets='{"events":{"0":60,"1":-1,"2":-1}}')
    assert plan(o, B) == [OffsetRange("events", 0, 5, 60), OffsetRange("events", 1, 10, 50),
                          OffsetRange("events", 2, 0, 0)]


def test_json_offsets_must_cover_every_partition():
    with pytest.raises(OptionError, match="'startingOffsets'.*events-1"):
        plan(opts(startingOffsets='{"events":{"0":5}}'), B)


def test_end_beyond_the_high_watermark_is_refused_not_read_short():
    o = opts(endingOffsets='{"events":{"0":101,"1":-1,"2":-1}}')
    with pytest.raises(OptionError, match="'endingOffsets'.*high watermark 100"):
        plan(o, B)


def test_start_beyond_high_watermark_or_end_is_named():
    """KafkaRelationSuite "SPARK-36576: Resolved start offset greater than end offset": Spark's
    RESOLVED_START_OFFSET_GREATER_THAN_END_OFFSET, for offsets against latest."""
    with pytest.raises(OptionError, match="'startingOffsets': The resolved start offset 500 is greater than the "
                       "resolved end offset 100 for topic events partition 0"):
        plan(opts(startingOffsets='{"events":{"0":500,"1":-2,"2":-2}}'), B)


def test_resolved_start_after_an_end_by_timestamp_fails_as_spark():
    """KafkaRelationSuite "SPARK-36576": startingOffsets past where endingOffsetsByTimestamp
    resolves is an error (it used to read nothing, silently)."""
    o = opts(startingOffsets='{"events":{"0":60,"1":-2,"2":-2}}',
             endingOffsetsByTimestamp='{"events":{"0":5000,"1":5000,"2":5000}}')
    end_ts = {("events", 0): 40, ("events", 1): 20, ("events", 2): 0}
    with pytest.raises(OptionError, match="resolved start offset 60 is greater than the resolved end offset 40 "
                       "for topic events partition 0"):
        plan(o, B, {}, end_ts)
    o = opts(startingTimestamp="3000", endingOffsets='{"events":{"0":30,"1":-1,"2":-1}}')
    with pytest.raises(OptionError, match="'startingTimestamp': The resolved start offset 70 is greater than "
                       "the resolved end offset 30"):
        plan(o, B, {("events", 0): 70, ("events", 1): 10, ("events", 2): 0}, {})


def test_start_below_log_start_is_data_loss_unless_allowed():
    o = opts(startingOffsets='{"events":{"0":0,"1":3,"2":0}}')
    with pytest.raises(DataLossError, match="KAFKA_DATA_LOSS: events-1.*\\[3, 10\\)") as info:
        plan(o, B)
    assert not isinstance(info.value, OptionError) and "failOnDataLoss" in str(info.value)
    o = opts(startingOffsets='{"events":{"0":0,"1":3,"2":0}}', failOnDataLoss="false")
    assert plan(o, B)[1] == OffsetRange("events", 1, 10, 50)


def test_timestamps_resolve_through_the_time_index():
    o = opts(startingTimestamp="1000", endingTimestamp="2000")
    q = timestamp_queries(o.starting, sorted(B))
    assert q == {tp: 1000 for tp in B}
    start_ts = {("events", 0): 20, ("events", 1): -1, ("events", 2): -1}
    with pytest.raises(OptionError, match="startingTimestamp.*events-1.*startingOffsetsByTimestampStrategy"):
        plan(o, B, start_ts, {})
    o = opts(startingTimestamp="1000", endingTimestamp="2000", startingOffsetsByTimestampStrategy="latest")
    end_ts = {("events", 0): 70, ("events", 1): -1, ("events", 2): -1}
    assert plan(o, B, start_ts, end_ts) == [OffsetRange("events", 0, 20, 70), OffsetRange("events", 1, 50, 50),
                                            OffsetRange("events", 2, 0, 0)]


def test_per_partition_timestamps_must_cover_every_partition():
    o = opts(startingOffsetsByTimestamp='{"events":{"0":5}}')
    with pytest.raises(OptionError, match="startingOffsetsByTimestamp.*events-1"):
        timestamp_queries(o.starting, sorted(B))


# ---------------------------------------------------------------- splitting
def test_split_drops_empty_ranges_and_keeps_one_per_partition_by_default():
    rs = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 5)]
    assert split_ranges(rs) == [OffsetRange("t", 0, 0, 10)]


def test_max_records_per_partition_caps_every_piece():
    out = split_ranges([OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 3)], max_records_per_partition=4)
    assert out == [OffsetRange("t", 0, 0, 3), OffsetRange("t", 0, 3, 6), OffsetRange("t", 0, 6, 10),
                   OffsetRange("t", 1, 0, 3)]


def test_min_partitions_splits_large_ranges_in_proportion():
    out = split_ranges([OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 0, 100)], min_partitions=10)
    assert len(out) >= 10
    assert [r for r in out if r.partition == 1] == [OffsetRange("t", 1, 0, 100)]


@pytest.mark.parametrize("seed", range(20))
def test_splits_cover_each_range_exactly_once(seed):
    rnd = random.Random(seed)
    rs = [OffsetRange("t", p, s, s + rnd.randrange(0, 5000)) for p, s in enumerate(rnd.sample(range(10_000), 6))]
    out = split_ranges(rs, min_partitions=rnd.choice([None, 1, 7, 40]),
                       max_records_per_partition=rnd.choice([None, 1, 333, 10_000]))
    for r in rs:
        pieces = sorted((x for x in out if x.partition == r.partition), key=lambda x: x.start)
        covered = [(x.start, x.end) for x in pieces]
        if r.size == 0:
            assert covered == []
            continue
        assert covered[0][0] == r.start and covered[-1][1] == r.end
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
        assert all(x.size > 0 for x in pieces)


# ---------------------------------------------------------------- admission control
def test_rate_limit_shares_in_proportion_and_never_exceeds():
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 100}
    latest = {("t", 0): 900, ("t", 1): 100, ("t", 2): 100}
    end = rate_limit(start, latest, 100)
    assert end == {("t", 0): 90, ("t", 1): 10, ("t", 2): 100}


def test_rate_limit_admits_everything_under_the_limit():
    start = {("t", 0): 5, ("t", 1): 7}
    latest = {("t", 0): 6, ("t", 1): 9}
    assert rate_limit(start, latest, 1000) == latest


@pytest.mark.parametrize("seed", range(30))
def test_rate_limit_total_is_exactly_min_of_limit_and_backlog(seed):
    rnd = random.Random(seed)
    start = {("t", p): rnd.randrange(0, 1000) for p in range(rnd.randrange(1, 9))}
    latest = {tp: s + rnd.choice([0, 1, 2, rnd.randrange(0, 10_000)]) for tp, s in start.items()}
    limit = rnd.randrange(1, 5000)
    end = rate_limit(start, latest, limit)
    backlog = sum(latest[tp] - start[tp] for tp in start)
    assert sum(end[tp] - start[tp] for tp in start) == min(limit, backlog)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)


def test_rate_limit_does_not_starve_a_small_partition():
    start = {("t", 0): 0, ("t", 1): 0}
    end = rate_limit(start, {("t", 0): 1_000_000, ("t", 1): 3}, 10)
    assert end[("t", 1)] >= 1


def test_offsets_json_round_trip_in_sparks_shape():
    offsets = {("events", 1): 17, ("events", 0): 42, ("b", 3): 0}
    doc = offsets_to_json(offsets)
    assert doc == {"b": {"3": 0}, "events": {"0": 42, "1": 17}}
    assert list(doc["events"]) == ["0", "1"]
    assert offsets_from_json(doc) == offsets
    with pytest.raises(ValueError):
        offsets_from_json({"events": {"0": -5}})


# ---------------------------------------------------------------- filter pushdown
UTC = dt.timezone.utc
COLS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


def test_partition_and_offset_filters_are_consumed_exactly():
    fs = [EqualTo(("partition",), 1), GreaterThanOrEqual(("offset",), 100), LessThan(("offset",), 200),
          IsNotNull(("offset",)), EqualTo(("value",), b"x")]
    c, remaining = push(fs, COLS)
    assert remaining == [fs[4]]
    assert remaining[0] is fs[4]
    assert c.allows("events", 1) and not c.allows("events", 0)
    assert c.clip(0, 1000) == (100, 200)
    assert c.clip(150, 160) == (150, 160)
    assert c.clip(300, 400)[0] == c.clip(300, 400)[1]


def test_topic_and_negated_and_in_filters():
    fs = [In(("partition",), (0, 2)), Not(EqualTo(("partition",), 2)), StringStartsWith(("topic",), "ev")]
    c, remaining = push(fs, COLS)
    assert remaining == []
    assert [p for p in range(4) if c.allows("events", p)] == [0]
    assert not c.allows("other", 0)


def test_offset_in_is_narrowed_but_left_to_spark():
    f = In(("offset",), (5, 9, 7))
    c, remaining = push([f], COLS)
    assert remaining == [f] and c.clip(0, 100) == (5, 10)


def test_contradictions_and_nulls_make_the_read_empty():
    c, _ = push([GreaterThan(("offset",), 10), LessThanOrEqual(("offset",), 10)], COLS)
    assert c.empty
    c, _ = push([IsNull(("partition",))], COLS)
    assert c.empty and not c.allows("events", 0)


def test_timestamp_bounds_prune_conservatively_and_stay_with_spark():
    t = dt.datetime(2024, 1, 1, 0, 0, 0, 500, tzinfo=UTC)              # .0005 ms
    ms = int(t.timestamp() * 1000)
    fs = [GreaterThanOrEqual(("timestamp",), t), LessThan(("timestamp",), t + dt.timedelta(seconds=1))]
    c, remaining = push(fs, COLS)
    assert remaining == fs                                            # Spark re-checks every row
    assert c.ts_lo_ms == ms                                           # floored, never above the bound
    assert c.ts_hi_ms == ms + 1000 + 1                                 # rounded up, exclusive
    naive = GreaterThan(("timestamp",), dt.datetime(2024, 1, 1))
    c, remaining = push([naive], COLS)
    assert remaining == [naive] and c.ts_lo_ms is None


def test_filters_on_unknown_columns_or_types_are_returned():
    fs = [EqualTo(("partition",), "1"), EqualTo(("offset",), 1.5), EqualTo(("a", "b"), 1), Not(GreaterThan(("offset",), 3))]
    c, remaining = push(fs, COLS)
    assert remaining == fs and not c.any
    f = EqualTo(("offset",), 3)
    c, remaining = push([f], ["key", "value"])                        # offset not in the output
    assert remaining == [f]


# ---------------------------------------------------------------- KafkaOffsetRangeCalculatorSuite, case by case
def _r(tp, lo, hi):
    return OffsetRange(tp, 1, lo, hi)


@pytest.mark.parametrize("spark_test,min_partitions,given,expected", [
    ("with no minPartition: N TopicPartitions to N offset ranges", None,
     [("t1", 1, 2)], [("t1", 1, 2)]),
    ("with no minPartition: empty ranges ignored", None,
     [("t1", 1, 2), ("t2", 1, 1)], [("t1", 1, 2)]),
    ("with minPartition = 3: N TopicPartitions to N offset ranges", 3,
     [("t1", 1, 2), ("t2", 1, 2), ("t3", 1, 2)], [("t1", 1, 2), ("t2", 1, 2), ("t3", 1, 2)]),
    ("with minPartition = 4: 1 TopicPartition to N offset ranges", 4,
     [("t1", 1, 5)], [("t1", 1, 2), ("t1", 2, 3), ("t1", 3, 4), ("t1", 4, 5)]),
    ("with minPartition = 4: N skewed TopicPartitions to M offset ranges", 4,
     [("t1", 1, 5), ("t2", 1, 21)], [("t1", 1, 5), ("t2", 1, 7), ("t2", 7, 14), ("t2", 14, 21)]),
    ("with minPartition = 4: SPARK-30656: ignore empty ranges and split the rest", 4,
     [("t1", 1, 1), ("t2", 1, 21)], [("t2", 1, 6), ("t2", 6, 11), ("t2", 11, 16), ("t2", 16, 21)]),
    ("with minPartition = 4: SPARK-30656: N very skewed TopicPartitions to M offset ranges", 4,
     [("t1", 1, 2), ("t2", 1, 1001)], [("t1", 1, 2), ("t2", 1, 334), ("t2", 334, 667), ("t2", 667, 1001)]),
    ("with minPartition = 1: SPARK-30656: minPartitions less than the length of topic partitions", 1,
     [("t1", 1, 5), ("t2", 1, 21)], [("t1", 1, 5), ("t2", 1, 21)]),
    ("with minPartition = 3: range inexact multiple of minPartitions", 3,
     [("t1", 1, 11)], [("t1", 1, 4), ("t1", 4, 7), ("t1", 7, 11)]),
    ("with minPartition = 4: empty ranges ignored", 4,
     [("t1", 1, 5), ("t2", 1, 21), ("t3", 1, 1)], [("t1", 1, 5), ("t2", 1, 7), ("t2", 7, 14), ("t2", 14, 21)]),
    ("with minPartition = 6: SPARK-28489: never drop offsets", 6,
     [("t1", 0, 10), ("t2", 0, 10), ("t3", 0, 1)],
     [("t1", 0, 3), ("t1", 3, 6), ("t1", 6, 10), ("t2", 0, 3), ("t2", 3, 6), ("t2", 6, 10), ("t3", 0, 1)]),
    ("with minPartition = 9: SPARK-36576: 0 small unsplit ranges and 3 large split ranges", 9,
     [("t1", 0, 10000), ("t2", 0, 15000), ("t3", 0, 20000)],
     [("t1", 0, 5000), ("t1", 5000, 10000), ("t2", 0, 5000), ("t2", 5000, 10000), ("t2", 10000, 15000),
      ("t3", 0, 5000), ("t3", 5000, 10000), ("t3", 10000, 15000), ("t3", 15000, 20000)]),
    ("with minPartition = 6: SPARK-36576: 1 small unsplit range and 2 large split ranges", 6,
     [("t1", 0, 500), ("t2", 0, 12000), ("t3", 0, 15001)],
     [("t1", 0, 500), ("t2", 0, 6000), ("t2", 6000, 12000), ("t3", 0, 5000), ("t3", 5000, 10000),
      ("t3", 10000, 15001)]),
    ("with minPartition = 6: SPARK-36576: 2 small unsplit ranges and 1 large split range", 6,
     [("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 10000)],
     [("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 2500), ("t3", 2500, 5000), ("t3", 5000, 7500), ("t3", 7500, 10000)]),
    ("with minPartition = 4: SPARK-46798: locations not set when ranges split (the ranges)", 4,
     [("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 2)], [("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 1), ("t3", 1, 2)]),
])
def test_kafka_offset_range_calculator_suite(spark_test, min_partitions, given, expected):
    """KafkaOffsetRangeCalculatorSuite, each case by its Spark test name (executor
    locations have no meaning here: tasks fetch from the partition's leader)."""
    out = split_ranges([_r(*g) for g in given], min_partitions)
    assert out == [_r(*e) for e in expected], spark_test
