"""The stream reader's offset decisions (initialOffset, latestOffset with
ReadMaxRows / ReadMinRows / ReadAllAvailable, Trigger.AvailableNow, new and
vanished partitions) against a fake cluster view and a fake clock."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from replikafka.records import KAFKA_SCHEMA, schema_to_bytes
from replikafka.spark.arrow_convert import output_layout
from replikafka.spark.offsets_planning import DataLossError, PartitionBounds, offsets_from_json, topic_ids_from_json
from replikafka.spark.options import OptionError
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
        self.ids = {}         # topic -> topic id (none: an unknown id)
        self.bounds_calls = 0

    def subscribed(self, sub, require_topics=True):
        tps = sorted(tp for tp in self.hw if sub.matches(tp[0]))
        return tps, {t: Topic(config={"topic.id": self.ids[t]} if t in self.ids else {}) for t, _ in tps}

    def bounds(self, tps):
        self.bounds_calls += 1
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


def reader(client, clock=None, sleeps=None, **options):
    opts = parse_source_options({"bootstrap.servers": "h:1", "subscribePattern": "ev.*", **options}, streaming=True)
    return StreamReader(opts, output_layout(KAFKA_SCHEMA), schema_to_bytes(KAFKA_SCHEMA), client=client,
                        clock=clock or Clock(), sleep=(sleeps.append if sleeps is not None else lambda s: None))


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
    """KafkaMicroBatchSourceSuite "added partition" cases: a partition that joins
    at a log start other than 0 is Spark's data loss "Added partition ... starts
    from 20 instead of 0"; with failOnDataLoss=false it is read from there."""
    c = FakeClient()
    c.hw = {("ev", 0): 10}
    start = reader(c).initialOffset()
    c.hw.update({("ev", 1): 70, ("ev2", 0): 5})
    c.log_starts[("ev", 1)] = 20
    with pytest.raises(DataLossError, match="Added partition ev-1 starts from 20 instead of 0"):
        reader(c).latestOffset(start, ReadAllAvailable())
    r = reader(c, failOnDataLoss="false")
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
    with pytest.raises(DataLossError, match=r"Partitions \[evgone-0\] are gone"):
        reader(c).latestOffset(start, ReadAllAvailable())
    assert reader(c, failOnDataLoss="false").latestOffset(start, ReadAllAvailable()) == {"ev": {"0": 10}}


def test_partitions_split_and_skip_empty_ranges():
    c = FakeClient()
    r = reader(c, maxRecordsPerPartition="40")
    parts = r.partitions({"ev": {"0": 0, "1": 5}}, {"ev": {"0": 100, "1": 5}})
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 0, 33), (0, 33, 66), (0, 66, 100)]
    assert r.partitions({"ev": {"0": 7}}, {"ev": {"0": 7}}) == []


# ---------------------------------------------------------------- re-created topics (issue 13, item 1)
def ranges(r, start, end):
    return [(p.topic, p.partition, p.start, p.end) for p in r.partitions(start, end)]


def test_checkpoint_json_is_sparks_with_topic_ids_beside_it():
    """KafkaSourceOffsetSuite "basic serialization - deserialization": the offsets
    are Spark's {"topic": {"partition": offset}}; the ids sit under "@topicIds"
    (not a legal topic name), and a plain Spark JSON without ids still reads."""
    c = FakeClient()
    c.hw = {("ev", 0): 10, ("ev", 1): 4}
    c.ids = {"ev": "id1"}
    first = reader(c).initialOffset()
    assert first == {"ev": {"0": 10, "1": 4}, "@topicIds": {"ev": "id1"}}
    assert offsets_from_json(first) == {("ev", 0): 10, ("ev", 1): 4}
    assert topic_ids_from_json(first) == {"ev": "id1"}
    assert offsets_from_json({"ev": {"0": 10}}) == {("ev", 0): 10} and topic_ids_from_json({"ev": {"0": 10}}) == {}


@pytest.mark.parametrize("new_hw", [3, 25])
def test_recreated_topic_fails_the_stream_with_fail_on_data_loss(new_hw):
    """KafkaMicroBatchSourceSuite "subscribe topic by pattern with topic recreation between batches"
    (failOnDataLoss=true): Spark fails with "offset was changed from X to Y". The topic id catches it
    even when the new topic already holds more records than the old offset (new_hw=25)."""
    c = FakeClient()
    c.hw = {("ev", 0): 10}
    c.ids = {"ev": "old"}
    r = reader(c)
    start = r.initialOffset()
    c.hw, c.ids = {("ev", 0): new_hw}, {"ev": "new"}
    to = new_hw if new_hw < 10 else 0
    with pytest.raises(DataLossError, match=f"Partition ev-0's offset was changed from 10 to {to}.*re-created") as e:
        r.latestOffset(start, ReadAllAvailable())
    assert e.value.code == "KAFKA_DATA_LOSS" and not isinstance(e.value, OptionError)
    # A restarted query (a new reader, nothing in memory) finds the same from the checkpoint's ids.
    with pytest.raises(DataLossError, match="was changed from 10"):
        reader(c).latestOffset(start, ReadMaxRows(5))


def test_recreated_topic_is_read_from_its_start_without_fail_on_data_loss():
    """KafkaDontFailOnDataLossSuite: with failOnDataLoss=false the stream goes on; the
    re-created topic's records are all delivered, none twice, none of the old topic again."""
    c = FakeClient()
    c.hw = {("ev", 0): 10, ("ev", 1): 10}
    c.ids = {"ev": "old"}
    r = reader(c, failOnDataLoss="false")
    start = r.initialOffset()
    c.hw, c.ids = {("ev", 0): 25, ("ev", 1): 4}, {"ev": "new"}
    o1 = r.latestOffset(start, ReadAllAvailable())
    assert o1 == {"ev": {"0": 0, "1": 0}, "@topicIds": {"ev": "new"}}     # entered at the new log start
    assert ranges(r, start, o1) == []                                     # nothing of either topic in that batch
    o2 = reader(c, failOnDataLoss="false").latestOffset(o1, ReadAllAvailable())   # after a restart, too
    assert o2 == {"ev": {"0": 25, "1": 4}, "@topicIds": {"ev": "new"}}
    assert ranges(r, o1, o2) == [("ev", 0, 0, 25), ("ev", 1, 0, 4)]
    # The batch that crossed the re-creation, replayed after a restart with failOnDataLoss=true, fails.
    with pytest.raises(DataLossError, match="re-created"):
        reader(c).partitions(start, o1)


def test_high_watermark_that_went_back_is_asked_again_then_is_data_loss():
    """KafkaOffsetReaderSuite / KafkaMicroBatchSourceSuite "offset was changed": a HW below the
    start under the same (or an unknown) topic id is asked again fetchOffset.numRetries times,
    then fails (true) or continues at that HW as Spark does (false)."""
    c = FakeClient()
    c.hw = {("ev", 0): 3}
    start = {"ev": {"0": 10}}                         # a checkpoint written without topic ids
    sleeps = []
    with pytest.raises(DataLossError, match="Partition ev-0's offset was changed from 10 to 3"):
        reader(c, sleeps=sleeps, **{"fetchOffset.retryIntervalMs": "7"}).latestOffset(start, ReadAllAvailable())
    assert sleeps == [0.007] * 3 and c.bounds_calls == 4
    r = reader(c, failOnDataLoss="false")
    o1 = r.latestOffset(start, ReadAllAvailable())
    assert o1 == {"ev": {"0": 3}}
    assert ranges(r, start, o1) == []
    c.hw = {("ev", 0): 8}
    assert ranges(r, o1, r.latestOffset(o1, ReadAllAvailable())) == [("ev", 0, 3, 8)]


def test_high_watermark_back_for_a_moment_is_no_data_loss():
    """A leader that had not caught up answers a lower HW once; the retry sees the real one."""
    c = FakeClient()
    c.hw = {("ev", 0): 3}
    original = c.bounds

    def recovering(tps):
        out = original(tps)
        c.hw = {("ev", 0): 12}
        return out
    c.bounds = recovering
    assert reader(c).latestOffset({"ev": {"0": 10}}, ReadAllAvailable()) == {"ev": {"0": 12}}


def test_available_now_fails_on_a_topic_recreated_before_it_started():
    """KafkaMicroBatchSourceSuite Trigger.AvailableNow with topic recreation: Spark fails
    (failOnDataLoss=true); it never reads the old topic's offsets into the new one."""
    c = FakeClient()
    c.hw = {("ev", 0): 10}
    c.ids = {"ev": "old"}
    start = reader(c).initialOffset()
    c.hw, c.ids = {("ev", 0): 30}, {"ev": "new"}
    r = reader(c)
    r.prepareForTriggerAvailableNow()
    with pytest.raises(DataLossError, match="was changed from 10 to 0"):
        r.latestOffset(start, ReadAllAvailable())
    # failOnDataLoss=false: the new topic is read from its start up to what was there when prepared.
    r = reader(c, failOnDataLoss="false")
    r.prepareForTriggerAvailableNow()
    o1 = r.latestOffset(start, ReadAllAvailable())
    assert ranges(r, start, o1) == []
    c.hw = {("ev", 0): 50}
    o2 = r.latestOffset(o1, ReadAllAvailable())
    assert ranges(r, o1, o2) == [("ev", 0, 0, 30)]
    assert r.latestOffset(o2, ReadAllAvailable()) == o2                     # done


def test_available_now_reads_nothing_of_a_topic_recreated_after_it_was_prepared():
    c = FakeClient()
    c.hw = {("ev", 0): 10}
    c.ids = {"ev": "old"}
    r = reader(c, failOnDataLoss="false")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    c.hw, c.ids = {("ev", 0): 40}, {"ev": "new"}
    o1 = r.latestOffset(start, ReadAllAvailable())
    o2 = r.latestOffset(o1, ReadAllAvailable())
    assert ranges(r, start, o1) == [] and ranges(r, o1, o2) == [] and o2 == o1


def test_refused_options_fail_the_stream_with_our_error_not_pysparks():
    """pyspark 4.3's stream runner masks an exception from streamReader() with an
    UnboundLocalError; the data source returns a reader that raises ours instead."""
    from pyspark.sql.datasource import DataSourceStreamReader  # noqa: F401
    from replikafka.spark.data_source import ReplikafkaDataSource
    from replikafka.spark.stream_reader import RefusedStreamReader
    ds = ReplikafkaDataSource({"bootstrap.servers": "h:1", "subscribe": "t", "endingOffsets": "latest"})
    r = ds.streamReader(None)
    assert isinstance(r, RefusedStreamReader)
    for call in (r.initialOffset, r.getDefaultReadLimit, lambda: r.latestOffset({}, ReadAllAvailable())):
        with pytest.raises(OptionError, match="option 'endingOffsets': applies to batch reads only"):
            call()
    r.stop()
