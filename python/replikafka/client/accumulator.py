"""The producer's record accumulator: per-partition queues of Arrow batches.

Pure bookkeeping, no I/O. :class:`Accumulator` is NOT thread-safe on its own:
the :class:`~replikafka.client.producer.Producer` calls every method with its
lock held. Methods that finish user futures return *actions* (callables) which
the caller runs after releasing the lock, so user callbacks never run under it.

Ordering and idempotence: concurrent gRPC calls may reach the broker in any
order, so a partition has at most one request in flight; a request carries,
for each of several partitions of the same leader, the partition's next
batches in order (up to ``PARTITION_REQUEST_BYTES``), and ``max_in_flight``
bounds the requests in flight per broker. A batch gets its sequence number
the first time it is drained and keeps it on retries, which go first, so
batches reach the broker in sequence order. If a sequenced batch fails for
good (the sequence then has a gap the broker would refuse), the accumulator
asks for a new producer id; batches not yet acknowledged are renumbered under
it (a new *generation*).
"""
from __future__ import annotations

import bisect
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.ipc as ipc

from replikafka import errors as E

TopicPartition = tuple[str, int]
Action = Callable[[], None]

SEQUENCE_MODULUS = 1 << 31  # Kafka wraps base sequences at Integer.MAX_VALUE
MAX_REQUEST_BYTES = 64 * 1024 * 1024  # cap on one Produce RPC (many partitions)
PARTITION_REQUEST_BYTES = 8 * 1024 * 1024  # cap on one partition's batches in one Produce RPC


def ipc_size(batch: pa.RecordBatch) -> int:
    """Bytes ``batch`` takes as an IPC message (metadata and padding included),
    computed without serializing. ``RecordBatch.nbytes`` can be far off: a
    slice of a list column may write whole child buffers."""
    return ipc.get_record_batch_size(batch)


@dataclass(frozen=True)
class RecordMetadata:
    """Where one :meth:`Producer.send` landed. ``base_offset`` is the offset of
    its first record (-1 with ``acks=0``); a send larger than the topic's
    ``max.message.bytes`` is split into several appends, contiguous unless
    another producer writes the same partition in between."""
    topic: str
    partition: int
    base_offset: int
    record_count: int
    log_append_time_ms: int = -1


class SendHandle:
    """Collects the outcome of the pieces of one ``send()`` into its future."""

    __slots__ = ("future", "topic", "partition", "remaining", "rows", "base_offset", "log_append_time", "finished")

    def __init__(self, future: Future, topic: str, partition: int, pieces: int, rows: int):
        self.future = future
        self.topic = topic
        self.partition = partition
        self.remaining = pieces
        self.rows = rows
        self.base_offset = -1
        self.log_append_time = -1
        self.finished = False

    def piece_ok(self, index: int, base_offset: int, log_append_time_ms: int) -> Action | None:
        if self.finished:
            return None
        if index == 0:
            self.base_offset = base_offset
            self.log_append_time = log_append_time_ms
        self.remaining -= 1
        if self.remaining:
            return None
        self.finished = True
        meta = RecordMetadata(self.topic, self.partition, self.base_offset, self.rows, self.log_append_time)
        return lambda: self.future.set_result(meta)

    def failed(self, exc: BaseException) -> Action | None:
        if self.finished:
            return None
        self.finished = True
        return lambda: self.future.set_exception(exc)


class ProducerBatch:
    """Pieces (Arrow batches of one partition) sent together in one append."""

    __slots__ = ("tp", "pieces", "size", "rows", "created", "deadline", "attempts", "retry_at",
                 "sequence", "generation", "producer_id", "producer_epoch", "sealed", "payload", "put",
                 "last_error", "done")

    def __init__(self, tp: TopicPartition, now: float, deadline: float):
        self.tp = tp
        self.pieces: list[tuple[pa.RecordBatch, SendHandle, int, int]] = []  # batch, handle, piece index, first row
        self.size = 0      # IPC bytes of the pieces
        self.rows = 0
        self.created = now
        self.deadline = deadline
        self.attempts = 0
        self.retry_at = 0.0
        self.sequence: int | None = None
        self.generation = -1
        self.producer_id = -1
        self.producer_epoch = -1
        self.sealed = False     # drained once: takes no more pieces
        self.payload: pa.Buffer | None = None  # the encoded IPC stream, reused on retries
        self.put: tuple | None = None  # a Flight append's (batches, body CRC-32Cs), reused on retries
        self.last_error: E.ReplikafkaError | None = None
        self.done = False

    def put_batches(self, concat_below: int) -> list[pa.RecordBatch]:
        """The pieces as a Flight append sends them (one stored batch each): as they are
        (no copy), or as one batch when the whole is under ``concat_below`` bytes (many
        small sends make one stored batch, as readers prefer)."""
        if len(self.pieces) > 1 and self.size < concat_below:
            return [self.record_batch()]
        return [p[0] for p in self.pieces]

    def record_batch(self) -> pa.RecordBatch:
        """All pieces as one RecordBatch (one copy when there are several)."""
        if len(self.pieces) == 1:
            return self.pieces[0][0]
        return pa.concat_batches([p[0] for p in self.pieces])


class _PartitionState:
    __slots__ = ("queue", "inflight", "next_sequence", "generation")

    def __init__(self):
        self.queue: deque[ProducerBatch] = deque()
        self.inflight: list[ProducerBatch] = []
        self.next_sequence = 0
        self.generation = -1


class Accumulator:
    """Batches appended records per partition and decides what to send when."""

    def __init__(self, *, batch_size: int, linger_s: float, max_in_flight: int, idempotent: bool,
                 delivery_timeout_s: float, retry_backoff_s: float):
        self.batch_size = batch_size
        self.linger_s = linger_s
        self.max_in_flight = max_in_flight
        self.idempotent = idempotent
        self.delivery_timeout_s = delivery_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self.parts: dict[TopicPartition, _PartitionState] = {}
        self.incomplete: set[ProducerBatch] = set()
        self.buffer_used = 0
        self.broker_inflight: dict[str, int] = {}
        # idempotence
        self.producer_id = -1
        self.producer_epoch = -1
        self.generation = 0
        self.needs_producer_id = idempotent

    # ------------------------------------------------------------ appending
    def append(self, tp: TopicPartition, batch: pa.RecordBatch, handle: SendHandle, index: int,
               cap: int, now: float) -> ProducerBatch:
        """Add one piece to the partition's open batch, or start a new batch
        when the piece would push it over ``cap`` bytes."""
        st = self.parts.get(tp)
        if st is None:
            st = self.parts[tp] = _PartitionState()
        size = ipc_size(batch)
        pb_ = st.queue[-1] if st.queue else None
        if pb_ is None or pb_.sealed or (pb_.rows and pb_.size + size > cap):
            pb_ = ProducerBatch(tp, now, now + self.delivery_timeout_s)
            st.queue.append(pb_)
            self.incomplete.add(pb_)
        pb_.pieces.append((batch, handle, index, pb_.rows))
        pb_.rows += batch.num_rows
        pb_.size += size
        self.buffer_used += size
        return pb_

    def room(self, tp: TopicPartition, cap: int) -> int:
        """Bytes the partition's open batch can still take (0: none open)."""
        st = self.parts.get(tp)
        b = st.queue[-1] if st and st.queue else None
        return cap - b.size if b is not None and not b.sealed and b.size < cap else 0

    def is_open(self, pb_: ProducerBatch | None, cap: int) -> bool:
        """Whether ``pb_`` still takes pieces (last of its queue, not drained, not full)."""
        if pb_ is None or pb_.sealed or pb_.done or pb_.size >= cap:
            return False
        st = self.parts.get(pb_.tp)
        return st is not None and bool(st.queue) and st.queue[-1] is pb_

    def has_queued(self) -> bool:
        return any(st.queue for st in self.parts.values())

    # ------------------------------------------------------------ draining
    def drain(self, now: float, *, flushing: bool, leader_of: Callable[[TopicPartition], str | None],
              cap_of: Callable[[TopicPartition], int]) -> tuple[dict[str, list[ProducerBatch]], float, bool]:
        """Pick the batches to send now: for each partition with nothing in
        flight, its first batch and the ready ones behind it, grouped by leader
        address into one request per broker.

        Returns ``(plan, next_wake, leaderless)``: ``plan`` maps an address to
        its batches (already marked in flight and sequenced), ``next_wake`` is
        when a lingering batch or a retry becomes due, ``leaderless`` says some
        ready batch waits for a leader (the metadata should be refreshed).
        """
        plan: dict[str, list[ProducerBatch]] = {}
        plan_bytes: dict[str, int] = {}
        wake = now + 1.0
        leaderless = False
        if self.idempotent and self.needs_producer_id:
            return plan, wake, leaderless
        for tp, st in self.parts.items():
            if not st.queue:
                continue
            if st.inflight:
                continue  # one append per partition in flight: gRPC does not order concurrent calls
            b = st.queue[0]
            if b.attempts:
                if now < b.retry_at:
                    wake = min(wake, b.retry_at)
                    continue
            else:
                full = len(st.queue) > 1 or b.size >= cap_of(tp)
                if not (full or flushing or now >= b.created + self.linger_s):
                    wake = min(wake, b.created + self.linger_s)
                    continue
            target = leader_of(tp)
            if target is None:
                leaderless = True
                continue
            if target not in plan and self.broker_inflight.get(target, 0) >= self.max_in_flight:
                continue
            if target in plan and plan_bytes[target] + b.size > MAX_REQUEST_BYTES:
                continue
            if self.idempotent and st.generation != self.generation:
                st.generation, st.next_sequence = self.generation, 0   # nothing in flight (checked above)
            if target not in plan:
                plan[target] = []
                plan_bytes[target] = 0
                self.broker_inflight[target] = self.broker_inflight.get(target, 0) + 1
            # The head batch, then the full ones queued behind it, in order in this one
            # request (the broker appends a partition's entries in request order).
            taken = 0
            while True:
                self._take(st, b)
                plan[target].append(b)
                plan_bytes[target] += b.size
                taken += b.size
                if not st.queue or b.attempts:
                    break  # a retry goes alone
                b = st.queue[0]
                ready = len(st.queue) > 1 or b.size >= cap_of(tp) or flushing or now >= b.created + self.linger_s
                if (not ready or b.attempts or taken + b.size > PARTITION_REQUEST_BYTES
                        or plan_bytes[target] + b.size > MAX_REQUEST_BYTES):
                    break
        return plan, wake, leaderless

    def _take(self, st: _PartitionState, b: ProducerBatch) -> None:
        """Mark ``b`` (the head of ``st.queue``) in flight, numbering it once."""
        if self.idempotent and (b.sequence is None or b.generation != self.generation):
            b.sequence = st.next_sequence
            b.generation = self.generation
            b.producer_id, b.producer_epoch = self.producer_id, self.producer_epoch
            st.next_sequence = (st.next_sequence + b.rows) % SEQUENCE_MODULUS
        st.queue.popleft()
        st.inflight.append(b)
        b.sealed = True

    def request_done(self, target: str) -> None:
        """One Produce RPC to ``target`` finished (whatever its outcome)."""
        n = self.broker_inflight.get(target, 0) - 1
        if n > 0:
            self.broker_inflight[target] = n
        else:
            self.broker_inflight.pop(target, None)

    # ------------------------------------------------------------ outcomes
    def completed(self, b: ProducerBatch, base_offset: int, log_append_time_ms: int = -1) -> list[Action]:
        """The broker appended ``b`` at ``base_offset`` (-1: unknown, acks=0)."""
        st = self.parts[b.tp]
        if b in st.inflight:
            st.inflight.remove(b)
        actions = []
        for batch, handle, index, first_row in b.pieces:
            a = handle.piece_ok(index, base_offset + first_row if base_offset >= 0 else -1, log_append_time_ms)
            if a:
                actions.append(a)
        self._finish(b)
        return actions

    def failed(self, b: ProducerBatch, err: E.ReplikafkaError, now: float) -> tuple[bool, list[Action]]:
        """The send of in-flight batch ``b`` failed with ``err``: requeue it for a
        retry if the error is retriable and its delivery deadline allows, else
        fail its sends. Returns ``(retrying, actions)``."""
        st = self.parts[b.tp]
        if b in st.inflight:
            st.inflight.remove(b)
        retriable = err.retriable
        if isinstance(err, E.OutOfOrderSequenceError):
            # Expected when an earlier batch of the partition is being retried,
            # or the batch was numbered under a producer id since replaced.
            retriable = self.idempotent and (b.generation != self.generation or self.needs_producer_id
                                             or self._earlier_unacked(st, b))
        if retriable and now < b.deadline:
            b.attempts += 1
            b.last_error = err
            b.retry_at = now + min(self.retry_backoff_s * (2 ** (b.attempts - 1)), 1.0)
            self._requeue(st, b)
            return True, []
        if retriable:
            err = E.KafkaTimeoutError(
                f"{b.rows} record(s) for {b.tp[0]}-{b.tp[1]} not delivered within delivery_timeout_ms "
                f"({b.attempts + 1} attempt(s)); last error: {err}")
        return False, self._fail(b, err)

    def expire(self, now: float) -> list[Action]:
        """Fail queued (not in-flight) batches whose delivery deadline passed."""
        actions: list[Action] = []
        for st in self.parts.values():
            while st.queue and st.queue[0].deadline <= now:
                b = st.queue.popleft()
                why = f"; last error: {b.last_error}" if b.last_error else ""
                actions += self._fail(b, E.KafkaTimeoutError(
                    f"{b.rows} record(s) for {b.tp[0]}-{b.tp[1]} expired after delivery_timeout_ms "
                    f"({b.attempts} attempt(s)){why}"))
        return actions

    def fail_partition(self, tp: TopicPartition, err: E.ReplikafkaError) -> list[Action]:
        """Fail every queued batch of a partition (e.g. its topic was deleted)."""
        st = self.parts.get(tp)
        actions: list[Action] = []
        while st and st.queue:
            actions += self._fail(st.queue.popleft(), err)
        return actions

    def fail_queued(self, err: E.ReplikafkaError) -> list[Action]:
        """Fail every batch not in flight."""
        actions: list[Action] = []
        for tp in list(self.parts):
            actions += self.fail_partition(tp, err)
        return actions

    def abort_all(self, err: E.ReplikafkaError) -> list[Action]:
        """Fail everything, in flight or not (forced close)."""
        actions = self.fail_queued(err)
        for st in self.parts.values():
            while st.inflight:
                actions += self._fail(st.inflight.pop(0), err)
        return actions

    def set_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id: unacknowledged batches are renumbered under it."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.generation += 1
        self.needs_producer_id = False

    # ------------------------------------------------------------ internals
    def _fail(self, b: ProducerBatch, err: BaseException) -> list[Action]:
        if self.idempotent and b.sequence is not None and b.generation == self.generation:
            self.needs_producer_id = True  # the partition's sequence now has a gap
        actions = [a for a in (handle.failed(err) for _, handle, _, _ in b.pieces) if a]
        self._finish(b)
        return actions

    def _finish(self, b: ProducerBatch) -> None:
        if not b.done:
            b.done = True
            self.buffer_used -= b.size
            self.incomplete.discard(b)
            b.pieces = []
            b.payload = None
            b.put = None

    @staticmethod
    def _earlier_unacked(st: _PartitionState, b: ProducerBatch) -> bool:
        for other in list(st.inflight) + list(st.queue):
            if (other is not b and other.sequence is not None and other.generation == b.generation
                    and other.sequence < b.sequence):
                return True
        return False

    @staticmethod
    def _requeue(st: _PartitionState, b: ProducerBatch) -> None:
        """Put a batch back at its place: retries first, in (generation, sequence)
        order, before never-sent batches."""
        items = list(st.queue)
        keys = [(0, o.generation, o.sequence) if o.sequence is not None else (1, 0, 0) for o in items]
        key = (0, b.generation, b.sequence) if b.sequence is not None else (0, -1, -1)
        i = bisect.bisect_right(keys, key)
        items.insert(i, b)
        st.queue = deque(items)
