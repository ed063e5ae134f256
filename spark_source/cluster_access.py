"""What the Spark source asks the cluster, on top of the client library.

:class:`ClusterClient` wraps the client's thread-safe
:class:`~replikafka.client.connection.ConnectionPool` and
:class:`~replikafka.client.metadata.ClusterMetadata` (routing to leaders,
retries on leader change) with the few questions planning needs: which topics
and partitions exist, each partition's log start offset and high watermark,
offsets for timestamps. :func:`client_for` keeps one client per bootstrap list
per process, so the short-lived planner workers and the reused executor
workers do not reconnect for every call (gRPC channels are never shared across
a fork: the key includes the process id).
"""
from __future__ import annotations

import os
import threading
from typing import Iterable

from replikafka import errors as E
from replikafka.client.connection import ConnectionPool, parse_bootstrap
from replikafka.client.flight_reader import FlightReader, flight_keeps_identity
from replikafka.client.metadata import ClusterMetadata, TopicInfo
from replikafka.client.offsets import EARLIEST, LATEST, list_offsets
from replikafka.spark.offsets_planning import PartitionBounds, TopicPartition, select_partitions
from replikafka.spark.options import OptionError, Subscription

REQUEST_TIMEOUT_MS = 30_000
RETRY_BACKOFF_MS = 100
#: Let brokers send Fetch answers (MBs of Arrow) in large HTTP/2 frames: measured
#: ~5-10% less CPU on both ends than gRPC's default 16 KiB frames.
CHANNEL_OPTIONS = [("grpc.http2.max_frame_size", 16 * 1024 * 1024 - 1)]

_clients: dict[tuple[int, str], "ClusterClient"] = {}
_clients_lock = threading.Lock()


def client_for(bootstrap: str, security: tuple[tuple[str, str], ...] = (),
               stream_window_bytes: int | None = None) -> "ClusterClient":
    """This process's client for ``bootstrap`` with these security settings and range
    reads' stream window (created on first use)."""
    key = (os.getpid(), bootstrap, security, stream_window_bytes)
    with _clients_lock:
        c = _clients.get(key)
        if c is None:
            c = _clients[key] = ClusterClient(bootstrap, security=dict(security),
                                              stream_window_bytes=stream_window_bytes)
        return c


class ClusterClient:
    """Thread-safe; every method may block up to about ``REQUEST_TIMEOUT_MS``."""

    def __init__(self, bootstrap: str, *, request_timeout_ms: int = REQUEST_TIMEOUT_MS, security=None,
                 use_flight: bool = True, stream_window_bytes: int | None = None):
        """``stream_window_bytes``: the most a range read's Flight stream receives ahead of
        the task (``fetchMaxBytes``; :class:`~replikafka.client.flight_reader.FlightReader`)."""
        try:
            self.bootstrap = parse_bootstrap(bootstrap)
        except E.InvalidConfigError as exc:
            raise OptionError("bootstrap.servers", exc.message) from None
        self.request_timeout_ms = request_timeout_ms
        self.pool = ConnectionPool(options=CHANNEL_OPTIONS, security=security)
        self.metadata = ClusterMetadata(self.pool, self.bootstrap, request_timeout_ms=request_timeout_ms,
                                        retry_backoff_ms=RETRY_BACKOFF_MS)
        # Range reads through the leaders' Arrow Flight listeners (range_fetcher.ClusterTransport):
        # one DoGet streams the rest of a range.
        self.flight = FlightReader(security=self.pool.security, stream_window_bytes=stream_window_bytes) \
            if use_flight and flight_keeps_identity(self.pool.security) else None

    # ------------------------------------------------------------ topics
    def all_topics(self) -> dict[str, TopicInfo]:
        """Every topic, fresh from the cluster."""
        try:
            self.metadata.refresh(all_topics=True)
        except E.BrokerNotAvailableError as exc:
            raise E.BrokerNotAvailableError(
                f"cannot reach the cluster at bootstrap.servers={','.join(self.bootstrap)}: {exc.message}") from None
        return {name: t for name, t in self.metadata.topics().items() if t.error is None}

    def subscribed(self, sub: Subscription, *, require_topics: bool = True
                   ) -> tuple[list[TopicPartition], dict[str, TopicInfo]]:
        """The partitions ``sub`` covers now, and their topics."""
        topics = self.all_topics()
        tps = select_partitions(sub, {n: list(t.partitions) for n, t in topics.items()},
                                require_topics=require_topics)
        return tps, {t: topics[t] for t in sorted({tp[0] for tp in tps} | _named(sub, topics))}

    def topic(self, name: str) -> TopicInfo:
        return self.metadata.require_topic(name)

    # ------------------------------------------------------------ offsets
    def bounds(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, PartitionBounds]:
        """Log start offset and high watermark of each partition (one
        ``ListOffsets(latest)`` per leader; the answer carries both)."""
        tps = list(tps)
        if not tps:
            return {}
        answers = list_offsets(self.metadata, self.pool, {tp: LATEST for tp in tps},
                               timeout_ms=self.request_timeout_ms, retry_backoff_ms=RETRY_BACKOFF_MS)
        return {tp: PartitionBounds(r.log_start_offset, r.offset) for tp, r in answers.items()}

    def offsets_for_times(self, queries: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """First offset with timestamp >= the given ms, per partition (-1: none)."""
        if not queries:
            return {}
        answers = list_offsets(self.metadata, self.pool, dict(queries),
                               timeout_ms=self.request_timeout_ms, retry_backoff_ms=RETRY_BACKOFF_MS)
        return {tp: r.offset for tp, r in answers.items()}

    def log_start(self, tp: TopicPartition) -> int:
        r = list_offsets(self.metadata, self.pool, {tp: EARLIEST}, timeout_ms=self.request_timeout_ms,
                         retry_backoff_ms=RETRY_BACKOFF_MS)[tp]
        return r.offset

    # ------------------------------------------------------------ routing
    def leader(self, tp: TopicPartition) -> tuple[str, int] | None:
        """``(address, leader epoch)`` of the partition's leader from the cache, or None."""
        info = self.metadata.partition(*tp)
        broker = self.metadata.leader_for(*tp)
        if info is None or broker is None:
            return None
        return broker.target, info.leader_epoch

    def refresh(self, topics: Iterable[str]) -> None:
        try:
            self.metadata.refresh(list(topics))
        except E.ReplikafkaError:
            pass  # the caller retries and reports its own deadline

    def close(self) -> None:
        if self.flight is not None:
            self.flight.close()
        self.pool.close()


def _named(sub: Subscription, topics: dict[str, TopicInfo]) -> set[str]:
    if sub.kind == "subscribe":
        return {t for t in sub.topics if t in topics}
    if sub.kind == "assign":
        return {t for t, _ in sub.assignment if t in topics}
    return {t for t in topics if sub.matches(t)}


def topic_id_of(topic: TopicInfo) -> str:
    """The id the cluster gave the topic when it was created ("" if unknown):
    a topic deleted and re-created under the same name has a new one."""
    return topic.config.get("topic.id", "")


def timestamp_type_of(topic: TopicInfo) -> int:
    """0 (CreateTime) or 1 (LogAppendTime), as Spark's ``timestampType`` column."""
    value = topic.config.get("message.timestamp.type", "CreateTime")
    return 1 if value.strip().lower() == "logappendtime" else 0
