"""Topic administration: create, describe, list, delete, add partitions.

An :class:`Admin` may be shared between threads: it holds only a thread-safe
connection pool and metadata cache, and each call is independent.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from replikafka import errors as E
from replikafka.client.client_config import ADMIN_KEYS, accepts_config_dict
from replikafka.client.connection import ConnectionPool, annotated, error_of, parse_bootstrap
from replikafka.client.metadata import BrokerInfo, ClusterMetadata
from replikafka.client.offsets import LATEST, group_by_leader
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import from_pb
from replikafka.records import is_kafka_shaped, parse_schema, schema_to_bytes, validate_topic_name


@dataclass(frozen=True)
class PartitionDescription:
    """One partition of :meth:`Admin.describe_topic`. Offsets are None when
    the leader could not be asked (offline partition or unreachable broker).
    Fields can also be read as ``d["leader"]``."""
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int
    high_watermark: int | None
    log_end_offset: int | None
    log_start_offset: int | None
    error: E.ReplikafkaError | None = None

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @property
    def offline(self) -> bool:
        return self.leader < 0

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TopicDescription:
    """A topic and its partitions; iterating or indexing it yields the
    :class:`PartitionDescription` of each partition in order."""
    name: str
    schema: pa.Schema
    config: dict[str, str]
    partitions: tuple[PartitionDescription, ...]

    @property
    def replication_factor(self) -> int:
        return max((len(p.replicas) for p in self.partitions), default=0)

    def __iter__(self) -> Iterator[PartitionDescription]:
        return iter(self.partitions)

    def __len__(self) -> int:
        return len(self.partitions)

    def __getitem__(self, i: int) -> PartitionDescription:
        return self.partitions[i]


@dataclass(frozen=True)
class ClusterDescription:
    brokers: tuple[BrokerInfo, ...]
    controller_id: int


def _config_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class Admin:
    """Administrative client. ``bootstrap_servers``: ``"host:port[,host:port...]"``.

    Any broker accepts admin requests; retriable failures (broker down, not
    the controller) are retried on another broker within the call's timeout.
    Each mutating call also waits (within its timeout) until every live
    broker's metadata shows the change, so a client created right after sees it.
    ``security``: librdkafka's keys (``security.protocol``, ``ssl.*``, ``sasl.*``).
    """

    @accepts_config_dict("Admin", ADMIN_KEYS)
    def __init__(self, bootstrap_servers: str | Iterable[str], *, request_timeout_ms: int = 30_000,
                 retry_backoff_ms: int = 100,
                 security: Any = None):
        self._bootstrap = parse_bootstrap(bootstrap_servers)
        self._request_timeout_ms = request_timeout_ms
        self._backoff_s = retry_backoff_ms / 1000
        self._security = security
        self._pool = ConnectionPool(security=security)
        self._metadata = ClusterMetadata(self._pool, self._bootstrap, request_timeout_ms=request_timeout_ms,
                                         retry_backoff_ms=retry_backoff_ms)

    # ------------------------------------------------------------ mutations
    def create_topic(self, name: str, partitions: int | None = 1, replication_factor: int | None = 1,
                     schema: Any = None, config: dict[str, Any] | None = None, timeout_ms: int = 30_000,
                     assignment: dict[int, list[int]] | None = None) -> None:
        """Create a topic. ``schema``: None (Kafka shape), a ``pa.Schema``, a Spark
        DDL string or a JSON description; ``partitions`` None = the brokers'
        num.partitions, ``replication_factor`` None or -1 = default.replication.factor;
        ``assignment`` (partition -> broker ids) replaces both."""
        validate_topic_name(name)
        if assignment:
            partitions, replication_factor = len(assignment), len(next(iter(assignment.values())))
        if partitions is None:
            partitions = 0  # the broker's num.partitions
        elif not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise E.InvalidPartitionsError(f"partitions must be a positive integer, got {partitions!r}")
        if replication_factor is None:
            replication_factor = -1
        if (not isinstance(replication_factor, int) or isinstance(replication_factor, bool)
                or (replication_factor < 1 and replication_factor != -1)):
            raise E.InvalidReplicationFactorError(
                f"replication factor must be a positive integer (or -1 for the broker default), got {replication_factor!r}")
        topic_schema = parse_schema(schema)
        request = pb.CreateTopicRequest(
            name=name, partitions=partitions, replication_factor=replication_factor,
            schema=b"" if is_kafka_shaped(topic_schema) else schema_to_bytes(topic_schema),
            config={str(k): _config_value(v) for k, v in (config or {}).items()},
            assignment={int(p): pb.ReplicaList(replicas=list(r)) for p, r in (assignment or {}).items()},
            timeout_ms=timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        self._admin_call("CreateTopic", request, deadline, f"create topic {name!r}")

        def created(t: pb.TopicMetadata | None) -> bool:
            return (t is not None and not t.error.code and len(t.partitions) >= partitions
                    and all(p.leader >= 0 for p in t.partitions))
        self._await_everywhere(name, created, deadline)

    def delete_topic(self, name: str, timeout_ms: int = 30_000) -> None:
        """Delete a topic (needs ``delete.topic.enable`` on the brokers)."""
        validate_topic_name(name)
        deadline = time.monotonic() + timeout_ms / 1000
        self._admin_call("DeleteTopic", pb.DeleteTopicRequest(name=name, timeout_ms=timeout_ms),
                         deadline, f"delete topic {name!r}", final=(E.UnknownTopicOrPartitionError,))
        self._metadata.forget(name)
        self._await_everywhere(name, lambda t: t is None, deadline)

    def create_partitions(self, name: str, total: int, timeout_ms: int = 30_000,
                          assignment: dict[int, list[int]] | None = None, force: bool = False) -> None:
        """Change a topic's partition count to ``total``.

        Growing adds partitions; ``assignment``: the new partitions' replicas
        (listed alone or after the existing partitions', as kafka-topics'
        --replica-assignment). Shrinking removes the highest-numbered ones and
        their data (Kafka never built it: keyed data would move). It is refused
        for a topic partitioned by key unless ``force``: one whose ``key`` column
        holds a non-null key anywhere in its logs (checked here, reading only the
        key column from the leaders; a topic without a ``key`` column is not keyed).
        """
        validate_topic_name(name)
        if not isinstance(total, int) or isinstance(total, bool) or total < 1:
            raise E.InvalidPartitionsError(f"the partition count must be a positive integer, got {total!r}")
        deadline = time.monotonic() + timeout_ms / 1000
        try:
            self._metadata.refresh([name], timeout_ms=timeout_ms)
            before = len(self._metadata.partitions_for(name))
        except E.ReplikafkaError:
            before = 0
        if 0 < total < before and not force:
            keyed = self._first_keyed_partition(name, before)
            if keyed is not None:
                raise E.InvalidPartitionsError(
                    f"topic {name!r} is partitioned by key (partition {keyed} holds records with a non-null "
                    f"key): removing partitions would move keys to other partitions, so records of one key "
                    f"would no longer be in one partition, in order. Give --force (force=True) to remove "
                    f"partitions {total}..{before - 1} and their data anyway")
        self._admin_call("CreatePartitions",
                         pb.CreatePartitionsRequest(name=name, total_count=total, timeout_ms=timeout_ms,
                                                    assignment={int(p): pb.ReplicaList(replicas=list(r))
                                                                for p, r in (assignment or {}).items()}),
                         deadline, f"change the partition count of {name!r}",
                         final=(E.UnknownTopicOrPartitionError, E.InvalidPartitionsError))

        def grown(t: pb.TopicMetadata | None) -> bool:  # the new partitions have leaders
            return (t is not None and len(t.partitions) >= total
                    and all(p.leader >= 0 for p in t.partitions if p.partition >= before))

        def shrunk(t: pb.TopicMetadata | None) -> bool:
            return t is not None and len(t.partitions) == total
        self._await_everywhere(name, shrunk if total < before else grown, deadline)

    def _first_keyed_partition(self, name: str, partitions: int) -> int | None:
        """The first partition holding a record with a non-null key; None if none does."""
        if "key" not in self._metadata.require_topic(name).schema.names:
            return None
        from replikafka.client.consumer import Consumer
        consumer = Consumer(self._bootstrap, columns=["key"], security=self._security,
                            request_timeout_ms=self._request_timeout_ms)
        try:
            tps = [(name, p) for p in range(partitions)]
            ends = consumer.end_offsets(tps)
            consumer.assign(tps)
            consumer.seek_to_beginning(tps)
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                table = consumer.poll(timeout_ms=1000)
                keyed = table.filter(pc.is_valid(table.column("key"))) if table.num_rows else table
                if keyed.num_rows:
                    return min(keyed.column("partition").to_pylist())
        finally:
            consumer.close()
        return None

    def alter_topic_config(self, name: str, set_config: dict[str, Any] | None = None, delete: Iterable[str] = (),
                           timeout_ms: int = 30_000) -> None:
        """Set (``set_config``) and remove (``delete``) a topic's config overrides,
        as ``kafka-configs --alter``; the brokers apply them live. Returns once
        every live broker's metadata shows them (or ``timeout_ms`` passed)."""
        validate_topic_name(name)
        wanted = {str(k): _config_value(v) for k, v in (set_config or {}).items()}
        gone = [str(k) for k in delete]
        if not wanted and not gone:
            raise E.InvalidConfigError("nothing to alter: give configs to set or to delete")
        deadline = time.monotonic() + timeout_ms / 1000
        self._admin_call("AlterConfigs", pb.AlterConfigsRequest(resource_type="topics", name=name, set=wanted,
                                                                delete=gone),
                         deadline, f"alter the config of topic {name!r}", final=(E.UnknownTopicOrPartitionError,))

        def applied(t: pb.TopicMetadata | None) -> bool:
            return (t is not None and all(t.config.get(k) == v for k, v in wanted.items())
                    and not any(k in t.config for k in gone))
        self._await_everywhere(name, applied, deadline)

    def describe_topic_config(self, name: str, timeout_ms: int = 30_000) -> dict[str, tuple[str, str]]:
        """Every topic-level key -> (value, source): ``DYNAMIC_TOPIC_CONFIG`` for
        the topic's overrides, ``DEFAULT_CONFIG`` for the brokers' defaults."""
        validate_topic_name(name)
        response = self._admin_call("DescribeConfigs", pb.DescribeConfigsRequest(resource_type="topics", name=name),
                                    time.monotonic() + timeout_ms / 1000, f"describe the config of topic {name!r}",
                                    final=(E.UnknownTopicOrPartitionError,))
        return {e.name: (e.value, e.source) for e in response.entries}

    def alter_partition_reassignments(self, plan: dict[tuple[str, int], list[int]], timeout_ms: int = 30_000) -> None:
        """Start moving partitions to new replicas ((topic, partition) -> broker
        ids); the controller carries it out. Refused while one is in progress."""
        request = pb.AlterPartitionReassignmentsRequest(partitions=[
            pb.PartitionReplicas(topic=t, partition=p, replicas=list(r)) for (t, p), r in sorted(plan.items())])
        self._admin_call("AlterPartitionReassignments", request, time.monotonic() + timeout_ms / 1000,
                         "start the reassignment", final=(E.UnknownTopicOrPartitionError,))

    def list_partition_reassignments(self, timeout_ms: int = 30_000) -> tuple[dict[tuple[str, int], list[int]], bool]:
        """The reassignment in progress ((topic, partition) -> target replicas,
        empty if none) and whether a preferred leader election is running."""
        r = self._admin_call("ListPartitionReassignments", pb.ListPartitionReassignmentsRequest(),
                             time.monotonic() + timeout_ms / 1000, "list reassignments")
        return {(e.topic, e.partition): list(e.replicas) for e in r.partitions}, r.preferred_election_running

    def elect_preferred_leaders(self, partitions: Iterable[tuple[str, int]], timeout_ms: int = 30_000) -> None:
        """Start a preferred leader election for these partitions (Kafka's ElectLeaders, PREFERRED)."""
        request = pb.ElectLeadersRequest(partitions=[pb.PartitionReplicas(topic=t, partition=p)
                                                     for t, p in sorted(set(partitions))])
        self._admin_call("ElectLeaders", request, time.monotonic() + timeout_ms / 1000,
                         "start the preferred leader election")

    # ------------------------------------------------------------ queries
    def list_topics(self) -> list[str]:
        """Names of all topics, sorted."""
        self._metadata.refresh(all_topics=True)
        return sorted(self._metadata.topics())

    def describe_cluster(self) -> ClusterDescription:
        self._metadata.refresh()
        return ClusterDescription(tuple(self._metadata.brokers()), self._metadata.controller_id)

    def describe_topic(self, name: str) -> TopicDescription:
        """Per partition: leader, replicas, isr, leader_epoch and, from the
        leader, high_watermark, log_end_offset, log_start_offset."""
        validate_topic_name(name)
        self._metadata.refresh([name])
        self._metadata.require_topic(name)
        return self._describe([name])[0]

    def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicDescription]:
        """Describe several topics (all of them when ``names`` is None), sorted by name."""
        if names is None:
            self._metadata.refresh(all_topics=True)
            names = sorted(self._metadata.topics())
        else:
            names = sorted(set(names))
            for n in names:
                validate_topic_name(n)
            self._metadata.refresh(names)
            for n in names:
                self._metadata.require_topic(n)
        return self._describe(names)

    def topic_schema(self, name: str) -> pa.Schema:
        """The topic's own schema (without ``timestamp``)."""
        return self._metadata.require_topic(name).schema

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ internals
    def _describe(self, names: list[str]) -> list[TopicDescription]:
        topics = [self._metadata.require_topic(n) for n in names]
        tps = [(t.name, p) for t in topics for p in t.partitions]
        offsets = self._latest_offsets(tps)
        out = []
        for t in topics:
            parts = []
            for p, info in t.partitions.items():
                r = offsets.get((t.name, p))
                parts.append(PartitionDescription(
                    partition=p, leader=info.leader, replicas=info.replicas, isr=info.isr,
                    leader_epoch=info.leader_epoch,
                    high_watermark=r.high_watermark if r is not None else None,
                    log_end_offset=r.log_end_offset if r is not None else None,
                    log_start_offset=r.log_start_offset if r is not None else None,
                    error=info.error))
            out.append(TopicDescription(t.name, t.schema, dict(t.config), tuple(parts)))
        return out

    def _latest_offsets(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], pb.ListOffsetsPartitionResponse]:
        """One ListOffsets(latest) round per leader; partitions whose leader
        fails to answer are left out (describe shows what it can)."""
        groups, _ = group_by_leader(self._metadata, tps)
        calls = []
        for target, items in groups.items():
            request = pb.ListOffsetsRequest(partitions=[
                pb.ListOffsetsPartition(topic=tp[0], partition=tp[1], timestamp_ms=LATEST, current_leader_epoch=-1)
                for tp, _ in items])
            calls.append((target, self._pool.call_async(target, "ListOffsets", request,
                                                        self._request_timeout_ms / 1000)))
        out = {}
        for target, fut in calls:
            if error_of(fut, target) is not None:
                continue
            for r in fut.result().partitions:
                if not r.error.code:
                    out[(r.topic, r.partition)] = r
        return out

    def _admin_call(self, method: str, request, deadline: float, what: str,
                    final: tuple[type[E.ReplikafkaError], ...] = ()):
        """Send an admin request to some broker; retry retriable failures on
        the next broker until ``deadline``. A timeout is not retried (the change
        may have happened), nor an error of a class in ``final`` (an answer for
        this request, e.g. a missing topic for a delete, as Kafka's admin)."""
        if self._metadata.version == 0:
            # never reached the cluster: a wrong address fails in seconds, naming it
            self._metadata.refresh(timeout_ms=int(max(deadline - time.monotonic(), 0.001) * 1000))
        backoff = self._backoff_s
        last: E.ReplikafkaError | None = None
        while True:
            for target in self._metadata.candidates():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    # The broker itself waits up to the request's timeout_ms.
                    response = self._pool.call(target, method, request, remaining + 5.0)
                except E.ReplikafkaError as exc:
                    err = exc
                else:
                    err = from_pb(response.error)
                    if err is None:
                        return response
                if isinstance(err, (E.RequestTimedOutError, *final)) or not err.retriable:
                    raise annotated(err, what)
                last = err
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise E.KafkaTimeoutError(f"{what}: no broker completed it in time"
                                          + (f"; last error: {last}" if last else ""))
            time.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, 1.0)
            try:
                self._metadata.refresh(timeout_ms=int(max(deadline - time.monotonic(), 0.001) * 1000))
            except E.BrokerNotAvailableError as exc:
                last = exc

    def _await_everywhere(self, name: str, done: Callable[[pb.TopicMetadata | None], bool],
                          deadline: float) -> None:
        """Wait until every live broker's metadata for ``name`` satisfies
        ``done`` (best effort: gives up silently at ``deadline``; a broker that
        does not answer is not waited for)."""
        try:
            self._metadata.refresh(timeout_ms=int(max(deadline - time.monotonic(), 0.001) * 1000))
        except E.BrokerNotAvailableError:
            return
        pending = {b.target for b in self._metadata.brokers()}
        request = pb.MetadataRequest(topics=[name])
        while pending:
            for target in sorted(pending):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    response = self._pool.call(target, "Metadata", request, min(remaining, 5.0))
                except E.ReplikafkaError:
                    pending.discard(target)
                    continue
                t = next((t for t in response.topics if t.name == name), None)
                if t is not None and t.error.code == E.UnknownTopicOrPartitionError.code:
                    t = None
                if done(t):
                    pending.discard(target)
            if pending:
                time.sleep(min(self._backoff_s, max(deadline - time.monotonic(), 0)))
