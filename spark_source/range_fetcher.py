"""Executor side: read exactly one planned ``[start, end)`` of one partition.

:func:`read_range` is the loop a Spark task runs. It talks to the cluster only
through a narrow :class:`Transport` (leader lookup, metadata refresh, an
asynchronous ``Fetch``, the log start offset), which tests replace with a
scripted one; :class:`ClusterTransport` is the real one.

What it guarantees: the records it yields are exactly offsets ``start .. end-1``
in order, each once — or it raises. In detail:

- Every fetch goes to the partition's current leader with the leader epoch the
  metadata holds (KIP-320). ``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``,
  an unreachable broker and every other retriable error: refresh metadata,
  back off, try again.
- An empty answer means the offset is at or above this leader's high watermark
  — in [HW, LEO) after a leader change, the new leader has not yet learnt that
  the data is committed. ``end`` was at or below the HW when the read was
  planned, so the data exists: wait (the broker long-polls) and ask again.
- ``OFFSET_OUT_OF_RANGE`` below the log start offset is data loss (retention):
  an error, or with ``failOnDataLoss=false`` the gone offsets are skipped and
  counted. Any other out-of-range answer (a stale broker) is retried.
- Nothing above stops waiting forever: if no record arrives for
  ``fetch_timeout_s`` the read fails loudly, naming the partition, the offsets
  still missing and the last error, rather than returning a short range.

The next fetch is sent as soon as an answer arrives, before its batches are
converted and handed to Spark, so network and conversion overlap.

:class:`ClusterTransport` reads through the leader's Arrow Flight listener when
it has one (``DoGet``: the stored batches as stored, no long poll, so a wait in
[HW, LEO) is a short pause and a new ask) and with ``Fetch`` otherwise; both
answer in the shape of a FetchResponse, so the loop is the same.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import pyarrow as pa

from replikafka import errors as E
from replikafka.client.connection import result_of
from replikafka.client.flight_reader import FLIGHT_PROTOCOL
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.flight_ticket import INT32_MAX, MAX_WAIT_MS, PartitionTicket
from replikafka.protocol.rpc_errors import from_pb
from replikafka.records import decode_untrusted
from replikafka.spark.offsets_planning import DataLossError, OffsetRange, TopicPartition

#: How long the broker may hold a fetch for data that is not committed yet.
FETCH_MAX_WAIT_MS = 500
RETRY_BACKOFF_S = 0.05
RETRY_BACKOFF_MAX_S = 1.0
EMPTY_ANSWER_PAUSE_S = 0.01
MIN_FETCH_BYTES = 64 * 1024


class Transport(Protocol):
    def leader(self, tp: TopicPartition) -> tuple[str, int] | None: ...
    def refresh(self, topics: list[str]) -> None: ...
    def fetch_async(self, target: str, request: pb.FetchRequest, timeout_s: float) -> Any: ...
    def log_start(self, tp: TopicPartition) -> int: ...


class ClusterTransport:
    """:class:`Transport` over a :class:`~replikafka.spark.cluster_access.ClusterClient`."""

    def __init__(self, client):
        self.client = client

    def leader(self, tp):
        found = self.client.leader(tp)
        if found is None and self.client.metadata.partition(*tp) is None:
            self.client.refresh([tp[0]])        # a fresh worker process: learn the topic first
            found = self.client.leader(tp)
        return found

    def refresh(self, topics):
        self.client.refresh(topics)

    def fetch_async(self, target, request, timeout_s):
        fp = request.partitions[0]
        broker = self.client.metadata.leader_for(fp.topic, fp.partition)
        flight = broker.listener(FLIGHT_PROTOCOL) if broker is not None and broker.target == target else None
        if flight is not None and self.client.flight is not None and self.client.flight.available(flight):
            ticket = PartitionTicket(fp.topic, fp.partition, fp.fetch_offset,
                                     max_bytes=min(max(fp.partition_max_bytes, 1), INT32_MAX),
                                     current_leader_epoch=fp.current_leader_epoch,
                                     columns=tuple(request.columns) or None,
                                     max_wait_ms=min(max(request.max_wait_ms, 0), MAX_WAIT_MS))
            return _FlightCall(self.client.flight_io.submit(self.client.flight.read, flight, ticket, timeout_s),
                               ticket)
        return _GrpcCall(self.client.pool.call_async(target, "Fetch", request, timeout_s), target)

    def log_start(self, tp):
        return self.client.log_start(tp)


class _GrpcCall:
    def __init__(self, future, target):
        self.future, self.target = future, target

    def result(self) -> pb.FetchResponse:
        return result_of(self.future, self.target)

    def cancel(self) -> None:
        self.future.cancel()


class _FlightAnswer:
    """A Flight read in the shape of one FetchResponse partition (``batches`` instead
    of ``records``). The HW is not sent: -1, as a leader that does not know it yet."""

    def __init__(self, ticket: PartitionTicket, read):
        self.topic, self.partition = ticket.topic, ticket.partition
        self.error = pb.Error()
        self.high_watermark = -1
        self.batches = read.batches
        self.record_count = read.record_count
        self.records_base_offset = read.first_offsets[0] if read.batches else ticket.start_offset
        self.nbytes = read.nbytes


class _FlightCall:
    def __init__(self, future, ticket: PartitionTicket):
        self.future, self.ticket = future, ticket

    def result(self):
        answer = _FlightAnswer(self.ticket, self.future.result())

        class Response:
            partitions = [answer]
        return Response

    def cancel(self) -> None:
        self.future.cancel()


def _answer_batches(part, where: str) -> tuple[list, int]:
    """(batches, bytes) of one answer: Flight's as received, Fetch's decoded in place and
    fully validated (CorruptRecordError naming the problem otherwise)."""
    batches = getattr(part, "batches", None)
    if batches is not None:
        return batches, part.nbytes
    records = part.records if part.record_count else b""     # upb copies on every access: once
    if not records:
        return [], 0
    return decode_untrusted(records, where)[1], len(records)


@dataclass
class ReadStats:
    """What one range read went through (for logs and tests)."""
    fetches: int = 0
    records: int = 0
    bytes: int = 0
    retries: int = 0
    waits: int = 0
    skipped: int = 0
    wait_s: float = 0.0          # time spent waiting for Fetch answers
    leaders: set = field(default_factory=set)
    errors: list = field(default_factory=list)


def _request(tp: TopicPartition, offset: int, epoch: int, max_bytes: int, columns, max_wait_ms: int) -> pb.FetchRequest:
    return pb.FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
        partitions=[pb.FetchPartition(topic=tp[0], partition=tp[1], fetch_offset=offset,
                                      current_leader_epoch=epoch, partition_max_bytes=max_bytes,
                                      last_fetched_epoch=-1)],
        columns=list(columns))


def read_range(transport: Transport, rng: OffsetRange, *, columns, convert: Callable[[pa.RecordBatch, int], Any],
               fetch_timeout_s: float, fail_on_data_loss: bool, max_bytes: int,
               stats: ReadStats | None = None, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[Any]:
    """Yield ``convert(batch, first_offset)`` for the records of ``rng``, exactly."""
    stats = stats if stats is not None else ReadStats()
    tp = rng.tp
    pos = rng.start
    end = rng.end
    deadline = clock() + fetch_timeout_s
    backoff = RETRY_BACKOFF_S
    last: str = ""
    pending = None          # (offset, call)

    def where() -> str:
        return f"{tp[0]}-{tp[1]} range [{rng.start}, {end})"

    def give_up() -> None:
        raise E.KafkaTimeoutError(
            f"{where()}: no progress for {fetch_timeout_s:.0f}s at offset {pos} ({end - pos} planned records "
            f"still unread); last: {last or 'none'}. The records were committed when the read was planned; "
            "failing rather than returning a short range (raise fetchTimeoutMs to wait longer)")

    def pause() -> None:
        nonlocal backoff
        remaining = deadline - clock()
        if remaining <= 0:
            give_up()
        sleep(min(backoff, remaining))
        backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)

    bytes_per_record = 0.0      # learnt from the answers; caps the last fetch near ``end``

    def start_fetch(offset: int):
        leader = transport.leader(tp)
        if leader is None:
            return None
        target, epoch = leader
        stats.leaders.add(target)
        stats.fetches += 1
        wait_ms = int(max(0, min(FETCH_MAX_WAIT_MS, (deadline - clock()) * 1000)))
        timeout_s = max(deadline - clock(), 0.001) + wait_ms / 1000 + 5.0
        want = max_bytes
        if bytes_per_record:
            # Do not make the broker read and send much past the planned end.
            want = int(min(max_bytes, max(MIN_FETCH_BYTES, (end - offset) * bytes_per_record * 1.1 + 4096)))
        return offset, transport.fetch_async(target, _request(tp, offset, epoch, want, columns, wait_ms),
                                             timeout_s)

    try:
        while pos < end:
            if pending is None or pending[0] != pos:
                pending = start_fetch(pos)
                if pending is None:
                    last = "no live leader"
                    stats.retries += 1
                    transport.refresh([tp[0]])
                    pause()
                    continue
            call = pending[1]
            pending = None
            try:
                waited = time.perf_counter()
                response = call.result()
                stats.wait_s += time.perf_counter() - waited
                part = next((p for p in response.partitions if p.topic == tp[0] and p.partition == tp[1]), None)
                if part is None:
                    raise E.ReplikafkaError(f"{where()}: the Fetch answer has no entry for the partition")
                err = from_pb(part.error)
                if err is not None:
                    raise err
            except E.OffsetOutOfRangeError as exc:
                log_start = _log_start(transport, tp)
                if log_start is not None and pos < log_start:
                    gone_to = min(log_start, end)
                    if fail_on_data_loss:
                        raise DataLossError(f"{where()}: offsets [{pos}, {gone_to}) were removed by retention "
                                            f"before they were read (the log now starts at {log_start})") from None
                    stats.skipped += gone_to - pos
                    pos = gone_to
                    deadline = clock() + fetch_timeout_s
                    continue
                last = f"{exc} (log start {log_start})"
                stats.retries += 1
                stats.errors.append(exc.code)
                transport.refresh([tp[0]])
                pause()
                continue
            except E.ReplikafkaError as exc:
                if not exc.retriable:
                    raise E.error_for_code(exc.code, f"{where()}: {exc.message}") from None
                last = str(exc)
                stats.retries += 1
                stats.errors.append(exc.code)
                transport.refresh([tp[0]])
                pause()
                continue
            try:  # a batch that is not valid Arrow fails this partition's read, named, never the process
                batches, nbytes = _answer_batches(part, where())
            except E.CorruptRecordError as exc:
                last = str(exc)
                stats.retries += 1
                stats.errors.append(exc.code)
                pause()
                continue
            if not batches:
                # At or above this leader's HW: committed at planning, not readable here yet.
                stats.waits += 1
                last = f"offset {pos} is not below the leader's high watermark {part.high_watermark} yet"
                if part.high_watermark > pos:
                    pause()         # an empty answer below the HW: odd, back off
                elif clock() >= deadline:
                    give_up()
                else:
                    sleep(EMPTY_ANSWER_PAUSE_S)   # the broker already held the fetch; do not spin
                continue
            stats.bytes += nbytes
            bytes_per_record = nbytes / part.record_count
            base = part.records_base_offset
            if base > pos:
                raise E.CorruptRecordError(f"{where()}: asked for offset {pos}, the broker answered from {base}")
            take = min(base + part.record_count, end) - pos
            next_pos = pos + take
            if next_pos < end:
                pending = start_fetch(next_pos)
            offset = base
            for batch in batches:
                n = batch.num_rows
                lo, hi = max(pos, offset), min(offset + n, end)
                if hi > lo:
                    piece = batch if (lo == offset and hi == offset + n) else batch.slice(lo - offset, hi - lo)
                    stats.records += piece.num_rows
                    pos = hi
                    yield convert(piece, lo)
                offset += n
                if offset >= end:
                    break
            if pos != next_pos:
                raise E.CorruptRecordError(f"{where()}: the broker announced records up to {base + part.record_count}"
                                           f" but sent only up to {pos}")
            deadline = clock() + fetch_timeout_s
            backoff = RETRY_BACKOFF_S
    finally:
        if pending is not None and hasattr(pending[1], "cancel"):
            pending[1].cancel()


def _log_start(transport: Transport, tp: TopicPartition) -> int | None:
    try:
        return transport.log_start(tp)
    except E.ReplikafkaError:
        return None
