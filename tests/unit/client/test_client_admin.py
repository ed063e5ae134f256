"""Admin against the in-process fake broker, and its client-side checks."""
import pyarrow as pa
import pytest

import replikafka
from replikafka import errors as E


def test_create_describe_list_delete_alter(fake):
    with replikafka.Admin(fake.bootstrap) as admin:
        admin.create_topic("events", partitions=3, replication_factor=2, config={"retention.ms": 1000,
                                                                                  "unclean.leader.election.enable": True})
        admin.create_topic("typed", schema="id BIGINT, name STRING")
        assert admin.list_topics() == ["events", "typed"]
        d = admin.describe_topic("events")
        assert d.name == "events" and len(d) == 3 and d.replication_factor == 2
        assert d.config == {"retention.ms": "1000", "unclean.leader.election.enable": "true"}
        p0 = d[0]
        assert (p0.partition, p0.leader, p0.replicas, p0.isr, p0.leader_epoch) == (0, 1, (1, 2), (1, 2), 0)
        assert (p0.high_watermark, p0.log_end_offset, p0["leader"]) == (0, 0, 1)
        assert not p0.under_replicated and not p0.offline
        assert admin.describe_topic("typed").schema == pa.schema([("id", pa.int64()), ("name", pa.string())])
        assert admin.topic_schema("typed").names == ["id", "name"]
        admin.create_partitions("events", 5)
        assert len(admin.describe_topic("events").partitions) == 5
        admin.delete_topic("events")
        assert admin.list_topics() == ["typed"]
        with pytest.raises(E.UnknownTopicOrPartitionError):
            admin.describe_topic("events")
        cluster = admin.describe_cluster()
        assert [b.id for b in cluster.brokers] == [1, 2] and cluster.controller_id == 1


def test_the_kafka_shape_is_sent_as_an_empty_schema(fake):
    with replikafka.Admin(fake.bootstrap) as admin:
        admin.create_topic("plain")
    assert fake.topics["plain"].schema.names == ["key", "value", "headers", "timestamp"]


def test_server_errors_come_back_as_the_error_tree(fake):
    with replikafka.Admin(fake.bootstrap) as admin:
        admin.create_topic("t")
        with pytest.raises(E.TopicExistsError) as info:
            admin.create_topic("t")
        assert "'t'" in str(info.value)


@pytest.mark.parametrize("kwargs, error", [
    (dict(name="bad name!"), E.InvalidTopicError),
    (dict(name="t", partitions=0), E.InvalidPartitionsError),
    (dict(name="t", partitions=-3), E.InvalidPartitionsError),
    (dict(name="t", replication_factor=0), E.InvalidReplicationFactorError),
    (dict(name="t", schema="a NOTATYPE"), E.InvalidSchemaError),
    (dict(name="t", schema="offset BIGINT"), E.InvalidSchemaError),
])
def test_bad_requests_are_refused_before_sending(fake, kwargs, error):
    with replikafka.Admin(fake.bootstrap) as admin:
        with pytest.raises(error):
            admin.create_topic(**kwargs)
    assert fake.topics == {}


def test_no_reachable_broker_is_a_clear_error():
    with replikafka.Admin("127.0.0.1:1", request_timeout_ms=300) as admin:
        with pytest.raises(E.BrokerNotAvailableError) as info:
            admin.list_topics()
    assert "127.0.0.1:1" in str(info.value)


def test_bad_bootstrap_is_refused_at_once():
    with pytest.raises(E.InvalidConfigError):
        replikafka.Admin("localhost")
