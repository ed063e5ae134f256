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
placeholder in rk.crc32c and patched into the header in place.

An end-of-stream marker is ``0xFFFFFFFF 0x00000000``.

Header fields are read by a small bounds-checked flatbuffer reader in this
module, not by pyarrow's stream reader: it works at any file position (the
stream reader must start at a schema) and it never hands unchecked bytes to
Arrow; Arrow only parses a message after its framing, header and CRC passed.

Thread-safety: the module functions are pure and thread-safe. A
``BatchEncoder`` reuses one scratch buffer and is NOT thread-safe (a Log owns
one and uses it under its lock).
"""
from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Sequence

import crc32c as _crc32c
import pyarrow as pa
import pyarrow.compute as pc

from replikafka.errors import CorruptRecordError

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
    """What the log keeps about one stored batch (its custom metadata)."""

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
    header: BatchHeader
    batch: pa.RecordBatch
    size: int


@dataclass(frozen=True, slots=True)
class EncodedMessage:
    header: BatchHeader    # with crc32c set
    data: pa.Buffer        # the message bytes


# ---- flatbuffer reading --------------------------------------------------------------
class _Malformed(Exception):
    pass


class _FlatBuffer:
    """Bounds-checked reads of a flatbuffer held in a bytes object."""

    __slots__ = ("data", "size")

    def __init__(self, data: bytes):
        self.data = data
        self.size = len(data)

    def _need(self, pos: int, n: int) -> None:
        if pos < 0 or pos + n > self.size:
            raise _Malformed(f"flatbuffer read of {n} bytes at {pos} outside its {self.size} bytes")

    def u8(self, pos: int) -> int:
        self._need(pos, 1)
        return self.data[pos]

    def u16(self, pos: int) -> int:
        self._need(pos, 2)
        return int.from_bytes(self.data[pos:pos + 2], "little")

    def i32(self, pos: int) -> int:
        self._need(pos, 4)
        return int.from_bytes(self.data[pos:pos + 4], "little", signed=True)

    def u32(self, pos: int) -> int:
        self._need(pos, 4)
        return int.from_bytes(self.data[pos:pos + 4], "little")

    def i64(self, pos: int) -> int:
        self._need(pos, 8)
        return int.from_bytes(self.data[pos:pos + 8], "little", signed=True)

    def deref(self, pos: int) -> int:
        return pos + self.u32(pos)

    def field(self, table: int, index: int) -> int:
        """Absolute position of field `index` of the table at `table`, 0 if absent."""
        vtable = table - self.i32(table)
        slot = 4 + 2 * index
        if slot + 2 > self.u16(vtable):
            return 0
        off = self.u16(vtable + slot)
        return table + off if off else 0

    def string(self, field_pos: int) -> str:
        start = self.deref(field_pos)
        n = self.u32(start)
        self._need(start + 4, n)
        return self.data[start + 4:start + 4 + n].decode("utf-8")


def _parse_message(meta: bytes, want_custom: bool) -> tuple[int, int, int, dict[str, str] | None]:
    """(header_type, body_length, record_count, custom_metadata) of a Message flatbuffer."""
    fb = _FlatBuffer(meta)
    root = fb.deref(0)
    p = fb.field(root, 1)
    header_type = fb.u8(p) if p else 0
    p = fb.field(root, 3)
    body_length = fb.i64(p) if p else 0
    record_count = 0
    p = fb.field(root, 2)
    if p and header_type == _MESSAGE_HEADER_RECORD_BATCH:
        rb = fb.deref(p)
        q = fb.field(rb, 0)
        record_count = fb.i64(q) if q else 0
    custom = None
    if want_custom:
        custom = {}
        p = fb.field(root, 4)
        if p:
            vec = fb.deref(p)
            for i in range(fb.u32(vec)):
                kv = fb.deref(vec + 4 + 4 * i)
                kp, vp = fb.field(kv, 0), fb.field(kv, 1)
                if kp and vp:
                    custom[fb.string(kp)] = fb.string(vp)
    return header_type, body_length, record_count, custom


# ---- framing ---------------------------------------------------------------------
def is_end_of_stream(buf, pos: int, limit: int) -> bool:
    return pos + PREFIX_SIZE <= limit and _PREFIX.unpack_from(buf, pos) == (CONTINUATION, 0)


def _frame(buf, pos: int, limit: int, where: str, want_custom: bool):
    if pos + PREFIX_SIZE > limit:
        raise CorruptRecordError(f"{where}: torn message prefix ({limit - pos} bytes left)")
    marker, meta_len = _PREFIX.unpack_from(buf, pos)
    if marker != CONTINUATION:
        raise CorruptRecordError(f"{where}: bad continuation marker {marker:#010x}")
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
    except (_Malformed, UnicodeDecodeError) as e:
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
    the RecordBatch length, the expected base offset, the body CRC, that Arrow
    parses the message against `schema`, and the max timestamp. Raises
    CorruptRecordError naming the first failure. The batch is zero-copy.
    """
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
    try:
        batch = pa.ipc.read_record_batch(_as_arrow_buffer(buf).slice(pos, info.size), schema)
        batch.validate()
    except (pa.ArrowException, ValueError, TypeError) as e:
        raise CorruptRecordError(f"{where}: Arrow cannot read the batch ({e})") from None
    if batch.num_rows != header.record_count:
        raise CorruptRecordError(f"{where}: {batch.num_rows} rows, header says {header.record_count}")
    actual_max = max_timestamp_ms(batch)
    if actual_max != header.max_timestamp_ms:
        raise CorruptRecordError(f"{where}: max timestamp {actual_max}, header says "
                                 f"{header.max_timestamp_ms}")
    return DecodedBatch(header, batch, info.size)


def record_batch_at(buf: pa.Buffer, pos: int, size: int, schema: pa.Schema) -> pa.RecordBatch:
    """The RecordBatch of an already-validated message: zero-copy over `buf`."""
    return pa.ipc.read_record_batch(buf.slice(pos, size), schema)


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
    except (pa.ArrowException, ValueError) as e:
        raise CorruptRecordError(f"{where}: unreadable schema message ({e})") from None
    return schema, size


# ---- encoding --------------------------------------------------------------------
def max_timestamp_ms(batch: pa.RecordBatch) -> int:
    """Largest value of the batch's `timestamp` column in ms; -1 if all null or absent."""
    idx = batch.schema.get_field_index("timestamp")
    if idx < 0:
        return -1
    value = pc.max(batch.column(idx).view(pa.int64())).as_py()
    return -1 if value is None else value


class BatchEncoder:
    """Serialises batches for one schema into a reusable scratch buffer.

    Each batch is written once by an Arrow stream writer (over a
    FixedSizeBufferWriter, so there is no growth-by-copy), its body CRC is
    computed on the bytes just written, and the CRC placeholder is patched in
    place. The returned messages are views of the scratch buffer, valid until
    the next `encode` call. Not thread-safe.
    """

    # Room for the custom metadata, which get_record_batch_size does not count
    # (eight short key/value pairs: a few hundred bytes).
    METADATA_SLACK = 2048
    _KEEP_SCRATCH_MAX = 64 << 20   # do not pin huge scratch buffers after one big append

    def __init__(self, schema: pa.Schema):
        self._schema = schema
        self._schema_size = len(schema_message(schema))
        self._scratch: pa.Buffer | None = None

    def encode(self, items: Sequence[tuple[pa.RecordBatch, BatchHeader]]) -> list[EncodedMessage]:
        need = self._schema_size + sum(pa.ipc.get_record_batch_size(b) + self.METADATA_SLACK
                                       for b, _ in items)
        scratch = self._scratch_for(need)
        try:
            ends = self._serialize(scratch, items)
        except OSError:
            # The slack estimate was short (not expected): retry once with room to spare.
            scratch = self._scratch_for(2 * need + (1 << 16))
            ends = self._serialize(scratch, items)
        return self._seal(scratch, items, ends)

    def _scratch_for(self, need: int) -> pa.Buffer:
        scratch = self._scratch
        if scratch is None or scratch.size < need:
            scratch = pa.allocate_buffer(max(need, 1 << 16))
        self._scratch = scratch if scratch.size <= self._KEEP_SCRATCH_MAX else None
        return scratch

    def _serialize(self, scratch: pa.Buffer, items) -> list[int]:
        sink = pa.FixedSizeBufferWriter(scratch)
        writer = pa.ipc.new_stream(sink, self._schema)
        ends = []
        placeholder = CRC_PLACEHOLDER.decode()
        for batch, header in items:
            writer.write_batch(batch, custom_metadata=header.metadata(placeholder))
            ends.append(sink.tell())
        # The writer is dropped without close(): no end-of-stream marker is wanted.
        return ends

    def _seal(self, scratch: pa.Buffer, items, ends: list[int]) -> list[EncodedMessage]:
        view = memoryview(scratch).cast("B")
        out = []
        start = PREFIX_SIZE + _PREFIX.unpack_from(scratch, 0)[1]   # after the schema message
        for (_, header), end in zip(items, ends):
            meta_len = _PREFIX.unpack_from(scratch, start)[1]
            meta_start = start + PREFIX_SIZE
            meta = bytes(view[meta_start:meta_start + meta_len])
            slot = meta.find(CRC_PLACEHOLDER)
            if slot < 0 or meta.find(CRC_PLACEHOLDER, slot + 1) >= 0:
                raise AssertionError("CRC placeholder not found exactly once in batch metadata")
            crc = _crc32c.crc32c(view[meta_start + meta_len:end])
            view[meta_start + slot:meta_start + slot + 8] = b"%08x" % crc
            out.append(EncodedMessage(dataclasses.replace(header, crc32c=crc),
                                      scratch.slice(start, end - start)))
            start = end
        return out


def encode_batch(batch: pa.RecordBatch, header: BatchHeader,
                 schema: pa.Schema | None = None) -> EncodedMessage:
    """Encode one batch into its own buffer (not shared with any encoder)."""
    msg = BatchEncoder(schema or batch.schema).encode([(batch, header)])[0]
    return EncodedMessage(msg.header, pa.py_buffer(msg.data.to_pybytes()))
