"""What this broker knows of the cluster, kept by the controller's UpdateMetadata.

Answers clients' ``Metadata`` requests without touching ZooKeeper. Learns the
controller's plain requests (``broker/replica/messages.py``).
Thread-safe: one lock; readers get copies of small values.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from replikafka.broker.replica import messages as M
from replikafka.protocol import replikafka_pb2 as pb


@dataclass
class TopicEntry:
    schema: bytes
    config: dict[str, str]
    topic_id: str
    partitions: dict[int, M.PartitionRole] = field(default_factory=dict)


class MetadataCache:
    def __init__(self):
        self.lock = threading.Lock()
        self.brokers: dict[int, tuple[str, int]] = {}
        self.broker_endpoints: dict[int, tuple[str, ...]] = {}   # every advertised listener per broker
        self.broker_epochs: dict[int, int] = {}     # registration czxids (KIP-380), from the controller
        self.controller_id = -1
        self.controller_epoch = -1
        self.topics: dict[str, TopicEntry] = {}
        self.changed = threading.Condition(self.lock)

    def update(self, req: M.UpdateMetadataRequest) -> None:
        with self.lock:
            self.controller_id = req.controller_id
            self.controller_epoch = req.controller_epoch
            if req.live_brokers:
                self.brokers = {b.id: (b.host, b.port) for b in req.live_brokers}
                self.broker_endpoints = {b.id: tuple(b.endpoints) for b in req.live_brokers}
                self.broker_epochs = {b.id: b.broker_epoch for b in req.live_brokers}
            if req.full:
                self.topics = {}
            self._apply_topics(req.topics, req.partitions)
            for t in req.deleted_topics:
                self.topics.pop(t, None)
            self.changed.notify_all()

    def set_topic_config(self, topic: str, config: dict[str, str]) -> None:
        """A topic's config overrides changed (a dynamic config change)."""
        with self.lock:
            entry = self.topics.get(topic)
            if entry is not None:
                entry.config = dict(config)
            self.changed.notify_all()

    def apply_leader_and_isr(self, req: M.LeaderAndIsrRequest) -> None:
        """Our own partitions' states are news too (the UpdateMetadata may come later)."""
        with self.lock:
            self._apply_topics(req.topics, req.partitions)
            self.changed.notify_all()

    def _apply_topics(self, topics: dict[str, M.TopicInfo], partitions: tuple[M.PartitionRole, ...]) -> None:
        for name, t in topics.items():
            entry = self.topics.get(name)
            if entry is None or entry.topic_id != t.topic_id:
                self.topics[name] = TopicEntry(t.schema, dict(t.config), t.topic_id)
            else:
                entry.schema, entry.config = t.schema, dict(t.config)
            entry = self.topics[name]
            if t.partition_count:   # partitions at or past the count were removed (seed 000 H)
                for p in [p for p in entry.partitions if p >= t.partition_count]:
                    del entry.partitions[p]
        for s in partitions:
            entry = self.topics.get(s.topic)
            if entry is None:
                continue
            old = entry.partitions.get(s.partition)
            if old is None or (s.leader_epoch, s.zk_version) >= (old.leader_epoch, old.zk_version) \
                    or s.controller_epoch > old.controller_epoch:
                entry.partitions[s.partition] = s

    def broker_epoch(self, broker_id: int) -> int | None:
        with self.lock:
            return self.broker_epochs.get(broker_id)

    def topic(self, name: str) -> TopicEntry | None:
        with self.lock:
            return self.topics.get(name)

    def topic_names(self) -> list[str]:
        with self.lock:
            return sorted(self.topics)

    def wait_for(self, predicate, timeout_s: float) -> bool:
        with self.lock:
            return self.changed.wait_for(lambda: predicate(self), timeout=timeout_s)

    def metadata_response(self, topics: list[str], all_topics: bool) -> pb.MetadataResponse:
        with self.lock:
            names = sorted(self.topics) if all_topics or not topics else list(topics)
            out = pb.MetadataResponse(controller_id=self.controller_id, brokers=[
                pb.BrokerEndpoint(id=b, host=h, port=p, endpoints=self.broker_endpoints.get(b, ()))
                for b, (h, p) in sorted(self.brokers.items())])
            for name in names:
                entry = self.topics.get(name)
                if entry is None:
                    out.topics.append(pb.TopicMetadata(name=name, error=pb.Error(
                        code="UNKNOWN_TOPIC_OR_PARTITION", message=f"topic {name!r} does not exist")))
                    continue
                tm = pb.TopicMetadata(name=name, schema=entry.schema, config=entry.config)
                for p, s in sorted(entry.partitions.items()):
                    err = pb.Error()
                    if s.leader < 0 or s.leader not in self.brokers:
                        err = pb.Error(code="LEADER_NOT_AVAILABLE", message=f"{name}-{p} has no live leader")
                    tm.partitions.append(pb.PartitionMetadata(partition=p, leader=s.leader,
                                                              leader_epoch=s.leader_epoch, replicas=s.replicas,
                                                              isr=s.isr, error=err))
                out.topics.append(tm)
            return out
