"""Kafka 3.x command-line habits against a real cluster: kafka-topics' flags
(--replica-assignment, optional --partitions/--replication-factor,
--under-min-isr-partitions, --at-min-isr-partitions, --topics-with-overrides)
and the console tools' --property print.headers, --producer-property,
--consumer-property."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

import replikafka
from replikafka.records import HEADER_TYPE

pytestmark = pytest.mark.integration


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "replikafka", *args], capture_output=True, text=True, timeout=120,
                          input=stdin)


def test_kafka_topics_flags(cluster3):
    bs = cluster3.bootstrap_servers
    t = ["topics", "--bootstrap-server", bs]
    r = cli(*t, "--create", "--topic", "placed", "--replica-assignment", "1:2,2:3,3:1")
    assert r.returncode == 0, r.stderr
    r = cli(*t, "--alter", "--topic", "placed", "--partitions", "4", "--replica-assignment", "1:2,2:3,3:1,2:1")
    assert r.returncode == 0, r.stderr
    admin = replikafka.Admin(bs)
    assert [p.replicas for p in admin.describe_topic("placed").partitions] == [(1, 2), (2, 3), (3, 1), (2, 1)]

    r = cli(*t, "--create", "--topic", "defaults")  # num.partitions / default.replication.factor of the brokers
    assert r.returncode == 0, r.stderr
    d = admin.describe_topic("defaults")
    assert len(d.partitions) == 1 and len(d.partitions[0].replicas) == 1  # LocalCluster: num.partitions=1, RF 1

    r = cli(*t, "--create", "--topic", "strict", "--partitions", "1", "--replication-factor", "2",
            "--config", "min.insync.replicas=2")
    assert r.returncode == 0, r.stderr
    r = cli(*t, "--describe", "--topics-with-overrides")
    assert "Topic: strict" in r.stdout and "Topic: placed" not in r.stdout and "\tPartition: " not in r.stdout
    r = cli(*t, "--describe", "--at-min-isr-partitions")
    assert "Topic: strict\tPartition: 0" in r.stdout and "placed" not in r.stdout, r.stdout
    r = cli(*t, "--describe", "--under-min-isr-partitions")
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout
    r = cli(*t, "--create", "--topic", "x", "--replica-assignment", "1:1")
    assert r.returncode == 2 and "names a broker twice" in r.stderr
    admin.close()


def test_console_tools_print_headers_and_take_client_properties(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("h", partitions=1, replication_factor=1)
    with replikafka.Producer(bs) as p:
        headers = pa.array([[{"key": "trace", "value": b"abc"}], None], HEADER_TYPE)
        p.send("h", pa.record_batch([pa.array([b"k1", b"k2"]), pa.array([b"v1", b"v2"]), headers],
                                    names=["key", "value", "headers"]), partition=0).result(30)
    r = cli("console-producer", "--bootstrap-server", bs, "--topic", "h", "--producer-property", "batch.size=65536",
            "--producer-property", "enable.idempotence=false", stdin="v3\n")
    assert r.returncode == 0, r.stderr
    r = cli("console-producer", "--bootstrap-server", bs, "--topic", "h", "--producer-property", "batch.sise=1",
            stdin="v4\n")
    assert r.returncode != 0 and "did you mean batch.size" in r.stderr, r.stderr
    r = cli("console-consumer", "--bootstrap-server", bs, "--topic", "h", "--from-beginning", "--max-messages", "3",
            "--property", "print.headers=true", "--property", "print.key=true",
            "--consumer-property", "max.partition.fetch.bytes=1048576")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["trace:abc\tk1\tv1", "NO_HEADERS\tk2\tv2", "NO_HEADERS\tnull\tv3"], r.stdout
    admin.close()
