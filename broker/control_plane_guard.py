"""Controller requests checked against ZooKeeper before a broker obeys them.

A LeaderAndIsr, UpdateMetadata or StopReplica names its controller's id and
epoch. The epoch the broker already knows is trusted; an older one is refused
(STALE_CONTROLLER_EPOCH, as before); a newer one is adopted only after
ZooKeeper confirms it: ``/controller_epoch`` holds that epoch and
``/controller`` names that ``controller_id``. Then only the entries ZooKeeper's
assignment knows are applied: partitions of topics ``/brokers/topics`` lists,
with a partition id that topic has, and (UpdateMetadata) live brokers
registered under ``/brokers/ids`` at their registered address. Everything else
is refused per entry, named, and changes nothing. Names and sizes are checked
first, by :mod:`wire_limits`. These checks hold with or without
authentication.

The ZooKeeper reads go through a narrow :class:`ClusterTruth` (tests script
it); the decisions are pure functions. A topic's assignment is read whole
once per znode version and kept (:class:`AssignmentCache`): each request asks
ZooKeeper only for the version, as a stat. Thread-safe: the confirmed epoch
and the kept assignments are under locks.
"""
from __future__ import annotations

import logging
import threading
from typing import Protocol

from replikafka import errors as E
from replikafka.broker import wire_limits as W
from replikafka.broker.zk_store import topic_path
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import to_pb

log = logging.getLogger("replikafka.control_plane")


class ClusterTruth(Protocol):
    """What ZooKeeper says (broker/zk_store.ZkStore has these methods)."""

    def controller_epoch(self) -> tuple[int, int]: ...
    def get_controller_id(self) -> int: ...
    def get_assignment(self, topic: str) -> dict[int, list[int]] | None: ...
    def assignment_version(self, topic: str) -> int | None: ...   # changes with every write; None: no topic
    def live_brokers(self, epochs: dict[int, int] | None = None) -> dict[int, tuple[str, int]]: ...
    def topics_pending_deletion(self) -> list[str]: ...
    def get_reassignment(self) -> dict[tuple[str, int], list[int]]: ...
    def partition_removals(self) -> dict[str, set[int]]: ...


#: Topics whose assignment the guard keeps (all are dropped when one more is read).
ASSIGNMENT_CACHE_TOPICS_MAX = 1000


class ZkClusterTruth:
    """A :class:`ClusterTruth` over a ``broker/zk_store.ZkStore``: its reads, and what
    identifies the current contents of a topic's assignment znode (a stat: no data
    moves)."""

    def __init__(self, store):
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)

    def assignment_version(self, topic: str) -> int | None:
        """The znode's mzxid (None: no such topic). Not its version: a topic deleted
        and created again starts at version 0 again; no two writes share an mzxid."""
        stat = self.store.zk.exists(topic_path(topic))
        return None if stat is None else stat.mzxid


class AssignmentCache:
    """Topic -> (znode version, assignment): a topic's assignment decoded once per
    version. A failover's LeaderAndIsr and UpdateMetadata each re-read and decoded
    the whole assignment (50,000 partitions: a megabyte of JSON, ~0.3 s of a
    survivor's GIL each, while it should be taking up its new leaders). The version
    is read before the data, so what is kept is never older than the version it is
    kept under (a write in between only costs a second read). Thread-safe."""

    def __init__(self, truth: ClusterTruth, max_topics: int = ASSIGNMENT_CACHE_TOPICS_MAX):
        self.truth = truth
        self.max_topics = max_topics
        self.lock = threading.Lock()
        self.kept: dict[str, tuple[int, dict[int, list[int]]]] = {}

    def get(self, topic: str) -> dict[int, list[int]] | None:
        version = self.truth.assignment_version(topic)
        if version is None:
            with self.lock:
                self.kept.pop(topic, None)
            return None
        with self.lock:
            kept = self.kept.get(topic)
        if kept is not None and kept[0] == version:
            return kept[1]
        assignment = self.truth.get_assignment(topic)
        if assignment is not None:
            with self.lock:
                if len(self.kept) >= self.max_topics:
                    self.kept.clear()
                self.kept[topic] = (version, assignment)
        return assignment


class ControlPlaneGuard:
    def __init__(self, truth: ClusterTruth, limits: W.WireLimits):
        self.truth = truth
        self.limits = limits
        self.lock = threading.Lock()
        self.confirmed: tuple[int, int] = (-1, -1)    # (controller epoch, controller id) ZooKeeper confirmed
        self.assignments = AssignmentCache(truth)

    def check_controller(self, controller_id: int, controller_epoch: int) -> None:
        """Raise unless (controller_id, controller_epoch) is the controller ZooKeeper names
        (checked there once per new epoch). An older epoch is STALE_CONTROLLER_EPOCH."""
        with self.lock:
            known_epoch, known_id = self.confirmed
            if controller_epoch < known_epoch:
                raise E.StaleControllerEpochError(
                    f"controller epoch {controller_epoch} is older than {known_epoch} already confirmed")
            if (controller_epoch, controller_id) == self.confirmed:
                return
        zk_epoch, _version = self.truth.controller_epoch()
        zk_id = self.truth.get_controller_id()
        if zk_epoch != controller_epoch or zk_id != controller_id:
            if controller_epoch < zk_epoch:
                raise E.StaleControllerEpochError(
                    f"controller {controller_id} epoch {controller_epoch}: ZooKeeper's controller epoch is "
                    f"{zk_epoch} (controller {zk_id})")
            raise E.InvalidRequestError(
                f"refused: the request claims controller {controller_id} epoch {controller_epoch}, ZooKeeper says "
                f"controller {zk_id} epoch {zk_epoch}")
        with self.lock:
            if controller_epoch >= self.confirmed[0]:
                self.confirmed = (controller_epoch, controller_id)

    # ---- per-entry filters ----------------------------------------------------------
    def _assignments(self, topics) -> dict[str, dict[int, list[int]] | None]:
        return {t: self.assignments.get(t) for t in set(topics)}

    def _partition_error(self, topic: str, partition: int, assignments) -> E.ReplikafkaError | None:
        assignment = assignments.get(topic)
        if assignment is None:
            return E.UnknownTopicOrPartitionError(f"topic {topic!r} is not in ZooKeeper's assignment")
        if partition not in assignment:
            return E.UnknownTopicOrPartitionError(f"{topic}-{partition} is not in ZooKeeper's assignment")
        return None

    def filter_leader_and_isr(self, req: pb.LeaderAndIsrRequest) -> tuple[pb.LeaderAndIsrRequest, list]:
        """The request with only the legal entries ZooKeeper knows, and PartitionErrors for the rest."""
        errors: list[pb.PartitionError] = []
        topics = [t for t in req.topics if self._topic_ok(t)]
        malformed = W.partition_state_errors(req.partitions, self.limits)
        assignments = self._assignments([s.topic for s, bad in zip(req.partitions, malformed) if bad is None])
        kept = []
        disjoint: dict[tuple, bool] = {}   # (replicas, ZooKeeper's): they share none (few distinct pairs)
        for s, bad in zip(req.partitions, malformed):
            err = bad or self._partition_error(s.topic, s.partition, assignments)
            if err is None:
                pair = (tuple(s.replicas), tuple(assignments[s.topic][s.partition]))
                shares_none = disjoint.get(pair)
                if shares_none is None:
                    shares_none = disjoint[pair] = sorted(pair[0]) != sorted(pair[1]) and not set(pair[0]) & set(pair[1])
                if shares_none:
                    err = E.InvalidRequestError(f"{s.topic}-{s.partition}: replicas {list(s.replicas)} share none "
                                                f"with ZooKeeper's {assignments[s.topic][s.partition]}")
            if err is None:
                kept.append(s)
            else:
                errors.append(pb.PartitionError(topic=s.topic, partition=s.partition, error=to_pb(err)))
        self._log_refused("LeaderAndIsr", req.controller_id, errors)
        leaders = [b for b in req.live_leaders if W.endpoint_error(b) is None]
        topics = [t for t in topics if t.name in assignments and assignments[t.name] is not None]
        if not errors and len(leaders) == len(req.live_leaders) and len(topics) == len(req.topics):
            return req, errors   # all of it legal: not copied (16,667 entries in a failover's)
        out = pb.LeaderAndIsrRequest(controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                                     broker_epoch=req.broker_epoch, partitions=kept, live_leaders=leaders,
                                     topics=topics)
        return out, errors

    def filter_stop_replica(self, req: pb.StopReplicaRequest, broker_id: int
                            ) -> tuple[pb.StopReplicaRequest, list]:
        """The legal entries, and PartitionErrors for the rest. With ``delete_partitions``
        a replica is deleted only if ZooKeeper agrees it must go: its topic is marked
        for deletion, or ZooKeeper's assignment no longer gives it to ``broker_id``, or
        a running reassignment moves it away (the controller stops the old replicas
        before it writes the final assignment), or a partition removal request names it
        (``/admin/partitions_remove``: the controller deletes the replicas before it
        shrinks the assignment). A forged delete of a live, assigned
        replica is refused and deletes nothing."""
        errors: list[pb.PartitionError] = []
        kept = []
        legal = []
        for ref in req.partitions:
            try:
                W.check_topic_partition(ref.topic, ref.partition, self.limits)
                legal.append(ref)
            except E.ReplikafkaError as exc:
                errors.append(pb.PartitionError(topic=ref.topic, partition=ref.partition, error=to_pb(exc)))
        if req.delete_partitions and legal:
            deleting = set(self.truth.topics_pending_deletion())
            moving = self.truth.get_reassignment()
            removing = self.truth.partition_removals()
            assignments = self._assignments([r.topic for r in legal if r.topic not in deleting])
            for ref in legal:
                tp = (ref.topic, ref.partition)
                assigned = (assignments.get(ref.topic) or {}).get(ref.partition, ())
                if ref.topic in deleting or broker_id not in assigned or \
                        (tp in moving and broker_id not in moving[tp]) or \
                        ref.partition in removing.get(ref.topic, ()):
                    kept.append(ref)
                else:
                    errors.append(pb.PartitionError(topic=ref.topic, partition=ref.partition, error=to_pb(
                        E.InvalidRequestError(f"refused to delete {ref.topic}-{ref.partition}: ZooKeeper still "
                                              f"assigns it to broker {broker_id} ({list(assigned)})"))))
        else:
            kept = legal
        self._log_refused("StopReplica", req.controller_id, errors)
        out = pb.StopReplicaRequest(controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                                    delete_partitions=req.delete_partitions, partitions=kept)
        return out, errors

    def deletable_here(self, broker_id: int, tps: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Of these replicas (that an UpdateMetadata says moved away), the ones ZooKeeper agrees to delete."""
        req = pb.StopReplicaRequest(delete_partitions=True, partitions=[
            pb.TopicPartitionRef(topic=t, partition=p) for t, p in tps])
        kept, _errors = self.filter_stop_replica(req, broker_id)
        return [(r.topic, r.partition) for r in kept.partitions]

    def filter_update_metadata(self, req: pb.UpdateMetadataRequest, cached_topics=()) -> pb.UpdateMetadataRequest:
        """Only legal entries of topics ZooKeeper knows, and only brokers registered there at
        the address and epoch given (a forged request cannot point clients elsewhere). A
        ``full`` update replaces no more than ZooKeeper agrees to: of ``cached_topics`` only
        those ZooKeeper no longer has are dropped (a forged empty one wipes nothing)."""
        epochs: dict[int, int] = {}
        registered = self.truth.live_brokers(epochs=epochs)
        brokers = [b for b in req.live_brokers if W.endpoint_error(b) is None
                   and registered.get(b.id) == (b.host, b.port) and epochs.get(b.id) == b.broker_epoch]
        states = [s for s, bad in zip(req.partitions, W.partition_state_errors(req.partitions, self.limits))
                  if bad is None]
        assignments = self._assignments([s.topic for s in states] + [t.name for t in req.topics
                                                                    if self._topic_ok(t)])
        kept = [s for s in states if self._partition_error(s.topic, s.partition, assignments) is None]
        topics = [t for t in req.topics if self._topic_ok(t) and assignments.get(t.name) is not None]
        dropped = (len(req.live_brokers) - len(brokers), len(req.partitions) - len(kept), len(req.topics) - len(topics))
        if any(dropped):
            log.warning("UpdateMetadata from controller %d: ignored %d brokers, %d partitions, %d topics that "
                        "ZooKeeper does not know (or that are not legal)", req.controller_id, *dropped)
        named = set(req.deleted_topics) | (set(cached_topics) - {t.name for t in topics} if req.full else set())
        deleted = [t for t in sorted(named) if self.assignments.get(t) is None]
        if not any(dropped):
            # All of it legal: the request itself, not a copy of each entry (33,333 in a
            # failover's). Parsed for this call alone, so changing it in place is safe.
            req.full = False
            del req.deleted_topics[:]
            req.deleted_topics.extend(deleted)
            return req
        return pb.UpdateMetadataRequest(controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                                        partitions=kept, live_brokers=brokers, topics=topics,
                                        deleted_topics=deleted, full=False)

    def _topic_ok(self, t: pb.TopicInfo) -> bool:
        return W.topic_info_error(t, self.limits) is None

    @staticmethod
    def _log_refused(what: str, controller_id: int, errors: list) -> None:
        if errors:
            log.warning("%s from controller %d: %d entries refused, first %s-%d: %s", what, controller_id,
                        len(errors), errors[0].topic, errors[0].partition, errors[0].error.message)
