"""A Produce's records, from the bytes of each partition entry to the batches the
leader's log appends, with few calls that give the GIL up.

Why: Arrow's IPC reading, validation and serialisation give the GIL up and take it
back on every call (``read_message`` twice, ``read_record_batch`` four times,
``RecordBatch.serialize`` twice, in pyarrow 26), and beside a busy broker's other
threads each take-back waits for their switch interval (~1 ms). A Produce naming
thousands of partitions (every producer's retry after a failover) made about eight
such calls a partition; now a small entry makes none here and none in the log's
encoding, which leaves the segment's open and write.

How: each entry's CRC-32C is checked (:func:`records.check_produced_crc`), then its
stream is framed here without Arrow (`_frame_plain`): a schema message, then plain
record-batch messages (:func:`batch_format.plain_message_at`: no custom metadata, no
compression, aligned), then the end marker or the end. Entries of at most
``GROUPED_ENTRY_MAX_BYTES`` framed so are grouped by their schema message, and Arrow
reads each group as one stream made of all their messages (one read, one full
validation, one combined batch, which each entry's batches are slices of: slicing
keeps the GIL). Every other entry is decoded alone, zero-copy
(:func:`records.decode_untrusted`), and validated with the others
(:func:`records.validate_untrusted_many`); so is every entry of a group Arrow
refuses, which is how the refusal names its entry and what is wrong.

Each batch travels with the producer's IPC message it was read from when that
message is plain (its bytes are exactly what Arrow validated), so the log stores
that message verbatim with its own header, not a serialisation of the batch
(:meth:`batch_format.BatchEncoder.encode`, ``messages``). Batches of no rows are
dropped here: a Produce stores none.

Pure functions over bytes; thread-safe.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from replikafka import errors as E
from replikafka import records as R
from replikafka.broker.storage import batch_format as bf

# An entry of at most this many bytes is read with the others of its schema (its
# bytes copied once into their one stream); a larger one is read alone, zero-copy
# (a few GIL hand-offs are nothing beside its data).
GROUPED_ENTRY_MAX_BYTES = 64 * 1024
# The bytes of one group's stream at most (then another group starts): bounds the
# copy, and keeps the combined batch's 32-bit offsets far from overflowing.
GROUP_MAX_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class ProducedRecords:
    """One entry's decoded records: its non-empty ``batches`` and, for each, the
    producer's message it was read from (`batch_format.PlainMessage`, for the log to
    store verbatim) or None."""
    batches: tuple[pa.RecordBatch, ...]
    sent_messages: tuple[bf.PlainMessage | None, ...]


def decode_produce_entries(entries: list[tuple[bytes, int | None, str]]) \
        -> list[ProducedRecords | E.ReplikafkaError]:
    """Per entry ``(records, records_crc32c or None, where)``, in order: its records,
    or the CorruptRecordError naming what is wrong with its bytes."""
    out: list = [None] * len(entries)
    framed: dict[int, tuple[pa.Buffer, list[bf.PlainMessage]]] = {}
    grouped: list[tuple[int, bytes, int]] = []     # (entry, schema message, bytes)
    alone: list[int] = []
    for i, (data, crc, where) in enumerate(entries):
        try:
            R.check_produced_crc(data, crc, where)
        except E.ReplikafkaError as exc:
            out[i] = exc
            continue
        buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
        frame = _frame_plain(buf)
        if frame is None:
            alone.append(i)
            continue
        schema_message, messages = frame
        framed[i] = (buf, messages)
        if buf.size > GROUPED_ENTRY_MAX_BYTES or not messages:
            alone.append(i)
            continue
        grouped.append((i, schema_message, buf.size))
    for schema_message, members_list in bf.group_by_schema_message(grouped, GROUP_MAX_BYTES).items():
        for members in members_list:
            batches = _read_group(schema_message, [framed[i][1] for i in members])
            if batches is None:
                alone.extend(members)    # Arrow refused the group: each is decoded alone to name why
                continue
            for i, entry_batches in zip(members, batches):
                messages = framed[i][1]
                kept = [j for j, m in enumerate(messages) if m.record_count]
                out[i] = ProducedRecords(tuple(entry_batches[j] for j in kept), tuple(messages[j] for j in kept))
    _decode_alone(sorted(alone), entries, framed, out)
    return out


def _decode_alone(indexes: list[int], entries, framed, out: list) -> None:
    """The entries at ``indexes`` decoded one by one and validated together; each
    batch keeps its framed message if Arrow read as many batches, each of the row
    count framed."""
    decoded, decoded_entry = [], []
    for i in indexes:
        data, _crc, where = entries[i]
        try:
            decoded.append((where, *R.decode_untrusted(framed[i][0] if i in framed else data, where,
                                                       validate=False)))
            decoded_entry.append(i)
        except E.ReplikafkaError as exc:
            out[i] = exc
    errors = R.validate_untrusted_many(decoded)
    for j, i in enumerate(decoded_entry):
        if j in errors:
            out[i] = errors[j]
            continue
        batches = decoded[j][2]
        messages = framed[i][1] if i in framed else ()
        if len(messages) != len(batches) or any(b.num_rows != m.record_count for b, m in zip(batches, messages)):
            messages = [None] * len(batches)
        kept = [k for k, b in enumerate(batches) if b.num_rows]
        out[i] = ProducedRecords(tuple(batches[k] for k in kept), tuple(messages[k] for k in kept))


def _frame_plain(buf: pa.Buffer) -> tuple[bytes, list[bf.PlainMessage]] | None:
    """``(the schema message's bytes, each record-batch message)`` of a stream that is a
    schema message, plain record-batch messages (`batch_format.plain_message_at`)
    and then the end marker or the buffer's end, nothing after; None for any other
    (Arrow's reader then reads it or names what is wrong). The schema message is
    not parsed: Arrow reads it with the group."""
    schema_message = bf.leading_schema_message(buf)
    if schema_message is None:
        return None
    size = buf.size
    view = memoryview(buf)
    pos = len(schema_message)
    messages = []
    while pos < size:
        if bf.is_end_of_stream(view, pos, size):
            pos += bf.PREFIX_SIZE
            break
        plain = bf.plain_message_at(buf, view, pos, size)
        if plain is None:
            return None
        messages.append(plain)
        pos += plain.message.size
    return (schema_message, messages) if pos == size else None


def _read_group(schema_message: bytes, members: list[list[bf.PlainMessage]]) -> list[list[pa.RecordBatch]] | None:
    """Each member's batches (one per message), read by Arrow from one stream of the
    schema message and every member's messages, fully validated; None if Arrow
    refuses any of it (or reads another number of rows than framed)."""
    pieces = [m.message for messages in members for m in messages]
    rows = sum(m.record_count for messages in members for m in messages)
    try:
        table = bf.read_one_stream(schema_message, pieces)
        if table.num_rows != rows or not len(table.schema):
            return None
        # Every column's chunks fully checked (buffer sizes, offsets, null counts,
        # UTF-8), as each batch's own full validation would.
        table.validate(full=True)
        combined = table.combine_chunks().to_batches()
    except R.ARROW_DECODE_ERRORS:
        return None
    whole = combined[0] if combined else None
    out = []
    at = 0
    for messages in members:
        batches = []
        for m in messages:
            # No rows at all: nothing to slice (and a Produce stores no empty batch).
            batches.append(whole.slice(at, m.record_count) if whole is not None else None)
            at += m.record_count
        out.append(batches)
    return out
