"""The stream reader's offset decisions (initialOffset, latestOffset with
ReadMaxRows / ReadMinRows / ReadAllAvailable, Trigger.AvailableNow, new and
vanished partitions) against a fake cluster view and a fake clock."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from replikafka.records import KAFKA_SCHEMA, schema_to_bytes
from replikafka.spark.arrow_convert import output_layout
from replikafka.spark.offsets_planning import DataLossError, PartitionBounds
from replikafka.spark.options import parse_source_options
from replikafka.spark.stream_reader import StreamReader


@dataclass
class Topic:
    schema: object = KAFKA_SCHEMA
    config: dict = field(default_factory=dict)
    partitions: dict = field(default_factory=dict)


class FakeClient:
    def __init__(self):
        self.hw = {}          # (topic, p) -> HW
        self.log_starts = {}

    def subscribed(self, sub, require_topics=True):
        tps = sorted(tp for tp in self.hw if sub.matches(tp[0]))
        return tps, {t: Topic() for t, _ in tps}

    def bounds(self, tps):
        return {tp: PartitionBounds(self.log_starts.get(tp, 0), self.hw[tp]) for tp in tps}

    def offsets_for_times(self, queries):
        return {tp: min(self.hw[tp], ts) for tp, ts in queries.items()}

    def log_start(self, tp):
        return self.log_starts.get(tp, 0)

    def topic(self, name):
        return Topic()


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def reader(client, clock=None, **options):
    opts = parse_source_options({"bootstrap.servers": "h:1", "subscribePattern": "ev.*", **options}, streaming=True)
    return StreamReader(opts, output_layout(KAFKA_SCHEMA), schema_to_bytes(KAFKA_SCHEMA), client=client,
                        clock=clock or Clock())


def test_initial_offset_latest_earliest_json_and_time():
    c = FakeClient()
    c.hw = {("ev", 0): 100, ("ev", 1): 40}
    c.log_starts = {("ev", 1): 5}
    assert reader(c).initialOffset() == {"ev": {"0": 100, "1": 40}}
    assert reader(c, startingOffsets="earliest").initialOffset() == {"ev": {"0": 0, "1": 5}}
    assert reader(c, startingOffsets='{"ev":{"0":7,"1":-2}}').initialOffset() == {"ev": {"0": 7, "1": 5}}
    assert reader(c, startingTimestamp="30").initialOffset() == {"ev": {"0": 30, "1": 30}}


def test_default_read_limits_follow_the_options():
    c = FakeClient()
    assert isinstance(reader(c).getDefaultReadLimit(), ReadAllAvailable)
    assert reader(c, maxOffsetsPerTrigger="10").getDefaultReadLimit() == ReadMaxRows(10)
    assert reader(c, minOffsetsPerTrigger="3").getDefaultReadLimit() == ReadMinRows(3)


def test_max_rows_is_shared_in_proportion_and_all_available_ignores_it():
    c = FakeClient()
    c.hw = {("ev", 0): 900, ("ev", 1): 100}
    r = reader(c, maxOffsetsPerTrigger="100")
    start = {"ev": {"0": 0, "1": 0}}
    assert r.latestOffset(start, ReadMaxRows(100)) == {"ev": {"0": 90, "1": 10}}
    assert r.latestOffset(start, ReadAllAvailable()) == {"ev": {"0": 900, "1": 100}}
    assert r.reportLatestOffset() == {"ev": {"0": 900, "1": 100}}


def test_min_rows_waits_for_records_or_the_trigger_delay():
    c = FakeClient()
    clock = Clock()
    c.hw = {("ev", 0): 10}
    r = reader(c, clock, minOffsetsPerTrigger="50", maxTriggerDelay="10s")
    s0 = {"ev": {"0": 0}}
    assert r.latestOffset(s0, ReadMinRows(50)) == {"ev": {"0": 10}}     # the first batch is never held
    s1 = {"ev": {"0": 10}}
    c.hw[("ev", 0)] = 30
    clock.t += 1
    assert r.latestOffset(s1, ReadMinRows(50)) == s1                    # 20 < 50: wait
    c.hw[("ev", 0)] = 60
    assert r.latestOffset(s1, ReadMinRows(50)) == {"ev": {"0": 60}}     # 50 waiting: go
    s2 = {"ev": {"0": 60}}
    c.hw[("ev", 0)] = 61
    clock.t += 5
    assert r.latestOffset(s2, ReadMinRows(50)) == s2
    clock.t += 6                                                         # maxTriggerDelay passed
    assert r.latestOffset(s2, ReadMinRows(50)) == {"ev": {"0": 61}}
    assert r.latestOffset({"ev": {"0": 61}}, ReadAllAvailable()) == {"ev": {"0": 61}}


def test_min_and_max_together():
    c = FakeClient()
    clock = Clock()
    c.hw = {("ev", 0): 1000}
    r = reader(c, clock, minOffsetsPerTrigger="5", maxOffsetsPerTrigger="100")
    assert r.getDefaultReadLimit() == ReadMaxRows(100)
    assert r.latestOffset({"ev": {"0": 0}}, ReadMaxRows(100)) == {"ev": {"0": 100}}
    clock.t += 1
    assert r.latestOffset({"ev": {"0": 998}}, ReadMaxRows(100)) == {"ev": {"0": 998}}   # 2 < 5: wait


def test_available_now_stops_at_the_high_watermarks_seen_when_prepared():
    c = FakeClient()
    c.hw = {("ev", 0): 300}
    r = reader(c, maxOffsetsPerTrigger="200", minOffsetsPerTrigger="150")
    r.prepareForTriggerAvailableNow()
    c.hw = {("ev", 0): 900, ("ev", 1): 50}                                # later data and a later partition
    o1 = r.latestOffset({"ev": {"0": 0}}, ReadMaxRows(200))
    assert o1 == {"ev": {"0": 200}}
    o2 = r.latestOffset(o1, ReadMaxRows(200))
    assert o2 == {"ev": {"0": 300}}                                       # 100 < minOffsetsPerTrigger: not held
    assert r.latestOffset(o2, ReadMaxRows(200)) == o2                     # done: same as start


def test_new_partitions_enter_at_their_log_start_then_are_read():
    c = FakeClient()
    c.hw = {("ev", 0): 10}
    r = reader(c)
    start = r.initialOffset()
    c.hw.update({("ev", 1): 70, ("ev2", 0): 5})
    c.log_starts[("ev", 1)] = 20
    o1 = r.latestOffset(start, ReadAllAvailable())
    assert o1 == {"ev": {"0": 10, "1": 20}, "ev2": {"0": 0}}              # entered, nothing admitted yet
    assert [(p.topic, p.partition, p.start, p.end) for p in r.partitions(start, o1)] == []
    o2 = r.latestOffset(o1, ReadAllAvailable())
    assert o2 == {"ev": {"0": 10, "1": 70}, "ev2": {"0": 5}}
    assert [(p.topic, p.partition, p.start, p.end) for p in r.partitions(o1, o2)] == [
        ("ev", 1, 20, 70), ("ev2", 0, 0, 5)]


def test_vanished_partitions_follow_fail_on_data_loss():
    c = FakeClient()
    c.hw = {("ev", 0): 10}
    start = {"ev": {"0": 5}, "evgone": {"0": 3}}
    with pytest.raises(DataLossError, match="evgone-0"):
        reader(c).latestOffset(start, ReadAllAvailable())
    assert reader(c, failOnDataLoss="false").latestOffset(start, ReadAllAvailable()) == {"ev": {"0": 10}}


def test_partitions_split_and_skip_empty_ranges():
    c = FakeClient()
    r = reader(c, maxRecordsPerPartition="40")
    parts = r.partitions({"ev": {"0": 0, "1": 5}}, {"ev": {"0": 100, "1": 5}})
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 0, 33), (0, 33, 66), (0, 66, 100)]
    assert r.partitions({"ev": {"0": 7}}, {"ev": {"0": 7}}) == []
