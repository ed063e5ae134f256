"""Options of format("replikafka"): every bad, missing or contradictory option
is refused with an error that names it (pure: no cluster, no Spark)."""
from __future__ import annotations

import pytest

from replikafka.errors import InvalidConfigError
from replikafka.spark.options import (DEFAULT_MAX_TRIGGER_DELAY_MS, EARLIEST, LATEST, OptionError,
                                      parse_sink_options, parse_source_options)

BASE = {"bootstrap.servers": "127.0.0.1:9092", "subscribe": "events"}


def src(streaming=False, **kw):
    return parse_source_options({**BASE, **kw}, streaming=streaming)


def refused(option: str, streaming=False, base=BASE, **kw) -> OptionError:
    opts = {**base, **kw}
    with pytest.raises(OptionError) as info:
        parse_source_options(opts, streaming=streaming)
    assert info.value.option == option, str(info.value)
    assert f"'{option}'" in str(info.value)
    return info.value


def test_defaults_batch_and_stream():
    b = src()
    assert b.starting.kind == "earliest" and b.ending.kind == "latest"
    assert b.fail_on_data_loss is True and b.include_headers is False and b.columns is None
    s = src(streaming=True)
    assert s.starting.kind == "latest"
    assert s.max_trigger_delay_ms == DEFAULT_MAX_TRIGGER_DELAY_MS


def test_keys_are_case_insensitive_and_kafka_prefix_accepted():
    o = parse_source_options({"KAFKA.BOOTSTRAP.SERVERS": "h:1,h2:2", "SUBSCRIBE": "a, b ,a",
                              "startingoffsets": "EARLIEST", "FailOnDataLoss": "False"}, streaming=False)
    assert o.bootstrap == "h:1,h2:2"
    assert o.subscription.topics == ("a", "b")
    assert o.fail_on_data_loss is False


def test_missing_bootstrap_and_subscription_are_named():
    assert "required" in str(refused("bootstrap.servers", base={"subscribe": "x"}))
    assert "one of" in str(refused("subscribe", base={"bootstrap.servers": "h:1"}))
    refused("bootstrap.servers", **{"bootstrap.servers": "nohostport"})
    refused("bootstrap.servers", **{"kafka.bootstrap.servers": "other:2"})


def test_exactly_one_subscription_kind():
    e = refused("assign", assign='{"events":[0]}')
    assert "only one of" in str(e)
    refused("subscribePattern", base={"bootstrap.servers": "h:1"}, subscribePattern="(")
    refused("assign", base={"bootstrap.servers": "h:1"}, assign='{"events":"0"}')
    refused("assign", base={"bootstrap.servers": "h:1"}, assign='not json')
    refused("subscribe", base={"bootstrap.servers": "h:1"}, subscribe=" , ")


def test_unknown_option_is_refused_with_a_suggestion():
    e = refused("startingOffset", startingOffset="earliest")
    assert "did you mean 'startingOffsets'" in str(e)
    e = refused("topic", topic="x")
    assert "sink" in str(e)


def test_starting_and_ending_offsets_parse_json_with_sentinels():
    o = src(startingOffsets='{"events":{"0":23,"1":-2}}', endingOffsets='{"events":{"0":50,"1":-1}}')
    assert o.starting.as_dict() == {("events", 0): 23, ("events", 1): EARLIEST}
    assert o.ending.as_dict() == {("events", 0): 50, ("events", 1): LATEST}


@pytest.mark.parametrize("kw,option", [
    ({"startingOffsets": "latest"}, "startingOffsets"),                    # batch: reads nothing
    ({"startingOffsets": '{"events":{"0":-1}}'}, "startingOffsets"),
    ({"endingOffsets": "earliest"}, "endingOffsets"),
    ({"endingOffsets": '{"events":{"0":-2}}'}, "endingOffsets"),
    ({"startingOffsets": '{"events":{"0":9}}', "endingOffsets": '{"events":{"0":5}}'}, "startingOffsets"),
    ({"startingOffsets": '{"events":{"x":1}}'}, "startingOffsets"),
    ({"startingOffsets": '{"events":{"0":-3}}'}, "startingOffsets"),
    ({"startingOffsets": '{"other":{"0":1}}'}, "startingOffsets"),         # not subscribed
    ({"startingOffsets": "sometimes"}, "startingOffsets"),
    ({"startingOffsets": '{"events":"middle"}'}, "startingOffsets"),
    ({"startingOffsets": '{"events":"latest"}'}, "startingOffsets"),      # batch: reads nothing
    ({"startingOffsets": '{"other":"earliest"}'}, "startingOffsets"),      # not subscribed
    ({"startingTimestamp": "abc"}, "startingTimestamp"),
    ({"startingTimestamp": "10", "endingTimestamp": "5"}, "startingTimestamp"),
    ({"startingOffsetsByTimestamp": '{"events":{"0":"x"}}'}, "startingOffsetsByTimestamp"),
    ({"startingOffsetsByTimestampStrategy": "maybe"}, "startingOffsetsByTimestampStrategy"),
    ({"failOnDataLoss": "perhaps"}, "failOnDataLoss"),
    ({"minPartitions": "0"}, "minPartitions"),
    ({"maxRecordsPerPartition": "ten"}, "maxRecordsPerPartition"),
    ({"includeHeaders": "y es"}, "includeHeaders"),
    ({"columns": "value,,key"}, "columns"),
    ({"columns": "value,value"}, "columns"),
    ({"maxOffsetsPerTrigger": "10"}, "maxOffsetsPerTrigger"),              # batch: streaming only
    ({"fetchTimeoutMs": "-1"}, "fetchTimeoutMs"),
])
def test_bad_batch_options_are_named(kw, option):
    refused(option, **kw)


@pytest.mark.parametrize("kw,option", [
    ({"endingOffsets": "latest"}, "endingOffsets"),                        # a stream has no end
    ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
    ({"maxTriggerDelay": "5m"}, "maxTriggerDelay"),                        # without minOffsetsPerTrigger
    ({"minOffsetsPerTrigger": "100", "maxTriggerDelay": "soon"}, "maxTriggerDelay"),
    ({"minOffsetsPerTrigger": "100", "maxOffsetsPerTrigger": "10"}, "minOffsetsPerTrigger"),
])
def test_bad_stream_options_are_named(kw, option):
    refused(option, streaming=True, **kw)


def test_stream_admission_options():
    o = src(streaming=True, maxOffsetsPerTrigger="1000", minOffsetsPerTrigger="10", maxTriggerDelay="30s")
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (1000, 10, 30_000)
    assert src(streaming=True, minOffsetsPerTrigger="1", maxTriggerDelay="250ms").max_trigger_delay_ms == 250
    assert src(streaming=True, startingOffsets="latest").starting.kind == "latest"


def test_mode_neutral_parse_accepts_what_either_mode_accepts():
    parse_source_options({**BASE, "startingOffsets": "latest"}, streaming=None)
    parse_source_options({**BASE, "maxOffsetsPerTrigger": "5"}, streaming=None)
    parse_source_options({**BASE, "endingOffsets": "latest"}, streaming=None)


def test_assign_and_offsets_must_agree():
    base = {"bootstrap.servers": "h:1", "assign": '{"events":[0,1]}'}
    o = parse_source_options({**base, "startingOffsets": '{"events":{"0":1,"1":2}}'}, streaming=False)
    assert o.subscription.assignment == (("events", (0, 1)),)
    refused("startingOffsets", base=base, startingOffsets='{"events":{"2":1}}')


def test_option_errors_are_config_errors():
    with pytest.raises(InvalidConfigError):
        parse_source_options({"subscribe": "x"}, streaming=False)


def test_sink_options():
    o = parse_sink_options({"bootstrap.servers": "h:1", "topic": "out", "checkpointLocation": "/tmp/x"})
    assert o.topic == "out"
    with pytest.raises(OptionError) as info:
        parse_sink_options({"bootstrap.servers": "h:1", "subscribe": "x"})
    assert info.value.option == "subscribe"
    with pytest.raises(OptionError) as info:
        parse_sink_options({"topic": "x"})
    assert info.value.option == "bootstrap.servers"
    with pytest.raises(OptionError) as info:
        parse_sink_options({"bootstrap.servers": "h:1", "sinkChunkRows": "0"})
    assert info.value.option == "sinkChunkRows"


def test_offset_options_follow_sparks_precedence():
    """KafkaSourceProviderSuite / KafkaRelationSuite "timestamp takes precedence": Spark applies
    startingTimestamp > startingOffsetsByTimestamp > startingOffsets (the same for ending);
    the options set aside are named in a warning."""
    o = src(startingTimestamp="123", startingOffsetsByTimestamp='{"events":{"0":5}}', startingOffsets="earliest",
            endingOffsetsByTimestamp='{"events":{"0":9}}', endingOffsets="latest")
    assert (o.starting.kind, o.starting.timestamp_ms) == ("timestamp", 123)
    assert o.ending.kind == "timestamps" and o.ending.option == "endingOffsetsByTimestamp"
    assert [n for n, _ in o.ignored] == ["startingOffsetsByTimestamp", "startingOffsets", "endingOffsets"]
    assert "'startingTimestamp' takes precedence" in dict(o.ignored)["startingOffsets"]


def test_kafka_client_options_are_accepted_and_named_as_ignored():
    """KafkaSourceProviderSuite: Spark passes kafka.* to its client; a ported job's
    kafka.group.id / kafka.metadata.max.age.ms must not stop it."""
    o = src(**{"kafka.group.id": "g", "KAFKA.METADATA.MAX.AGE.MS": "100", "kafkaConsumer.pollTimeoutMs": "5",
               "groupIdPrefix": "x"})
    names = [n for n, _ in o.ignored]
    assert names == sorted(["kafka.group.id", "KAFKA.METADATA.MAX.AGE.MS", "kafkaConsumer.pollTimeoutMs",
                            "groupIdPrefix"])
    assert o.bootstrap == BASE["bootstrap.servers"]
    s = parse_sink_options({"bootstrap.servers": "h:1", "topic": "t", "kafka.acks": "all"})
    assert [n for n, _ in s.ignored] == ["kafka.acks"]
    refused("startingOffset", startingOffset="earliest")                  # a typo is still refused
    assert src(**{"kafka.security.protocol": "PLAINTEXT"}).ignored == ()  # used (TLS/SASL), not ignored


def test_topic_level_starting_offsets():
    """Spark's topic-level startingOffsets {"t": "earliest"} (SPARK-47345 style JSON)."""
    o = src(streaming=True, startingOffsets='{"events":"earliest"}')
    assert o.starting.per_topic == (("events", EARLIEST),)
    assert o.starting.offset_of(("events", 7)) == EARLIEST
    o = src(streaming=True, startingOffsets='{"events":"latest"}')
    assert o.starting.offset_of(("events", 0)) == LATEST
    mixed = src(startingOffsets='{"events":{"0":5}}')
    assert mixed.starting.offset_of(("events", 0)) == 5 and mixed.starting.offset_of(("events", 1)) is None
