"""The sink: ``df.write.format("replikafka")`` and ``df.writeStream.format("replikafka")``.

Usage: ``df.write.format("replikafka").mode("append").option("bootstrap.servers", bs)
.option("topic", "events").save()``. Spark accepts only the Append and Overwrite
save modes for Python data sources (its default, ErrorIfExists, is refused by
Spark before we are asked); a topic only appends, so Overwrite is refused here.
Without the ``topic`` option each row's ``topic`` column names its topic.
Input columns: the topic's own columns by name (for Kafka-shaped topics
``value``, optionally ``key`` and ``headers``; ``string`` is stored as
``binary``), plus optional ``partition`` and ``timestamp``; ``offset`` and
``timestampType`` (from a DataFrame read from a topic) are ignored; anything
else is an error naming the column.

Rows arrive as Arrow batches (``DataSourceArrowWriter`` /
``DataSourceStreamArrowWriter``), are converted to the topic's stored schema
(:func:`~replikafka.spark.arrow_convert.to_stored_batch`), routed to partitions
(``partition`` column, else murmur2 of ``key`` as Kafka does, else a
deterministic round-robin) and produced with ``acks=all`` as Arrow IPC, one
``Produce`` append per *chunk*.

Exactly-once: how a replayed micro-batch adds nothing
-----------------------------------------------------
Spark's Kafka sink is at-least-once: a micro-batch replayed after a failure
(same query id, same batch id — Spark re-runs a batch whose commit it did not
record) writes its records again. Here a replay is recognised by the broker's
idempotent-producer check (KIP-98), with identities the sink derives instead
of asks for:

1. Each write task knows who it is: for a stream, the query id and batch id
   (Spark's task-local properties ``sql.streaming.queryId`` and
   ``streaming.sql.batchId``) and the task's partition id; for a batch write, a
   write id fixed on the driver when the write is planned, and the task's
   partition id.
2. The task cuts its rows for each target partition into chunks by a rule that
   depends only on the rows and their order (every ``sinkChunkRows`` rows; a
   chunk whose IPC encoding would exceed the topic's ``max.message.bytes`` is
   halved, recursively). Spark replays a micro-batch from the offsets in its
   offset log, so a replayed task sees the same rows in the same order and cuts
   the same chunks.
3. Each chunk is produced under its own producer id — a 62-bit hash of
   (task identity, topic, partition, chunk number), in a range the brokers never
   hand out (they count up from 1) — with epoch 0 and sequence 0. The leader
   remembers each producer id's last batches (rebuilt from the log after a
   restart, kept by followers, so a new leader knows them too). The first
   append of a chunk is stored; any later append of the same chunk — a retry
   after a lost answer, a retried task, a replayed micro-batch — matches the
   remembered sequence range and is answered as a duplicate, with the original
   offsets, and not stored again.

So a replay adds nothing, whether the earlier attempt wrote all, some or none
of its chunks; chunks the earlier attempt never wrote are written. Chunks of
one partition are sent one at a time, so a task's records keep their order.

Limits, stated: (a) the rows of a replayed task must be the same and in the
same order — true for queries whose per-task input is deterministic (the
common map/filter/project pipelines from a replayable source), not for a task
fed by a shuffle whose row order changes between attempts; (b) a replay is
recognised while the brokers remember the producer id: ``producer.id.expiration.ms``
(24 h by default) after its last write; (c) the partition count of a topic
must not change between an attempt and its replay (rows are routed by it).
"""
from __future__ import annotations

import hashlib
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage)

from replikafka import errors as E
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import from_pb
from replikafka.records import encode_stream, records_crc32c, schema_from_bytes, schema_to_bytes
from replikafka.spark.arrow_convert import SchemaError, check_sink_input, route_partitions, to_stored_batch
from replikafka.spark.cluster_access import ClusterClient, client_for
from replikafka.spark.options import OptionError, SinkOptions

DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 + 12
_IPC_HEADROOM = 0.97          # keep the encoded chunk a little under max.message.bytes
PRODUCE_TIMEOUT_MS = 30_000
MAX_IN_FLIGHT = 8             # chunks of different partitions sent at once by one task
_PID_BASE = 1 << 62


def chunk_producer_id(identity: str, topic: str, partition: int, chunk: str) -> int:
    """The producer id of one chunk: a hash in [2^62, 2^63), far above the ids brokers allocate."""
    digest = hashlib.blake2b(f"{identity}\x00{topic}\x00{partition}\x00{chunk}".encode(), digest_size=8).digest()
    return _PID_BASE | (int.from_bytes(digest, "big") & (_PID_BASE - 1))


@dataclass(frozen=True)
class TopicTarget:
    """What a task needs to know about a topic it writes (fixed at planning)."""
    name: str
    schema_bytes: bytes
    partitions: int
    max_message_bytes: int


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """One task's report: records and chunks per ``(topic, partition)``."""
    identity: str
    records: dict = field(default_factory=dict)
    chunks: int = 0


@dataclass
class Chunk:
    topic: str
    partition: int
    label: str
    batch: pa.RecordBatch
    payload: bytes
    producer_id: int


# ---------------------------------------------------------------- chunking
class PartitionChunker:
    """Cuts one target partition's rows into chunks of ``chunk_rows`` (the last
    may be shorter), independent of how the rows arrived in batches."""

    def __init__(self, chunk_rows: int):
        self.chunk_rows = chunk_rows
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.next_index = 0

    def add(self, batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
        if batch.num_rows:
            self.pending.append(batch)
            self.pending_rows += batch.num_rows
        while self.pending_rows >= self.chunk_rows:
            yield self._cut(self.chunk_rows)

    def finish(self) -> Iterator[tuple[int, pa.RecordBatch]]:
        if self.pending_rows:
            yield self._cut(self.pending_rows)

    def _cut(self, rows: int) -> tuple[int, pa.RecordBatch]:
        whole = pa.concat_batches(self.pending) if len(self.pending) > 1 else self.pending[0]
        chunk, rest = whole.slice(0, rows), whole.slice(rows)
        self.pending = [rest] if rest.num_rows else []
        self.pending_rows = rest.num_rows
        index = self.next_index
        self.next_index += 1
        return index, chunk


def encode_chunks(topic: str, partition: int, index: int, batch: pa.RecordBatch, identity: str,
                  limit_bytes: int) -> list[Chunk]:
    """Encode a chunk; halve it (recursively, labels ``k``, ``k.0``, ``k.1``, ...)
    while its IPC stream is over ``limit_bytes``."""
    out: list[Chunk] = []

    def go(b: pa.RecordBatch, label: str) -> None:
        b = pa.concat_batches([b])        # compact buffers: the encoding depends on the rows only
        payload = encode_stream(b.schema, [b]).to_pybytes()
        if len(payload) > limit_bytes:
            if b.num_rows <= 1:
                raise E.RecordTooLargeError(
                    f"topic {topic!r}: one record encodes to {len(payload)} bytes, over the topic's "
                    f"max.message.bytes ({int(limit_bytes / _IPC_HEADROOM)})")
            half = b.num_rows // 2
            go(b.slice(0, half), label + ".0")
            go(b.slice(half), label + ".1")
            return
        out.append(Chunk(topic, partition, label, b, payload,
                         chunk_producer_id(identity, topic, partition, label)))

    go(batch, str(index))
    return out


# ---------------------------------------------------------------- sending
class ChunkSender:
    """Produces chunks with ``acks=all``: one in flight per partition (order),
    up to ``MAX_IN_FLIGHT`` partitions at once; retriable errors are retried
    (same producer id, so never stored twice) until ``delivery_timeout_s``."""

    def __init__(self, client: ClusterClient, delivery_timeout_s: float, *, sleep=time.sleep):
        self.client = client
        self.delivery_timeout_s = delivery_timeout_s
        self.sleep = sleep
        self.queues: dict[tuple[str, int], deque] = {}
        self.inflight: dict[tuple[str, int], tuple] = {}   # tp -> (chunk, call, target, deadline, backoff)
        self.records: dict[str, int] = {}
        self.chunks = 0

    def submit(self, chunk: Chunk) -> None:
        tp = (chunk.topic, chunk.partition)
        self.queues.setdefault(tp, deque()).append(chunk)
        self._pump()
        while sum(len(q) for q in self.queues.values()) > 2 * MAX_IN_FLIGHT:
            self._wait_one()
            self._pump()

    def flush(self) -> None:
        self._pump()
        while self.inflight or any(self.queues.values()):
            self._wait_one()
            self._pump()

    def _pump(self) -> None:
        for tp, q in self.queues.items():
            if len(self.inflight) >= MAX_IN_FLIGHT:
                return
            if q and tp not in self.inflight:
                chunk = q.popleft()
                self._start(chunk, time.monotonic() + self.delivery_timeout_s, 0.05)

    def _start(self, chunk: Chunk, deadline: float, backoff: float) -> None:
        tp = (chunk.topic, chunk.partition)
        while True:
            leader = self.client.leader(tp)
            if leader is not None:
                break
            if time.monotonic() > deadline:
                raise E.KafkaTimeoutError(f"{tp[0]}-{tp[1]}: no leader within the delivery timeout")
            self.client.refresh([tp[0]])
            self.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
        target, _epoch = leader
        request = pb.ProduceRequest(acks=-1, timeout_ms=PRODUCE_TIMEOUT_MS, partitions=[pb.PartitionProduceData(
            topic=chunk.topic, partition=chunk.partition, records=chunk.payload,
            records_crc32c=records_crc32c(chunk.payload),
            producer_id=chunk.producer_id, producer_epoch=0, base_sequence=0)])
        call = self.client.pool.call_async(target, "Produce", request, PRODUCE_TIMEOUT_MS / 1000 + 5)
        self.inflight[tp] = (chunk, call, target, deadline, backoff)

    def _wait_one(self) -> None:
        if not self.inflight:
            return
        tp = next(iter(self.inflight))
        chunk, call, target, deadline, backoff = self.inflight.pop(tp)
        from replikafka.client.connection import result_of
        try:
            response = result_of(call, target)
            part = next((p for p in response.partitions
                         if p.topic == chunk.topic and p.partition == chunk.partition), None)
            if part is None:
                raise E.ReplikafkaError(f"the Produce answer has no entry for {chunk.topic}-{chunk.partition}")
            err = from_pb(part.error)
            if isinstance(err, E.OutOfOrderSequenceError):
                # The broker holds a different chunk under this chunk's producer id: an earlier
                # attempt of this task saw other rows. Refuse rather than guess.
                raise E.OutOfOrderSequenceError(
                    f"{chunk.topic}-{chunk.partition}: chunk {chunk.label} of this task was written before with "
                    "different rows; the sink's exactly-once replay needs each task to see the same rows in the "
                    f"same order on every attempt ({err.message})")
            if err is not None:
                raise err
        except E.ReplikafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise E.error_for_code(exc.code, f"writing {chunk.topic}-{chunk.partition} (chunk {chunk.label}): "
                                       f"{exc.message}") from None
            self.client.refresh([chunk.topic])
            self.sleep(backoff)
            self._start(chunk, deadline, min(backoff * 2, 1.0))
            return
        key = f"{chunk.topic}-{chunk.partition}"
        self.records[key] = self.records.get(key, 0) + chunk.batch.num_rows
        self.chunks += 1


# ---------------------------------------------------------------- the task
def plan_targets(client: ClusterClient, topics: Iterable[str]) -> dict[str, TopicTarget]:
    out = {}
    for name in topics:
        try:
            info = client.topic(name)
        except E.UnknownTopicOrPartitionError:
            raise OptionError("topic", f"topic {name!r} does not exist; create it first") from None
        limit = int(info.config.get("max.message.bytes", DEFAULT_MAX_MESSAGE_BYTES))
        out[name] = TopicTarget(name, schema_to_bytes(info.schema), len(info.partitions), limit)
    return out


def write_task(opts: SinkOptions, targets: dict[str, TopicTarget], identity: str, task_id: int,
               batches: Iterable[pa.RecordBatch], *, client: ClusterClient | None = None) -> SinkCommitMessage:
    """Write one task's rows; returns what was written. Deterministic in
    (identity, rows): running it again with the same rows writes nothing new."""
    client = client or client_for(opts.bootstrap, opts.security)
    sender = ChunkSender(client, opts.delivery_timeout_ms / 1000)
    chunkers: dict[tuple[str, int], PartitionChunker] = {}
    rows_seen: dict[str, int] = {}
    schemas = {name: schema_from_bytes(t.schema_bytes) for name, t in targets.items()}
    checked: set[tuple[str, tuple[str, ...]]] = set()

    def emit(topic: str, partition: int, pieces) -> None:
        limit = int(targets[topic].max_message_bytes * _IPC_HEADROOM)
        for index, chunk in pieces:
            for c in encode_chunks(topic, partition, index, chunk, identity, limit):
                sender.submit(c)

    for batch in batches:
        if batch.num_rows == 0:
            continue
        for topic, part in _split_by_topic(batch, opts.topic, targets):
            key = (topic, tuple(part.schema.names))
            if key not in checked:
                check_sink_input(part.schema.names, schemas[topic], topic)
                checked.add(key)
            first = rows_seen.get(topic, 0)
            rows_seen[topic] = first + part.num_rows
            routes = route_partitions(part, targets[topic].partitions, task_id=task_id, first_row=first)
            stored = to_stored_batch(part, schemas[topic], topic)
            for p in np.unique(routes):
                idx = np.nonzero(routes == p)[0]
                rows = stored if len(idx) == stored.num_rows else stored.take(pa.array(idx))
                chunker = chunkers.setdefault((topic, int(p)), PartitionChunker(opts.chunk_rows))
                emit(topic, int(p), chunker.add(rows))
    for (topic, p), chunker in chunkers.items():
        emit(topic, p, chunker.finish())
    sender.flush()
    return SinkCommitMessage(identity, dict(sender.records), sender.chunks)


def _split_by_topic(batch: pa.RecordBatch, topic_option: str | None, targets: dict[str, TopicTarget]):
    """``(topic, rows)`` groups: the ``topic`` option wins over a ``topic`` column."""
    names = batch.schema.names
    if topic_option is not None:
        yield topic_option, batch
        return
    if "topic" not in names:
        raise OptionError("topic", "is required (or give the input a 'topic' column)")
    col = batch.column(names.index("topic"))
    if col.null_count:
        raise SchemaError("topic", "the input's 'topic' column holds nulls; every row needs a topic")
    values = pc.unique(col).to_pylist()
    for t in values:
        if t not in targets:
            raise OptionError("topic", f"input rows name topic {t!r}, which was not found when the write was planned")
    if len(values) == 1:
        yield values[0], batch
        return
    for t in sorted(values):
        yield t, batch.filter(pc.equal(col, t))


def _task_context():
    from pyspark import TaskContext
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the replikafka sink's write() must run inside a Spark task")
    return ctx


class BatchWriter(DataSourceArrowWriter):
    """``df.write``: each task's chunks are identified by (write id, task
    partition), so a retried task adds nothing."""

    def __init__(self, opts: SinkOptions, targets: dict[str, TopicTarget]):
        self.opts = opts
        self.targets = targets
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        task_id = _task_context().partitionId()
        return write_task(self.opts, self.targets, f"write:{self.write_id}:{task_id}", task_id, iterator)

    def commit(self, messages) -> None:
        """Records are durable (acks=all) once every task returned."""

    def abort(self, messages) -> None:
        """Records written by tasks that succeeded stay: a topic has no undo."""


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream``: chunks identified by (query id, batch id, task
    partition), so a replayed micro-batch adds nothing."""

    def __init__(self, opts: SinkOptions, targets: dict[str, TopicTarget]):
        self.opts = opts
        self.targets = targets

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        ctx = _task_context()
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RuntimeError("the replikafka stream sink found no streaming query id / batch id in the task's "
                               "properties; it needs them to make replays exactly-once")
        task_id = ctx.partitionId()
        return write_task(self.opts, self.targets, f"stream:{query_id}:{batch_id}:{task_id}", task_id, iterator)

    def commit(self, messages, batchId) -> None:
        """Nothing to do: every chunk is durable when its task returns."""

    def abort(self, messages, batchId) -> None:
        """A failed batch is replayed by Spark; what it wrote is recognised then."""
