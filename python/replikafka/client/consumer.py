"""The consumer: reads committed records of assigned partitions as Arrow tables.

Reading: by default each :meth:`Consumer.poll` reads every assigned partition
from its leader's Arrow Flight listener (one ``DoGet`` per partition, the stored
batches as stored, at most ``max_partition_fetch_bytes`` each and
``fetch_max_bytes`` in all: what the consumer holds at once). A consumer of one
partition long-polls with its DoGet (the ticket's ``max_wait_ms``: the leader
answers as soon as the HW passes the position). With several partitions, when
the DoGets bring nothing (every position at its high watermark), it long-polls
with one ``Fetch`` RPC per leader broker (``fetch_max_wait_ms``), so new records
arrive without delay. Leaders without a Flight listener are read with ``Fetch`` throughout.

Threading: a :class:`Consumer` is meant for one thread at a time (like
Kafka's); concurrent reads (several leaders or partitions) run on a small pool
of I/O threads owned by the consumer.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, NamedTuple

import numpy as np
import pyarrow as pa

from replikafka import errors as E
from replikafka.client.client_config import CONSUMER_KEYS, accepts_config_dict
from replikafka.client.connection import ConnectionPool, annotated, parse_bootstrap
from replikafka.client.flight_reader import FLIGHT_PROTOCOL, FlightRead, FlightReader, flight_keeps_identity
from replikafka.client.metadata import ClusterMetadata
from replikafka.client.offsets import EARLIEST, LATEST, TopicPartition, ensure_partitions, group_by_leader, list_offsets
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.flight_ticket import MAX_WAIT_MS, PartitionTicket
from replikafka.protocol.rpc_errors import from_pb
from replikafka.records import RESERVED_NAMES, TIMESTAMP_TYPE, decode_untrusted

log = logging.getLogger("replikafka.consumer")
__all__ = ["Consumer", "OffsetAndTimestamp", "output_schema", "records_to_table"]

_RESET_POLICIES = ("earliest", "latest", "none")
_EXTRA_FIELDS = [pa.field("topic", pa.string(), nullable=False),
                 pa.field("partition", pa.int32(), nullable=False),
                 pa.field("offset", pa.int64(), nullable=False),
                 pa.field("timestamp", TIMESTAMP_TYPE, nullable=False)]


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


def output_schema(topic_schema: pa.Schema, columns: list[str] | None = None) -> pa.Schema:
    """The schema :meth:`Consumer.poll` returns for a topic: its columns (or
    the projection, in the order given), then topic, partition, offset, timestamp."""
    if columns is None:
        data = [pa.field(f.name, f.type, f.nullable) for f in topic_schema]
    else:
        data = []
        for name in columns:
            if name in RESERVED_NAMES:
                continue
            i = topic_schema.get_field_index(name)
            if i < 0:
                raise E.InvalidSchemaError(
                    f"column {name!r} is not in the topic's schema (it has {', '.join(topic_schema.names)})")
            f = topic_schema.field(i)
            data.append(pa.field(f.name, f.type, f.nullable))
    return pa.schema(data + _EXTRA_FIELDS)


def records_to_table(records: bytes, records_base_offset: int, fetch_offset: int, high_watermark: int,
                     topic: str, partition: int, schema: pa.Schema) -> tuple[pa.Table | None, int]:
    """Turn one partition's Fetch answer into rows of ``schema`` (see
    :func:`output_schema`). Offsets are ``records_base_offset`` + row index
    (built with numpy, no per-row objects); rows before ``fetch_offset`` or at
    or beyond ``high_watermark`` are dropped. Returns ``(table or None, next offset)``."""
    if not records:
        return None, fetch_offset
    stream_schema, batches = decode_untrusted(records, f"fetched records of {topic}-{partition}")
    n = sum(b.num_rows for b in batches)
    first = max(fetch_offset, records_base_offset)
    end = min(records_base_offset + n, high_watermark)
    rows = end - first
    if rows <= 0:
        return None, fetch_offset
    table = pa.Table.from_batches(batches, stream_schema).slice(first - records_base_offset, rows)
    return _output_table(table, first, topic, partition, schema), end


def flight_read_to_table(read: FlightRead, topic: str, partition: int, schema: pa.Schema
                         ) -> tuple[pa.Table | None, int | None]:
    """Rows of ``schema`` from one Flight read (exactly the asked range: nothing to
    drop); returns ``(table or None, next offset)``."""
    if not read.batches:
        return None, None
    table = pa.Table.from_batches(read.batches)
    return _output_table(table, read.first_offsets[0], topic, partition, schema), read.end_offset


def _output_table(table: pa.Table, first: int, topic: str, partition: int, schema: pa.Schema) -> pa.Table:
    """``table`` (rows from offset ``first`` on) with the columns of ``schema``:
    topic, partition and offset added with numpy, no per-row objects."""
    rows = table.num_rows
    end = first + rows
    arrays = []
    for f in schema:
        if f.name == "topic":
            arrays.append(pa.repeat(pa.scalar(topic, pa.string()), rows))
        elif f.name == "partition":
            arrays.append(pa.array(np.full(rows, partition, dtype=np.int32)))
        elif f.name == "offset":
            arrays.append(pa.array(np.arange(first, end, dtype=np.int64)))
        elif f.name in table.column_names:
            col = table.column(f.name)
            arrays.append(col if col.type.equals(f.type) else col.cast(f.type))
        else:
            arrays.append(pa.nulls(rows, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


class Consumer:
    """Reads committed records (below the high watermark) of assigned partitions.

    ``bootstrap_servers``: ``"host:port[,host:port...]"``. ``columns``: a
    projection done by the broker (the topic columns to return).
    ``fetch_max_bytes``/``max_partition_fetch_bytes``/``fetch_max_wait_ms``/
    ``fetch_min_bytes``: per Fetch RPC, as in Kafka. ``auto_offset_reset``:
    where a partition without a position, or whose position is out of range,
    starts: ``"earliest"``, ``"latest"`` or ``"none"`` (raise).
    ``security``: librdkafka's keys (``security.protocol``, ``ssl.*``, ``sasl.*``).
    ``use_flight`` (``fetch.use.flight``): read through the brokers' Arrow Flight
    listeners (module doc); False reads with ``Fetch`` only.
    """

    @accepts_config_dict("Consumer", CONSUMER_KEYS)
    def __init__(self, bootstrap_servers: str | Iterable[str], columns: Iterable[str] | None = None,
                 fetch_max_bytes: int = 52_428_800, max_partition_fetch_bytes: int = 4 * 1024 * 1024,
                 fetch_max_wait_ms: int = 500, fetch_min_bytes: int = 1, auto_offset_reset: str = "earliest",
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100,
                 security: Any = None, use_flight: bool = True):
        if auto_offset_reset not in _RESET_POLICIES:
            raise E.InvalidConfigError(
                f"auto_offset_reset must be one of {', '.join(_RESET_POLICIES)}, got {auto_offset_reset!r}")
        for name, v in (("fetch_max_bytes", fetch_max_bytes), ("max_partition_fetch_bytes", max_partition_fetch_bytes),
                        ("request_timeout_ms", request_timeout_ms)):
            if not isinstance(v, int) or v < 1:
                raise E.InvalidConfigError(f"{name} must be a positive integer, got {v!r}")
        if isinstance(columns, str):
            columns = [c.strip() for c in columns.split(",") if c.strip()]
        self._columns = list(columns) if columns is not None else None
        self._fetch_max_bytes = fetch_max_bytes
        self._partition_max_bytes = max_partition_fetch_bytes
        self._max_wait_ms = fetch_max_wait_ms
        self._min_bytes = fetch_min_bytes
        self._reset = auto_offset_reset
        self._request_timeout_ms = request_timeout_ms
        self._backoff_ms = retry_backoff_ms
        self._pool = ConnectionPool(security=security)
        self._flight = FlightReader(security=self._pool.security) \
            if use_flight and flight_keeps_identity(self._pool.security) else None
        self._metadata = ClusterMetadata(self._pool, parse_bootstrap(bootstrap_servers),
                                         request_timeout_ms=request_timeout_ms, retry_backoff_ms=retry_backoff_ms)
        self._positions: dict[TopicPartition, int | None] = {}
        self._highwater: dict[TopicPartition, int] = {}
        self._schemas: dict[str, pa.Schema] = {}
        self._closed = False
        self._io: ThreadPoolExecutor | None = None  # fetches to several leaders at once

    # ------------------------------------------------------------ assignment
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these ``(topic, partition)`` pairs (replaces the previous
        assignment; positions of partitions kept are kept)."""
        self._check_open()
        tps = []
        for tp in partitions:
            try:
                topic, p = tp
            except (TypeError, ValueError):
                raise E.InvalidRequestError(f"assign() takes (topic, partition) pairs, got {tp!r}") from None
            if not isinstance(topic, str) or not isinstance(p, int) or isinstance(p, bool) or p < 0:
                raise E.InvalidRequestError(f"assign() takes (topic, partition) pairs, got {tp!r}")
            if (topic, p) not in tps:
                tps.append((topic, p))
        ensure_partitions(self._metadata, tps)
        schemas = {t: output_schema(self._metadata.require_topic(t).schema, self._columns) for t, _ in tps}
        self._positions = {tp: self._positions.get(tp) for tp in tps}
        self._highwater = {tp: hw for tp, hw in self._highwater.items() if tp in self._positions}
        self._schemas = schemas

    def assignment(self) -> set[TopicPartition]:
        return set(self._positions)

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids (refreshing metadata if it is not cached)."""
        return sorted(self._metadata.require_topic(topic).partitions)

    def topic_schema(self, topic: str) -> pa.Schema:
        """The topic's own schema (its columns, without ``timestamp``)."""
        return self._metadata.require_topic(topic).schema

    def schema_for(self, topic: str) -> pa.Schema:
        """The schema :meth:`poll` returns for ``topic`` (with this consumer's projection)."""
        return output_schema(self.topic_schema(topic), self._columns)

    # ------------------------------------------------------------ positions
    def seek(self, tp: TopicPartition, offset: int) -> None:
        """The next poll reads ``tp`` from ``offset``."""
        tp = self._assigned(tp)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise E.InvalidOffsetError(f"seek offset must be a non-negative integer, got {offset!r}")
        self._positions[tp] = offset

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_to(partitions, EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Position at the high watermark (the next record to be committed)."""
        self._seek_to(partitions, LATEST)

    def position(self, tp: TopicPartition) -> int:
        """The offset the next poll reads from (resolving ``auto_offset_reset`` if needed)."""
        tp = self._assigned(tp)
        if self._positions[tp] is None:
            self._resolve_positions(time.monotonic() + self._request_timeout_ms / 1000)
        return self._positions[tp]

    def highwater(self, tp: TopicPartition) -> int | None:
        """The high watermark seen in the last fetch of ``tp`` (None: not fetched yet)."""
        return self._highwater.get(self._assigned(tp))

    # ------------------------------------------------------------ offsets queries
    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        return {tp: r.offset for tp, r in self._list({tuple(tp): EARLIEST for tp in partitions}).items()}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition (offset of the next committed record)."""
        return {tp: r.offset for tp, r in self._list({tuple(tp): LATEST for tp in partitions}).items()}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first offset whose timestamp is >= the given ms
        (with that record's timestamp), or None when there is none."""
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
                raise E.InvalidRequestError(f"timestamp for {tp} must be a non-negative integer of ms, got {ts!r}")
        found = self._list({tuple(tp): ts for tp, ts in timestamps.items()})
        return {tp: (OffsetAndTimestamp(r.offset, r.timestamp_ms) if r.offset >= 0 else None)
                for tp, r in found.items()}

    # ------------------------------------------------------------ reading
    def poll(self, timeout_ms: int = 1000) -> pa.Table:
        """Committed records fetched from the current positions, waiting up to
        ``timeout_ms`` for some; an empty table (same schema) if none came.
        Columns: the topic's columns (or the projection), then topic,
        partition, offset, timestamp. Positions move past what is returned."""
        self._check_open()
        if not self._positions:
            raise E.InvalidRequestError("poll() needs assigned partitions; call assign() first")
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            self._resolve_positions(max(deadline, time.monotonic() + self._request_timeout_ms / 1000))
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            wait_ms = max(min(self._max_wait_ms, remaining_ms), 0)
            # One partition: its DoGet is the long poll (the leader answers when the HW
            # passes the position). Several: a DoGet each without waiting, then, if all
            # are at their HW, one Fetch per leader long-polls them together.
            long_poll = len(self._positions) == 1
            tables, trouble, asked = self._flight_round(wait_ms if long_poll else 0) \
                if self._flight is not None else ([], False, 0)
            if not tables and not trouble and not (long_poll and asked):
                tables, trouble = self._fetch_round(wait_ms)
            if tables:
                return self._combine(tables)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._combine([])
            if trouble:
                time.sleep(min(self._backoff_ms / 1000, remaining))

    def close(self) -> None:
        self._closed = True
        if self._io is not None:
            self._io.shutdown(wait=False)
        if self._flight is not None:
            self._flight.close()
        self._pool.close()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise E.ReplikafkaError("the consumer is closed", code="CLIENT_CLOSED")

    def _assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = tuple(tp)
        if tp not in self._positions:
            raise E.InvalidRequestError(f"partition {tp[0]}-{tp[1]} is not assigned to this consumer")
        return tp

    def _list(self, specs: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
        self._check_open()
        return list_offsets(self._metadata, self._pool, specs, timeout_ms=self._request_timeout_ms,
                            retry_backoff_ms=self._backoff_ms)

    def _seek_to(self, partitions: Iterable[TopicPartition] | None, which: int) -> None:
        tps = list(self._positions) if partitions is None else [self._assigned(tp) for tp in partitions]
        if tps:
            for tp, r in self._list({tp: which for tp in tps}).items():
                self._positions[tp] = r.offset

    def _resolve_positions(self, deadline: float) -> None:
        """Give partitions without a position one, per ``auto_offset_reset``."""
        missing = [tp for tp, pos in self._positions.items() if pos is None]
        if not missing:
            return
        if self._reset == "none":
            tp = missing[0]
            raise E.InvalidOffsetError(
                f"no position for {tp[0]}-{tp[1]}: seek() first, or use auto_offset_reset='earliest'/'latest'")
        which = EARLIEST if self._reset == "earliest" else LATEST
        timeout_ms = max(int((deadline - time.monotonic()) * 1000), 1)
        for tp, r in list_offsets(self._metadata, self._pool, {tp: which for tp in missing},
                                  timeout_ms=timeout_ms, retry_backoff_ms=self._backoff_ms).items():
            self._positions[tp] = r.offset

    def _flight_columns(self, topic: str) -> tuple[str, ...] | None:
        if self._columns is None:
            return None
        return tuple(dict.fromkeys([c for c in self._columns if c not in RESERVED_NAMES] + ["timestamp"]))

    def _flight_round(self, max_wait_ms: int) -> tuple[list[pa.Table], bool, int]:
        """One DoGet per partition whose leader serves Flight, concurrently, each for at
        most ``max_partition_fetch_bytes`` (and ``fetch_max_bytes`` over all), each
        waiting up to ``max_wait_ms`` for records (the ticket's long poll). Returns
        the tables, whether something needs a retry (metadata refreshed if so), and
        how many partitions were asked."""
        version = self._metadata.version
        calls = []
        budget = self._fetch_max_bytes
        for tp, pos in self._positions.items():
            if pos is None or budget <= 0:
                continue
            info = self._metadata.partition(*tp)
            broker = self._metadata.leader_for(*tp)
            address = broker.listener(FLIGHT_PROTOCOL) if broker is not None else None
            if info is None or address is None or not self._flight.available(address):
                continue
            want = min(self._partition_max_bytes, budget)
            budget -= want
            calls.append((tp, pos, address, PartitionTicket(tp[0], tp[1], pos, max_bytes=want,
                                                            current_leader_epoch=info.leader_epoch,
                                                            columns=self._flight_columns(tp[0]),
                                                            max_wait_ms=min(max_wait_ms, MAX_WAIT_MS))))
        if not calls:
            return [], False, 0
        timeout_s = (self._request_timeout_ms + max_wait_ms) / 1000

        def one(call):
            try:
                return self._flight.read(call[2], call[3], timeout_s)
            except E.ReplikafkaError as exc:
                return exc
        if len(calls) == 1:
            results = [one(calls[0])]
        else:
            if self._io is None:
                self._io = ThreadPoolExecutor(max_workers=8, thread_name_prefix="replikafka-consumer-io")
            results = list(self._io.map(one, calls))
        tables: list[pa.Table] = []
        trouble = False
        for (tp, pos, _, _), got in zip(calls, results):
            if self._positions.get(tp) != pos:
                continue
            if isinstance(got, E.OffsetOutOfRangeError):
                if self._reset == "none":
                    raise annotated(got, f"{tp[0]}-{tp[1]} offset {pos}")
                self._positions[tp] = None
            elif isinstance(got, E.BrokerNotAvailableError):
                pass    # its Flight listener is unreachable: the Fetch round reads it
            elif isinstance(got, E.ReplikafkaError):
                if not got.retriable:
                    raise annotated(got, f"read {tp[0]}-{tp[1]}")
                trouble = True
            else:
                table, nxt = flight_read_to_table(got, tp[0], tp[1], self._schemas[tp[0]])
                if table is not None:
                    tables.append(table)
                    self._positions[tp] = nxt
                    self._highwater[tp] = max(self._highwater.get(tp, -1), nxt)
        if trouble:
            self._refresh_after_trouble(version)
        return tables, trouble, len(calls)

    def _refresh_after_trouble(self, version: int) -> None:
        try:
            self._metadata.refresh({t for t, _ in self._positions}, if_version=version,
                                   timeout_ms=self._request_timeout_ms)
        except E.BrokerNotAvailableError:
            pass
        self._check_topics_exist()

    def _fetch_round(self, max_wait_ms: int) -> tuple[list[pa.Table], bool]:
        """One Fetch per leader, concurrently. Returns the tables read and
        whether something needs a retry (metadata refreshed if so)."""
        version = self._metadata.version
        wanted = [tp for tp, pos in self._positions.items() if pos is not None]
        groups, leaderless = group_by_leader(self._metadata, wanted)
        trouble = bool(leaderless)
        columns = [] if self._columns is None else [c for c in self._columns if c not in RESERVED_NAMES] + ["timestamp"]
        calls = []
        for target, items in groups.items():
            request = pb.FetchRequest(
                replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=self._min_bytes, max_bytes=self._fetch_max_bytes,
                columns=columns,
                partitions=[pb.FetchPartition(topic=tp[0], partition=tp[1], fetch_offset=self._positions[tp],
                                              current_leader_epoch=info.leader_epoch,
                                              partition_max_bytes=self._partition_max_bytes, last_fetched_epoch=-1)
                            for tp, info in items])
            calls.append((target, request))
        tables: list[pa.Table] = []
        for target, response in self._call_all(calls, max_wait_ms / 1000 + self._request_timeout_ms / 1000):
            if isinstance(response, E.ReplikafkaError):
                if not response.retriable:
                    raise response
                trouble = True
                continue
            for r in response.partitions:
                tp = (r.topic, r.partition)
                fetch_offset = self._positions.get(tp)
                if fetch_offset is None:
                    continue
                perr = from_pb(r.error)
                if perr is None:
                    if r.high_watermark >= 0:   # -1: a new leader that does not know it yet (KIP-207)
                        self._highwater[tp] = r.high_watermark
                    try:
                        table, nxt = records_to_table(r.records, r.records_base_offset, fetch_offset,
                                                      r.high_watermark, r.topic, r.partition, self._schemas[r.topic])
                    except E.CorruptRecordError as exc:  # this partition only: the others' records are kept
                        log.warning("%s", exc)
                        trouble = True
                        continue
                    if table is not None:
                        tables.append(table)
                        self._positions[tp] = nxt
                elif isinstance(perr, E.OffsetOutOfRangeError):
                    if self._reset == "none":
                        raise annotated(perr, f"{tp[0]}-{tp[1]} offset {fetch_offset} (log {r.log_start_offset}"
                                              f"..{r.log_end_offset})")
                    self._positions[tp] = None
                elif perr.retriable:
                    trouble = True
                else:
                    raise annotated(perr, f"fetch {tp[0]}-{tp[1]}")
        if trouble:
            self._refresh_after_trouble(version)
        return tables, trouble

    def _call_all(self, calls: list[tuple[str, pb.FetchRequest]], timeout_s: float) -> list[tuple[str, Any]]:
        """Run the Fetch calls (concurrently when there are several leaders);
        each result is the response or the error-tree exception."""
        def one(target: str, request: pb.FetchRequest):
            try:
                return self._pool.call(target, "Fetch", request, timeout_s)
            except E.ReplikafkaError as exc:
                return exc
        if len(calls) <= 1:
            return [(t, one(t, r)) for t, r in calls]
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=8, thread_name_prefix="replikafka-consumer-io")
        futures = [(t, self._io.submit(one, t, r)) for t, r in calls]
        return [(t, f.result()) for t, f in futures]

    def _check_topics_exist(self) -> None:
        """After a refresh: an assigned topic the cluster no longer knows is an error."""
        for topic in {t for t, _ in self._positions}:
            if self._metadata.topic(topic) is None:
                raise E.UnknownTopicOrPartitionError(f"topic {topic!r} does not exist (deleted?)")

    def _combine(self, tables: list[pa.Table]) -> pa.Table:
        if not tables:
            schemas = list(dict.fromkeys(self._schemas.values()))
            if len(schemas) == 1:
                return schemas[0].empty_table()
            return pa.unify_schemas(schemas).empty_table()
        if len(tables) == 1:
            return tables[0]
        if all(t.schema.equals(tables[0].schema) for t in tables):
            return pa.concat_tables(tables)
        return pa.concat_tables(tables, promote_options="default")

