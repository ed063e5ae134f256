"""The reassignment and election commands' view of the cluster over its RPCs.

``reassign-partitions`` and ``preferred-replica-election`` read and write a
narrow "store": topics, assignments, partition states, live brokers, the
pending reassignment and election. With ``--zookeeper`` that is
:class:`replikafka.broker.zk_store.ZkStore`; with ``--bootstrap-server`` (as
Kafka 3.x) it is :class:`AdminRpcStore`, the same methods answered by a
broker through Metadata, AlterPartitionReassignments,
ListPartitionReassignments and ElectLeaders, so the commands hold one logic.
"""
from __future__ import annotations

from types import SimpleNamespace

from replikafka.errors import UnknownTopicOrPartitionError


class AdminRpcStore:
    """The store methods the commands use, over an :class:`replikafka.Admin`."""

    def __init__(self, admin):
        self.admin = admin

    # ---- reads (Metadata)
    def list_topics(self) -> list[str]:
        return self.admin.list_topics()

    def _topic(self, topic: str):
        try:
            return self.admin.describe_topic(topic)
        except UnknownTopicOrPartitionError:  # reads as absent, as a missing znode
            return None

    def get_assignment(self, topic: str) -> dict[int, list[int]] | None:
        t = self._topic(topic)
        return None if t is None else {p.partition: list(p.replicas) for p in t.partitions}

    def get_partition_state(self, topic: str, partition: int):
        t = self._topic(topic)
        part = next((p for p in t.partitions if p.partition == partition), None) if t else None
        return None if part is None else (SimpleNamespace(leader=part.leader, isr=list(part.isr)), -1)

    def get_partition_states(self, tps):
        out = {}
        for topic in sorted({t for t, _ in tps}):
            t = self._topic(topic)
            for p in (t.partitions if t else ()):
                if (topic, p.partition) in tps:
                    out[(topic, p.partition)] = (SimpleNamespace(leader=p.leader, isr=list(p.isr)), -1)
        return out

    def live_brokers(self) -> dict[int, tuple[str, int]]:
        return {b.id: (b.host, b.port) for b in self.admin.describe_cluster().brokers}

    # ---- admin requests
    def create_reassignment(self, plan) -> None:
        self.admin.alter_partition_reassignments(plan)

    def get_reassignment(self) -> dict[tuple[str, int], list[int]]:
        return self.admin.list_partition_reassignments()[0]

    def create_preferred_election(self, tps) -> None:
        self.admin.elect_preferred_leaders(tps)

    def get_preferred_election(self):
        return [] if self.admin.list_partition_reassignments()[1] else None


def open_store(args):
    """A context manager giving the store for ``--bootstrap-server`` (over RPCs)
    or ``--zookeeper`` (ZooKeeper directly), whichever the command was given."""
    import contextlib

    @contextlib.contextmanager
    def store():
        if getattr(args, "bootstrap_server", None):
            from replikafka.cli.topics_cmd import admin_for
            with admin_for(args) as admin:
                yield AdminRpcStore(admin)
        else:
            from replikafka.broker.zk_store import ZkStore
            from replikafka.cli.zk_session import zk_session
            with zk_session(args.zookeeper) as zk:
                yield ZkStore(zk)
    return store()
