"""The producer: batches Arrow records per partition and sends them to leaders.

Threading: :meth:`Producer.send`, :meth:`Producer.flush` and
:meth:`Producer.close` may be called from any thread. One background *sender*
thread drains ready batches, encodes them (one Arrow IPC stream per partition,
one ``Produce`` RPC per leader broker, made by a small pool of I/O threads)
and handles the answers, which the I/O threads put in a queue the sender reads. All shared state is
guarded by one condition variable; futures are completed outside it, on the
sender thread, so keep callbacks short and never block in them.
"""
from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.flight as fl

from replikafka import errors as E
from replikafka.client.accumulator import (Accumulator, Action, ProducerBatch, RecordMetadata, SendHandle,
                                           TopicPartition, ipc_size)
from replikafka.client.client_config import PRODUCER_KEYS, accepts_config_dict
from replikafka.client.connection import ConnectionPool, error_of, parse_bootstrap
from replikafka.client.delivery_outcomes import DeliveryOutcomes
from replikafka.client.flight_reader import FLIGHT_PROTOCOL, FlightReader, flight_keeps_identity
from replikafka.client.metadata import METADATA_ATTEMPT_S, ClusterMetadata, TopicInfo
from replikafka.client.partitioner import partition_for_key
from replikafka.client.put_streams import REQUEST_PARTITIONS_MAX, PutStreams
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.broker.storage.batch_format import body_crc32c
from replikafka.protocol import flight_produce
from replikafka.protocol.flight_produce import Append, ProduceCommand
from replikafka.protocol.rpc_errors import from_flight_error, from_pb, to_pb
from replikafka.protocol.produce_wire import PRODUCE_PATH, encode_produce_request
from replikafka.records import encode_stream, records_crc32c, to_record_batch

DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
# Pieces are measured as IPC messages; joining several into one batch can
# change the size a little (e.g. a validity bitmap appears), so keep room.
_IPC_SLACK = 0.01
#: A Flight append joins its pieces into one stored batch below this size (many small
#: sends, one batch for readers); bigger ones go as they are, without a copy.
_CONCAT_BELOW_BYTES = 1 << 20
# Errors after which the partition's leader may have moved.
_REFRESH_ON = (E.NotLeaderOrFollowerError, E.LeaderNotAvailableError, E.FencedLeaderEpochError,
               E.UnknownLeaderEpochError, E.UnknownTopicOrPartitionError, E.BrokerNotAvailableError,
               E.RequestTimedOutError, E.StorageError)

log = logging.getLogger("replikafka.producer")

__all__ = ["Producer", "RecordMetadata", "split_batch", "parse_acks"]


def parse_acks(acks: Any) -> int:
    """``"all"``/-1, 1 or 0 (ints or strings) -> -1, 1, 0."""
    text = str(acks).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise E.InvalidConfigError(f"acks must be 'all', -1, 0 or 1, got {acks!r}")


def split_batch(batch: pa.RecordBatch, target: int, limit: int | None = None,
                first_target: int | None = None) -> list[pa.RecordBatch]:
    """Zero-copy slices of ``batch`` of at most ``target`` bytes each (IPC
    size, see :func:`ipc_size`); the first slice at most ``first_target`` if
    given (to fill a partly full batch). A single record over ``target`` forms
    its own slice if it is within ``limit`` (default ``target``); over it,
    raises :class:`RecordTooLargeError`."""
    limit = max(limit or target, target)
    n = batch.num_rows
    if n == 0:
        return []
    total = ipc_size(batch)
    if total <= (first_target or target):
        return [batch]
    out = []
    per_row = total / n
    start = 0
    goal = first_target or target
    while start < n:
        rows = max(1, min(n - start, int(goal / per_row)))
        piece = batch.slice(start, rows)
        size = ipc_size(piece)
        while size > goal and rows > 1:
            rows = max(1, min(rows - 1, int(rows * goal / size * 0.98)))
            piece = batch.slice(start, rows)
            size = ipc_size(piece)
        if size > goal and goal != target:
            goal = target  # the first record does not fit the partly full batch: start a new one
            continue
        goal = target
        if size > limit:
            raise E.RecordTooLargeError(
                f"record {start} is {size} bytes, larger than the {limit}-byte limit (max.message.bytes)")
        out.append(piece)
        start += rows
    return out


class Producer:
    """Sends records to topics; ``send`` returns a future per call.

    ``bootstrap_servers``: ``"host:port[,host:port...]"``. ``acks``: ``"all"``
    (-1), 1 or 0. ``idempotent``: number batches so the broker drops resent
    duplicates (ignored with ``acks=0``). ``linger_ms``/``batch_size`` (bytes):
    a partition's batch is sent when it is full or has waited that long.
    ``buffer_memory`` bytes may wait in the queues; ``send`` blocks up to
    ``max_block_ms`` for room (and for metadata), then raises
    :class:`KafkaTimeoutError`. A record is retried on retriable errors, with
    a metadata refresh, until ``delivery_timeout_ms`` after its send.
    ``max_in_flight``: Produce RPCs in flight per broker; each partition has
    at most one append in flight (gRPC does not order concurrent calls).
    ``max_request_size`` caps one partition's append in bytes (default: the
    topic's ``max.message.bytes``, else 1 MiB); bigger sends are split.
    ``use_flight`` (``produce.use.flight``): append through the leaders' Arrow Flight
    listeners (``DoPut``: the batches go as Arrow, no request built; one call kept open
    per partition, :mod:`replikafka.client.put_streams`), gRPC
    ``Produce`` for leaders without one (or with SSL, where Flight cannot see the
    client's certificate).
    ``security``: librdkafka's keys (``security.protocol``, ``ssl.*``, ``sasl.*``),
    also accepted in the config dict; see the README's "Securing a cluster".
    """

    @accepts_config_dict("Producer", PRODUCER_KEYS)
    def __init__(self, bootstrap_servers: str | Iterable[str], acks: Any = "all", idempotent: bool = True,
                 linger_ms: float = 5, batch_size: int = 1024 * 1024, delivery_timeout_ms: int = 120_000,
                 request_timeout_ms: int = 30_000, max_in_flight: int = 5, retry_backoff_ms: int = 100,
                 buffer_memory: int = 64 * 1024 * 1024, max_block_ms: int = 60_000,
                 max_request_size: int | None = None,
                 security: Any = None, use_flight: bool = True):
        self._acks = parse_acks(acks)
        for name, v in (("batch_size", batch_size), ("max_in_flight", max_in_flight),
                        ("buffer_memory", buffer_memory), ("request_timeout_ms", request_timeout_ms),
                        ("delivery_timeout_ms", delivery_timeout_ms)):
            if not isinstance(v, int) or v < 1:
                raise E.InvalidConfigError(f"{name} must be a positive integer, got {v!r}")
        if linger_ms < 0 or retry_backoff_ms < 0 or max_block_ms < 0:
            raise E.InvalidConfigError("linger_ms, retry_backoff_ms and max_block_ms must not be negative")
        self._bootstrap = parse_bootstrap(bootstrap_servers)
        self._idempotent = bool(idempotent) and self._acks != 0
        self._batch_size = batch_size
        self._request_timeout_ms = request_timeout_ms
        self._backoff_s = retry_backoff_ms / 1000
        self._buffer_memory = buffer_memory
        self._max_block_s = max_block_ms / 1000
        self._max_request_size = max_request_size
        self._pool = ConnectionPool(security=security)
        self._flight = FlightReader(security=self._pool.security) \
            if use_flight and flight_keeps_identity(self._pool.security) else None
        self._put_streams = PutStreams(wait_s=request_timeout_ms / 1000 + 2.0)
        self._metadata = ClusterMetadata(self._pool, self._bootstrap, request_timeout_ms=request_timeout_ms,
                                         retry_backoff_ms=retry_backoff_ms)
        self._acc = Accumulator(batch_size=batch_size, linger_s=linger_ms / 1000, max_in_flight=max_in_flight,
                                idempotent=self._idempotent, delivery_timeout_s=delivery_timeout_ms / 1000,
                                retry_backoff_s=self._backoff_s)
        self._cv = threading.Condition()
        self._responses: list[tuple[str, list[ProducerBatch], Future]] = []
        self._sticky: dict[str, tuple[int, ProducerBatch | None]] = {}
        # What a topic's metadata gives, worked out once per refresh: (kind, topic) -> (the
        # TopicInfo it came from, value); a refresh makes a new TopicInfo, so a stale one misses.
        self._per_refresh: dict[tuple[str, str], tuple[TopicInfo, Any]] = {}
        self._round_robin = itertools.count(random.randrange(1 << 16))
        self._flushing = 0
        self._closing = False
        self._abort: E.ReplikafkaError | None = None
        self._refresh_wanted = False
        # Blocking RPCs run here (gRPC's own futures start a polling thread per idle call).
        self._io = ThreadPoolExecutor(max_workers=max(4, 4 * max_in_flight), thread_name_prefix="replikafka-producer-io")
        self._outcomes = DeliveryOutcomes()
        self._sender = threading.Thread(target=self._run, name="replikafka-producer-sender", daemon=True)
        self._sender.start()

    # ------------------------------------------------------------ public API
    def send(self, topic: str, data: Any, partition: int | None = None, key: bytes | str | None = None,
             timestamp_ms: int | None = None) -> Future:
        """Queue ``data`` for ``topic``; returns a ``Future[RecordMetadata]``.

        ``data``: a ``pyarrow.RecordBatch``/``Table`` with the topic's columns
        (``timestamp`` optional), a list of dicts, or a bytes/str value for a
        Kafka-shaped topic. The partition is ``partition`` if given, else the
        hash of ``key`` (Kafka's murmur2), else a sticky round-robin choice; a
        ``key`` also becomes the record key when ``data`` is a bytes value.
        Anything knowable at send time raises here: a closed producer, an
        unknown topic or partition (after ``max_block_ms``), data that does
        not fit the topic's schema (the column is named), a record over the
        size limit, no buffer room within ``max_block_ms``. Delivery errors
        become the future's exception; one nobody looked at (``result()`` /
        ``exception()``) is raised by the next :meth:`flush` or :meth:`close`.
        """
        self._check_open()
        # Everything knowable now raises here, as Kafka's send() does (unknown
        # topic after max_block_ms, schema, types, columns, partition, size).
        info = self._metadata.topic(topic) or self._metadata.require_topic(
            topic, timeout_ms=int(self._max_block_s * 1000))
        if isinstance(key, str):
            key = key.encode()
        try:
            batch = to_record_batch(data, info.schema, key=key, timestamp_ms=timestamp_ms, topic=topic)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise E.InvalidSchemaError(f"topic {topic!r}: cannot convert the data: {exc}") from None
        if partition is not None:
            info = self._check_partition(info, partition)
        elif not info.partitions:
            raise E.LeaderNotAvailableError(f"topic {topic!r} has no partitions yet")
        limit = self._append_limit(info)
        future = self._outcomes.new_future()
        if batch.num_rows == 0:
            future.set_result(RecordMetadata(topic, partition if partition is not None else -1, -1, 0))
            return future
        deadline = time.monotonic() + self._max_block_s
        cap = min(self._batch_size, limit)
        with self._cv:
            if partition is None:
                partition = (partition_for_key(key, len(info.partitions)) if key is not None
                             else self._sticky_partition(info, cap))
            room = self._acc.room((topic, partition), cap)
            try:
                pieces = split_batch(batch, cap, limit, first_target=room if room >= cap // 8 else None)
            except E.ReplikafkaError as exc:
                self._outcomes.discard(future)
                raise exc from None
            handle = SendHandle(future, topic, partition, len(pieces), batch.num_rows)
            tp = (topic, partition)
            for i, piece in enumerate(pieces):
                try:
                    self._wait_for_room(ipc_size(piece), deadline, handle)
                except E.ReplikafkaError:
                    self._outcomes.discard(future)  # raised to the caller: not also a delivery failure
                    raise
                b = self._acc.append(tp, piece, handle, i, cap, time.monotonic())
                if key is None and self._sticky.get(topic, (None,))[0] == partition:
                    self._sticky[topic] = (partition, b)
                if b.rows == piece.num_rows or b.size >= cap:
                    self._cv.notify_all()  # a new batch (linger starts) or a full one
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now (ignoring linger) and wait until every
        record sent before this call is acknowledged or has failed. Raises
        :class:`KafkaTimeoutError` after ``timeout`` seconds, and the error of
        any failed send whose future nobody looked at (never a silent drop)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        sent = self._outcomes.outstanding()
        with self._cv:
            pending = list(self._acc.incomplete)
            self._flushing += 1
            self._cv.notify_all()
            try:
                for b in pending:
                    while not b.done:
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise E.KafkaTimeoutError(f"flush did not finish within {timeout} s")
                        self._cv.wait(remaining)
            finally:
                self._flushing -= 1
        # The futures complete just after their batches (outside the lock).
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
        if wait_futures(sent, timeout=remaining).not_done:
            raise E.KafkaTimeoutError(f"flush did not finish within {timeout} s")
        self._outcomes.raise_unobserved("flush")

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (waiting at most ``timeout`` seconds), then
        stop the sender; records still undelivered then fail. Raises the error
        of any failed send whose future nobody looked at. Idempotent."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._sender.join(timeout)
        if self._sender.is_alive():
            with self._cv:
                self._abort = E.KafkaTimeoutError("the producer was closed before these records were delivered")
                self._cv.notify_all()
            self._sender.join()
        self._io.shutdown(wait=False)
        self._put_streams.close()
        if self._flight is not None:
            self._flight.close()
        self._pool.close()
        self._outcomes.raise_unobserved("close")

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids (refreshing metadata if it is not cached)."""
        return sorted(self._metadata.require_topic(topic).partitions)

    def topic_schema(self, topic: str) -> pa.Schema:
        """The topic's own schema (its columns, without ``timestamp``)."""
        return self._metadata.require_topic(topic).schema

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # an exception is already on its way out: report failed sends, do not replace it
            self.close()
        except E.ReplikafkaError as failed:
            log.error("producer closed while %s was raised; %s", exc_type.__name__, failed)

    # ------------------------------------------------------------ send helpers
    def _check_open(self) -> None:
        if self._closing:
            raise E.ReplikafkaError("cannot send: the producer is closed", code="CLIENT_CLOSED")

    def _check_partition(self, info: TopicInfo, partition: int) -> TopicInfo:
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise E.UnknownTopicOrPartitionError(f"partition must be a non-negative integer, got {partition!r}")
        if partition not in info.partitions:
            self._metadata.refresh([info.name])  # partitions may just have been added
            info = self._metadata.require_topic(info.name)
            if partition not in info.partitions:
                raise E.UnknownTopicOrPartitionError(
                    f"topic {info.name!r} has no partition {partition} (it has {len(info.partitions)})")
        return info

    def _append_limit(self, info: TopicInfo) -> int:
        """Largest IPC size (bytes) one partition append may carry (worked out once per
        metadata refresh: the sender asks it for every queued partition at each drain)."""
        cached = self._per_refresh.get(("limit", info.name))
        if cached is not None and cached[0] is info:
            return cached[1]
        limit = DEFAULT_MAX_MESSAGE_BYTES
        raw = info.config.get("max.message.bytes")
        if raw is not None:
            try:
                limit = int(raw)
            except ValueError:
                pass
        if self._max_request_size:
            limit = min(limit, self._max_request_size)
        overhead = len(info.stored_schema.serialize()) + 64  # schema message, end-of-stream marker
        limit = max(int(limit * (1 - _IPC_SLACK)) - overhead, 1024)
        self._per_refresh[("limit", info.name)] = (info, limit)
        return limit

    def _sticky_partition(self, info: TopicInfo, cap: int) -> int:
        """Keep filling one partition's batch; move to the next partition (with
        a leader, round-robin) once that batch is full or sent. Lock held."""
        current = self._sticky.get(info.name)
        if current and current[0] in info.partitions and (current[1] is None or self._acc.is_open(current[1], cap)):
            return current[0]
        cached = self._per_refresh.get(("live", info.name))
        if cached is not None and cached[0] is info:
            live = cached[1]
        else:   # once per refresh: every partition's leader is read (decoded) here
            ids = sorted(info.partitions)
            live = [p for p in ids if info.partitions[p].leader >= 0] or ids
            self._per_refresh[("live", info.name)] = (info, live)
        p = live[next(self._round_robin) % len(live)]
        if current and len(live) > 1 and p == current[0]:
            p = live[next(self._round_robin) % len(live)]
        self._sticky[info.name] = (p, None)
        return p

    def _wait_for_room(self, size: int, deadline: float, handle: SendHandle) -> None:
        """Block (lock held, released while waiting) until ``size`` bytes fit in buffer_memory."""
        while self._acc.buffer_used and self._acc.buffer_used + size > self._buffer_memory:
            self._check_open()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                err = E.KafkaTimeoutError(
                    f"no room in buffer_memory ({self._buffer_memory} bytes) within max_block_ms")
                action = handle.failed(err)
                if action:
                    action()
                raise err
            self._cv.wait(remaining)

    # ------------------------------------------------------------ sender thread
    def _run(self) -> None:
        while True:
            actions: list[Action] = []
            with self._cv:
                now = time.monotonic()
                actions += self._handle_responses(now)
                actions += self._acc.expire(now)
                if self._abort is not None:
                    actions += self._acc.abort_all(self._abort)
                    done = True
                else:
                    done = self._closing and not self._acc.incomplete and not self._responses
                need_pid = not done and self._idempotent and self._acc.needs_producer_id and self._acc.has_queued()
                plan: dict[str, list[ProducerBatch]] = {}
                wake = now + 1.0
                if not done and not need_pid:
                    actions += self._fail_vanished()
                    plan, wake, leaderless = self._acc.drain(
                        now, flushing=bool(self._flushing or self._closing),
                        leader_of=self._leader_target, cap_of=self._cap_of)
                    self._refresh_wanted |= leaderless
                refresh = False
                if self._refresh_wanted and not done:
                    due = self._metadata.last_refresh + self._backoff_s
                    if now >= due:
                        refresh, self._refresh_wanted = True, False
                    else:
                        wake = min(wake, due)
                if actions:
                    self._cv.notify_all()  # memory freed, batches done
                elif not (plan or refresh or need_pid or done):
                    self._cv.wait(max(wake - now, 0.0005))
            for action in actions:
                action()
            if done:
                return
            if refresh:
                self._refresh_metadata()
            if need_pid:
                self._init_producer_id()
            for target, batches in plan.items():
                self._send_request(target, batches)

    def _leader_target(self, tp: TopicPartition) -> str | None:
        leader = self._metadata.leader_for(*tp)
        return leader.target if leader else None

    def _cap_of(self, tp: TopicPartition) -> int:
        info = self._metadata.topic(tp[0])
        limit = self._append_limit(info) if info else DEFAULT_MAX_MESSAGE_BYTES
        return min(self._batch_size, limit)

    def _fail_vanished(self) -> list[Action]:
        """Fail the queued batches of partitions the metadata says no longer
        exist (the topic was deleted). Lock held."""
        actions: list[Action] = []
        for tp, st in self._acc.parts.items():
            if st.queue and self._metadata.partition(*tp) is None:
                actions += self._acc.fail_partition(tp, E.UnknownTopicOrPartitionError(
                    f"topic {tp[0]!r} partition {tp[1]} no longer exists"))
        return actions

    def _refresh_metadata(self) -> None:
        with self._cv:
            topics = {tp[0] for tp, st in self._acc.parts.items() if st.queue or st.inflight}
        try:
            self._metadata.refresh(topics)
        except E.ReplikafkaError:
            with self._cv:
                self._refresh_wanted = True  # try again after the backoff

    def _init_producer_id(self) -> None:
        """Get a producer id from any broker; a non-retriable refusal fails the
        queued batches (the next send tries again)."""
        request = pb.InitProducerIdRequest(timeout_ms=self._request_timeout_ms)
        err: E.ReplikafkaError | None = None
        for target in self._metadata.candidates():
            try:
                # short per-broker wait: a hung broker must not stall the sender for long
                response = self._pool.call(target, "InitProducerId", request,
                                           min(self._request_timeout_ms / 1000, 2 * METADATA_ATTEMPT_S))
            except E.ReplikafkaError as exc:
                err = exc
            else:
                err = from_pb(response.error)
                if err is None:
                    with self._cv:
                        self._acc.set_producer_id(response.producer_id, response.producer_epoch)
                    return
            if not err.retriable:
                break
        if err is not None and not err.retriable:
            with self._cv:
                actions = self._acc.fail_queued(E.error_for_code(
                    err.code, f"could not get a producer id for idempotence: {err.message}"))
            for action in actions:
                action()
        else:
            time.sleep(self._backoff_s)  # the queued batches expire by their delivery deadline

    def _send_request(self, target: str, batches: list[ProducerBatch]) -> None:
        """Hand one Produce RPC to the I/O pool; its outcome is queued for the
        sender thread when it finishes."""
        try:
            call = self._io.submit(self._produce, target, batches)
        except RuntimeError as exc:  # the pool is shut down (forced close)
            call = Future()
            call.set_exception(E.ReplikafkaError(f"could not send to {target}: {exc}"))
        call.add_done_callback(lambda f: self._on_response(target, batches, f))

    def _flight_address(self, target: str) -> str | None:
        """The Flight listener of the broker at gRPC ``target``, if it has one we may use."""
        if self._flight is None:
            return None
        for broker in self._metadata.brokers():
            if broker.target == target:
                address = broker.listener(FLIGHT_PROTOCOL)
                return address if address is not None and self._flight.available(address) else None
        return None

    def _produce(self, target: str, batches: list[ProducerBatch]) -> pb.ProduceResponse:
        """I/O thread: append the batches through the leader's Flight listener (one
        ``DoPut`` per partition batch, all started before any answer is read), or
        with one gRPC Produce call where it has none or the request names more than
        ``REQUEST_PARTITIONS_MAX`` partitions (as after a failover: one call, not thousands)."""
        address = self._flight_address(target)
        if address is not None and len({b.tp for b in batches}) <= REQUEST_PARTITIONS_MAX:
            return self._produce_flight(address, batches)
        return self._produce_grpc(target, batches)

    def _produce_flight(self, address: str, batches: list[ProducerBatch]) -> pb.ProduceResponse:
        """Each partition's batches as one group of appends on its open DoPut
        (:mod:`replikafka.client.put_streams`, :mod:`replikafka.protocol.flight_produce`):
        the pieces go as Arrow batches (no IPC stream built here, no copy into a
        request), each with its body CRC-32C (computed once, kept for retries). Every
        partition's group is written before any answer is read. The answers become a
        ``ProduceResponse`` in request order, as the gRPC path's."""
        try:
            client = self._flight.client(address)
        except (fl.FlightError, pa.ArrowException, OSError) as exc:
            self._flight.mark_unreachable(address)
            raise E.BrokerNotAvailableError(f"could not open a Flight client to {address}: {exc}") from None
        out = pb.ProduceResponse()
        entries = [out.partitions.add(topic=b.tp[0], partition=b.tp[1], log_append_time_ms=-1) for b in batches]
        by_partition: dict = {}
        for i, b in enumerate(batches):
            by_partition.setdefault(b.tp, []).append(i)
        calls = [(idx, self._start_put(client, address, [batches[i] for i in idx])) for idx in by_partition.values()]
        for idx, call in calls:
            reused = False
            try:
                if isinstance(call, Exception):
                    raise call
                reused = call.reused
                results = self._put_streams.answer(call, len(idx))
            except (fl.FlightError, pa.ArrowException, OSError) as exc:
                err = from_flight_error(exc, address)
                if isinstance(err, E.BrokerNotAvailableError) and not reused:
                    self._flight.mark_unreachable(address)  # the retry goes through gRPC
                results = [err] * len(idx)
            except E.ReplikafkaError as exc:
                results = [exc] * len(idx)
            for i, got in zip(idx, results):
                r = entries[i]
                if isinstance(got, E.ReplikafkaError):
                    r.error.CopyFrom(to_pb(got))
                else:
                    r.base_offset, r.record_count = got["base_offset"], got["record_count"]
                    r.log_start_offset, r.log_append_time_ms = got["log_start_offset"], got["log_append_time_ms"]
        return out

    def _start_put(self, client: fl.FlightClient, address: str, batches: list[ProducerBatch]):
        """Write one partition's ``batches`` as a group of appends on its open DoPut: the
        stream to read the answer from, or the error."""
        try:
            appends, rbs = [], []
            for b in batches:
                if b.put is None:
                    pieces = b.put_batches(_CONCAT_BELOW_BYTES)
                    b.put = (pieces, body_crc32c(pieces, pieces[0].schema))
                appends.append(Append(b.sequence if self._idempotent else -1, tuple(b.put[1])))
                rbs += b.put[0]
            first = batches[0]
            ids = (first.producer_id, first.producer_epoch) if self._idempotent else (-1, -1)
            cmd = ProduceCommand(first.tp[0], first.tp[1], self._acks, self._request_timeout_ms, tuple(appends),
                                 *ids)
            return self._put_streams.append(client, self._flight.call_options, address, cmd, rbs)
        except (fl.FlightError, pa.ArrowException, OSError, E.ReplikafkaError) as exc:
            return exc

    def _produce_grpc(self, target: str, batches: list[ProducerBatch]) -> pb.ProduceResponse:
        """Encode each batch once (one IPC stream per partition; kept for retries) and
        make the blocking Produce call."""
        entries = []
        for b in batches:
            if b.payload is None:
                rb = b.record_batch()
                b.payload = encode_stream(rb.schema, [rb])
            entries.append((pb.PartitionProduceData(
                topic=b.tp[0], partition=b.tp[1],
                producer_id=b.producer_id if self._idempotent else -1,
                producer_epoch=b.producer_epoch if self._idempotent else -1,
                base_sequence=b.sequence if self._idempotent else -1,
                records_crc32c=records_crc32c(b.payload)), b.payload))
        # The payloads go into the request bytes once (protobuf's own path copies them twice).
        request = encode_produce_request(self._acks, self._request_timeout_ms, entries)
        try:
            return self._pool.call_bytes(target, PRODUCE_PATH, request, pb.ProduceResponse.FromString,
                                         self._request_timeout_ms / 1000 + 2.0)
        except E.ReplikafkaError:
            raise
        except Exception as exc:  # e.g. encoding: the batches must fail, not hang
            raise E.ReplikafkaError(f"could not send to {target}: {type(exc).__name__}: {exc}") from None

    def _on_response(self, target: str, batches: list[ProducerBatch], call: Future) -> None:
        """I/O thread: hand the finished call to the sender."""
        with self._cv:
            self._responses.append((target, batches, call))
            self._cv.notify_all()

    def _handle_responses(self, now: float) -> list[Action]:
        """Apply finished Produce calls to the accumulator. Lock held."""
        actions: list[Action] = []
        responses, self._responses = self._responses, []
        for target, batches, call in responses:
            self._acc.request_done(target)
            err = error_of(call, target)
            # The broker answers entry by entry in request order (a partition may
            # appear several times, one entry per batch).
            answers = list(call.result().partitions) if err is None else []
            for i, b in enumerate(batches):
                if b.done:
                    continue
                r = answers[i] if i < len(answers) and (answers[i].topic, answers[i].partition) == b.tp else None
                perr = err
                if perr is None:
                    perr = from_pb(r.error) if r is not None else E.ReplikafkaError(
                        f"the broker's Produce answer has no entry for {b.tp[0]}-{b.tp[1]} ({target})")
                if perr is None:   # a duplicate is answered as a success, with the first offsets
                    base = r.base_offset if self._acks != 0 else -1
                    actions += self._acc.completed(b, base, r.log_append_time_ms)
                    continue
                retrying, acts = self._acc.failed(b, perr, now)
                actions += acts
                if retrying and isinstance(perr, _REFRESH_ON):
                    self._refresh_wanted = True
        return actions
