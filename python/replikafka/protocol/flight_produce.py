"""The Arrow Flight form of a partition append (``DoPut``).

A producer appends to one partition with one ``DoPut`` call: its descriptor is a
command, compact JSON (UTF-8)::

    {"v": 1, "topic": "events", "partition": 0, "acks": -1, "timeout_ms": 30000,
     "producer_id": 7, "producer_epoch": 0,
     "appends": [{"base_sequence": 120, "batch_crc32c": [3735928559, 305419896]},
                 {"base_sequence": 20120, "batch_crc32c": [4022250974]}]}

and its stream is the record batches, in the topic's stored schema (its columns
then ``timestamp``), one stored batch each: the first append's batches, then the
next's. The appends are the producer's batches of this partition, appended in
order (each its own idempotent sequence, as gRPC Produce's entries); acks=all
waits once, for all of them. ``batch_crc32c`` has one CRC-32C per batch, of the
batch's IPC body (its column buffers, 8-byte padded: what the log stores under
``rk.crc32c``, :mod:`replikafka.broker.storage.batch_format`). The leader checks
each against the body it stores and refuses the append if one differs, so a
batch damaged between the producer's memory and the disk is never stored, and
checking costs no pass over the data beyond the one the log makes.

The call is a stream a producer keeps open (one per partition it appends to):
after the command's appends come further groups of appends, each announced by the
``app_metadata`` of its first batch, compact JSON with the same append objects::

    {"v": 1, "appends": [{"base_sequence": 20240, "batch_crc32c": [2882400001]}]}

and carried by that batch and the ones after it (no metadata on the others). The
topic, partition, acks, timeout and producer id of the command hold for every group,
and each group is checked as strictly as the command. A batch with metadata inside
a group, or one without it where a group must start, refuses the call.

Each group (the command's first) is answered by one ``PutResult`` whose ``app_metadata``
is JSON, one result per append, in order (an append after a failed one is not made
and carries the same error), written before the next group is read::

    {"results": [{"base_offset": 1200, "record_count": 20000, "log_append_time_ms": -1,
                  "log_start_offset": 0},
                 {"error_code": "NOT_ENOUGH_REPLICAS", "error_message": "..."}]}

A refused call (a bad command, a stream that does not match it, no
authorization) is a Flight error carrying our error code (as DoGet's).
Decoding is strict: unknown or missing keys and wrong types raise
:class:`InvalidRequestError` naming the field. Pure functions, thread-safe.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

from replikafka import errors as E
from replikafka.protocol import flight_ticket
from replikafka.protocol.flight_ticket import INT32_MAX
from replikafka.records import validate_topic_name

VERSION = 1
_REQUIRED = ("v", "topic", "partition", "acks", "timeout_ms", "appends")
_OPTIONAL = ("producer_id", "producer_epoch")
_APPEND_KEYS = ("base_sequence", "batch_crc32c")
#: Appends (producer batches of one partition) one call may carry.
MAX_APPENDS = 1_000
INT64_MAX = 2**63 - 1
_WHERE = "flight produce"
#: Batches one append may carry (a producer's batch is split at max.message.bytes; far fewer in practice).
MAX_BATCHES = 100_000


def _bad(field: str, what: str, value) -> E.InvalidRequestError:
    return flight_ticket._bad(field, what, value, _WHERE)


def _int(field: str, value, lo: int, hi: int) -> int:
    return flight_ticket._int(field, value, lo, hi, _WHERE)


@dataclass(frozen=True, slots=True)
class Append:
    """One producer batch: its idempotent sequence (-1: none) and its batches' body CRC-32Cs."""
    base_sequence: int
    batch_crc32c: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProduceCommand:
    topic: str
    partition: int
    acks: int
    timeout_ms: int
    appends: tuple[Append, ...]
    producer_id: int = -1
    producer_epoch: int = -1

    def __post_init__(self):
        _check(self)

    @property
    def batch_count(self) -> int:
        return sum(len(a.batch_crc32c) for a in self.appends)

    def encode(self) -> bytes:
        d = {"v": VERSION, "topic": self.topic, "partition": self.partition, "acks": self.acks,
             "timeout_ms": self.timeout_ms,
             "appends": [{"base_sequence": a.base_sequence, "batch_crc32c": list(a.batch_crc32c)}
                         for a in self.appends]}
        if self.producer_id >= 0:
            d.update(producer_id=self.producer_id, producer_epoch=self.producer_epoch)
        return json.dumps(d, separators=(",", ":")).encode()


def _check(c: ProduceCommand) -> None:
    if type(c.topic) is not str:
        raise _bad("topic", "a string", c.topic)
    try:
        validate_topic_name(c.topic)
    except E.ReplikafkaError as exc:
        raise E.InvalidRequestError(f"flight produce: 'topic': {exc.message}") from None
    _int("partition", c.partition, 0, INT32_MAX)
    if type(c.acks) is not int or c.acks not in (-1, 0, 1):
        raise _bad("acks", "-1 (all), 0 or 1", c.acks)
    _int("timeout_ms", c.timeout_ms, 0, INT32_MAX)
    if not isinstance(c.appends, tuple) or not c.appends or len(c.appends) > MAX_APPENDS:
        raise _bad("appends", f"a non-empty list of at most {MAX_APPENDS} appends", c.appends)
    total = 0
    for a in c.appends:
        _int("base_sequence", a.base_sequence, -1, INT32_MAX)
        crcs = a.batch_crc32c
        if not isinstance(crcs, tuple) or not crcs:
            raise _bad("batch_crc32c", "a non-empty list of CRC-32C values", crcs)
        total += len(crcs)
        for v in crcs:
            _int("batch_crc32c", v, 0, 0xFFFFFFFF)
    if total > MAX_BATCHES:
        raise _bad("appends", f"at most {MAX_BATCHES} batches in all", total)
    _int("producer_id", c.producer_id, -1, INT64_MAX)
    _int("producer_epoch", c.producer_epoch, -1, 32767)


def decode(data) -> ProduceCommand:
    """The command in ``data`` (bytes, or a ``pyarrow.flight.FlightDescriptor``)."""
    raw = getattr(data, "command", data)
    if not isinstance(raw, (bytes, bytearray, memoryview)) or not raw:
        raise E.InvalidRequestError("flight produce: the descriptor must be a command (JSON bytes)")
    d = flight_ticket.decode_object(raw, _WHERE, _REQUIRED, _OPTIONAL,
                                    "the produce command version this broker reads")
    return ProduceCommand(d["topic"], d["partition"], d["acks"], d["timeout_ms"], _appends(d["appends"]),
                          d.get("producer_id", -1), d.get("producer_epoch", -1))


def _appends(appends) -> tuple[Append, ...]:
    if not isinstance(appends, list):
        raise _bad("appends", "a list of appends", appends)
    parsed = []
    for a in appends[:MAX_APPENDS + 1]:
        if not isinstance(a, dict) or sorted(a) != sorted(_APPEND_KEYS):
            raise _bad("appends", f"a list of objects with exactly {list(_APPEND_KEYS)}", a)
        crcs = a["batch_crc32c"]
        if not isinstance(crcs, list):
            raise _bad("batch_crc32c", "a list of CRC-32C values", crcs)
        parsed.append(Append(a["base_sequence"], tuple(crcs)))
    return tuple(parsed)


def encode_next_appends(appends: tuple[Append, ...]) -> bytes:
    """The ``app_metadata`` announcing a further group of appends on an open call."""
    return json.dumps({"v": VERSION, "appends": [{"base_sequence": a.base_sequence,
                                                  "batch_crc32c": list(a.batch_crc32c)} for a in appends]},
                      separators=(",", ":")).encode()


def decode_next_appends(command: ProduceCommand, metadata) -> ProduceCommand:
    """``command`` (the call's) with the appends a group's first batch announces in
    ``metadata`` (bytes or a pyarrow Buffer), checked as strictly as the command."""
    raw = metadata.to_pybytes() if hasattr(metadata, "to_pybytes") else metadata
    d = flight_ticket.decode_object(raw, f"{_WHERE} (a further append's metadata)", ("v", "appends"), (),
                                    "the produce command version this broker reads")
    return replace(command, appends=_appends(d["appends"]))


RESULT_KEYS = ("base_offset", "record_count", "log_append_time_ms", "log_start_offset")


def encode_results(results: list) -> bytes:
    """``results``: per append, a dict of RESULT_KEYS or an error of the tree."""
    out = []
    for r in results:
        if isinstance(r, E.ReplikafkaError):
            out.append({"error_code": r.code, "error_message": r.message})
        else:
            out.append({k: r[k] for k in RESULT_KEYS})
    return json.dumps({"results": out}, separators=(",", ":")).encode()


def decode_results(data, appends: int) -> list:
    """The leader's answer: per append, a dict of RESULT_KEYS or an error of the tree;
    CorruptRecordError if it is not one answer per append."""
    raw = data.to_pybytes() if hasattr(data, "to_pybytes") else bytes(data or b"")
    try:
        results = json.loads(raw.decode("utf-8"))["results"]
        if len(results) != appends:
            raise ValueError(f"{len(results)} results for {appends} appends")
        return [E.error_for_code(str(r["error_code"]), str(r["error_message"])) if "error_code" in r
                else {k: int(r[k]) for k in RESULT_KEYS} for r in results]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise E.CorruptRecordError(f"flight produce: unreadable answer {raw[:80]!r} ({exc})") from None
