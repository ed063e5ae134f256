"""The client's cache of cluster metadata: brokers, topics, partition leaders.

:class:`ClusterMetadata` is thread-safe: readers take a snapshot under a lock
(the cached objects are immutable), and :meth:`ClusterMetadata.refresh` runs at
most one ``Metadata`` RPC at a time; callers that pass the ``version`` they saw
skip the RPC when another thread refreshed meanwhile.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Iterable

import pyarrow as pa

from replikafka import errors as E
from replikafka.client.connection import ConnectionPool, target_of
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import from_pb
from replikafka.records import KAFKA_SCHEMA, schema_from_bytes, stored_schema, topic_schema_of


# A broker answers Metadata from its cache at once; one that does not within
# this time is likely hung (e.g. stopped), so the next candidate is tried
# (Kafka's socket.connection.setup.timeout.ms plays this part for its clients).
METADATA_ATTEMPT_S = 5.0
# The shortest attempt an address gets when the time left is shared among the
# addresses still untried in a round (a healthy broker answers well within it).
METADATA_ATTEMPT_MIN_S = 1.0
# Until some broker has answered once, a client gives up after this long
# (seconds) once every address has had its attempt and failed: a wrong bootstrap
# address is reported soon, naming it, instead of after the whole request timeout.
# It never cuts an address's attempt short: each is tried within the deadline.
BOOTSTRAP_UNREACHABLE_S = 5.0


def attempt_budget_s(remaining_s: float, untried: int, request_timeout_s: float) -> float:
    """How long one address may take to answer a Metadata request: bounded by
    :data:`METADATA_ATTEMPT_S` and the request timeout, and by a fair share of
    the time left among the ``untried`` addresses of this round (at least
    :data:`METADATA_ATTEMPT_MIN_S`), so a hung first address cannot use up the
    deadline before the next one is tried."""
    share = max(remaining_s / max(untried, 1), METADATA_ATTEMPT_MIN_S)
    return max(0.0, min(remaining_s, request_timeout_s, METADATA_ATTEMPT_S, share))


@dataclass(frozen=True)
class BrokerInfo:
    id: int
    host: str
    port: int
    endpoints: tuple[str, ...] = ()   # every advertised listener, "PROTOCOL://host:port"

    @property
    def target(self) -> str:
        return target_of(self.host, self.port)

    def listener(self, protocol: str) -> str | None:
        """``"host:port"`` of this broker's ``protocol`` listener (e.g. ``"FLIGHT"``), or None."""
        prefix = protocol.upper() + "://"
        return next((e[len(prefix):] for e in self.endpoints if e.upper().startswith(prefix)), None)


def _broker_for(b: pb.BrokerEndpoint, protocol: str) -> BrokerInfo:
    """The broker as this client reaches it: through its listener of the client's
    security protocol when it publishes one (as a Kafka client uses the listener it
    bootstrapped on), else the registration's address."""
    info = BrokerInfo(b.id, b.host, b.port, tuple(b.endpoints))
    address = info.listener(protocol)
    if address:
        host, _, port = address.rpartition(":")
        if port.isdigit():
            return BrokerInfo(b.id, host.strip("[]"), int(port), info.endpoints)
    return info


@dataclass(frozen=True)
class PartitionInfo:
    """One partition as the metadata cache knows it (``leader`` -1: offline)."""
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error: E.ReplikafkaError | None = None


@dataclass(frozen=True)
class TopicInfo:
    """A topic: its stored schema (topic columns + ``timestamp``), topic schema, config, partitions."""
    name: str
    stored_schema: pa.Schema
    schema: pa.Schema
    config: dict[str, str]
    partitions: Mapping[int, PartitionInfo] = field(default_factory=dict)
    error: E.ReplikafkaError | None = None


class ListedPartitions(Mapping):
    """A topic's partitions (partition -> :class:`PartitionInfo`, iterated in
    partition order) read from its Metadata answer, each decoded on first use: a
    refresh of a 50,000-partition topic makes no Python object per partition
    until that partition is looked at (a producer after a failover looks at the
    few it sends to). Thread-safe: the answer is never changed; two threads
    decoding the same partition store equal values."""

    __slots__ = ("_topic", "_listed", "_ids", "_place", "_decoded")

    def __init__(self, topic: str, listed):
        self._topic = topic
        self._listed = listed       # the answer's repeated PartitionMetadata
        ids = [p.partition for p in listed]
        self._ids = sorted(ids)
        # Brokers list 0..n-1 in order; anything else is looked up by its place.
        self._place = None if ids == list(range(len(ids))) else {p: i for i, p in enumerate(ids)}
        self._decoded: dict[int, PartitionInfo] = {}

    def __getitem__(self, partition: int) -> PartitionInfo:
        info = self._decoded.get(partition)
        if info is None:
            if self._place is None:
                if not (isinstance(partition, int) and 0 <= partition < len(self._ids)):
                    raise KeyError(partition)
                p = self._listed[partition]
            else:
                p = self._listed[self._place[partition]]
            info = PartitionInfo(self._topic, p.partition, p.leader, p.leader_epoch,
                                 tuple(p.replicas), tuple(p.isr), from_pb(p.error))
            self._decoded[partition] = info
        return info

    def __contains__(self, partition) -> bool:
        if self._place is None:
            return isinstance(partition, int) and 0 <= partition < len(self._ids)
        return partition in self._place

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return f"ListedPartitions({self._topic!r}, {len(self._ids)} partitions)"

    def __reduce__(self):
        # Pickled (or copied) as the plain dict it stands for: the answer it reads is not picklable.
        return dict, (dict(self.items()),)


def topic_info_from_pb(t: pb.TopicMetadata) -> TopicInfo:
    stored = schema_from_bytes(t.schema) if t.schema else stored_schema(KAFKA_SCHEMA)
    return TopicInfo(t.name, stored, topic_schema_of(stored), dict(t.config),
                     ListedPartitions(t.name, t.partitions), from_pb(t.error))


class ClusterMetadata:
    """Cached view of the cluster, refreshed from any reachable broker.

    ``bootstrap`` is a list of ``"host:port"``. Topics are fetched on demand:
    a refresh asks for every topic asked about before plus the ones named.
    """

    def __init__(self, pool: ConnectionPool, bootstrap: list[str], *,
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100):
        self._pool = pool
        self._bootstrap = list(bootstrap)
        self._request_timeout_s = request_timeout_ms / 1000
        self._backoff_s = max(retry_backoff_ms, 1) / 1000
        self._lock = threading.Lock()          # guards the cache fields
        self._refresh_lock = threading.Lock()  # one Metadata RPC at a time
        self._brokers: dict[int, BrokerInfo] = {}
        self._controller_id = -1
        self._topics: dict[str, TopicInfo] = {}
        self._wanted: set[str] = set()
        self._version = 0
        self._last_refresh = 0.0

    # ------------------------------------------------------------ reading
    @property
    def version(self) -> int:
        """Increases with every successful refresh."""
        with self._lock:
            return self._version

    @property
    def last_refresh(self) -> float:
        """``time.monotonic()`` of the last successful refresh (0: never)."""
        with self._lock:
            return self._last_refresh

    @property
    def controller_id(self) -> int:
        with self._lock:
            return self._controller_id

    def brokers(self) -> list[BrokerInfo]:
        with self._lock:
            return sorted(self._brokers.values(), key=lambda b: b.id)

    def broker(self, broker_id: int) -> BrokerInfo | None:
        with self._lock:
            return self._brokers.get(broker_id)

    def topic(self, name: str) -> TopicInfo | None:
        """The cached topic (no RPC), or None when unknown."""
        with self._lock:
            return self._topics.get(name)

    def topics(self) -> dict[str, TopicInfo]:
        with self._lock:
            return dict(self._topics)

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        t = self.topic(topic)
        return t.partitions.get(partition) if t else None

    def partitions_for(self, topic: str) -> list[int]:
        t = self.topic(topic)
        return sorted(t.partitions) if t else []

    def leader_for(self, topic: str, partition: int) -> BrokerInfo | None:
        """The live leader broker of a partition, or None (offline/unknown)."""
        with self._lock:
            t = self._topics.get(topic)
            p = t.partitions.get(partition) if t else None
            if p is None or p.leader < 0:
                return None
            return self._brokers.get(p.leader)

    def require_topic(self, name: str, timeout_ms: int | None = None) -> TopicInfo:
        """The topic, refreshing once if it is not cached; raises
        :class:`UnknownTopicOrPartitionError` if the cluster does not know it."""
        t = self.topic(name)
        if t is None:
            self.refresh([name], timeout_ms=timeout_ms)
            t = self.topic(name)
        if t is None:
            raise E.UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        if isinstance(t.error, E.AuthorizationError):
            raise t.error   # TOPIC_AUTHORIZATION_FAILED: not allowed to Describe it
        return t

    def candidates(self) -> list[str]:
        """Addresses to try for a cluster-wide request: known brokers first
        (in random order, to spread load), then the bootstrap list."""
        with self._lock:
            known = [b.target for b in self._brokers.values()]
        random.shuffle(known)
        return known + [t for t in self._bootstrap if t not in known]

    # ------------------------------------------------------------ refreshing
    def forget(self, topic: str) -> None:
        """Stop tracking a topic (it is no longer refreshed)."""
        with self._lock:
            self._wanted.discard(topic)
            self._topics.pop(topic, None)

    def refresh(self, topics: Iterable[str] = (), *, all_topics: bool = False,
                timeout_ms: int | None = None, if_version: int | None = None) -> None:
        """Fetch metadata for the tracked topics plus ``topics`` (or every topic).

        Tries each known broker and then the bootstrap servers, each for a
        bounded attempt (:func:`attempt_budget_s`), backing off between rounds,
        until one answers or ``timeout_ms`` (default: the request timeout)
        passes; then raises :class:`BrokerNotAvailableError`. A client that
        never reached the cluster gives up sooner, after
        :data:`BOOTSTRAP_UNREACHABLE_S`, but only at the end of a round in which
        every address was tried. With ``if_version``: does nothing if a refresh
        completed since that version was read.
        """
        topics = list(topics)
        with self._lock:
            self._wanted.update(topics)
        start = time.monotonic()
        deadline = start + (self._request_timeout_s if timeout_ms is None else timeout_ms / 1000)
        with self._refresh_lock:
            if if_version is not None and self.version != if_version:
                return
            with self._lock:
                wanted = sorted(self._wanted)
            request = pb.MetadataRequest(topics=[] if all_topics else wanted, all_topics=all_topics)
            backoff = self._backoff_s
            failures: dict[str, E.ReplikafkaError] = {}   # each address's last failure, named in the error
            while True:
                candidates = self.candidates()
                for i, target in enumerate(candidates):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        response = self._pool.call(target, "Metadata", request, attempt_budget_s(
                            remaining, len(candidates) - i, self._request_timeout_s))
                    except E.AuthenticationError:
                        raise   # wrong credentials or certificates: retrying cannot help
                    except E.ReplikafkaError as exc:
                        failures[target] = exc
                        continue
                    if not response.brokers:
                        # A broker that just started has no metadata yet (not even itself).
                        failures[target] = E.LeaderNotAvailableError(f"broker {target} has no cluster metadata yet")
                        continue
                    self._apply(response, request)
                    return
                now = time.monotonic()
                remaining = deadline - now
                never_reached = self._version == 0
                if remaining <= 0 or (never_reached and now - start >= BOOTSTRAP_UNREACHABLE_S):
                    why = "; ".join(f"{t}: {exc}" for t, exc in failures.items())
                    if never_reached:
                        raise E.BrokerNotAvailableError(
                            f"could not reach any bootstrap server ({','.join(self._bootstrap)}) within "
                            f"{time.monotonic() - start:.1f} s" + (f"; last errors: {why}" if why else ""))
                    raise E.BrokerNotAvailableError(
                        f"no broker answered a metadata request (bootstrap {','.join(self._bootstrap)})"
                        + (f"; last errors: {why}" if why else ""))
                time.sleep(min(backoff, remaining))
                backoff = min(backoff * 2, 1.0)

    def _apply(self, response: pb.MetadataResponse, request: pb.MetadataRequest) -> None:
        brokers = {b.id: _broker_for(b, getattr(self._pool, "protocol", "PLAINTEXT")) for b in response.brokers}
        fresh: dict[str, TopicInfo] = {}
        unknown: set[str] = set()
        for t in response.topics:
            info = topic_info_from_pb(t)
            if isinstance(info.error, (E.UnknownTopicOrPartitionError, E.InvalidTopicError)):
                unknown.add(t.name)
            else:
                fresh[t.name] = info
        with self._lock:
            if brokers:
                self._brokers = brokers
            self._controller_id = response.controller_id
            if request.all_topics:
                self._topics = fresh
            else:
                for name in request.topics:
                    if name not in fresh:
                        unknown.add(name)
                for name in unknown:
                    self._topics.pop(name, None)
                    self._wanted.discard(name)
                self._topics.update(fresh)
            self._version += 1
            self._last_refresh = time.monotonic()
