"""Partitions removed from a topic under a running streaming query (issue 16,
item 4; seed 000 H), through the CLI, a real cluster and a real SparkSession.

``topics --alter --partitions N`` to fewer partitions is refused for a topic
partitioned by key (these records all have keys) unless ``--force``; the
controller then removes the highest-numbered partitions (StopReplica with
delete, then the znodes). The stream sees them as gone: data loss, which fails
it with ``failOnDataLoss`` (the default) and is skipped without.
"""
from __future__ import annotations

import os
import time

import pytest

from replikafka.cli.main import main as cli

from test_spark_recreated_topic import Collected, stream

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def shrink(bootstrap, topic, n, *flags) -> int:
    return cli(["topics", "--bootstrap-server", bootstrap, "--alter", "--topic", topic, "--partitions", str(n),
                *flags])


def wait_rows(sink, n, q, timeout_s=90):
    deadline = time.time() + timeout_s
    while len(sink.rows) < n and time.time() < deadline and q.exception() is None:
        time.sleep(0.3)


def test_keyed_topic_refused_without_force_then_removed_under_a_failing_stream(spark, bootstrap, topics,
                                                                            checkpoint, capsys):
    t = topics.new(3)
    topics.fill(t, {0: 10, 1: 10, 2: 10})
    sink = Collected()
    q = (stream(spark, bootstrap, t).writeStream.foreachBatch(sink)
         .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        assert len(sink.rows) == 30
        # Keyed: refused, saying why, and nothing changes.
        assert shrink(bootstrap, t, 1) != 0
        err = capsys.readouterr().err
        assert "partitioned by key" in err and "--force" in err, err
        assert len(topics.admin.describe_topic(t).partitions) == 3
        # Forced: partitions 1 and 2 go with their data.
        assert shrink(bootstrap, t, 1, "--force") == 0
        assert [p.partition for p in topics.admin.describe_topic(t).partitions] == [0]
        topics.fill(t, {0: 5})
        deadline = time.time() + 90
        while q.exception() is None and time.time() < deadline:
            time.sleep(0.3)
        text = str(q.exception())
    finally:
        q.stop()
    assert f"Partitions [{t}-1, {t}-2] are gone" in text and "KAFKA_DATA_LOSS" in text, text
    assert len(sink.rows) == 30


def test_removed_partitions_are_skipped_without_fail_on_data_loss(spark, bootstrap, topics, checkpoint,
                                                                  spark_cluster):
    t = topics.new(3)
    topics.fill(t, {0: 10, 1: 10, 2: 10})
    sink = Collected()
    q = (stream(spark, bootstrap, t, failOnDataLoss="false").writeStream.foreachBatch(sink)
         .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        assert len(sink.rows) == 30
        assert shrink(bootstrap, t, 2, "--force") == 0
        topics.fill(t, {0: 5, 1: 5})
        wait_rows(sink, 40, q)
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    assert sorted(sink.rows) == sorted([(p, i, f"{p}:{i}") for p in (0, 1, 2) for i in range(10)]
                                       + [(p, i, f"{p}:{i}") for p in (0, 1) for i in range(10, 15)])
    # The znodes went, and no broker keeps a log of a removed partition.
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=spark_cluster.zookeeper_connect)
    zk.start(timeout=15)
    try:
        assert sorted(zk.get_children(f"/brokers/topics/{t}/partitions")) == ["0", "1"]
        assert not zk.exists(f"/admin/partitions_remove/{t}")
    finally:
        zk.stop()
        zk.close()
    dirs = _partition_dirs(spark_cluster.base_dir, t)
    assert f"{t}-2" not in dirs and dirs.count(f"{t}-1") == 3, dirs


def _partition_dirs(base_dir: str, topic: str) -> list[str]:
    found = []
    for _root, dirs, _files in os.walk(base_dir):
        found += [d for d in dirs if d.startswith(f"{topic}-")]
    return found
