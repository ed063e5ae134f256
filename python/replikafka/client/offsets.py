"""``ListOffsets`` to partition leaders, shared by :class:`Admin` and :class:`Consumer`.

Stateless functions; safe from any thread (they use the thread-safe
:class:`ClusterMetadata` and :class:`ConnectionPool`).
"""
from __future__ import annotations

import time
from typing import Iterable

from replikafka import errors as E
from replikafka.client.connection import ConnectionPool, annotated, error_of
from replikafka.client.metadata import ClusterMetadata, PartitionInfo
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import from_pb

EARLIEST = -2
LATEST = -1

TopicPartition = tuple[str, int]


def group_by_leader(metadata: ClusterMetadata, tps: Iterable[TopicPartition]
                    ) -> tuple[dict[str, list[tuple[TopicPartition, PartitionInfo]]], list[TopicPartition]]:
    """Split partitions by the address of their leader; the second list holds
    partitions without a known live leader. Raises
    :class:`UnknownTopicOrPartitionError` for a partition the topic does not have."""
    groups: dict[str, list[tuple[TopicPartition, PartitionInfo]]] = {}
    leaderless: list[TopicPartition] = []
    for tp in tps:
        topic = metadata.require_topic(tp[0])
        info = topic.partitions.get(tp[1])
        if info is None:
            raise E.UnknownTopicOrPartitionError(
                f"topic {tp[0]!r} has no partition {tp[1]} (it has {len(topic.partitions)})")
        leader = metadata.leader_for(*tp)
        if leader is None:
            leaderless.append(tp)
        else:
            groups.setdefault(leader.target, []).append((tp, info))
    return groups, leaderless


def ensure_partitions(metadata: ClusterMetadata, tps: Iterable[TopicPartition]) -> None:
    """Refresh once if a partition is not in the cache (e.g. just added), then
    raise :class:`UnknownTopicOrPartitionError` for any still missing."""
    tps = list(tps)
    missing = [tp for tp in tps if metadata.partition(*tp) is None]
    if missing:
        metadata.refresh({t for t, _ in missing})
    for t, p in tps:
        topic = metadata.require_topic(t)
        if p not in topic.partitions:
            raise E.UnknownTopicOrPartitionError(
                f"topic {t!r} has no partition {p} (it has {len(topic.partitions)})")


def list_offsets(metadata: ClusterMetadata, pool: ConnectionPool, specs: dict[TopicPartition, int], *,
                 timeout_ms: int, retry_backoff_ms: int) -> dict[TopicPartition, pb.ListOffsetsPartitionResponse]:
    """``ListOffsets`` for each ``(topic, partition) -> timestamp_ms`` (-2 earliest,
    -1 latest = HW), one RPC per leader, retrying retriable errors with a
    metadata refresh until ``timeout_ms`` passes."""
    deadline = time.monotonic() + timeout_ms / 1000
    pending = dict(specs)
    ensure_partitions(metadata, pending)
    results: dict[TopicPartition, pb.ListOffsetsPartitionResponse] = {}
    backoff = retry_backoff_ms / 1000
    last: E.ReplikafkaError | None = None
    while pending:
        version = metadata.version
        groups, leaderless = group_by_leader(metadata, pending)
        if leaderless:
            last = E.LeaderNotAvailableError(f"no leader for {leaderless[0][0]}-{leaderless[0][1]}")
        calls = []
        for target, items in groups.items():
            request = pb.ListOffsetsRequest(partitions=[
                pb.ListOffsetsPartition(topic=tp[0], partition=tp[1], timestamp_ms=pending[tp],
                                        current_leader_epoch=info.leader_epoch)
                for tp, info in items])
            remaining = max(deadline - time.monotonic(), 0.001)
            calls.append((target, pool.call_async(target, "ListOffsets", request, remaining)))
        for target, fut in calls:
            err = error_of(fut, target)
            if err is not None:
                if not err.retriable:
                    raise err
                last = err
                continue
            for r in fut.result().partitions:
                tp = (r.topic, r.partition)
                if tp not in pending:
                    continue
                err = from_pb(r.error)
                if err is None:
                    results[tp] = r
                    del pending[tp]
                elif err.retriable:
                    last = err
                else:
                    raise annotated(err, f"{tp[0]}-{tp[1]}")
        if not pending:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise E.KafkaTimeoutError(
                f"ListOffsets for {len(pending)} partition(s) did not succeed within {timeout_ms} ms"
                + (f"; last error: {last}" if last else ""))
        time.sleep(min(backoff, remaining))
        backoff = min(backoff * 2, 1.0)
        try:
            metadata.refresh({t for t, _ in pending}, if_version=version,
                             timeout_ms=int(max(deadline - time.monotonic(), 0.001) * 1000))
        except E.BrokerNotAvailableError as exc:
            last = exc
    return results
