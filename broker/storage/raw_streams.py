"""A follower's fetched streams (`Log.read_raw`'s format: a schema message, stored
batch messages, the end marker) checked together before each is appended, with few
calls that give the GIL up.

Why: `Log.append_raw` checks each stored batch with `batch_format.decode_batch`,
whose Arrow read and validation give the GIL up five times a batch (pyarrow 26:
``read_record_batch`` four, ``validate`` one). Beside one other busy thread each
take-back waits for that thread's switch interval: a follower's fetcher applying one
answer of 10,000 partitions (two one-record batches each) took 75-80 s that way,
against 1.9 s alone (`bench/failover_inproc.py --gil-load 1`, follow-write). After a
failover each survivor follows thousands of new leaders, and every write to them
comes back to it as such an answer.

How: each stream is framed and checked here without Arrow
(`batch_format.check_framed`: framing, every header key, record counts, contiguous
offsets, the body's CRC-32C). Streams of at most ``GROUPED_STREAM_MAX_BYTES`` are
grouped by their schema message's bytes, and Arrow reads each group as one stream of
all their batch messages: one read, one validation (the same, not full, as each
batch's), then the row count and largest timestamp of each batch against its header
(`batch_format.check_decoded`, over the read's chunks). A stream that does not frame
or check, a larger one, one of fewer than ``GROUP_MIN_STREAMS`` of its schema, and
every stream of a group Arrow refuses, get None: the log checks it alone, which is
how a refusal names its stream and what is wrong.

A `CheckedStream` holds the stream's messages as zero-copy slices of its buffer, and
the schema message the checks were made against: `Log.append_raw` trusts it only if
that is, byte for byte, the log's own.

Pure functions over buffers; thread-safe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa

from replikafka.errors import CorruptRecordError

from . import batch_format as bf

# A stream of at most this many bytes is read with the others of its schema (its
# batches copied once into their one stream); a larger one is checked alone,
# zero-copy (a few GIL hand-offs are nothing beside reading its data).
GROUPED_STREAM_MAX_BYTES = 64 * 1024
# The bytes of one group's stream at most (then another group starts): bounds the copy.
GROUP_MAX_BYTES = 16 << 20
# Fewer streams of a schema than this are left to the log: reading a group costs a
# stream's copy and a table, and one 10-record stream checked in a group of one took
# 128 us of CPU against 84 us alone; in groups of 3 the CPU was even, of 8 62 us, of
# 50 53 us (2026-11-24). A fetch of one partition (a quiet follower's) stays as it was.
GROUP_MIN_STREAMS = 3


@dataclass(frozen=True, slots=True)
class CheckedStream:
    """A stream that passed every check `Log.append_raw` makes, against the schema
    of ``schema_message`` (its bytes): its batch ``messages``, in order, contiguous."""
    schema_message: bytes
    messages: tuple[bf.EncodedMessage, ...]


def check_raw_streams(streams: Sequence) -> list[CheckedStream | None]:
    """Per stream (a ``pyarrow.Buffer``, bytes, or anything ``bytes()`` joins), in
    order: the `CheckedStream`, or None if it must be checked alone."""
    out: list[CheckedStream | None] = [None] * len(streams)
    small = [i for i, data in enumerate(streams) if len(data) <= GROUPED_STREAM_MAX_BYTES]
    if len(small) < GROUP_MIN_STREAMS:
        return out      # no group possible: framing them here would be done again by the log
    framed: dict[int, tuple[bytes, list[bf.EncodedMessage]]] = {}
    grouped: list[tuple[int, bytes, int]] = []     # (stream, schema message, bytes)
    for i in small:
        data = streams[i]
        buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data if isinstance(data, bytes) else bytes(data))
        got = _frame(buf)
        if got is None:
            continue
        framed[i] = got
        grouped.append((i, got[0], buf.size))
    for schema_message, members_list in bf.group_by_schema_message(grouped, GROUP_MAX_BYTES).items():
        for members in members_list:
            if len(members) >= GROUP_MIN_STREAMS and _read_group(schema_message, [framed[i][1] for i in members]):
                for i in members:
                    out[i] = CheckedStream(schema_message, tuple(framed[i][1]))
    return out


def _frame(buf: pa.Buffer) -> tuple[bytes, list[bf.EncodedMessage]] | None:
    """(the schema message's bytes, each batch message checked by
    `batch_format.check_framed`) of a stream whose batch messages are 8-byte aligned
    and contiguous, ending at the end marker or the buffer's end; None for any other."""
    schema_message = bf.leading_schema_message(buf)
    if schema_message is None:
        return None
    size = buf.size
    pos = len(schema_message)
    messages: list[bf.EncodedMessage] = []
    expected = None
    try:
        while pos < size:
            got = bf.check_framed(buf, pos, size, "append_raw data", expected)
            if got is None:                     # the end marker: nothing may follow it
                if pos + bf.PREFIX_SIZE != size:
                    return None
                break
            header, info = got
            if info.size % 8:                   # Arrow reads a stream's messages 8-byte aligned
                return None
            messages.append(bf.EncodedMessage.verbatim(header, buf.slice(pos, info.size), info.size))
            expected = header.next_offset
            pos += info.size
    except CorruptRecordError:
        return None
    return (schema_message, messages) if messages else None


def _read_group(schema_message: bytes, members: list[list[bf.EncodedMessage]]) -> bool:
    """True if Arrow reads one stream of the schema message and every member's
    messages, the read validates, and each batch's rows and largest timestamp agree
    with its header."""
    messages = [m for ms in members for m in ms]
    try:
        table = bf.read_one_stream(schema_message, [m.body[0] for m in messages])
        if table.num_columns == 0:
            return False
        table.validate()
        # One chunk per batch message: the read keeps them apart (no batch is empty).
        rows = table.column(0).chunks
        ts = table.schema.get_field_index("timestamp")
        stamps = table.column(ts).chunks if ts >= 0 else [None] * len(rows)
        if len(rows) != len(messages):
            return False
        for m, chunk, stamp in zip(messages, rows, stamps):
            bf.check_decoded(m.header, len(chunk), stamp)
    except (pa.ArrowException, OSError, ValueError, TypeError, CorruptRecordError):
        return False
    return True
