"""The plain data the replica manager and the follower fetchers take and return,
and the controller sends (LeaderAndIsr, UpdateMetadata, StopReplica): one
vocabulary for both sides of a controller request.

The RPC layer (``broker/replica_rpc.py`` on the broker's side,
``broker/controller_rpc.py`` on the controller's) turns protobuf requests into
these and these into protobuf (or, for a follower's fetch, into the
``replica_fetch_codec`` format); nothing in ``broker/replica/`` or
``broker/controller/`` sees the wire.
Errors are instances of the one error tree (``replikafka.errors``), None when
there is none; they meet wire codes only in the RPC layer.

Field defaults are what the wire answers when a field is not set (a partition
that failed answers only its error).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa

from replikafka.errors import ReplikafkaError

TP = tuple[str, int]


# ---------------------------------------------------------------- controller requests
@dataclass(frozen=True)
class BrokerEndpoint:
    """A live broker as the controller announces it: its inter-broker listener, every
    advertised listener ("PROTOCOL://host:port") and its registration's epoch (KIP-380)."""
    id: int
    host: str
    port: int
    endpoints: tuple[str, ...] = ()
    broker_epoch: int = 0


@dataclass(frozen=True)
class TopicInfo:
    """A topic's schema (Arrow IPC bytes), config and id, as a LeaderAndIsr or an
    UpdateMetadata carries them; ``partition_count`` 0: not said (partitions at or past
    a count said were removed)."""
    schema: bytes
    config: dict[str, str]
    topic_id: str = ""
    partition_count: int = 0


class PartitionRole(NamedTuple):
    """One partition of a LeaderAndIsr: who leads in which epoch, with which ISR.
    A NamedTuple rather than a frozen dataclass: a failover builds one per partition
    on the controller and again on each broker that decodes it (50,000 each), and a
    frozen dataclass's ``__init__`` costs ten times a tuple's."""
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    zk_version: int
    controller_epoch: int

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


@dataclass(frozen=True)
class LeaderAndIsrRequest:
    """``broker_epoch``: the recipient's registration the controller decided for
    (KIP-380; 0 unset): a restarted broker refuses requests meant for its previous life."""
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partitions: tuple[PartitionRole, ...]
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    live_leaders: tuple[BrokerEndpoint, ...] = ()


@dataclass(frozen=True)
class UpdateMetadataRequest:
    """Partition states, live brokers and topics for every broker's metadata cache;
    ``full`` replaces the whole cache (controller failover). ``live_brokers`` empty:
    the set of brokers is not news."""
    controller_id: int
    controller_epoch: int
    partitions: tuple[PartitionRole, ...] = ()
    live_brokers: tuple[BrokerEndpoint, ...] = ()
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    deleted_topics: tuple[str, ...] = ()
    full: bool = False


@dataclass(frozen=True)
class StopReplicaRequest:
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    delete_partitions: bool
    partitions: tuple[TP, ...]


@dataclass
class ControllerRequestResult:
    """A LeaderAndIsr's, UpdateMetadata's or StopReplica's outcome: a refusal of the
    whole request, or the partitions that failed (in request order)."""
    error: ReplikafkaError | None = None
    partition_errors: list[tuple[TP, ReplikafkaError]] = field(default_factory=list)


# ---------------------------------------------------------------- produce
@dataclass(frozen=True)
class ProducePartition:
    """One partition's produced records, decoded from the wire by the RPC layer:
    ``batches``, or ``decode_error`` when its bytes were refused (corrupt, wrong
    CRC), reported after the topic and partition checks as any other error.
    ``sent_messages``: per batch, the producer's IPC message it was read from
    (``batch_format.PlainMessage``: the log stores it verbatim) or None; None: not
    known for any."""
    topic: str
    partition: int
    batches: tuple[pa.RecordBatch, ...]
    size_bytes: int                    # on the wire (byte-rate metrics)
    producer_id: int = -1              # -1: not idempotent
    producer_epoch: int = -1
    base_sequence: int = -1
    decode_error: ReplikafkaError | None = None
    sent_messages: tuple[Any, ...] | None = None   # batch_format.PlainMessage | None each


@dataclass(frozen=True)
class ProduceRequest:
    acks: int
    timeout_ms: int                    # 0: request.timeout.ms
    partitions: tuple[ProducePartition, ...]


@dataclass
class ProducePartitionResult:
    topic: str
    partition: int
    error: ReplikafkaError | None = None
    base_offset: int = 0
    record_count: int = 0
    log_start_offset: int = 0
    log_append_time_ms: int = -1


@dataclass
class ProduceWait:
    """An acks=all append still waiting for its partition's HW to reach ``end_offset``
    (Kafka's DelayedProduce); its outcome goes in ``result``."""
    result: ProducePartitionResult
    partition: Any                     # the Partition appended to
    end_offset: int
    min_insync: int


# ---------------------------------------------------------------- fetch
@dataclass(frozen=True)
class FetchPartition:
    topic: str
    partition: int
    fetch_offset: int
    current_leader_epoch: int = -1
    partition_max_bytes: int = 0       # 0: the request's budget
    last_fetched_epoch: int = -1
    # A follower's HW (None: unknown): the leader leaves the partition out of its answer
    # while it has nothing new for it (ReplicaManager.fetch).
    follower_high_watermark: int | None = None


@dataclass(frozen=True)
class FetchRequest:
    """replica_id >= 0: a follower (with its broker epoch, KIP-380); -1: a consumer;
    -2: a debugging fetch (any replica answers from its own log)."""
    replica_id: int
    partitions: tuple[FetchPartition, ...]
    max_wait_ms: int = 0
    min_bytes: int = 0
    max_bytes: int = 0                 # 0: 64 MiB
    replica_epoch: int = -1
    columns: tuple[str, ...] | None = None   # a consumer's projection
    # A follower's fetch session (KIP-227, ``fetch_session.py``): ``session_epoch`` None:
    # no session; 0: a full fetch opening one (closing ``session_id`` if set); -1: a full
    # fetch closing ``session_id``; N > 0: an incremental fetch, ``partitions`` only those
    # changed since the last one, ``forgotten`` those to drop.
    session_id: int = 0
    session_epoch: int | None = None
    forgotten: tuple[TP, ...] = ()


@dataclass
class FetchResponse:
    """A follower fetch's answer: ``error`` refuses the whole request (a session the
    leader does not hold, a wrong session epoch); ``session_id`` 0: no session."""
    partitions: list = field(default_factory=list)   # FetchPartitionResult
    session_id: int = 0
    error: ReplikafkaError | None = None


@dataclass
class FetchPartitionResult:
    """``records``: an Arrow IPC stream (bytes for a consumer; stored batches verbatim,
    bytes or a ``pyarrow.Buffer``, for a replica), None when empty."""
    topic: str
    partition: int
    error: ReplikafkaError | None = None
    high_watermark: int = 0
    log_end_offset: int = 0
    log_start_offset: int = 0
    records: Any = None
    records_base_offset: int = 0
    record_count: int = 0


# ---------------------------------------------------------------- offsets
@dataclass(frozen=True)
class ListOffsetsQuery:
    topic: str
    partition: int
    timestamp_ms: int                  # -2 earliest, -1 latest, else a time
    current_leader_epoch: int = -1


@dataclass
class ListOffsetsResult:
    topic: str
    partition: int
    error: ReplikafkaError | None = None
    offset: int = -1
    timestamp_ms: int = -1
    leader_epoch: int = 0
    high_watermark: int = 0
    log_end_offset: int = 0
    log_start_offset: int = 0


@dataclass(frozen=True)
class EpochQuery:
    """OffsetsForLeaderEpoch: where does ``leader_epoch`` end on the leader?"""
    topic: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1


@dataclass
class EpochEndOffset:
    topic: str
    partition: int
    error: ReplikafkaError | None = None
    leader_epoch: int = -1
    end_offset: int = -1
