"""The Arrow Flight ticket of a partition read (``DoGet``).

A ticket is compact JSON (UTF-8), so any Flight client can print one or write
one by hand::

    {"v": 1, "topic": "events", "partition": 0, "start_offset": 0,
     "end_offset": 1000, "max_bytes": 8388608, "current_leader_epoch": 3,
     "columns": ["value", "timestamp"]}

- ``start_offset``: the first offset to return (Fetch's ``fetch_offset``).
- ``end_offset``: stop before this offset; -1 (or absent) for no end offset.
- ``max_bytes``: stop before a stored batch that would take the stream past this
  many stored bytes (the first batch always goes); 0 (or absent) for no budget.
  At least one of ``end_offset`` / ``max_bytes`` bounds the read. Like Kafka's
  ``fetch.max.bytes`` it is an int32.
- ``current_leader_epoch``: the caller's leader epoch for KIP-320 fencing, -1 to skip.
- ``columns``: top-level columns to return (projection), absent for all.
- ``max_wait_ms``: the long poll (Fetch's ``max_wait_ms``): when nothing at
  ``start_offset`` is committed yet, wait up to this long for the HW to pass it
  (woken by the HW's advance, not by polling); 0 (or absent) answers at once. At
  most :data:`MAX_WAIT_MS`.

Decoding is strict: unknown or missing keys, wrong types (a bool is not an
integer) and out-of-range values raise :class:`InvalidRequestError` naming the
field. Pure functions, thread-safe.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from replikafka import errors as E
from replikafka.records import validate_topic_name

VERSION = 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_TICKET_BYTES = 1 << 20
MAX_COLUMNS = 10_000
_REQUIRED = ("v", "topic", "partition", "start_offset")
_OPTIONAL = ("end_offset", "max_bytes", "current_leader_epoch", "columns", "max_wait_ms")
#: The longest long poll a ticket may ask for (as Fetch caps max_wait_ms).
MAX_WAIT_MS = 30_000


@dataclass(frozen=True, slots=True)
class PartitionTicket:
    topic: str
    partition: int
    start_offset: int
    end_offset: int = -1            # exclusive; -1: none
    max_bytes: int = 0              # 0: none
    current_leader_epoch: int = -1  # -1: no fencing
    columns: tuple[str, ...] | None = None
    max_wait_ms: int = 0            # long poll: 0 answers at once

    def __post_init__(self):
        _check(self)

    def encode(self) -> bytes:
        d = {"v": VERSION, "topic": self.topic, "partition": self.partition, "start_offset": self.start_offset}
        if self.end_offset != -1:
            d["end_offset"] = self.end_offset
        if self.max_bytes:
            d["max_bytes"] = self.max_bytes
        if self.current_leader_epoch != -1:
            d["current_leader_epoch"] = self.current_leader_epoch
        if self.columns is not None:
            d["columns"] = list(self.columns)
        if self.max_wait_ms:
            d["max_wait_ms"] = self.max_wait_ms
        return json.dumps(d, separators=(",", ":")).encode()


def _bad(field: str, what: str, value, where: str = "flight ticket") -> E.InvalidRequestError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return E.InvalidRequestError(f"{where}: {field!r} must be {what}, got {shown}")


def _int(field: str, value, lo: int, hi: int, where: str = "flight ticket") -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise _bad(field, f"an integer in [{lo}, {hi}]", value, where)
    return value


def _check(t: PartitionTicket) -> None:
    if type(t.topic) is not str:
        raise _bad("topic", "a string", t.topic)
    try:
        validate_topic_name(t.topic)
    except E.ReplikafkaError as exc:
        raise E.InvalidRequestError(f"flight ticket: 'topic': {exc.message}") from None
    _int("partition", t.partition, 0, INT32_MAX)
    _int("start_offset", t.start_offset, 0, INT64_MAX)
    if t.end_offset != -1:
        _int("end_offset", t.end_offset, t.start_offset, INT64_MAX)
    _int("max_bytes", t.max_bytes, 0, INT32_MAX)
    _int("current_leader_epoch", t.current_leader_epoch, -1, INT32_MAX)
    _int("max_wait_ms", t.max_wait_ms, 0, MAX_WAIT_MS)
    if t.end_offset == -1 and t.max_bytes == 0:
        raise E.InvalidRequestError("flight ticket: needs an 'end_offset' or a 'max_bytes' to bound the read")
    if t.columns is not None:
        cols = t.columns
        if not isinstance(cols, tuple) or not cols or len(cols) > MAX_COLUMNS:
            raise _bad("columns", f"a non-empty list of at most {MAX_COLUMNS} column names", cols)
        for c in cols:
            if type(c) is not str or not c:
                raise _bad("columns", "a list of non-empty strings", list(cols))
        if len(set(cols)) != len(cols):
            raise _bad("columns", "a list without repeated names", list(cols))


def decode_object(raw, where: str, required: tuple, optional: tuple, version_doc: str) -> dict:
    """The strict JSON object of a ticket or a produce command: at most
    MAX_TICKET_BYTES of UTF-8 JSON, an object with every required key, no unknown
    one, and ``v`` == VERSION. Each refusal is InvalidRequestError naming it."""
    if len(raw) > MAX_TICKET_BYTES:
        raise E.InvalidRequestError(f"{where}: {len(raw)} bytes, more than {MAX_TICKET_BYTES}")
    try:
        d = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise E.InvalidRequestError(f"{where}: not UTF-8 JSON ({exc})") from None
    if not isinstance(d, dict):
        raise E.InvalidRequestError(f"{where}: expected a JSON object, got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    if missing:
        raise E.InvalidRequestError(f"{where}: missing field(s) {missing}")
    unknown = sorted(k for k in d if k not in required and k not in optional)
    if unknown:
        raise E.InvalidRequestError(f"{where}: unknown field(s) {unknown}")
    if d["v"] != VERSION or type(d["v"]) is not int:
        raise _bad("v", f"{VERSION} ({version_doc})", d["v"], where)
    return d


def decode(data) -> PartitionTicket:
    """The ticket in ``data`` (bytes, or a ``pyarrow.flight.Ticket``)."""
    raw = getattr(data, "ticket", data)
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise E.InvalidRequestError(f"flight ticket: expected bytes, got {type(raw).__name__}")
    d = decode_object(raw, "flight ticket", _REQUIRED, _OPTIONAL, "the ticket version this broker reads")
    cols = d.get("columns")
    if cols is not None and not isinstance(cols, list):
        raise _bad("columns", "a list of column names", cols)
    return PartitionTicket(d["topic"], d["partition"], d["start_offset"], d.get("end_offset", -1),
                           d.get("max_bytes", 0), d.get("current_leader_epoch", -1),
                           tuple(cols) if cols is not None else None, d.get("max_wait_ms", 0))
