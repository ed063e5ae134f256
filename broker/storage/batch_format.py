"""The stored-batch format: one Arrow IPC record-batch message per stored batch.

On disk (and on the replication wire) a stored batch is exactly one
encapsulated Arrow IPC message of the *stream* format::

    0xFFFFFFFF            continuation marker (u32 little-endian)
    L                     flatbuffer metadata length (i32, a multiple of 8)
    Message flatbuffer    L bytes: RecordBatch header, bodyLength, custom_metadata
    body                  Message.bodyLength bytes: the column buffers, 8-byte padded

The Message's custom metadata carries the batch header, every value a decimal
string except the CRC::

    rk.base_offset     offset of the first record (offsets are dense: base + row)
    rk.record_count    rows in the batch (>= 1; equals RecordBatch.length)
    rk.leader_epoch    epoch of the leader that assigned the offsets
    rk.max_timestamp_ms  largest value of the `timestamp` column, -1 if all null
    rk.crc32c          CRC-32C of the body bytes, exactly 8 lowercase hex digits
    rk.producer_id, rk.producer_epoch, rk.base_sequence   (-1 when not idempotent)

The CRC covers the body only (like Kafka's, which leaves the base offset and
epoch out). It is computed after serialising once with a fixed-width
placeholder in rk.crc32c, then patched into the header (see BatchEncoder).

An end-of-stream marker is ``0xFFFFFFFF 0x00000000``.

Untrusted bytes (recovery, a follower's append_raw) go through
`decode_batch`: framing and header fields are read by a small bounds-checked
flatbuffer reader in this module (it works at any file position, where
pyarrow's stream reader must start at a schema), and Arrow parses a message
only after its framing, header and CRC passed. Bytes already validated that
way are framed on the read path by Arrow itself when the reader needs the
batches (`read_trusted`, several times faster than framing in Python), and by
the flatbuffer reader here when it only sends the stored messages on (a
follower's fetch: `peek_message`, with a batch decoded only if asked for,
`read_stored_message`): each Arrow call gives the GIL up and takes it back, and
beside a busy broker's other threads each take-back waits ~1 ms.

Thread-safety: the module functions are pure and thread-safe. A
``BatchEncoder`` is thread-safe: its one Arrow stream writer is used under the
encoder's own lock (the logs of one schema share one encoder, each appending
under its own lock), and the CRCs are computed outside it.
"""
from __future__ import annotations

import struct
import threading
import weakref
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import crc32c as _crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replikafka.errors import CorruptRecordError, InvalidSchemaError
from replikafka.records import has_dictionary

CONTINUATION = 0xFFFFFFFF
PREFIX_SIZE = 8
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# Sanity bound when framing untrusted bytes: real batch metadata is < 1 KiB
# plus 32 bytes per column buffer.
MAX_METADATA_LENGTH = 1 << 20

KEY_BASE_OFFSET = "rk.base_offset"
KEY_RECORD_COUNT = "rk.record_count"
KEY_LEADER_EPOCH = "rk.leader_epoch"
KEY_MAX_TIMESTAMP = "rk.max_timestamp_ms"
KEY_CRC = "rk.crc32c"
KEY_PRODUCER_ID = "rk.producer_id"
KEY_PRODUCER_EPOCH = "rk.producer_epoch"
KEY_BASE_SEQUENCE = "rk.base_sequence"
HEADER_KEYS = (KEY_BASE_OFFSET, KEY_RECORD_COUNT, KEY_LEADER_EPOCH, KEY_MAX_TIMESTAMP,
               KEY_CRC, KEY_PRODUCER_ID, KEY_PRODUCER_EPOCH, KEY_BASE_SEQUENCE)
CRC_PLACEHOLDER = b"~~~~~~~~"

_PREFIX = struct.Struct("<Ii")
_MESSAGE_HEADER_RECORD_BATCH = 3   # flatbuf MessageHeader union tag


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """What the log keeps about one stored batch (its custom metadata). Immutable."""

    base_offset: int
    record_count: int
    leader_epoch: int
    max_timestamp_ms: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    crc32c: int = 0     # of the body; filled in by encoding / decoding

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    def metadata(self, crc_text: str) -> dict[str, str]:
        return {
            KEY_BASE_OFFSET: str(self.base_offset),
            KEY_RECORD_COUNT: str(self.record_count),
            KEY_LEADER_EPOCH: str(self.leader_epoch),
            KEY_MAX_TIMESTAMP: str(self.max_timestamp_ms),
            KEY_CRC: crc_text,
            KEY_PRODUCER_ID: str(self.producer_id),
            KEY_PRODUCER_EPOCH: str(self.producer_epoch),
            KEY_BASE_SEQUENCE: str(self.base_sequence),
        }

    @classmethod
    def from_metadata(cls, kv: dict[str, str], where: str) -> "BatchHeader":
        missing = [k for k in HEADER_KEYS if k not in kv]
        if missing:
            raise CorruptRecordError(f"{where}: batch metadata lacks {', '.join(missing)}")
        crc_text = kv[KEY_CRC]
        try:
            if len(crc_text) != 8:
                raise ValueError(crc_text)
            return cls(
                base_offset=int(kv[KEY_BASE_OFFSET]),
                record_count=int(kv[KEY_RECORD_COUNT]),
                leader_epoch=int(kv[KEY_LEADER_EPOCH]),
                max_timestamp_ms=int(kv[KEY_MAX_TIMESTAMP]),
                producer_id=int(kv[KEY_PRODUCER_ID]),
                producer_epoch=int(kv[KEY_PRODUCER_EPOCH]),
                base_sequence=int(kv[KEY_BASE_SEQUENCE]),
                crc32c=int(crc_text, 16),
            )
        except ValueError as e:
            raise CorruptRecordError(f"{where}: batch metadata has a non-numeric value ({e})") from None


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """Framing of one record-batch message, read without building the batch."""

    size: int              # whole message: prefix + metadata + body
    metadata_length: int
    body_length: int
    record_count: int      # RecordBatch.length from the flatbuffer


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A validated stored batch: its header, its RecordBatch (zero-copy), its size."""

    header: BatchHeader
    batch: pa.RecordBatch
    size: int


# ---- flatbuffer reading --------------------------------------------------------------
class _Malformed(Exception):
    pass


_U16 = struct.Struct("<H").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I64 = struct.Struct("<q").unpack_from
_U16X2 = struct.Struct("<HH").unpack_from


def _fb_fields(meta: bytes, table: int) -> tuple[int, ...]:
    """Absolute positions of a flatbuffer table's fields (0 = field absent).

    Bounds: positions past the end make struct raise struct.error; negative ones
    (which struct would count from the end) are rejected here."""
    vtable = table - _I32(meta, table)[0] if table >= 0 else -1
    if vtable < 0:
        raise _Malformed(f"table at {table} has no valid vtable")
    vt_size = _U16(meta, vtable)[0]
    if vt_size < 4 or vt_size % 2:
        raise _Malformed(f"vtable at {vtable} has size {vt_size}")
    count = (vt_size - 4) >> 1
    unpack = _VTABLE_UNPACKERS.get(count)
    if unpack is None:      # (a vtable has at most 65,535 bytes: a bounded set of formats)
        unpack = _VTABLE_UNPACKERS[count] = struct.Struct(f"<{count}H").unpack_from
    # Every stored batch read is framed here: a list, not a generator (half the time).
    return tuple([table + o if o else 0 for o in unpack(meta, vtable + 4)])


_VTABLE_UNPACKERS: dict = {}     # field count -> its vtable's unpacker


def _fb_string(meta: bytes, field_pos: int) -> str:
    start = field_pos + _U32(meta, field_pos)[0]
    n = _U32(meta, start)[0]
    if start + 4 + n > len(meta):
        raise _Malformed(f"string at {start} runs past the metadata")
    return meta[start + 4:start + 4 + n].decode("utf-8")


def _parse_message(meta: bytes, want_custom: bool) -> tuple[int, int, int, dict[str, str] | None]:
    """(header_type, body_length, record_count, custom_metadata) of an Arrow
    Message flatbuffer: fields 1 header_type, 2 header (RecordBatch: field 0
    length), 3 bodyLength, 4 custom_metadata [KeyValue{key, value}]."""
    f = _fb_fields(meta, _U32(meta, 0)[0]) + (0, 0, 0, 0, 0)
    header_type = meta[f[1]] if f[1] else 0
    body_length = _I64(meta, f[3])[0] if f[3] else 0
    record_count = 0
    if f[2] and header_type == _MESSAGE_HEADER_RECORD_BATCH:
        rb = _fb_fields(meta, f[2] + _U32(meta, f[2])[0])
        record_count = _I64(meta, rb[0])[0] if rb and rb[0] else 0
    custom = None
    if want_custom:
        custom = {}
        if f[4]:
            vec = f[4] + _U32(meta, f[4])[0]
            count = _U32(meta, vec)[0]
            if vec + 4 + 4 * count > len(meta):
                raise _Malformed(f"custom_metadata vector at {vec} runs past the metadata")
            custom = _key_values(meta, vec, count)
    return header_type, body_length, record_count, custom


def _key_values(meta: bytes, vec: int, count: int) -> dict[str, str]:
    """The KeyValue tables of a custom_metadata vector (``count`` entries at ``vec``),
    as ``_fb_fields`` and ``_fb_string`` would read them (same bounds checks, same
    skipping of an entry without key or value), in one loop: every read of a stored
    batch's header goes through here (the leader's first read, each follower's
    append, recovery), and the general helpers cost twice as much."""
    out = {}
    size = len(meta)
    base = vec + 4
    for i, rel in enumerate(struct.unpack_from(f"<{count}I", meta, base)):
        table = base + 4 * i + rel
        vtable = table - _I32(meta, table)[0]
        if vtable < 0:
            raise _Malformed(f"table at {table} has no valid vtable")
        vt_size = _U16(meta, vtable)[0]
        if vt_size < 4 or vt_size % 2 or vtable + vt_size > size:
            raise _Malformed(f"vtable at {vtable} has size {vt_size}")
        if vt_size < 8:
            continue          # no value field
        key_at, value_at = _U16X2(meta, vtable + 4)
        if not (key_at and value_at):
            continue
        key_at += table
        start = key_at + _U32(meta, key_at)[0]
        n = _U32(meta, start)[0]
        if start + 4 + n > size:
            raise _Malformed(f"string at {start} runs past the metadata")
        key = meta[start + 4:start + 4 + n].decode("utf-8")
        value_at += table
        start = value_at + _U32(meta, value_at)[0]
        n = _U32(meta, start)[0]
        if start + 4 + n > size:
            raise _Malformed(f"string at {start} runs past the metadata")
        out[key] = meta[start + 4:start + 4 + n].decode("utf-8")
    return out


# ---- framing ---------------------------------------------------------------------
def is_end_of_stream(buf, pos: int, limit: int) -> bool:
    return pos + PREFIX_SIZE <= limit and _PREFIX.unpack_from(buf, pos) == (CONTINUATION, 0)


def _metadata_length(buf, pos: int, limit: int, where: str) -> int:
    """The metadata length in the message prefix at `pos` (0 = end-of-stream)."""
    if pos + PREFIX_SIZE > limit:
        raise CorruptRecordError(f"{where}: torn message prefix ({limit - pos} bytes left)")
    marker, meta_len = _PREFIX.unpack_from(buf, pos)
    if marker != CONTINUATION:
        raise CorruptRecordError(f"{where}: bad continuation marker {marker:#010x}")
    return meta_len


def _frame(buf, pos: int, limit: int, where: str, want_custom: bool):
    meta_len = _metadata_length(buf, pos, limit, where)
    if meta_len == 0:
        return None
    if meta_len < 8 or meta_len % 8 or meta_len > MAX_METADATA_LENGTH:
        raise CorruptRecordError(f"{where}: implausible metadata length {meta_len}")
    if pos + PREFIX_SIZE + meta_len > limit:
        raise CorruptRecordError(f"{where}: torn metadata ({meta_len} bytes declared, "
                                 f"{limit - pos - PREFIX_SIZE} present)")
    meta = bytes(memoryview(buf)[pos + PREFIX_SIZE:pos + PREFIX_SIZE + meta_len])
    try:
        header_type, body_length, record_count, custom = _parse_message(meta, want_custom)
    except (_Malformed, struct.error, IndexError, UnicodeDecodeError) as e:
        raise CorruptRecordError(f"{where}: unreadable message metadata ({e})") from None
    if header_type != _MESSAGE_HEADER_RECORD_BATCH:
        raise CorruptRecordError(f"{where}: message is not a record batch (header type {header_type})")
    size = PREFIX_SIZE + meta_len + body_length
    if body_length < 0 or pos + size > limit:
        raise CorruptRecordError(f"{where}: torn body ({body_length} bytes declared, "
                                 f"{limit - pos - PREFIX_SIZE - meta_len} present)")
    return MessageInfo(size, meta_len, body_length, record_count), custom


def peek_message(buf, pos: int, limit: int, where: str = "batch") -> MessageInfo | None:
    """Frame the record-batch message at `pos` (bytes below `limit` are valid).

    Returns None at an end-of-stream marker; raises CorruptRecordError when the
    bytes are not a complete record-batch message.
    """
    framed = _frame(buf, pos, limit, where, False)
    return None if framed is None else framed[0]


def read_header(buf, pos: int, limit: int, where: str = "batch") -> tuple[BatchHeader, MessageInfo] | None:
    """The batch header stored in the message at `pos`; None at end-of-stream."""
    framed = _frame(buf, pos, limit, where, True)
    if framed is None:
        return None
    info, custom = framed
    return BatchHeader.from_metadata(custom, where), info


def decode_batch(buf, pos: int, limit: int, schema: pa.Schema, where: str = "batch",
                 expected_base_offset: int | None = None) -> DecodedBatch | None:
    """Fully validate and decode the stored batch at `pos`; None at end-of-stream.

    Checks, in order: framing and lengths, header keys, record count against
    the RecordBatch length, the expected base offset, the body CRC
    (`check_framed`), that Arrow parses the message against `schema`, and the row
    count and max timestamp (`check_decoded`). Raises CorruptRecordError naming
    the first failure. The batch is zero-copy.
    """
    framed = check_framed(buf, pos, limit, where, expected_base_offset)
    if framed is None:
        return None
    header, info = framed
    try:
        batch = pa.ipc.read_record_batch(_as_arrow_buffer(buf).slice(pos, info.size), schema)
        batch.validate()
    except (pa.ArrowException, OSError, ValueError, TypeError) as e:
        raise CorruptRecordError(f"{where}: Arrow cannot read the batch ({e})") from None
    ts = batch.schema.get_field_index("timestamp")
    check_decoded(header, batch.num_rows, batch.column(ts) if ts >= 0 else None, where)
    return DecodedBatch(header, batch, info.size)


def check_framed(buf, pos: int, limit: int, where: str = "batch",
                 expected_base_offset: int | None = None) -> tuple[BatchHeader, MessageInfo] | None:
    """The checks of `decode_batch` made without Arrow (so without giving the GIL
    up): framing and lengths, header keys, record count against the RecordBatch
    length, the expected base offset, the body CRC. (header, message info), None at
    end-of-stream; CorruptRecordError naming the first failure."""
    got = read_header(buf, pos, limit, where)
    if got is None:
        return None
    header, info = got
    if header.record_count < 1 or header.record_count != info.record_count:
        raise CorruptRecordError(f"{where}: record count {header.record_count} in metadata, "
                                 f"{info.record_count} in the RecordBatch header")
    if expected_base_offset is not None and header.base_offset != expected_base_offset:
        raise CorruptRecordError(f"{where}: base offset {header.base_offset}, "
                                 f"expected {expected_base_offset}")
    body_start = pos + PREFIX_SIZE + info.metadata_length
    crc = _crc32c.crc32c(memoryview(buf)[body_start:body_start + info.body_length])
    if crc != header.crc32c:
        raise CorruptRecordError(f"{where}: CRC-32C mismatch (stored {header.crc32c:08x}, "
                                 f"computed {crc:08x})")
    return header, info


def check_decoded(header: BatchHeader, rows: int, timestamps: pa.Array | None, where: str = "batch") -> None:
    """The checks of `decode_batch` made once Arrow has read the batch: its ``rows``
    and its ``timestamps`` column's largest value (None: no such column) agree with
    the header; CorruptRecordError otherwise."""
    if rows != header.record_count:
        raise CorruptRecordError(f"{where}: {rows} rows, header says {header.record_count}")
    actual_max = -1 if timestamps is None else column_max_timestamp_ms(timestamps)
    if actual_max != header.max_timestamp_ms:
        raise CorruptRecordError(f"{where}: max timestamp {actual_max}, header says "
                                 f"{header.max_timestamp_ms}")


def leading_schema_message(buf) -> bytes | None:
    """The bytes of the message an IPC stream starts with, if its prefix frames a
    whole, 8-byte aligned message there (not parsed: Arrow reads it with the rest);
    None otherwise. For grouping streams by schema (`group_by_schema_message`)."""
    size = len(buf)
    if size < PREFIX_SIZE:
        return None
    marker, meta_len = _PREFIX.unpack_from(buf, 0)
    if marker != CONTINUATION or meta_len <= 0 or meta_len % 8 or PREFIX_SIZE + meta_len > size:
        return None
    return bytes(memoryview(buf)[:PREFIX_SIZE + meta_len])


def group_by_schema_message(streams, group_max_bytes: int) -> dict[bytes, list[list[int]]]:
    """Per schema message's bytes, groups of stream indexes for `read_one_stream`, in
    order, each of at most ``group_max_bytes`` (a larger stream goes in a group of its
    own). ``streams``: ``(index, schema message, size in bytes)`` of each stream."""
    groups: dict[bytes, list[list[int]]] = {}
    group_bytes: dict[bytes, int] = {}
    for i, schema_message, size in streams:
        total = group_bytes.get(schema_message, group_max_bytes)
        if total + size > group_max_bytes:
            groups.setdefault(schema_message, []).append([])
            total = len(schema_message)
        groups[schema_message][-1].append(i)
        group_bytes[schema_message] = total + size
    return groups


def read_one_stream(schema_message: bytes, messages: Sequence) -> pa.Table:
    """What Arrow reads from one IPC stream made of ``schema_message``, ``messages``
    (whole serialised messages, each 8-byte aligned; copied once into the stream) and
    the end marker: one call for many small batches, where reading each alone gives
    the GIL up several times. One chunk per batch message. Raises Arrow's errors."""
    return pa.ipc.open_stream(pa.py_buffer(b"".join([schema_message, *messages, END_OF_STREAM]))).read_all()


def check_stored_crc(buf, pos: int, limit: int, where: str = "batch") -> None:
    """Bit rot check on the read path: the body of the stored message at `pos` must
    still hash to the CRC-32C in its header (CorruptRecordError otherwise). Cheap: the
    CRC runs at memory speed, the header is a few hundred bytes."""
    got = read_header(buf, pos, limit, where)
    if got is None:
        return
    header, info = got
    body_start = pos + PREFIX_SIZE + info.metadata_length
    crc = _crc32c.crc32c(memoryview(buf)[body_start:body_start + info.body_length])
    if crc != header.crc32c:
        raise CorruptRecordError(f"{where}: CRC-32C mismatch on read (stored {header.crc32c:08x}, "
                                 f"computed {crc:08x}): the stored batch is damaged")


def read_trusted(buf: pa.Buffer, pos: int, limit: int, schema: pa.Schema,
                 where: str = "batch") -> tuple[pa.RecordBatch, int] | None:
    """(batch, message size) of the already-validated message at `pos`, framed and
    decoded by Arrow itself (several times faster than framing in Python); None
    at end-of-stream. Used on the read path, for bytes that passed `decode_batch`
    when they were appended or recovered, by a reader that needs the batches (a
    consumer's). Zero-copy over `buf`."""
    meta_len = _metadata_length(buf, pos, limit, where)
    if meta_len == 0:
        return None
    try:
        message = pa.ipc.read_message(buf.slice(pos, limit - pos))
        batch = pa.ipc.read_record_batch(message, schema)
    except (pa.ArrowException, OSError, ValueError, TypeError) as e:
        raise CorruptRecordError(f"{where}: Arrow cannot read the batch ({e})") from None
    return batch, PREFIX_SIZE + meta_len + message.body.size


def read_stored_message(message: pa.Buffer, schema: pa.Schema, where: str = "batch") -> pa.RecordBatch:
    """The RecordBatch of one already-validated stored message (``message`` holds it
    whole), decoded by Arrow, zero-copy; CorruptRecordError if Arrow cannot read it."""
    try:
        return pa.ipc.read_record_batch(message, schema)
    except (pa.ArrowException, OSError, ValueError, TypeError) as e:
        raise CorruptRecordError(f"{where}: Arrow cannot read the batch ({e})") from None


def _as_arrow_buffer(buf) -> pa.Buffer:
    return buf if isinstance(buf, pa.Buffer) else pa.py_buffer(buf)


# ---- schema message --------------------------------------------------------------
def schema_message(schema: pa.Schema) -> bytes:
    """The IPC stream's first message for `schema`, as the stream writer emits it."""
    return schema.serialize().to_pybytes()


def read_schema_message(buf, limit: int, where: str = "stream") -> tuple[pa.Schema, int]:
    """(schema, size) of the schema message at position 0 of an IPC stream."""
    if limit < PREFIX_SIZE:
        raise CorruptRecordError(f"{where}: torn schema message ({limit} bytes)")
    marker, meta_len = _PREFIX.unpack_from(buf, 0)
    if marker != CONTINUATION or meta_len < 8 or meta_len % 8 or meta_len > MAX_METADATA_LENGTH:
        raise CorruptRecordError(f"{where}: no schema message at the start")
    size = PREFIX_SIZE + meta_len
    if size > limit:
        raise CorruptRecordError(f"{where}: torn schema message ({limit} of {size} bytes)")
    try:
        schema = pa.ipc.read_schema(_as_arrow_buffer(buf).slice(0, size))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorruptRecordError(f"{where}: unreadable schema message ({e})") from None
    return schema, size


# ---- encoding --------------------------------------------------------------------
def max_timestamp_ms(batch: pa.RecordBatch) -> int:
    """Largest value of the batch's `timestamp` column in ms; -1 if all null or absent."""
    idx = batch.schema.get_field_index("timestamp")
    if idx < 0 or batch.num_rows == 0:
        return -1
    return column_max_timestamp_ms(batch.column(idx))


def column_max_timestamp_ms(col: pa.Array) -> int:
    """Largest value of a `timestamp` column (ms since the epoch, 64-bit) in ms; -1
    if it is empty or all null. Keeps the GIL unless the column holds nulls."""
    if len(col) == 0:
        return -1
    if col.null_count == 0:
        n = len(col)
        buf = col.buffers()[1]
        if n <= 16 and buf.size % 8 == 0:  # a small batch: a memoryview beats numpy's call overhead
            return max(memoryview(buf).cast("B").cast("q")[col.offset:col.offset + n])
        # numpy over the value buffer: a few microseconds, vs ~20 for a compute call.
        values = np.frombuffer(buf, dtype=np.int64, count=n, offset=col.offset * 8)
        return int(values.max())
    value = pc.max(col.view(pa.int64())).as_py()
    return -1 if value is None else value


@dataclass(frozen=True, slots=True)
class EncodedMessage:
    """One encoded stored batch: the pieces to hand to os.pwritev.

    `head` is the prefix and flatbuffer metadata (which holds the CRC), `body`
    the body pieces: zero-copy views of the source batch's buffers, so an
    EncodedMessage must be written before that batch is released. An unsealed
    message still has the CRC placeholder in its head; `seal(body_crc())`
    patches it. Messages taken verbatim from a stream are sealed, with an empty
    head and the whole message as body."""

    header: BatchHeader             # crc32c is set once sealed
    head: tuple
    body: tuple
    size: int
    crc_slot: tuple[int, int] | None = None   # (head piece, byte offset) of the placeholder
    sealed: bool = True

    @classmethod
    def verbatim(cls, header: BatchHeader, data, size: int) -> "EncodedMessage":
        return cls(header, (), (data,), size)

    @property
    def pieces(self) -> tuple:
        return self.head + self.body

    def body_crc(self) -> int:
        crc = 0
        for p in self.body:
            crc = _crc32c.crc32c(p, crc)
        return crc

    def seal(self, crc: int) -> "EncodedMessage":
        """This message with `crc` written into its header."""
        i, slot = self.crc_slot
        meta = self.head[i]
        head = list(self.head)
        head[i] = b"".join((meta[:slot], b"%08x" % crc, meta[slot + 8:]))
        h = self.header
        header = BatchHeader(h.base_offset, h.record_count, h.leader_epoch, h.max_timestamp_ms,
                             h.producer_id, h.producer_epoch, h.base_sequence, crc)
        return EncodedMessage(header, tuple(head), self.body, self.size, None, True)

    def to_bytes(self) -> bytes:
        return b"".join(self.pieces)


class _GatherSink:
    """A write-only file object for pa.PythonFile that keeps what it is given.

    pyarrow hands the IPC body buffers to a Python sink as zero-copy pa.Buffer
    objects, so "serialising" into this sink copies only the prefix and the
    flatbuffer metadata (a few hundred bytes), never the column data."""

    def __init__(self):
        self.pieces: list = []
        self.position = 0
        self.closed = False

    def write(self, data) -> int:
        self.pieces.append(data)
        n = len(data)
        self.position += n
        return n

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class BatchEncoder:
    """Serialises batches of one schema into stored-batch messages.

    Each batch is serialised once by a long-lived Arrow stream writer into a
    gathering sink (metadata copied, body buffers referenced, nothing else
    copied). Sealing computes the CRC-32C over the body pieces and replaces the
    8-character placeholder in the metadata piece by the hex CRC. The column
    data is then copied once, by the kernel, when the pieces are written, as
    when pyarrow writes a file itself. A batch of at most SMALL_BATCH_MAX_BYTES is
    encoded without the writer (`_encode_small`: from Arrow's serialisation, its data
    copied once), and so is a batch whose producer's message is given (that message
    verbatim, not serialised again: nothing copied before the write).
    Thread-safe: the writer is used under a lock, the CRCs are computed outside it. The logs of one schema share one
    encoder (:func:`shared_encoder`).
    """

    def __init__(self, schema: pa.Schema):
        self._schema = schema
        self._schema_size = len(schema_message(schema))
        self._sink: _GatherSink | None = None
        self._writer = None
        self._schema_pending = False
        self._placeholder = CRC_PLACEHOLDER.decode()
        # A dictionary column's dictionary is a message of its own, beside the one message
        # a stored batch is (topics refuse such columns: records.validate_topic_schema).
        self._plain = not any(has_dictionary(f.type) for f in schema)
        self._lock = threading.Lock()

    def _start(self) -> None:
        self._sink = _GatherSink()
        self._writer = pa.ipc.new_stream(pa.PythonFile(self._sink, mode="w"), self._schema)
        self._schema_pending = True     # the writer emits the schema with the first batch

    def encode(self, items: Sequence[tuple[pa.RecordBatch, BatchHeader]],
               seal: bool = True, messages: Sequence[PlainMessage | None] | None = None) -> list[EncodedMessage]:
        """One message per (batch, header). With seal=False the CRCs are left to
        compute (`msg.seal(msg.body_crc())`), e.g. to size-check first.
        ``messages``: per item, the `PlainMessage` the batch was read from (a
        producer's, validated) or None; it is stored verbatim with the header's
        metadata around it, not serialised again."""
        if not self._plain:
            raise InvalidSchemaError(f"batches of schema {self._schema} cannot be stored: dictionary-encoded "
                                     f"columns are not supported (a stored batch is one IPC message)")
        out = []
        for i, (batch, header) in enumerate(items):
            plain = messages[i] if messages is not None else None
            if plain is None:
                plain = _small_serialization(batch)
            if plain is not None:
                msg = _encode_small(batch, header, self._placeholder, plain)
                out.append(msg.seal(msg.body_crc()) if seal else msg)
                continue
            with self._lock:
                if self._writer is None:
                    self._start()
                sink = self._sink
                sink.pieces = []
                try:
                    self._writer.write_batch(batch, custom_metadata=header.metadata(self._placeholder))
                except BaseException:
                    self._writer = None     # its stream state is unknown now: start a new one
                    raise
                pieces = sink.pieces
                if self._schema_pending:
                    pieces = _drop_prefix(pieces, self._schema_size)
                    self._schema_pending = False
            msg = _split(pieces, header)
            out.append(msg.seal(msg.body_crc()) if seal else msg)
        return out


# A batch this small (its buffers' bytes) is encoded by `_encode_small`: one copy of
# its data costs less than the stream writer's GIL hand-offs (below).
SMALL_BATCH_MAX_BYTES = 64 * 1024
_I16 = struct.Struct("<h").unpack_from


def _buffer_bytes(batch: pa.RecordBatch) -> int:
    """The sizes of the buffers `batch` references, added up (whole buffers: a slice
    counts its parents'), with calls that keep the GIL (``RecordBatch.nbytes`` gives
    it up)."""
    return sum(b.size for column in batch.columns for b in column.buffers() if b is not None)


# The Message table `_encode_small` writes: its vtable (size 14, table size 24, field
# offsets of version, header_type, header, bodyLength, custom_metadata), then the
# table (soffset to that vtable, bodyLength, header, custom_metadata, version,
# header_type, padding); and the one vtable of its KeyValue tables (key, value).
_MESSAGE_VTABLE = struct.pack("<7H", 14, 24, 20, 22, 12, 4, 16)
_MESSAGE_TABLE = struct.Struct("<iqIIhBx")
_KEY_VALUE_VTABLE = struct.pack("<4H", 8, 12, 4, 8)
_KEY_VALUE_TABLE = struct.Struct("<iII")


def _fb_string_bytes(text: bytes) -> bytes:
    """A flatbuffer string: its length, its bytes, a NUL, zeros to a multiple of 4."""
    return struct.pack("<I", len(text)) + text + b"\0" * (((len(text) + 4) & ~3) - len(text))


# Where `_encode_small`'s pieces go: the root offset (4) and the vtable (14, then 2 of
# padding) put the Message table at 20, its custom_metadata vector after it (a count
# and an offset per KeyValue), then the KeyValue tables' one vtable, the tables, and
# the strings (each key, then its value). Everything before the strings is the same
# for every batch but the Message table and the KeyValue tables' string offsets.
_KV_COUNT = len(HEADER_KEYS)
_TABLE_AT = 20
_VECTOR_AT = _TABLE_AT + _MESSAGE_TABLE.size
_KV_VTABLE_AT = _VECTOR_AT + 4 + 4 * _KV_COUNT
_KV_TABLES_AT = _KV_VTABLE_AT + len(_KEY_VALUE_VTABLE)
_STRINGS_AT = _KV_TABLES_AT + _KEY_VALUE_TABLE.size * _KV_COUNT
_META_START = struct.pack("<I", _TABLE_AT) + _MESSAGE_VTABLE + b"\0\0"
_VECTOR_AND_KV_VTABLE = struct.pack(
    f"<{_KV_COUNT + 1}I", _KV_COUNT,
    *(_KV_TABLES_AT + _KEY_VALUE_TABLE.size * i - (_VECTOR_AT + 4 + 4 * i) for i in range(_KV_COUNT))) \
    + _KEY_VALUE_VTABLE
_KV_TABLES = struct.Struct("<" + "iII" * _KV_COUNT)
# The keys in the order BatchHeader.metadata gives them.
_KEY_STRINGS = tuple(_fb_string_bytes(k.encode()) for k in BatchHeader(0, 0, 0).metadata("0" * 8))


class PlainMessage(NamedTuple):
    """One serialised record-batch message `_encode_small` can store with a header of
    its own (Arrow's ``RecordBatch.serialize`` or a producer's stream message):
    8-byte aligned metadata with a RecordBatch header, no custom metadata, an
    uncompressed body (a stored body is what readers map) whose length is a multiple
    of 8 (the next stored message stays aligned), right after the metadata."""
    message: pa.Buffer       # the whole message, its 8-byte prefix included
    meta: bytes              # its flatbuffer metadata
    version: int             # the Message table's fields
    record_batch: int        # position of the RecordBatch table in `meta`
    body_length: int
    record_count: int        # the RecordBatch's length

    @property
    def body(self) -> pa.Buffer:
        return self.message.slice(PREFIX_SIZE + len(self.meta))


_U16X4 = struct.Struct("<4H").unpack_from


def plain_message_at(buf: pa.Buffer, view: memoryview, pos: int, limit: int) -> PlainMessage | None:
    """The `PlainMessage` at ``pos`` of ``buf`` (``view``: its memoryview; bytes below
    ``limit`` are valid), or None if what is there is not one, or not whole. Reads
    the flatbuffer by hand, no Arrow call (each gives the GIL up); bounds-checked
    (a malformed one is None too)."""
    if limit - pos < PREFIX_SIZE:
        return None
    marker, meta_len = _PREFIX.unpack_from(view, pos)
    if marker != CONTINUATION or meta_len <= 0 or meta_len % 8 or meta_len > MAX_METADATA_LENGTH \
            or pos + PREFIX_SIZE + meta_len > limit:
        return None
    meta = view[pos + PREFIX_SIZE:pos + PREFIX_SIZE + meta_len].tobytes()
    try:
        # The Message table: version, header_type, header, bodyLength, custom_metadata.
        table = _U32(meta, 0)[0]
        vtable = table - _I32(meta, table)[0]
        vt_size = _U16(meta, vtable)[0] if vtable >= 0 else 0
        if vt_size < 12 or vt_size % 2:
            return None
        f_version, f_type, f_header, f_body = _U16X4(meta, vtable + 4)
        f_custom = _U16(meta, vtable + 12)[0] if vt_size >= 14 else 0
        if not (f_version and f_type and f_header and f_body) or f_custom \
                or meta[table + f_type] != _MESSAGE_HEADER_RECORD_BATCH:
            return None
        version = _I16(meta, table + f_version)[0]
        header_at = table + f_header
        record_batch = header_at + _U32(meta, header_at)[0]
        body_length = _I64(meta, table + f_body)[0]
        # The RecordBatch table: length, nodes, buffers, compression, ...
        rb = _fb_fields(meta, record_batch)
        record_count = _I64(meta, rb[0])[0] if rb and rb[0] else 0
        compressed = len(rb) > 3 and rb[3]
    except (_Malformed, struct.error, IndexError):
        return None
    end = pos + PREFIX_SIZE + meta_len + body_length
    if compressed or body_length < 0 or body_length % 8 or record_count < 0 or end > limit:
        return None
    return PlainMessage(buf.slice(pos, end - pos), meta, version, record_batch, body_length, record_count)


def plain_message(message: pa.Buffer) -> PlainMessage | None:
    """``message`` (one serialised message, whole) as a `PlainMessage`; None if it is
    not one or holds bytes after it."""
    plain = plain_message_at(message, memoryview(message), 0, message.size)
    return plain if plain is not None and plain.message.size == message.size else None


def _plain_serialization(batch: pa.RecordBatch) -> PlainMessage | None:
    """`plain_message` of Arrow's own serialisation of ``batch``."""
    return plain_message(batch.serialize())


def _small_serialization(batch: pa.RecordBatch):
    """`_plain_serialization` of a batch of at most SMALL_BATCH_MAX_BYTES; None for a
    larger one (the stream writer encodes it) or one not plain."""
    return _plain_serialization(batch) if _buffer_bytes(batch) <= SMALL_BATCH_MAX_BYTES else None


def _encode_small(batch: pa.RecordBatch, header: BatchHeader, crc_text: str,
                  plain: PlainMessage | None = None) -> EncodedMessage | None:
    """An unsealed message of `batch` (the same bytes a reader sees as the stream
    writer's: the same body, the same RecordBatch header, the header's custom
    metadata), built from Arrow's own serialisation of the batch and a Message
    flatbuffer written here; None if that serialisation is not the plain message
    expected (the stream writer then encodes it).

    Why: the stream writer gives the GIL up and takes it back for each batch (and
    for each write into the Python sink), and beside a busy broker's other threads
    each take-back waits for their switch interval, ~1 ms with one thread running
    Python. A Produce naming thousands of partitions (the retries after a failover)
    encodes thousands of small batches. ``RecordBatch.serialize`` gives the GIL up
    too (twice a call, pyarrow 26): a produced batch whose producer's message is at
    hand is stored from that message (``plain``), without serialising it again.

    The metadata is a new Message table (its vtable, the custom_metadata vector,
    its KeyValue tables and strings) followed, 8-byte aligned, by Arrow's metadata
    verbatim: the new table's ``header`` field points into it at the RecordBatch
    table (flatbuffer offsets are relative, so that table reads the same at its
    new place); Arrow's own Message table there is not referenced any more. The
    parts that are the same for every batch are built once (at import). ``plain``:
    `_plain_serialization(batch)` if the caller has it."""
    plain = _plain_serialization(batch) if plain is None else plain
    if plain is None:
        return None
    meta, version, record_batch, body_length = plain.meta, plain.version, plain.record_batch, plain.body_length
    strings = []
    offsets = []
    pos = _STRINGS_AT
    at = _KV_TABLES_AT
    for key, value in zip(_KEY_STRINGS, header.metadata(crc_text).values()):
        text = _fb_string_bytes(value.encode())
        offsets += (at - _KV_VTABLE_AT, pos - (at + 4), pos + len(key) - (at + 8))
        strings += (key, text)
        pos += len(key) + len(text)
        at += _KEY_VALUE_TABLE.size
    arrow_at = (pos + 7) & ~7
    new_meta = b"".join((
        _META_START,
        _MESSAGE_TABLE.pack(_TABLE_AT - 4, body_length, arrow_at + record_batch - (_TABLE_AT + 12),
                            _VECTOR_AT - (_TABLE_AT + 16), version, _MESSAGE_HEADER_RECORD_BATCH),
        _VECTOR_AND_KV_VTABLE, _KV_TABLES.pack(*offsets), *strings, b"\0" * (arrow_at - pos), meta))
    head = _PREFIX.pack(CONTINUATION, len(new_meta)) + new_meta
    crc_at = head.find(CRC_PLACEHOLDER)
    return EncodedMessage(header, (head,), (plain.body,),
                          len(head) + body_length, (0, crc_at), False)


_shared_encoders: "weakref.WeakValueDictionary[bytes, BatchEncoder]" = weakref.WeakValueDictionary()
_shared_encoders_lock = threading.Lock()


def shared_encoder(schema: pa.Schema, schema_msg: bytes | None = None) -> BatchEncoder:
    """The encoder every log of this schema uses. Starting a stream writer costs
    about as much as encoding a small batch; after a failover thousands of logs of
    one topic take their first append at once, and they start one writer, not one
    each. Held by its logs (weakly here): it goes with the last of them."""
    key = schema_message(schema) if schema_msg is None else schema_msg
    with _shared_encoders_lock:
        enc = _shared_encoders.get(key)
        if enc is None:
            enc = _shared_encoders[key] = BatchEncoder(schema)
        return enc


def body_crc32c(batches: Sequence[pa.RecordBatch], schema: pa.Schema) -> list[int]:
    """The CRC-32C of each batch's body as the log would store it (``rk.crc32c``):
    what a producer sends with a Flight append so the leader can check what it
    stores (``Log.append(body_crc32c=...)``). A small batch's body is Arrow's
    serialisation's (`_encode_small`; its data copied once, as the log copies it):
    its CRC needs no message built around it. A larger one's comes from the stream
    writer's pieces, its column data not copied. A schema the log refuses goes to
    the encoder, which names why."""
    out = []
    storable = not any(has_dictionary(f.type) for f in schema)
    for b in batches:
        plain = _small_serialization(b) if storable else None
        if plain is not None:
            out.append(_crc32c.crc32c(plain.body))
        else:
            [msg] = shared_encoder(schema).encode([(b, BatchHeader(0, 0, -1))], seal=False)
            out.append(msg.body_crc())
    return out


def _drop_prefix(pieces: list, nbytes: int) -> list:
    """The pieces after the first `nbytes` bytes."""
    out = []
    for p in pieces:
        n = len(p)
        if nbytes >= n:
            nbytes -= n
            continue
        out.append(memoryview(p)[nbytes:] if nbytes else p)
        nbytes = 0
    return out


def _split(pieces: list, header: BatchHeader) -> EncodedMessage:
    """An unsealed message: pieces split at the body start, CRC placeholder located."""
    prefix = b""
    for p in pieces:
        prefix += bytes(p[:PREFIX_SIZE - len(prefix)])
        if len(prefix) == PREFIX_SIZE:
            break
    meta_end = PREFIX_SIZE + _PREFIX.unpack_from(prefix, 0)[1]
    head: list = []
    body: list = []
    pos = 0
    slot = None
    for p in pieces:
        n = len(p)
        if pos >= meta_end:
            body.append(p)
        elif pos + n <= meta_end:
            head.append(p if isinstance(p, bytes) else bytes(p))
        else:       # straddles the body start (pyarrow does not do this; be safe)
            cut = meta_end - pos
            head.append(bytes(p[:cut]))
            body.append(memoryview(p)[cut:])
        pos += n
    for i, meta in enumerate(head):
        at = meta.find(CRC_PLACEHOLDER)
        if at >= 0:
            if slot is not None or meta.find(CRC_PLACEHOLDER, at + 1) >= 0:
                raise AssertionError("CRC placeholder found more than once in batch metadata")
            slot = (i, at)
    if slot is None:
        raise AssertionError("CRC placeholder not found in batch metadata")
    return EncodedMessage(header, tuple(head), tuple(body), pos, slot, False)


def encode_batch(batch: pa.RecordBatch, header: BatchHeader,
                 schema: pa.Schema | None = None) -> EncodedMessage:
    """Encode one batch with a throwaway encoder (tests, tools, rare paths)."""
    return BatchEncoder(schema or batch.schema).encode([(batch, header)])[0]
