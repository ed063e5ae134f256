"""Dynamic topic config (kafka-configs --entity-type topics) against real
brokers: stored in /config/topics/T with a /config/changes notification,
applied live (min.insync.replicas refuses acks=all at once; removed, writes go
through again), shown by `configs --describe` and `topics --describe`."""
from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

import replikafka
from cluster_helpers import wait_until
from replikafka import errors as E

pytestmark = pytest.mark.integration


def cli(*args):
    return subprocess.run([sys.executable, "-m", "replikafka", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def one_value(v: bytes) -> pa.RecordBatch:
    return pa.record_batch([pa.array([v])], names=["value"])


def test_configs_alter_describe_and_live_application(cluster3, kazoo_client):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("dyn", partitions=1, replication_factor=3)
    base = ["configs", "--bootstrap-server", bs, "--entity-type", "topics", "--entity-name", "dyn"]

    r = cli(*base, "--alter", "--add-config", "min.insync.replicas=4,retention.ms=3600000")
    assert r.returncode == 0 and "Completed updating config for topic dyn." in r.stdout, r.stderr
    stored = json.loads(kazoo_client.get("/config/topics/dyn")[0])["config"]
    assert stored["min.insync.replicas"] == "4" and stored["retention.ms"] == "3600000"
    changes = [json.loads(kazoo_client.get(f"/config/changes/{c}")[0])
               for c in kazoo_client.get_children("/config/changes")]
    assert {"version": 2, "entity_path": "topics/dyn"} in changes

    # live: the leader refuses acks=all below min.insync.replicas=4 (3 replicas), no restart
    with replikafka.Producer(bs, acks="all", delivery_timeout_ms=3000, retry_backoff_ms=100) as p:
        exc = p.send("dyn", one_value(b"x"), partition=0).exception(30)
        assert isinstance(exc, (E.NotEnoughReplicasError, E.KafkaTimeoutError)), exc
        assert "NOT_ENOUGH_REPLICAS" in str(exc)

    r = cli(*base, "--describe")
    assert r.returncode == 0, r.stderr
    assert "min.insync.replicas=4" in r.stdout and "retention.ms=3600000" in r.stdout
    assert "segment.bytes" not in r.stdout  # only overrides without --all
    r = cli(*base, "--describe", "--all")
    assert "segment.bytes=" in r.stdout and "DEFAULT_CONFIG" in r.stdout
    r = cli("topics", "--bootstrap-server", bs, "--describe", "--topic", "dyn")
    assert "min.insync.replicas=4" in r.stdout, r.stdout

    r = cli(*base, "--alter", "--delete-config", "min.insync.replicas")
    assert r.returncode == 0, r.stderr
    with replikafka.Producer(bs, acks="all") as p:
        assert p.send("dyn", one_value(b"y"), partition=0).result(30).base_offset == 0
    assert admin.describe_topic_config("dyn")["min.insync.replicas"][1] == "DEFAULT_CONFIG"

    r = cli(*base, "--alter", "--add-config", "retention.mss=5")
    assert r.returncode == 1 and "did you mean retention.ms" in r.stderr, r.stderr
    r = cli("configs", "--bootstrap-server", bs, "--entity-type", "topics", "--entity-name", "nosuch",
            "--alter", "--add-config", "retention.ms=5")
    assert r.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in r.stderr
    admin.close()
