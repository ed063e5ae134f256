"""Limits on everything that arrives from the wire, checked in one place.

Every entry point (client and admin RPCs, the controller's LeaderAndIsr /
UpdateMetadata / StopReplica, the metadata cache, log directory loading) asks
this module whether a name, a count or an entry is legal, so one rule holds
everywhere: topic names by Kafka's rule (``records.validate_topic_name``),
partition ids below ``max.partitions.per.topic``, replica lists no longer than
``max.replication.factor`` with distinct non-negative ids, repeated fields no
longer than ``max.request.entries``. Pure functions over protobuf messages; no
I/O, thread-safe.
"""
from __future__ import annotations

from dataclasses import dataclass

from replikafka import errors as E
from replikafka import records as R
from replikafka.protocol import replikafka_pb2 as pb

PORT_MAX = 65535


@dataclass(frozen=True, slots=True)
class WireLimits:
    partitions_per_topic_max: int = 100_000
    replication_factor_max: int = 32
    request_entries_max: int = 1_000_000

    @classmethod
    def from_config(cls, config) -> "WireLimits":
        return cls(config.get("max.partitions.per.topic"), config.get("max.replication.factor"),
                   config.get("max.request.entries"))


def check_request_entries(request, limits: WireLimits) -> None:
    """Every repeated or map field of ``request`` holds at most ``max.request.entries``
    entries (a few field lookups per request; the lists inside entries, replicas and ISRs,
    are bounded by max.replication.factor where they are read)."""
    _check_lengths(request, limits, type(request).__name__, depth=1)


def _check_lengths(msg, limits: WireLimits, where: str, depth: int) -> None:
    for field, value in msg.ListFields():
        if not field.is_repeated:
            continue
        if len(value) > limits.request_entries_max:
            raise E.InvalidRequestError(f"{where}.{field.name} has {len(value)} entries, over max.request.entries "
                                        f"{limits.request_entries_max}")
        if depth > 1 and field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value:
                _check_lengths(item, limits, f"{where}.{field.name}", depth - 1)


def check_partition_count(topic: str, count: int, limits: WireLimits) -> None:
    if count < 1 or count > limits.partitions_per_topic_max:
        raise E.InvalidPartitionsError(f"topic {topic!r}: {count} partitions is not within 1.."
                                       f"{limits.partitions_per_topic_max} (max.partitions.per.topic)")


def check_replication_factor(topic: str, rf: int, limits: WireLimits) -> None:
    if rf < 1 or rf > limits.replication_factor_max:
        raise E.InvalidReplicationFactorError(f"topic {topic!r}: replication factor {rf} is not within 1.."
                                              f"{limits.replication_factor_max} (max.replication.factor)")


def check_partition_id(topic: str, partition: int, limits: WireLimits) -> None:
    if partition < 0 or partition >= limits.partitions_per_topic_max:
        raise E.UnknownTopicOrPartitionError(f"{topic}-{partition}: partition ids are 0.."
                                             f"{limits.partitions_per_topic_max - 1} (max.partitions.per.topic)")


def check_replica_list(what: str, replicas, limits: WireLimits, allow_empty: bool = False) -> None:
    ids = list(replicas)
    if not ids and not allow_empty:
        raise E.InvalidReplicationFactorError(f"{what}: empty replica list")
    if len(ids) > limits.replication_factor_max:
        raise E.InvalidReplicationFactorError(f"{what}: {len(ids)} replicas, over max.replication.factor "
                                              f"{limits.replication_factor_max}")
    if any(b < 0 for b in ids) or len(set(ids)) != len(ids):
        raise E.InvalidReplicationFactorError(f"{what}: replicas {ids} must be distinct broker ids >= 0")


def check_topic_partition(topic: str, partition: int, limits: WireLimits) -> None:
    R.validate_topic_name(topic)
    check_partition_id(topic, partition, limits)


def partition_state_errors(states, limits: WireLimits) -> list[E.ReplikafkaError | None]:
    """:func:`partition_state_error` of each of ``states`` (a request's), in one pass:
    each distinct topic name and replica list is checked once, and an entry's name is
    formatted only when it is refused. A failover's LeaderAndIsr and UpdateMetadata name
    up to every partition, and at scale those take few values (one topic, a handful of
    replica orders): checking each entry as if alone cost ~9 us of the broker's GIL,
    0.3 s for 33,333 entries."""
    topic_errors: dict[str, E.ReplikafkaError | None] = {}
    legal_lists: set[tuple[int, ...]] = set()    # replica lists (replicas or ISRs) found legal
    partitions_max = limits.partitions_per_topic_max
    out: list[E.ReplikafkaError | None] = []
    for s in states:
        topic, partition = s.topic, s.partition
        err = topic_errors.get(topic, False)
        if err is False:
            try:
                R.validate_topic_name(topic)
                err = None
            except E.ReplikafkaError as exc:
                err = exc
            topic_errors[topic] = err
        if err is None:
            replicas, isr = tuple(s.replicas), tuple(s.isr)
            if not 0 <= partition < partitions_max or replicas not in legal_lists or isr not in legal_lists \
                    or s.leader < -1 or s.leader_epoch < -1:
                err = partition_state_error(s, limits)
                if err is None:
                    legal_lists.update((replicas, isr))
        out.append(err)
    return out


def partition_state_error(s: pb.PartitionState, limits: WireLimits) -> E.ReplikafkaError | None:
    """Why a controller's PartitionState is not legal, or None."""
    try:
        check_topic_partition(s.topic, s.partition, limits)
        where = f"{s.topic}-{s.partition}"
        check_replica_list(f"{where} replicas", s.replicas, limits, allow_empty=True)
        check_replica_list(f"{where} isr", s.isr, limits, allow_empty=True)
        if s.leader < -1 or s.leader_epoch < -1:
            raise E.InvalidRequestError(f"{where}: leader {s.leader} epoch {s.leader_epoch} is not legal")
    except E.ReplikafkaError as exc:
        return exc
    return None


def topic_info_error(t: pb.TopicInfo, limits: WireLimits) -> E.ReplikafkaError | None:
    """Why a controller's TopicInfo is not legal, or None (the schema must parse)."""
    try:
        R.validate_topic_name(t.name)
        if t.partition_count:
            check_partition_count(t.name, t.partition_count, limits)
        if t.schema:
            R.schema_from_bytes(t.schema)
    except E.ReplikafkaError as exc:
        return exc
    return None


def endpoint_error(b: pb.BrokerEndpoint) -> E.ReplikafkaError | None:
    if b.id < 0 or not b.host or not 0 < b.port <= PORT_MAX:
        return E.InvalidRequestError(f"broker endpoint {b.id} {b.host!r}:{b.port} is not legal")
    return None
