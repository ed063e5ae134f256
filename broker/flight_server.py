"""Arrow Flight on the broker: partitions read as the stored record batches.

- ``DoGet(ticket)`` (ticket: :mod:`replikafka.protocol.flight_ticket`) streams a
  partition's committed records with Fetch's semantics: only below the HW (a start
  in [HW, LEO] gives an empty stream, after waiting up to the ticket's
  ``max_wait_ms`` for the HW to pass it: the long poll, woken by the HW's
  advance), KIP-320 epoch fencing, errors as Flight errors carrying our error code. Every batch is a stored batch decoded in place
  from the segment mapping (its buffers are the mapped bytes; gRPC sends them
  without a copy), cut only where the ticket's range starts or ends mid-batch,
  projected by selecting the requested columns' buffers. Each batch's
  ``app_metadata`` is ``{"first_offset": N}``: the reader numbers rows from it.
- ``DoPut(command)`` appends to one partition (:mod:`replikafka.protocol.flight_produce`):
  the producer's batches as Arrow reads them off the stream (zero-copy views of
  the received messages), fully validated, appended with their offsets, epoch and
  CRC added (the body goes to disk as received; its CRC-32C must equal the
  producer's), acks=all waiting for the HW as Produce does. One ``PutResult``
  answers, a result per append; a producer keeps the call open and sends further
  groups of appends on it, each answered the same way (and each counted as one
  Produce request); a refused call is a Flight error carrying our error code. One
  group holds at most ``socket.request.max.bytes``.
- ``GetFlightInfo(path=[topic])``: one endpoint per partition, at its leader's
  Flight listener, with a ticket for [log start, HW) in the leader's epoch.
- ``ListFlights``: one FlightInfo per topic (no endpoints: ask GetFlightInfo).
- ``GetSchema(path=[topic])``: the topic's schema.

Memory: each stream holds one batch at a time, and all streams together hold at
most ``flight.max.bytes.in.flight`` (:class:`InFlightBudget`): a stream waits
for room before it hands gRPC its next batch.

Thread-safety: Flight calls run on gRPC's threads; the server keeps no per-call
state outside the call's generator. The budget is a condition variable.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.flight as fl

from replikafka import errors as E
from replikafka import records as R
from replikafka.broker import replica_fetch_codec, replica_rpc
from replikafka.broker.flight_security import MIDDLEWARE_KEY, allowed, require
from replikafka.broker.wire_limits import WireLimits, check_request_entries
from replikafka.broker.replica.replica_manager import partition_read_error
from replikafka.broker.storage.log import clip_stored
from replikafka.protocol import flight_produce, flight_ticket
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import to_flight_error

log = logging.getLogger("replikafka.flight")
#: Stored bytes read from the log per step of a stream (each step re-checks leadership and the HW).
READ_STEP_BYTES = 8 << 20
INT64_MAX = 2**63 - 1
#: The Flight action a follower fetches with (``replica.fetch.transport=flight``).
REPLICA_FETCH_ACTION = "replica-fetch"


class InFlightBudget:
    """At most ``max_bytes`` of batches handed to streams and not yet written.
    A batch larger than the whole budget goes when nothing else is in flight (as a
    fetch always returns its first batch). Thread-safe."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.in_flight = 0
        self.peak = 0
        self._cond = threading.Condition()

    def acquire(self, nbytes: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.in_flight and self.in_flight + nbytes > self.max_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise E.RequestTimedOutError(
                        f"flight: no room for a {nbytes}-byte batch in {timeout_s:.1f}s "
                        f"(flight.max.bytes.in.flight={self.max_bytes}, {self.in_flight} in flight)")
                self._cond.wait(left)
            self.in_flight += nbytes
            self.peak = max(self.peak, self.in_flight)
            return nbytes

    def release(self, nbytes: int) -> None:
        if nbytes:
            with self._cond:
                self.in_flight -= nbytes
                self._cond.notify_all()


def batch_metadata(first_offset: int) -> bytes:
    return b'{"first_offset":%d}' % first_offset


def stream_ticket(ticket: flight_ticket.PartitionTicket, read, step_bytes: int = READ_STEP_BYTES
                  ) -> Iterator[tuple[pa.RecordBatch, int, int]]:
    """(batch, first offset, stored bytes) of the ticket's range, read in steps of
    ``step_bytes`` through ``read(offset, max_bytes, end)`` -> the partition's
    StoredReadResult below the HW (or None at the HW). Stops at the end offset, at
    the HW, or before the batch that would take the stream past the byte budget
    (the stream's first batch always goes)."""
    offset = ticket.start_offset
    end = ticket.end_offset if ticket.end_offset >= 0 else INT64_MAX
    left = ticket.max_bytes or INT64_MAX
    first = True
    while offset < end:
        stored = read(offset, min(step_bytes, left), end)
        if stored is None or not stored.batches:
            return
        batches = []
        for sb in stored.batches:
            if not first and sb.message.size > left:
                break
            first = False
            left -= sb.message.size
            batches.append(sb)
        if not batches:
            return
        stop = min(batches[-1].base_offset + batches[-1].record_count, stored.end_offset)
        for c in clip_stored(batches, offset, stop, ticket.columns):
            size = c.verbatim.message.size if c.verbatim is not None else c.batch.nbytes
            yield c.batch, c.first_offset, size
        if len(batches) < len(stored.batches):
            return
        offset = stop


class BrokerFlightServer(fl.FlightServerBase):
    """The broker's Flight service (module doc). ``location`` is ``grpc://host:port``
    (``grpc+tls://`` with ``tls_certificates``); ``middleware`` is a dict of
    ``pyarrow.flight.ServerMiddlewareFactory`` (authorization, metrics)."""

    def __init__(self, location: str, replica_manager, metadata, *, max_bytes_in_flight: int,
                 wait_timeout_s: float, flight_location_of: Callable[[int], str | None],
                 partition_offsets: Callable[[str, list[tuple[int, int]]], dict], security=None,
                 tls_certificates=None, verify_client: bool = False, root_certificates=None,
                 middleware: dict | None = None, max_put_bytes: int = 100 << 20,
                 wire_limits: WireLimits | None = None,
                 observe_produce: Callable[[float, str], None] = lambda seconds, error_code: None):
        super().__init__(location, tls_certificates=tls_certificates or [], verify_client=verify_client,
                         root_certificates=root_certificates, middleware=middleware)
        self.tls = bool(tls_certificates)
        self.security = security     # ACLs: broker/flight_security.require / allowed
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.budget = InFlightBudget(max_bytes_in_flight)
        self.wait_timeout_s = wait_timeout_s
        self.flight_location_of = flight_location_of
        self.partition_offsets = partition_offsets
        self.max_put_bytes = max_put_bytes
        self.wire_limits = wire_limits or WireLimits()
        # Each group of appends a DoPut carries is one Produce request (seconds, error code).
        self.observe_produce = observe_produce

    # ------------------------------------------------------------ DoGet
    def do_get(self, context, ticket):
        try:
            t = flight_ticket.decode(ticket)
            require(context, self.security, "Read", t.topic)
            part = self.replica_manager.flight_partition(t.topic, t.partition)
            schema = part.log.schema
            if t.columns is not None:
                part.log.check_columns(t.columns)
                schema = pa.schema([schema.field(c) for c in t.columns])

            def read(offset, max_bytes, end):
                try:
                    return part.read_committed(offset, max_bytes, t.current_leader_epoch, end).data
                except E.ReplikafkaError:
                    raise
                except Exception as exc:   # a file or mapping refused (the disk, the process's limits):
                    raise partition_read_error(t.topic, t.partition, exc) from None   # named, as Fetch
            batches = stream_ticket(t, read)
            head = next(batches, None)    # the first read's errors fail the call itself
            if head is None and t.max_wait_ms and (t.end_offset < 0 or t.end_offset > t.start_offset):
                # The long poll: nothing committed at the start yet. Wait for the HW's
                # advance (or a role change), then read once more.
                part.wait_committed_past(t.start_offset, t.max_wait_ms / 1000)
                batches = stream_ticket(t, read)
                head = next(batches, None)
        except E.ReplikafkaError as exc:
            raise to_flight_error(exc) from None
        return fl.GeneratorStream(schema, self._send(head, batches))

    def _send(self, head, batches: Iterator) -> Iterator:
        held = 0
        try:
            item = head
            while item is not None:
                batch, first_offset, size = item
                self.budget.release(held)
                held = 0
                held = self.budget.acquire(size, self.wait_timeout_s)
                yield batch, pa.py_buffer(batch_metadata(first_offset))
                item = next(batches, None)
        except E.ReplikafkaError as exc:   # e.g. leadership lost mid-stream: the reader resumes elsewhere
            raise to_flight_error(exc) from None
        finally:
            self.budget.release(held)

    # ------------------------------------------------------------ DoPut
    def do_put(self, context, descriptor, reader, writer):
        """The command's appends, then each further group the stream announces, each
        answered (one PutResult) before the next is read: a producer keeps the call open
        and pays for opening it once. Every group is authorized, limited and counted as
        one Produce request, as if it had come alone."""
        cmd = None
        started = time.perf_counter()
        try:
            cmd = flight_produce.decode(descriptor)
            chunks = self._put_chunks(reader, f"flight produce to {cmd.topic}-{cmd.partition}")
            head = next(chunks, None)
            while True:
                require(context, self.security, "Write", cmd.topic)
                batches = self._read_put(chunks, cmd, head)
                answer = flight_produce.encode_results(self.replica_manager.append_flight(cmd, batches))
                self.observe_produce(time.perf_counter() - started, "")
                writer.write(pa.py_buffer(answer))
                head = next(chunks, None)     # the producer's next group (or the end of the call)
                if head is None:
                    return
                started = time.perf_counter()
                if head[1] is None:
                    raise E.InvalidRequestError(
                        f"flight produce to {cmd.topic}-{cmd.partition}: more batches than the {cmd.batch_count} "
                        f"CRC-32C values in the command (a further append starts with its metadata)")
                cmd = flight_produce.decode_next_appends(cmd, head[1])
        except E.ReplikafkaError as exc:
            self.observe_produce(time.perf_counter() - started, exc.code)
            raise to_flight_error(exc) from None

    @staticmethod
    def _put_chunks(reader, where: str) -> Iterator[tuple[pa.RecordBatch, object]]:
        """(batch, app_metadata or None) of each batch the stream carries."""
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise E.CorruptRecordError(f"{where}: the stream is not Arrow IPC: {exc}") from None
            if chunk.data is not None:
                meta = chunk.app_metadata
                yield chunk.data, (meta if meta is not None and meta.size else None)

    def _read_put(self, chunks: Iterator, cmd, head) -> list:
        """One group's batches, starting with ``head`` (already read): exactly one per CRC
        in ``cmd``'s appends, at most ``max_put_bytes`` in all (refused as soon as the
        stream passes it). Nothing past the group is read: the producer may send the
        next group only after this one's answer."""
        where = f"flight produce to {cmd.topic}-{cmd.partition}"
        batches = []
        nbytes = 0
        item = head
        while len(batches) < cmd.batch_count:
            if item is None:
                raise E.InvalidRequestError(f"{where}: {len(batches)} batches for the {cmd.batch_count} "
                                            f"CRC-32C values in the command")
            batch, meta = item
            if batches and meta is not None:
                raise E.InvalidRequestError(f"{where}: batch {len(batches)} carries metadata inside an append "
                                            f"of {cmd.batch_count} batches")
            nbytes += batch.nbytes
            if nbytes > self.max_put_bytes:
                raise E.InvalidRequestError(f"{where}: more than socket.request.max.bytes "
                                            f"({self.max_put_bytes}) in one append")
            if batch.num_rows == 0:
                raise E.InvalidRequestError(f"{where}: batch {len(batches)} holds no records")
            batches.append(batch)
            if len(batches) < cmd.batch_count:
                item = next(chunks, None)
        return batches

    # ------------------------------------------------------------ discovery
    def _topic_of(self, descriptor) -> tuple[str, object]:
        if descriptor.descriptor_type != fl.DescriptorType.PATH or len(descriptor.path) != 1:
            raise to_flight_error(E.InvalidRequestError(
                "flight descriptor: expected a path of one element, the topic name"))
        topic = descriptor.path[0].decode("utf-8", "replace")
        entry = self.metadata.topic(topic)
        if entry is None:
            raise to_flight_error(E.UnknownTopicOrPartitionError(f"topic {topic!r} does not exist"))
        return topic, entry

    def get_schema(self, context, descriptor):
        topic, entry = self._topic_of(descriptor)
        require(context, self.security, "Describe", topic)
        return fl.SchemaResult(R.schema_from_bytes(entry.schema))

    def get_flight_info(self, context, descriptor):
        topic, entry = self._topic_of(descriptor)
        require(context, self.security, "Describe", topic)
        states = sorted(entry.partitions.items())
        try:
            offsets = self.partition_offsets(topic, [(p, s.leader) for p, s in states])
        except E.ReplikafkaError as exc:
            raise to_flight_error(exc) from None
        endpoints = []
        records = 0
        for p, s in states:
            got = offsets.get(p)
            if isinstance(got, E.ReplikafkaError):
                raise to_flight_error(E.error_for_code(got.code, f"{topic}-{p}: {got.message}"))
            where = self.flight_location_of(s.leader) if s.leader >= 0 else None
            if got is None or where is None:
                raise to_flight_error(E.LeaderNotAvailableError(f"{topic}-{p} has no live leader with a "
                                                                f"Flight listener"))
            log_start, hw, epoch = got
            ticket = flight_ticket.PartitionTicket(topic, p, log_start, hw, current_leader_epoch=epoch)
            endpoints.append(fl.FlightEndpoint(ticket.encode(), [where]))
            records += hw - log_start
        schema = R.schema_from_bytes(entry.schema)
        return fl.FlightInfo(schema, fl.FlightDescriptor.for_path(topic), endpoints, records, -1)

    def list_flights(self, context, criteria):
        for topic in self.metadata.topic_names():
            entry = self.metadata.topic(topic)
            if entry is not None and allowed(context, self.security, "Describe", topic):
                yield fl.FlightInfo(R.schema_from_bytes(entry.schema), fl.FlightDescriptor.for_path(topic),
                                    [], -1, -1)

    def do_action(self, context, action):
        if action.type == REPLICA_FETCH_ACTION:
            yield fl.Result(pa.py_buffer(self._replica_fetch(context, action.body)))
            return
        if action.type == "in-flight-bytes":   # the budget's state, for operators and the memory-bound test
            yield json.dumps({"in_flight": self.budget.in_flight, "peak": self.budget.peak,
                              "max": self.budget.max_bytes}).encode()
            return
        raise to_flight_error(E.InvalidRequestError(f"unknown flight action {action.type!r}"))

    def _replica_fetch(self, context, body) -> bytes:
        """A follower's fetch over Flight (``replica.fetch.transport=flight``): the body is a
        ``FetchRequest``, the answer the ``replica_fetch_codec`` bytes the gRPC
        ``ReplicaData/Fetch`` returns, from the same ``ReplicaManager.fetch`` (long poll,
        KIP-380 checks). Only on a broker without security: Flight cannot see a peer's
        certificate, so secured clusters' followers fetch with gRPC."""
        if context.get_middleware(MIDDLEWARE_KEY) is not None:
            raise fl.FlightUnauthorizedError(
                f"{E.ClusterAuthorizationFailedError.code}: a follower fetch over Flight needs a cluster without "
                f"security (replica.fetch.transport=grpc there)")
        try:
            try:
                request = pb.FetchRequest.FromString(body.to_pybytes() if body is not None else b"")
            except Exception as exc:     # protobuf's DecodeError
                raise E.InvalidRequestError(f"{REPLICA_FETCH_ACTION}: the body is not a FetchRequest ({exc})") \
                    from None
            check_request_entries(request, self.wire_limits)
            return replica_fetch_codec.encode(replica_rpc.follower_fetch(self.replica_manager, request,
                                                                         lambda: not context.is_cancelled()))
        except E.ReplikafkaError as exc:
            raise to_flight_error(exc) from None

    def list_actions(self, context):
        return [("in-flight-bytes", "bytes of batches held by streams now, the peak, and the limit (JSON)"),
                (REPLICA_FETCH_ACTION, "a follower's fetch: FetchRequest in, replica_fetch_codec bytes out")]
