"""Partition removal (seed 000 H) on a real cluster, without Spark: the request
znode written directly, carried out by a controller elected after it was
written (a removal left unfinished resumes on controller failover), and a
broker that was down meanwhile deleting its copy when it starts."""
from __future__ import annotations

import os

import replikafka
from cluster_helpers import wait_until


def _dirs(cluster, topic):
    found = []
    for root, dirs, _files in os.walk(cluster.base_dir):
        found += [os.path.join(root, d) for d in dirs if d.startswith(f"{topic}-") and not d.endswith("-delete")]
    return found


def test_a_removal_written_with_no_controller_running_is_done_by_the_next_one(cluster_factory):
    cluster = cluster_factory(2)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("shrinking", partitions=4, replication_factor=2)
    wait_until(lambda: len(_dirs(cluster, "shrinking")) == 8, 30, what="8 replicas on disk")
    # Every broker down: no controller. The request is written straight into ZooKeeper.
    for b in cluster.ids:
        cluster.stop_broker(b)
    zk = cluster.zk()
    try:
        for p in (2, 3):
            zk.create(f"/admin/partitions_remove/shrinking/{p}", b"", makepath=True)
        # One broker comes back and becomes controller; the other stays down.
        first, second = cluster.ids
        cluster.start_broker(first)
        wait_until(lambda: not zk.exists("/admin/partitions_remove/shrinking"), 60, what="the removal done")
        assert sorted(zk.get_children("/brokers/topics/shrinking/partitions")) == ["0", "1"]
        assert sorted(p.partition for p in replikafka.Admin(cluster.address(first))
                      .describe_topic("shrinking").partitions) == [0, 1]
        on_first = [d for d in _dirs(cluster, "shrinking") if f"broker-{first}" in d]
        assert sorted(os.path.basename(d) for d in on_first) == ["shrinking-0", "shrinking-1"]
        # The broker that was down deletes its copies of the removed partitions at start-up.
        cluster.start_broker(second)
        wait_until(lambda: sorted(os.path.basename(d) for d in _dirs(cluster, "shrinking"))
                   == ["shrinking-0", "shrinking-0", "shrinking-1", "shrinking-1"], 60,
                   what="the removed partitions' logs gone from both brokers")
    finally:
        zk.stop()
        zk.close()
    admin.close()
