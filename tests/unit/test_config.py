"""Broker and topic configuration: every key's default and validation, overrides, precedence."""
from __future__ import annotations

import os

import pytest

from replikafka.broker import config as C
from replikafka.broker.config import (
    BOOLEAN, BROKER_CONFIG_KEYS, BROKER_KEYS, INT, LIST, LONG, REQUIRED, STRING, TOPIC_CONFIG_KEYS,
    TOPIC_KEYS, BrokerConfig, Endpoint, config_reference_markdown, log_config_for_topic, parse_overrides,
    parse_properties, parse_topic_config_args, validate_topic_config, _broker_key,
)
from replikafka.broker.storage.log_config import LogConfig
from replikafka.errors import InvalidConfigError, ReplikafkaError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MINIMAL = {"broker.id": "1", "zookeeper.connect": "127.0.0.1:2181"}

# A bad value for every type: refused whatever the validator says.
BAD_BY_TYPE = {
    INT: ["abc", "1.5", "", "2147483648", True],
    LONG: ["abc", "1e3", "", "9223372036854775808", False],
    BOOLEAN: ["yes", "1", "", 1],
    STRING: [5],
    LIST: [7],
}

# Kafka's defaults, written out independently of the table.
KAFKA_DEFAULTS = {
    "listeners": "PLAINTEXT://127.0.0.1:9092",
    "log.dirs": "/tmp/replikafka-logs",
    "zookeeper.session.timeout.ms": "18000",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "unclean.leader.election.enable": "false",
    "replica.lag.time.max.ms": "30000",
    "replica.fetch.max.bytes": "1048576",
    "replica.fetch.wait.max.ms": "500",
    "replica.fetch.min.bytes": "1",
    "replica.fetch.backoff.ms": "1000",
    "num.replica.fetchers": "1",
    "log.segment.bytes": "1073741824",
    "log.roll.hours": "168",
    "log.retention.hours": "168",
    "log.retention.bytes": "-1",
    "log.retention.check.interval.ms": "300000",
    "log.index.interval.bytes": "4096",
    "log.flush.interval.messages": "9223372036854775807",
    "log.flush.scheduler.interval.ms": "9223372036854775807",
    "replica.high.watermark.checkpoint.interval.ms": "5000",
    "delete.topic.enable": "true",
    "auto.leader.rebalance.enable": "true",
    "leader.imbalance.per.broker.percentage": "10",
    "leader.imbalance.check.interval.seconds": "300",
    "controlled.shutdown.enable": "true",
    "controlled.shutdown.max.retries": "3",
    "controlled.shutdown.retry.backoff.ms": "5000",
    "message.max.bytes": "1048588",
    "log.message.timestamp.type": "CreateTime",
    "request.timeout.ms": "30000",
    "controller.socket.timeout.ms": "30000",
    "num.io.threads": "8",
    "queued.max.requests": "500",
    "producer.id.expiration.ms": "86400000",
    "producer.id.expiration.check.interval.ms": "600000",
}

INTERFACE_KEYS = [
    "broker.id", "listeners", "log.dirs", "zookeeper.connect", "zookeeper.session.timeout.ms", "num.partitions",
    "default.replication.factor", "min.insync.replicas", "unclean.leader.election.enable",
    "replica.lag.time.max.ms", "replica.fetch.max.bytes", "replica.fetch.wait.max.ms", "num.replica.fetchers",
    "log.segment.bytes", "log.roll.ms", "log.retention.ms", "log.retention.hours", "log.retention.bytes",
    "log.flush.interval.messages", "log.flush.interval.ms", "replica.high.watermark.checkpoint.interval.ms",
    "delete.topic.enable", "auto.leader.rebalance.enable", "leader.imbalance.per.broker.percentage",
    "leader.imbalance.check.interval.seconds", "controlled.shutdown.enable", "message.max.bytes",
]


def cfg(**kw) -> BrokerConfig:
    props = dict(MINIMAL)
    props.update({k.replace("_", "."): v for k, v in kw.items()})
    return BrokerConfig.from_dict(props)


def refused(fn, *names):
    """Call fn, expect InvalidConfigError whose message names every one of `names`."""
    with pytest.raises(InvalidConfigError) as info:
        fn()
    msg = str(info.value)
    for name in names:
        assert str(name) in msg, f"{name!r} not in {msg!r}"
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------- the table
def test_table_has_every_interface_key_and_each_key_is_documented():
    for name in INTERFACE_KEYS + list(KAFKA_DEFAULTS):
        assert name in BROKER_KEYS, name
    for table in (BROKER_CONFIG_KEYS, TOPIC_CONFIG_KEYS):
        names = [k.name for k in table]
        assert len(names) == len(set(names))
        for k in table:
            assert k.doc and "\n" not in k.doc and k.unit and k.type in (INT, LONG, BOOLEAN, STRING, LIST)


def test_required_keys_are_broker_id_and_zookeeper_connect():
    assert {k.name for k in BROKER_CONFIG_KEYS if k.required} == {"broker.id", "zookeeper.connect"}


@pytest.mark.parametrize("key", BROKER_CONFIG_KEYS + TOPIC_CONFIG_KEYS, ids=lambda k: k.name)
def test_each_default_validates_and_round_trips(key):
    if key.default in (None, REQUIRED):
        return
    text = key.format(key.default)
    assert key.parse(text) == key.default
    assert key.parse(key.default) == key.default


@pytest.mark.parametrize("name,expected", sorted(KAFKA_DEFAULTS.items()))
def test_kafka_defaults(name, expected):
    c = cfg()
    assert BROKER_KEYS[name].format(c.get(name, effective=False)) == expected
    assert not c.is_set(name)


@pytest.mark.parametrize("key", BROKER_CONFIG_KEYS, ids=lambda k: k.name)
def test_bad_value_of_each_type_is_refused_naming_the_key(key):
    for bad in BAD_BY_TYPE[key.type]:
        props = dict(MINIMAL)
        props[key.name] = bad
        refused(lambda: BrokerConfig.from_dict(props), key.name, "allowed")


@pytest.mark.parametrize("key", TOPIC_CONFIG_KEYS, ids=lambda k: k.name)
def test_bad_topic_value_of_each_type_is_refused_naming_the_key(key):
    for bad in BAD_BY_TYPE[key.type]:
        refused(lambda: validate_topic_config({key.name: bad}), key.name, "allowed")


@pytest.mark.parametrize("key", [k for k in BROKER_CONFIG_KEYS + TOPIC_CONFIG_KEYS
                                 if isinstance(k.validator, C.Range)], ids=lambda k: k.name)
def test_range_bounds(key):
    lo, hi = key.validator.lo, key.validator.hi
    assert key.parse(str(lo)) == lo
    refused(lambda: key.parse(str(lo - 1)), key.name, str(lo - 1), f">= {lo}" if hi in (None, key.type.hi) else f"{lo}..{hi}")
    if hi is not None:
        assert key.parse(str(hi)) == hi
        refused(lambda: key.parse(str(hi + 1)), key.name, str(hi + 1))


def test_values_are_typed_and_whitespace_tolerant():
    c = cfg(broker_id=" 7 ", unclean_leader_election_enable="TRUE", replica_lag_time_max_ms=1234,
            log_dirs="/a, /b ,", delete_topic_enable=False)
    assert c.broker_id == 7 and isinstance(c.broker_id, int)
    assert c.unclean_leader_election_enable is True
    assert c.replica_lag_time_max_ms == 1234
    assert c.get("replica.lag.time.max.ms") == 1234
    assert c["replica.lag.time.max.ms"] == 1234
    assert c.log_dirs == ("/a", "/b")
    assert c.delete_topic_enable is False
    assert c.is_set("broker.id") and not c.is_set("num.partitions")


def test_enum_is_case_insensitive_and_normalized():
    assert cfg(log_message_timestamp_type="logappendtime").log_message_timestamp_type == "LogAppendTime"
    refused(lambda: cfg(log_message_timestamp_type="NoTime"), "log.message.timestamp.type", "'NoTime'",
            "CreateTime | LogAppendTime")


def test_unknown_key_is_refused_naming_it_with_a_suggestion():
    msg = refused(lambda: cfg(replica_lag_max_ms="1"), "replica.lag.max.ms", "replica.lag.time.max.ms")
    assert "unknown" in msg
    refused(lambda: cfg(**{"retention.ms": "5"}), "retention.ms", "log.retention.ms")
    refused(lambda: cfg(**{"totally.bogus": "5"}), "totally.bogus")
    refused(lambda: cfg().get("nope.key"), "nope.key")
    with pytest.raises(AttributeError):
        cfg().no_such_key


def test_missing_required_keys():
    refused(lambda: BrokerConfig.from_dict({"zookeeper.connect": "h:1"}), "broker.id")
    refused(lambda: BrokerConfig.from_dict({"broker.id": 1}), "zookeeper.connect")


def test_invalid_config_error_is_a_replikafka_error_with_its_code():
    with pytest.raises(ReplikafkaError) as info:
        cfg(num_partitions="0")
    assert info.value.code == "INVALID_CONFIG" and not info.value.retriable


# ---------------------------------------------------------------- listeners, zookeeper.connect
def test_listeners():
    c = cfg(listeners="PLAINTEXT://:9093, ssl://[::1]:9094,FLIGHT://0.0.0.0:0")
    assert c.listeners == (Endpoint("PLAINTEXT", "", 9093), Endpoint("SSL", "::1", 9094),
                           Endpoint("FLIGHT", "0.0.0.0", 0))
    assert c.listeners[1].address == "[::1]:9094"
    assert c.grpc_listeners() == [Endpoint("PLAINTEXT", "", 9093), Endpoint("SSL", "::1", 9094)]
    assert c.listener("FLIGHT") == Endpoint("FLIGHT", "0.0.0.0", 0) and c.listener("SASL_SSL") is None
    assert cfg(listeners="FLIGHT://h:1,SSL://h:2").advertised_endpoint() == Endpoint("SSL", "h", 2)
    assert cfg().advertised_endpoint() == Endpoint("PLAINTEXT", "127.0.0.1", 9092)
    assert cfg().listeners[0].address == "127.0.0.1:9092"
    for bad in ("127.0.0.1:9092", "HTTP://h:1", "PLAINTEXT://h:70000", "PLAINTEXT://h", "",
                "PLAINTEXT://a:1,PLAINTEXT://b:1", "PLAINTEXT://a:1,PLAINTEXT://b:2", "FLIGHT://h:1"):
        refused(lambda: cfg(listeners=bad), "listeners", repr(bad) if bad else "listeners")


def test_advertised_listeners():
    c = cfg(listeners="PLAINTEXT://0.0.0.0:9092", advertised_listeners="PLAINTEXT://broker1:9092")
    assert c.advertised_endpoint() == Endpoint("PLAINTEXT", "broker1", 9092)
    assert c.get("advertised.listeners", effective=False) == (Endpoint("PLAINTEXT", "broker1", 9092),)
    assert cfg().get("advertised.listeners", effective=False) is None
    assert cfg().get("advertised.listeners") == cfg().listeners
    refused(lambda: cfg(advertised_listeners="PLAINTEXT://0.0.0.0:9092"), "advertised.listeners")
    refused(lambda: cfg(advertised_listeners="PLAINTEXT://h:0"), "advertised.listeners")
    refused(lambda: cfg(advertised_listeners="PLAINTEXT://a:1,FLIGHT://b:2"), "advertised.listeners")
    # Port 0 advertises the bound port (Kafka's registration does so), only where the listener binds port 0.
    proxied = cfg(listeners="PLAINTEXT://127.0.0.1:9092,FLIGHT://127.0.0.1:0",
                  advertised_listeners="PLAINTEXT://proxy:7000,FLIGHT://127.0.0.1:0")
    assert proxied.get("advertised.listeners") == (Endpoint("PLAINTEXT", "proxy", 7000),
                                                   Endpoint("FLIGHT", "127.0.0.1", 0))
    assert proxied.advertised_endpoint() == Endpoint("PLAINTEXT", "proxy", 7000)
    refused(lambda: cfg(listeners="PLAINTEXT://h:1,FLIGHT://h:2", advertised_listeners="PLAINTEXT://a:1,FLIGHT://a:0"),
            "advertised.listeners", "FLIGHT://a:0")


@pytest.mark.parametrize("good", ["h:2181", "a:1,b:2,c:3/chroot/x", "h", "[::1]:2181/kafka", "h:2181/"])
def test_zookeeper_connect_accepts(good):
    assert cfg(zookeeper_connect=good).zookeeper_connect == good


@pytest.mark.parametrize("bad", ["", "h:0", "h:99999", "h:x", "a b:1", "h:1/x/", "h:1/a//b", ",h:1"])
def test_zookeeper_connect_refuses(bad):
    refused(lambda: cfg(zookeeper_connect=bad), "zookeeper.connect")


def test_log_dirs_must_not_be_empty_or_repeat():
    refused(lambda: cfg(log_dirs=" , "), "log.dirs")
    refused(lambda: cfg(log_dirs="/a,/a"), "log.dirs")


# ---------------------------------------------------------------- precedence and derived values
def test_retention_precedence_ms_over_minutes_over_hours():
    assert cfg().log_retention_ms == 168 * 3600 * 1000
    assert cfg(log_retention_hours=1).log_retention_ms == 3600 * 1000
    assert cfg(log_retention_hours=1, log_retention_minutes=2).log_retention_ms == 120000
    assert cfg(log_retention_hours=1, log_retention_minutes=2, log_retention_ms=5).log_retention_ms == 5
    assert cfg(log_retention_minutes=2, log_retention_ms=5).log_retention_ms == 5
    assert cfg(log_retention_hours=-1).log_retention_ms == -1
    assert cfg(log_retention_minutes=-1).log_retention_ms == -1
    assert cfg(log_retention_ms=-1, log_retention_hours=5).log_retention_ms == -1
    assert cfg(log_retention_minutes=2).get("log.retention.ms", effective=False) is None


def test_roll_precedence_ms_over_hours():
    assert cfg().log_roll_ms == 168 * 3600 * 1000
    assert cfg(log_roll_hours=2).log_roll_ms == 2 * 3600 * 1000
    assert cfg(log_roll_hours=2, log_roll_ms=777).log_roll_ms == 777


def test_flush_interval_ms_falls_back_to_scheduler_interval():
    assert cfg().log_flush_interval_ms == C.LONG_MAX
    assert cfg(log_flush_scheduler_interval_ms=3000).log_flush_interval_ms == 3000
    assert cfg(log_flush_scheduler_interval_ms=3000, log_flush_interval_ms=10).log_flush_interval_ms == 10


def test_connection_timeout_defaults_to_session_timeout():
    assert cfg(zookeeper_session_timeout_ms=6000).zookeeper_connection_timeout_ms == 6000
    assert cfg(zookeeper_connection_timeout_ms=100).zookeeper_connection_timeout_ms == 100


def test_fetch_wait_must_not_exceed_lag_time():
    cfg(replica_fetch_wait_max_ms=1000, replica_lag_time_max_ms=1000)
    refused(lambda: cfg(replica_fetch_wait_max_ms=1001, replica_lag_time_max_ms=1000),
            "replica.fetch.wait.max.ms", "1001", "replica.lag.time.max.ms")


# ---------------------------------------------------------------- files and overrides
def test_properties_parser_follows_java_properties():
    text = (
        "# comment\n! also a comment\n\n"
        "a=1\n"
        "b : two words  \n"
        "c   3\n"
        "d=line \\\n    continued\n"
        "e=tab\\there\\u0041\n"
        "key\\=with\\:seps = v\n"
        "empty=\n"
        "a=last wins\n"
    )
    assert parse_properties(text) == {
        "a": "last wins", "b": "two words", "c": "3", "d": "line continued", "e": "tab\thereA",
        "key=with:seps": "v", "empty": "",
    }


def test_load_file_with_overrides(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("broker.id=1\nzookeeper.connect=127.0.0.1:2181\nnum.partitions=3\n")
    c = BrokerConfig.load(path, ["num.partitions=5", "broker.id = 9", "log.dirs=/x,/y", "num.partitions=6"])
    assert (c.broker_id, c.num_partitions, c.log_dirs) == (9, 6, ("/x", "/y"))
    assert c.source == str(path)
    assert BrokerConfig.load(path).num_partitions == 3


def test_file_errors_name_the_file_line_and_key(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("broker.id=1\nzookeeper.connect=h:1\n\nnum.partitions=lots\n")
    refused(lambda: BrokerConfig.load(path), f"{path}:4", "num.partitions", "'lots'")
    path.write_text("broker.id=1\nzookeeper.connect=h:1\nlog.dir=/x\n")
    refused(lambda: BrokerConfig.load(path), f"{path}:3", "log.dir", "log.dirs")
    refused(lambda: BrokerConfig.load(tmp_path / "missing.properties"), "missing.properties")
    path.write_text("broker.id=1\nzookeeper.connect=h:1\n")
    refused(lambda: BrokerConfig.load(path, ["num.partitions=0"]), "--override", "num.partitions", "'0'")


@pytest.mark.parametrize("bad", ["novalue", "=5", " =5", "two words=5"])
def test_malformed_override_is_named(bad):
    refused(lambda: parse_overrides([bad]), repr(bad))
    refused(lambda: BrokerConfig.from_dict(MINIMAL, [bad]), repr(bad))


def test_override_values_keep_equals_signs_and_unknown_override_keys_are_refused():
    assert parse_overrides(["a=b=c", "x= y "]) == {"a": "b=c", "x": "y"}
    refused(lambda: BrokerConfig.from_dict(MINIMAL, ["brokr.id=3"]), "brokr.id", "broker.id")


def test_with_overrides_and_properties_round_trip():
    c = cfg(listeners="PLAINTEXT://127.0.0.1:0", num_partitions=4)
    c2 = c.with_overrides(["broker.id=2", "num.partitions=8"])
    assert (c2.broker_id, c2.num_partitions, c2.listeners) == (2, 8, c.listeners)
    assert (c.broker_id, c.num_partitions) == (1, 4)
    assert c.with_overrides({"num.partitions": 9}).num_partitions == 9
    back = BrokerConfig.from_dict(parse_properties(c2.to_properties_text()))
    assert back == c2
    full = c.as_properties(include_defaults=True)
    assert full["replica.lag.time.max.ms"] == "30000" and "log.retention.ms" not in full


@pytest.mark.parametrize("name", ["server.properties", "cluster/broker-1.properties",
                                  "cluster/broker-2.properties", "cluster/broker-3.properties"])
def test_shipped_configs_load(name):
    c = BrokerConfig.load(os.path.join(REPO, "conf", name))
    assert c.zookeeper_connect == "127.0.0.1:2181"
    if name.startswith("cluster/"):
        n = int(name[-12])
        assert c.broker_id == n and c.listeners[0].port == 9091 + n
        assert c.default_replication_factor == 3 and c.min_insync_replicas == 2
        assert c.log_dirs == (f"/tmp/replikafka-cluster/broker-{n}",)
    else:
        assert c.broker_id == 1 and c.listeners[0].port == 9092


def test_server_properties_mentions_only_known_keys():
    """Even the commented-out examples in conf/server.properties are real keys."""
    with open(os.path.join(REPO, "conf", "server.properties")) as f:
        for line in f:
            line = line.strip().lstrip("#")
            if "=" in line and " " not in line.split("=", 1)[0]:
                key, value = line.split("=", 1)
                (BROKER_KEYS.get(key) or _broker_key(key)).parse(value)   # log.level.<logger> keys too


# ---------------------------------------------------------------- topic-level configuration
def test_validate_topic_config_normalizes():
    assert validate_topic_config({
        "retention.ms": " 1000 ", "unclean.leader.election.enable": "True", "min.insync.replicas": 2,
        "message.timestamp.type": "logappendtime", "segment.bytes": "1024",
    }) == {
        "retention.ms": "1000", "unclean.leader.election.enable": "true", "min.insync.replicas": "2",
        "message.timestamp.type": "LogAppendTime", "segment.bytes": "1024",
    }
    assert validate_topic_config({}) == {} and validate_topic_config(None) == {}


def test_topic_config_refusals_name_the_key():
    refused(lambda: validate_topic_config({"log.retention.ms": "1"}), "log.retention.ms", "retention.ms")
    refused(lambda: validate_topic_config({"retention.mss": "1"}), "retention.mss", "retention.ms")
    refused(lambda: validate_topic_config({"cleanup.policy": "compact"}), "cleanup.policy")
    refused(lambda: validate_topic_config({"retention.ms": "-2"}), "retention.ms", "'-2'")
    refused(lambda: validate_topic_config({"segment.bytes": "13"}), "segment.bytes", ">= 14")
    refused(lambda: validate_topic_config({"min.insync.replicas": "0"}), "min.insync.replicas")


def test_parse_topic_config_args():
    assert parse_topic_config_args(["retention.ms=5", "flush.messages=1"]) == {"retention.ms": "5",
                                                                               "flush.messages": "1"}
    refused(lambda: parse_topic_config_args(["retention.ms"]), "--config", "'retention.ms'")


def test_every_topic_key_has_a_broker_synonym_and_a_log_config_field():
    fields = set(LogConfig.__dataclass_fields__)
    for k in TOPIC_CONFIG_KEYS:
        assert k.synonym in BROKER_KEYS, k.name
        assert C._LOG_CONFIG_FIELDS[k.name] in fields
    assert set(C._LOG_CONFIG_FIELDS.values()) == fields


def test_log_config_defaults_agree_with_log_config_class():
    assert log_config_for_topic(None) == LogConfig()
    assert log_config_for_topic(cfg()) == LogConfig()
    assert C.topic_defaults() == {k.name: k.default for k in TOPIC_CONFIG_KEYS}


def test_log_config_takes_broker_values_then_topic_overrides():
    b = cfg(log_segment_bytes=2048, log_roll_hours=1, log_retention_minutes=10, log_retention_bytes=99,
            log_flush_interval_messages=7, log_flush_scheduler_interval_ms=3000, log_index_interval_bytes=100,
            message_max_bytes=5000, log_message_timestamp_type="LogAppendTime", min_insync_replicas=2,
            unclean_leader_election_enable="true")
    assert log_config_for_topic(b, {}) == LogConfig(
        segment_bytes=2048, segment_ms=3600000, retention_ms=600000, retention_bytes=99,
        flush_interval_messages=7, flush_interval_ms=3000, index_interval_bytes=100, max_message_bytes=5000,
        message_timestamp_type="LogAppendTime", min_insync_replicas=2, unclean_leader_election_enable=True,
    )
    lc = log_config_for_topic(b, {"segment.bytes": "512", "segment.ms": 60000, "retention.ms": "-1",
                                  "retention.bytes": "1000", "flush.messages": "1", "flush.ms": "0",
                                  "index.interval.bytes": "0", "max.message.bytes": "100",
                                  "message.timestamp.type": "CreateTime", "min.insync.replicas": "3",
                                  "unclean.leader.election.enable": "false"})
    assert lc == LogConfig(
        segment_bytes=512, segment_ms=60000, retention_ms=-1, retention_bytes=1000, flush_interval_messages=1,
        flush_interval_ms=0, index_interval_bytes=0, max_message_bytes=100, message_timestamp_type="CreateTime",
        min_insync_replicas=3, unclean_leader_election_enable=False,
    )
    # the stored (normalized string) form gives the same LogConfig
    overrides = {"segment.bytes": "512", "unclean.leader.election.enable": "TRUE"}
    assert log_config_for_topic(b, validate_topic_config(overrides)) == log_config_for_topic(b, overrides)
    refused(lambda: log_config_for_topic(b, {"segment.bytes": "tiny"}), "segment.bytes", "'tiny'")
    refused(lambda: log_config_for_topic(b, {"log.segment.bytes": "1024"}), "log.segment.bytes", "segment.bytes")


# ---------------------------------------------------------------- reference docs
def test_reference_markdown_lists_every_key_once():
    md = config_reference_markdown()
    for k in BROKER_CONFIG_KEYS + TOPIC_CONFIG_KEYS:
        assert f"| `{k.name}` |" in md
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert len(rows) == len(BROKER_CONFIG_KEYS) + len(TOPIC_CONFIG_KEYS)
    for row in rows:  # 5 columns, pipes in text escaped
        assert row.replace("\\|", "").count("|") == 6, row
    assert "| `broker.id` | *(required)* |" in md
    assert "| `replica.lag.time.max.ms` | `30000` | ms |" in md


def test_kafka_keys_that_do_not_apply_are_ignored_and_others_still_refused():
    from replikafka.broker.config import BrokerConfig, kafka_keys_honoured
    from replikafka.errors import InvalidConfigError

    base = {"broker.id": 1, "log.dirs": "/tmp/x", "zookeeper.connect": "127.0.0.1:2181"}
    cfg = BrokerConfig.from_dict({**base, "num.network.threads": 3, "log.cleaner.enable": "true",
                                  "offsets.topic.replication.factor": 1, "socket.send.buffer.bytes": 1})
    assert cfg.ignored_kafka_keys == ("log.cleaner.enable", "num.network.threads",
                                      "offsets.topic.replication.factor", "socket.send.buffer.bytes")
    assert cfg.with_overrides(["num.replica.fetchers=2"]).get("num.replica.fetchers") == 2
    with pytest.raises(InvalidConfigError, match="did you mean num.network.threads|did you mean num.io.threads"):
        BrokerConfig.from_dict({**base, "num.netwrk.threads": 3})
    honoured = kafka_keys_honoured()
    assert "replica.lag.time.max.ms" in honoured and "num.network.threads" not in honoured


def test_the_readme_lists_every_kafka_key_honoured():
    from pathlib import Path

    from replikafka.broker.config import kafka_keys_honoured

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    missing = [k for k in kafka_keys_honoured() if f"`{k}`" not in readme]
    assert not missing, f"README's Configuration section does not list {missing}"
