"""Executor side: read exactly one planned ``[start, end)`` of one partition.

:func:`read_range` is the loop a Spark task runs. It talks to the cluster only
through a narrow :class:`Transport` (leader lookup, metadata refresh, opening a
stream of the partition from an offset, the log start offset), which tests
replace with a scripted one; :class:`ClusterTransport` is the real one.

What it guarantees: the records it yields are exactly offsets ``start .. end-1``
in order, each once — or it raises. In detail:

- Every read goes to the partition's current leader with the leader epoch the
  metadata holds (KIP-320). ``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``,
  an unreachable broker and every other retriable error, when a stream is opened
  or in its middle: refresh metadata, back off, open a new stream from the first
  offset not yet yielded.
- A stream that ends before ``end`` stopped at this leader's high watermark — in
  [HW, LEO) after a leader change, the new leader has not yet learnt that the
  data is committed. ``end`` was at or below the HW when the read was planned, so
  the data exists: open the stream again (the broker long-polls for the HW when
  nothing is readable yet) until it is.
- ``OFFSET_OUT_OF_RANGE`` below the log start offset is data loss (retention):
  an error, or with ``failOnDataLoss=false`` the gone offsets are skipped and
  counted. Any other out-of-range answer (a stale broker) is retried.
- Nothing above stops waiting forever: if no record arrives for
  ``fetch_timeout_s`` the read fails loudly, naming the partition, the offsets
  still missing and the last error, rather than returning a short range.

:class:`ClusterTransport` reads through the leader's Arrow Flight listener when
it has one: one ``DoGet`` for the whole rest of the range, the stored batches
streamed as stored up to ``end`` (the broker bounds its own in-flight bytes, the
client's receive window bounds what arrives ahead of Spark: ``fetchMaxBytes``),
so there is no per-fetch round trip and no per-fetch Python work, and network
and conversion overlap through the stream itself. Without a Flight listener (SSL
clients, an unreachable listener) :func:`fetch_stream` makes consecutive
``Fetch`` calls look like the same stream, the next one sent before the last
one's batches are handed on.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol

import pyarrow as pa

from replikafka import errors as E
from replikafka.client.connection import result_of
from replikafka.client.flight_reader import FLIGHT_PROTOCOL
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.flight_ticket import MAX_WAIT_MS, PartitionTicket
from replikafka.protocol.rpc_errors import from_pb
from replikafka.records import decode_untrusted
from replikafka.spark.offsets_planning import DataLossError, OffsetRange, TopicPartition

#: How long the broker may hold a read for data that is not committed yet.
FETCH_MAX_WAIT_MS = 500
RETRY_BACKOFF_S = 0.05
RETRY_BACKOFF_MAX_S = 1.0
EMPTY_ANSWER_PAUSE_S = 0.01
MIN_FETCH_BYTES = 64 * 1024
#: Added to a call's own deadline (``fetch_timeout_s`` plus the long poll) for the network.
CALL_TIMEOUT_MARGIN_S = 5.0


@dataclass(frozen=True, slots=True)
class StreamAsk:
    """What a stream is opened for: ``tp`` from ``offset`` up to ``end`` (exclusive) at
    the leader in ``epoch``, projected to ``columns``; ``max_wait_ms`` is the long poll
    when nothing is readable yet, ``timeout_s`` bounds the call, ``max_bytes`` each
    ``Fetch`` answer (the Fetch stream's memory bound)."""
    tp: TopicPartition
    offset: int
    end: int
    epoch: int
    columns: tuple[str, ...]
    max_wait_ms: int
    timeout_s: float
    max_bytes: int


class Transport(Protocol):
    def leader(self, tp: TopicPartition) -> tuple[str, int] | None: ...
    def refresh(self, topics: list[str]) -> None: ...
    def open(self, target: str, ask: StreamAsk) -> Iterable[tuple[pa.RecordBatch, int]]: ...
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

    def open(self, target, ask):
        broker = self.client.metadata.leader_for(*ask.tp)
        flight = broker.listener(FLIGHT_PROTOCOL) if broker is not None and broker.target == target else None
        if flight is not None and self.client.flight is not None and self.client.flight.available(flight):
            ticket = PartitionTicket(ask.tp[0], ask.tp[1], ask.offset, end_offset=ask.end,
                                     current_leader_epoch=ask.epoch, columns=tuple(ask.columns) or None,
                                     max_wait_ms=min(max(ask.max_wait_ms, 0), MAX_WAIT_MS))
            return self.client.flight.stream(flight, ticket, ask.timeout_s)
        return fetch_stream(lambda request: _GrpcCall(self.client.pool.call_async(target, "Fetch", request,
                                                                                  ask.timeout_s), target), ask)

    def log_start(self, tp):
        return self.client.log_start(tp)


class _GrpcCall:
    def __init__(self, future, target):
        self.future, self.target = future, target

    def result(self) -> pb.FetchResponse:
        return result_of(self.future, self.target)

    def cancel(self) -> None:
        self.future.cancel()


def _request(ask: StreamAsk, offset: int, max_bytes: int) -> pb.FetchRequest:
    return pb.FetchRequest(
        replica_id=-1, max_wait_ms=ask.max_wait_ms, min_bytes=1, max_bytes=max_bytes,
        partitions=[pb.FetchPartition(topic=ask.tp[0], partition=ask.tp[1], fetch_offset=offset,
                                      current_leader_epoch=ask.epoch, partition_max_bytes=max_bytes,
                                      last_fetched_epoch=-1)],
        columns=list(ask.columns))


def fetch_stream(send: Callable[[pb.FetchRequest], Any], ask: StreamAsk) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The stream of ``ask`` as consecutive ``Fetch`` calls (``send(request)`` -> a call
    whose ``result()`` is the FetchResponse): ``(batch, first offset)`` of each answer,
    fully validated (CorruptRecordError naming the problem otherwise), the next call
    sent before the last answer's batches are handed on; it ends at the first empty
    answer (the leader's HW) or at ``end``, and raises an answer's error."""
    where = f"{ask.tp[0]}-{ask.tp[1]} from offset {ask.offset}"
    bytes_per_record = 0.0      # learnt from the answers; caps the last fetch near ``end``

    def send_from(offset: int):
        want = ask.max_bytes
        if bytes_per_record:
            # Do not make the broker read and send much past the planned end.
            want = int(min(ask.max_bytes, max(MIN_FETCH_BYTES, (ask.end - offset) * bytes_per_record * 1.1 + 4096)))
        return send(_request(ask, offset, want))

    pending = send_from(ask.offset)
    try:
        while pending is not None:
            call, pending = pending, None
            response = call.result()
            part = next((p for p in response.partitions if p.topic == ask.tp[0] and p.partition == ask.tp[1]), None)
            if part is None:
                raise E.ReplikafkaError(f"{where}: the Fetch answer has no entry for the partition")
            err = from_pb(part.error)
            if err is not None:
                raise err
            records = part.records if part.record_count else b""     # upb copies on every access: once
            if not records:
                return
            batches = decode_untrusted(records, where)[1]
            base, count = part.records_base_offset, part.record_count
            if sum(b.num_rows for b in batches) != count:
                raise E.CorruptRecordError(f"{where}: the broker announced {count} records from {base} but sent "
                                           f"{sum(b.num_rows for b in batches)}")
            bytes_per_record = len(records) / count
            if base + count < ask.end:
                pending = send_from(base + count)
            first = base
            for batch in batches:
                yield batch, first
                first += batch.num_rows
    finally:
        if pending is not None:
            pending.cancel()


@dataclass
class ReadStats:
    """What one range read went through (for logs and tests)."""
    fetches: int = 0             # streams opened
    records: int = 0
    bytes: int = 0
    retries: int = 0
    waits: int = 0
    skipped: int = 0
    wait_s: float = 0.0          # time spent waiting for the broker's batches
    leaders: set = field(default_factory=set)
    errors: list = field(default_factory=list)


def read_range(transport: Transport, rng: OffsetRange, *, columns, convert: Callable[[pa.RecordBatch, int], Any],
               fetch_timeout_s: float, fail_on_data_loss: bool, max_bytes: int,
               stats: ReadStats | None = None, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[Any]:
    """Yield ``convert(batch, first_offset)`` for the records of ``rng``, exactly."""
    stats = stats if stats is not None else ReadStats()
    tp = rng.tp
    pos = rng.start
    end = rng.end
    columns = tuple(columns)
    deadline = clock() + fetch_timeout_s
    backoff = RETRY_BACKOFF_S
    last: str = ""

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

    def retry(exc: E.ReplikafkaError, why: str, refresh: bool = True) -> None:
        nonlocal last
        last = why
        stats.retries += 1
        stats.errors.append(exc.code)
        if refresh:
            transport.refresh([tp[0]])
        pause()

    while pos < end:
        leader = transport.leader(tp)
        if leader is None:
            last = "no live leader"
            stats.retries += 1
            transport.refresh([tp[0]])
            pause()
            continue
        target, epoch = leader
        stats.leaders.add(target)
        stats.fetches += 1
        wait_ms = int(max(0, min(FETCH_MAX_WAIT_MS, (deadline - clock()) * 1000)))
        ask = StreamAsk(tp, pos, end, epoch, columns, wait_ms,
                        fetch_timeout_s + wait_ms / 1000 + CALL_TIMEOUT_MARGIN_S, max_bytes)
        opened_at = pos
        gap = None                 # the first offset of an answer that skipped records
        failure = None             # the error that ended the stream (opening it or midway)
        try:
            stream = iter(transport.open(target, ask))
        except E.ReplikafkaError as exc:
            stream, failure = iter(()), exc
        try:
            while pos < end:
                waited = time.perf_counter()
                try:
                    item = next(stream, None)
                except E.ReplikafkaError as exc:
                    failure = exc
                    break
                finally:
                    stats.wait_s += time.perf_counter() - waited
                if item is None:
                    break
                batch, first = item
                if first > pos:
                    gap = first
                    break
                n = batch.num_rows
                hi = min(first + n, end)
                if hi <= pos:
                    continue            # wholly before the asked offset (an answer from a batch start)
                piece = batch if (pos == first and hi == first + n) else batch.slice(pos - first, hi - pos)
                stats.bytes += batch.nbytes
                stats.records += piece.num_rows
                lo, pos = pos, hi
                deadline = clock() + fetch_timeout_s
                backoff = RETRY_BACKOFF_S
                yield convert(piece, lo)
            if pos >= end and gap is None and failure is None:
                _drain(stream)      # let the stream end as the broker ends it (at ``end``), not cancelled
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()             # a stream left early cancels its call
        if gap is not None:
            raise E.CorruptRecordError(f"{where()}: asked for offset {pos}, the broker answered from {gap}")
        if isinstance(failure, E.OffsetOutOfRangeError):
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
            retry(failure, f"{failure} (log start {log_start})")
        elif isinstance(failure, E.CorruptRecordError):
            # A batch that is not valid Arrow fails this partition's read, named, never the process.
            retry(failure, str(failure), refresh=False)
        elif failure is not None:
            if not failure.retriable:
                raise E.error_for_code(failure.code, f"{where()}: {failure.message}") from None
            retry(failure, str(failure))
        elif pos == opened_at and pos < end:
            # At or above this leader's HW: committed at planning, not readable here yet.
            stats.waits += 1
            last = f"offset {pos} is not below the high watermark of the leader {target} yet"
            if clock() >= deadline:
                give_up()
            sleep(EMPTY_ANSWER_PAUSE_S)   # the broker already held the read; do not spin


def _drain(stream: Iterator) -> None:
    """Read the end of a stream whose range is complete (the broker ends it right after
    the last batch; anything else it says is moot, and closing it cancels the rest)."""
    try:
        next(stream, None)
    except E.ReplikafkaError:
        pass


def _log_start(transport: Transport, tp: TopicPartition) -> int | None:
    try:
        return transport.log_start(tp)
    except E.ReplikafkaError:
        return None
