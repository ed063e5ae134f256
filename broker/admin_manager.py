"""Admin requests any broker accepts: create/delete topics, add partitions,
alter/describe topic configs, producer ids. They are validated here and written to ZooKeeper; the
controller, watching those paths, does the rest. The request then waits
(bounded) until this broker's metadata shows the result.
"""
from __future__ import annotations

import logging
import threading
import uuid

from replikafka import errors as E
from replikafka import records as R
from replikafka.broker import wire_limits as W
from replikafka.broker.config import TOPIC_KEYS, topic_defaults, validate_topic_config
from replikafka.broker.controller.controller import random_assignment
from replikafka.protocol import replikafka_pb2 as pb

log = logging.getLogger("replikafka.admin")
TIMEOUT_MS_MAX = 120_000


class AdminManager:
    def __init__(self, config, store, metadata):
        self.config = config
        self.store = store
        self.metadata = metadata
        self.limits = W.WireLimits.from_config(config)
        self.pid_lock = threading.Lock()
        self.pid_next = 0
        self.pid_end = 0

    def _timeout_s(self, timeout_ms: int) -> float:
        return min(timeout_ms if timeout_ms > 0 else 30_000, TIMEOUT_MS_MAX) / 1000.0

    def create_topic(self, req: pb.CreateTopicRequest) -> None:
        R.validate_topic_name(req.name)
        if req.partitions == 0 and not req.assignment:
            n = self.config.get("num.partitions")
        else:
            n = req.partitions
        if n <= 0 and not req.assignment:
            raise E.InvalidPartitionsError(f"topic {req.name!r}: number of partitions must be at least 1, got {n}")
        rf = req.replication_factor if req.replication_factor != -1 else self.config.get("default.replication.factor")
        if rf == 0 and not req.assignment:
            rf = self.config.get("default.replication.factor")
        if req.assignment:
            W.check_partition_count(req.name, len(req.assignment), self.limits)
            for p, r in req.assignment.items():
                W.check_replica_list(f"topic {req.name!r} partition {p}", r.replicas, self.limits)
        else:
            W.check_partition_count(req.name, n, self.limits)
            W.check_replication_factor(req.name, rf, self.limits)
        topic_schema = R.parse_schema(req.schema or None)
        cfg = validate_topic_config(dict(req.config))
        cfg["topic.id"] = uuid.uuid4().hex
        if self.store.get_assignment(req.name) is not None:
            raise E.TopicExistsError(f"topic {req.name!r} already exists")
        if req.name in self.store.topics_pending_deletion():
            raise E.TopicExistsError(f"topic {req.name!r} is being deleted; try again shortly")
        live = sorted(self.store.live_brokers())
        if req.assignment:
            assignment = {p: list(r.replicas) for p, r in req.assignment.items()}
            if sorted(assignment) != list(range(len(assignment))):
                raise E.InvalidPartitionsError(f"topic {req.name!r}: explicit assignment must cover partitions 0..n-1")
            for p, reps in assignment.items():
                bad = [b for b in reps if b not in live]
                if not reps or len(set(reps)) != len(reps) or bad:
                    raise E.InvalidReplicationFactorError(
                        f"topic {req.name!r} partition {p}: replicas {reps} must be distinct live brokers {live}")
        else:
            if rf <= 0:
                raise E.InvalidReplicationFactorError(f"replication factor must be at least 1, got {rf}")
            assignment = random_assignment(n, rf, live)
        stored = R.stored_schema(topic_schema)
        self.store.create_topic(req.name, assignment, R.schema_to_bytes(stored), cfg)
        log.info("topic %s created: %s", req.name, assignment)
        want = len(assignment)
        ok = self.metadata.wait_for(
            lambda m: (t := m.topics.get(req.name)) is not None and len(t.partitions) >= want
            and all(s.leader >= 0 for s in t.partitions.values()), self._timeout_s(req.timeout_ms))
        if not ok:
            raise E.RequestTimedOutError(
                f"topic {req.name!r} was created but not every partition has a leader yet")

    def delete_topic(self, req: pb.DeleteTopicRequest) -> None:
        if not self.config.get("delete.topic.enable"):
            raise E.TopicDeletionDisabledError("delete.topic.enable is false on this cluster")
        R.validate_topic_name(req.name)
        if self.store.get_assignment(req.name) is None:
            raise E.UnknownTopicOrPartitionError(f"topic {req.name!r} does not exist")
        self.store.request_topic_deletion(req.name)
        ok = self.metadata.wait_for(lambda m: req.name not in m.topics, self._timeout_s(req.timeout_ms))
        if not ok:
            raise E.RequestTimedOutError(f"deletion of topic {req.name!r} was requested but has not finished")

    def create_partitions(self, req: pb.CreatePartitionsRequest) -> None:
        R.validate_topic_name(req.name)
        assignment = self.store.get_assignment(req.name)
        if assignment is None:
            raise E.UnknownTopicOrPartitionError(f"topic {req.name!r} does not exist")
        current = len(assignment)
        W.check_partition_count(req.name, req.total_count, self.limits)
        if req.total_count == current:
            raise E.InvalidPartitionsError(f"topic {req.name!r} already has {current} partitions")
        if req.total_count < current:
            if req.assignment:
                raise E.InvalidPartitionsError(f"topic {req.name!r}: an assignment cannot come with fewer "
                                               f"partitions ({req.total_count} < {current})")
            self._remove_partitions(req, current)
            return
        rf = len(assignment[0])
        live = sorted(self.store.live_brokers())
        if req.assignment:
            extra = self._explicit_new_partitions(req, current, live)
        else:
            extra = random_assignment(req.total_count - current, rf, live, first_partition=current)
        # Only the new partitions, on the znode's version: a reassignment's AR writes stay.
        self.store.update_assignment(req.name, extra)
        ok = self.metadata.wait_for(
            lambda m: (t := m.topics.get(req.name)) is not None and len(t.partitions) >= req.total_count,
            self._timeout_s(req.timeout_ms))
        if not ok:
            raise E.RequestTimedOutError(f"partitions of {req.name!r} were added but have no leader yet")

    # ---- dynamic configs (kafka-configs); users' SCRAM credentials are written by the configs tool
    def _topic_overrides(self, resource_type: str, name: str) -> dict[str, str]:
        if resource_type != "topics":
            raise E.InvalidRequestError(f"configs of entity type {resource_type!r} are not served over the "
                                        f"cluster's RPCs (entity type topics is)")
        R.validate_topic_name(name)
        found = self.store.get_topic_config(name)
        if found is None or self.store.get_assignment(name) is None:
            raise E.UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return found[0]

    def alter_configs(self, req: pb.AlterConfigsRequest) -> None:
        """Set and delete a topic's overrides in ``/config/topics/T`` plus a change
        notification; every broker applies them live (see BrokerServer's config
        change work). Unknown keys and bad values are refused, naming the key."""
        current = self._topic_overrides(req.resource_type, req.name)
        for key in req.delete:
            if key not in TOPIC_KEYS:
                validate_topic_config({key: ""})  # raises, naming it and the closest key
        both = set(req.set) & set(req.delete)
        if both:
            raise E.InvalidConfigError(f"config {sorted(both)[0]!r} is both added and deleted")
        updated = {k: v for k, v in current.items() if k not in req.delete}
        updated.update(validate_topic_config(dict(req.set)))
        self.store.set_topic_config(req.name, updated)
        log.info("topic %s config overrides now %s", req.name,
                 {k: v for k, v in updated.items() if k != "topic.id"})

    def describe_configs(self, req: pb.DescribeConfigsRequest) -> list[pb.ConfigEntry]:
        """Every topic-level key: the topic's override, else the broker's default."""
        overrides = self._topic_overrides(req.resource_type, req.name)
        out = []
        for key, default in topic_defaults(self.config).items():
            if key in overrides:
                out.append(pb.ConfigEntry(name=key, value=overrides[key], source="DYNAMIC_TOPIC_CONFIG"))
            else:
                out.append(pb.ConfigEntry(name=key, value=TOPIC_KEYS[key].format(default), source="DEFAULT_CONFIG"))
        return out

    def _remove_partitions(self, req: pb.CreatePartitionsRequest, current: int) -> None:
        """A count below the current one removes the highest-numbered partitions
        (seed 000 H) through ``/admin/partitions_remove``; the controller does it.
        Whether keyed data allows it is the caller's check (Admin.create_partitions)."""
        self.store.request_partition_removal(req.name, list(range(req.total_count, current)))
        log.info("removal of partitions %d..%d of %s requested", req.total_count, current - 1, req.name)
        ok = self.metadata.wait_for(
            lambda m: (t := m.topics.get(req.name)) is not None and len(t.partitions) <= req.total_count,
            self._timeout_s(req.timeout_ms))
        if not ok:
            raise E.RequestTimedOutError(f"removal of partitions of {req.name!r} was requested but has not "
                                         f"finished")

    @staticmethod
    def _explicit_new_partitions(req: pb.CreatePartitionsRequest, current: int, live: list[int]) -> dict[int, list[int]]:
        """The new partitions' replicas from ``req.assignment``: listed alone, or
        for every partition (kafka-topics --alter --replica-assignment; the
        existing ones are dropped)."""
        given = [list(req.assignment[p].replicas) for p in sorted(req.assignment)]
        if len(given) == req.total_count:
            given = given[current:]
        if len(given) != req.total_count - current:
            raise E.InvalidPartitionsError(
                f"topic {req.name!r}: the assignment lists {len(req.assignment)} partitions; expected "
                f"{req.total_count - current} new ones (or all {req.total_count})")
        out = {}
        for i, reps in enumerate(given):
            bad = [b for b in reps if b not in live]
            if not reps or len(set(reps)) != len(reps) or bad:
                raise E.InvalidReplicationFactorError(
                    f"topic {req.name!r} partition {current + i}: replicas {reps} must be distinct live brokers {live}")
            out[current + i] = reps
        return out

    # ---- reassignment and preferred election: the same znodes the ZooKeeper tools write
    def alter_partition_reassignments(self, req: pb.AlterPartitionReassignmentsRequest) -> None:
        """Write ``/admin/reassign_partitions`` (the controller carries it out);
        refused while one is in progress. Partitions and brokers are checked."""
        plan = {(e.topic, e.partition): list(e.replicas) for e in req.partitions}
        if not plan:
            raise E.InvalidRequestError("the reassignment lists no partitions")
        for (t, p), reps in plan.items():
            W.check_topic_partition(t, p, self.limits)
            W.check_replica_list(f"{t}-{p}", reps, self.limits)
            if p not in (self.store.get_assignment(t) or {}):
                raise E.UnknownTopicOrPartitionError(f"partition {t}-{p} does not exist")
            if not reps or len(set(reps)) != len(reps):
                raise E.InvalidReplicationFactorError(f"{t}-{p}: replicas {reps} must be distinct broker ids")
        self.store.create_reassignment(plan)

    def list_partition_reassignments(self) -> pb.ListPartitionReassignmentsResponse:
        pending = self.store.get_reassignment()
        return pb.ListPartitionReassignmentsResponse(
            partitions=[pb.PartitionReplicas(topic=t, partition=p, replicas=r) for (t, p), r in sorted(pending.items())],
            preferred_election_running=self.store.get_preferred_election() is not None)

    def elect_leaders(self, req: pb.ElectLeadersRequest) -> None:
        """Write ``/admin/preferred_replica_election`` for these partitions."""
        tps = [(e.topic, e.partition) for e in req.partitions]
        if not tps:
            raise E.InvalidRequestError("the election lists no partitions")
        assignments: dict[str, dict | None] = {}
        for t, p in tps:
            W.check_topic_partition(t, p, self.limits)
            if t not in assignments:
                assignments[t] = self.store.get_assignment(t)
            if p not in (assignments[t] or {}):
                raise E.UnknownTopicOrPartitionError(f"partition {t}-{p} does not exist")
        self.store.create_preferred_election(tps)

    def init_producer_id(self) -> tuple[int, int]:
        with self.pid_lock:
            if self.pid_next >= self.pid_end:
                self.pid_next, self.pid_end = self.store.allocate_producer_id_block()
            pid = self.pid_next
            self.pid_next += 1
            return pid, 0
