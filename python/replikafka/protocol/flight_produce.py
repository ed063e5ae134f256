"""The Arrow Flight form of a partition append (``DoPut``).

A producer appends to one partition with one ``DoPut`` call: its descriptor is a
command, compact JSON (UTF-8)::

    {"v": 1, "topic": "events", "partition": 0, "acks": -1, "timeout_ms": 30000,
     "producer_id": 7, "producer_epoch": 0, "base_sequence": 120,
     "batch_crc32c": [3735928559, 305419896]}

and its stream is the record batches, in the topic's stored schema (its columns
then ``timestamp``), one stored batch each. ``batch_crc32c`` has one CRC-32C per
batch, of the batch's IPC body (its column buffers, 8-byte padded: what the log
stores under ``rk.crc32c``, :mod:`replikafka.broker.storage.batch_format`). The
leader checks each against the body it stores and refuses the append if one
differs, so a batch damaged between the producer's memory and the disk is never
stored, and checking costs no pass over the data beyond the one the log makes.

The answer is one ``PutResult`` whose ``app_metadata`` is JSON::

    {"base_offset": 1200, "record_count": 20000, "log_append_time_ms": -1,
     "log_start_offset": 0}

A refused append is a Flight error carrying our error code (as DoGet's).
Decoding is strict: unknown or missing keys and wrong types raise
:class:`InvalidRequestError` naming the field. Pure functions, thread-safe.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from replikafka import errors as E
from replikafka.protocol import flight_ticket
from replikafka.protocol.flight_ticket import INT32_MAX, MAX_TICKET_BYTES
from replikafka.records import validate_topic_name

VERSION = 1
_REQUIRED = ("v", "topic", "partition", "acks", "timeout_ms", "batch_crc32c")
_OPTIONAL = ("producer_id", "producer_epoch", "base_sequence")
INT64_MAX = 2**63 - 1
_WHERE = "flight produce"
#: Batches one append may carry (a producer's batch is split at max.message.bytes; far fewer in practice).
MAX_BATCHES = 100_000


def _bad(field: str, what: str, value) -> E.InvalidRequestError:
    return flight_ticket._bad(field, what, value, _WHERE)


def _int(field: str, value, lo: int, hi: int) -> int:
    return flight_ticket._int(field, value, lo, hi, _WHERE)


@dataclass(frozen=True, slots=True)
class ProduceCommand:
    topic: str
    partition: int
    acks: int
    timeout_ms: int
    batch_crc32c: tuple[int, ...]
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1

    def __post_init__(self):
        _check(self)

    def encode(self) -> bytes:
        d = {"v": VERSION, "topic": self.topic, "partition": self.partition, "acks": self.acks,
             "timeout_ms": self.timeout_ms, "batch_crc32c": list(self.batch_crc32c)}
        if self.producer_id >= 0:
            d.update(producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                     base_sequence=self.base_sequence)
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
    crcs = c.batch_crc32c
    if not isinstance(crcs, tuple) or not crcs or len(crcs) > MAX_BATCHES:
        raise _bad("batch_crc32c", f"a non-empty list of at most {MAX_BATCHES} CRC-32C values", crcs)
    for v in crcs:
        _int("batch_crc32c", v, 0, 0xFFFFFFFF)
    _int("producer_id", c.producer_id, -1, INT64_MAX)
    _int("producer_epoch", c.producer_epoch, -1, 32767)
    _int("base_sequence", c.base_sequence, -1, INT32_MAX)


def decode(data) -> ProduceCommand:
    """The command in ``data`` (bytes, or a ``pyarrow.flight.FlightDescriptor``)."""
    raw = getattr(data, "command", data)
    if not isinstance(raw, (bytes, bytearray, memoryview)) or not raw:
        raise E.InvalidRequestError("flight produce: the descriptor must be a command (JSON bytes)")
    if len(raw) > MAX_TICKET_BYTES:
        raise E.InvalidRequestError(f"flight produce: command of {len(raw)} bytes, more than {MAX_TICKET_BYTES}")
    try:
        d = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise E.InvalidRequestError(f"flight produce: command is not UTF-8 JSON ({exc})") from None
    if not isinstance(d, dict):
        raise E.InvalidRequestError(f"flight produce: expected a JSON object, got {type(d).__name__}")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise E.InvalidRequestError(f"flight produce: missing field(s) {missing}")
    unknown = sorted(k for k in d if k not in _REQUIRED and k not in _OPTIONAL)
    if unknown:
        raise E.InvalidRequestError(f"flight produce: unknown field(s) {unknown}")
    if d["v"] != VERSION or type(d["v"]) is not int:
        raise _bad("v", f"{VERSION} (the produce command version this broker reads)", d["v"])
    crcs = d["batch_crc32c"]
    if not isinstance(crcs, list):
        raise _bad("batch_crc32c", "a list of CRC-32C values", crcs)
    return ProduceCommand(d["topic"], d["partition"], d["acks"], d["timeout_ms"], tuple(crcs),
                          d.get("producer_id", -1), d.get("producer_epoch", -1), d.get("base_sequence", -1))


def encode_result(base_offset: int, record_count: int, log_append_time_ms: int, log_start_offset: int) -> bytes:
    return (b'{"base_offset":%d,"record_count":%d,"log_append_time_ms":%d,"log_start_offset":%d}'
            % (base_offset, record_count, log_append_time_ms, log_start_offset))


def decode_result(data) -> dict:
    """The leader's answer; CorruptRecordError if it is not one."""
    raw = data.to_pybytes() if hasattr(data, "to_pybytes") else bytes(data or b"")
    try:
        d = json.loads(raw.decode("utf-8"))
        return {k: int(d[k]) for k in ("base_offset", "record_count", "log_append_time_ms", "log_start_offset")}
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise E.CorruptRecordError(f"flight produce: unreadable answer {raw[:80]!r} ({exc})") from None
