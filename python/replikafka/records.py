"""Record schemas and Arrow IPC encoding shared by clients, brokers and Spark.

A topic has an Arrow schema fixed at creation. Without one it has Kafka's shape
(``key binary, value binary, headers array<struct<key string, value binary>>``).
Stored batches carry the topic's columns followed by ``timestamp``
(``timestamp[ms, tz=UTC]``); offsets are not stored, they are the batch's base
offset plus the row index.
"""
from __future__ import annotations

import json
import re
import struct
import time
from typing import Any, Iterable

import crc32c as _crc32c
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from replikafka.errors import CorruptRecordError, InvalidSchemaError, InvalidTopicError

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
KAFKA_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("headers", HEADER_TYPE)])
TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")
TIMESTAMP_FIELD = pa.field("timestamp", TIMESTAMP_TYPE, nullable=False)
# Names the system adds to every record on the way out (Spark, consumer): a
# topic's own schema may not use them.
RESERVED_NAMES = frozenset({"topic", "partition", "offset", "timestamp", "timestampType"})

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def validate_topic_name(name: str) -> str:
    """Kafka's rule: 1-249 chars of [a-zA-Z0-9._-], not '.' or '..'."""
    if not isinstance(name, str) or not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise InvalidTopicError(
            f"topic name {name!r} is not legal: use 1-249 characters of [a-zA-Z0-9._-], not '.' or '..'")
    return name


# ---------------------------------------------------------------- schemas
def stored_schema(topic_schema: pa.Schema) -> pa.Schema:
    """The schema of stored batches: the topic's columns then ``timestamp``."""
    return topic_schema.append(TIMESTAMP_FIELD)


def topic_schema_of(stored: pa.Schema) -> pa.Schema:
    return stored.remove(stored.get_field_index("timestamp"))


def is_kafka_shaped(topic_schema: pa.Schema) -> bool:
    return topic_schema.remove_metadata().equals(KAFKA_SCHEMA)


def schema_to_bytes(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


_PREFIX = struct.Struct("<Ii")   # an IPC message's continuation marker and metadata length

#: What pyarrow raises on bytes that are not what they claim (untrusted input).
ARROW_DECODE_ERRORS = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, SystemError)


def schema_from_bytes(data: bytes) -> pa.Schema:
    """An Arrow IPC schema message; InvalidSchemaError naming the problem if it is not one."""
    try:
        return ipc.read_schema(pa.py_buffer(data))
    except ARROW_DECODE_ERRORS as exc:
        raise InvalidSchemaError(f"the schema is not an Arrow IPC schema message ({len(data)} bytes): "
                                 f"{type(exc).__name__}: {exc}") from None


def has_dictionary(t: pa.DataType) -> bool:
    """Whether `t` is dictionary-encoded or holds a dictionary-encoded child. A stored
    batch is one IPC message, and a dictionary would need a message of its own."""
    return pa.types.is_dictionary(t) or any(has_dictionary(t.field(i).type) for i in range(t.num_fields))


def validate_topic_schema(schema: pa.Schema) -> pa.Schema:
    if len(schema) == 0:
        raise InvalidSchemaError("a topic schema needs at least one column")
    seen = set()
    for f in schema:
        if f.name in RESERVED_NAMES:
            raise InvalidSchemaError(
                f"column {f.name!r} is reserved (the system adds {', '.join(sorted(RESERVED_NAMES))})")
        if not f.name:
            raise InvalidSchemaError("a column has an empty name")
        if f.name in seen:
            raise InvalidSchemaError(f"column {f.name!r} appears twice")
        seen.add(f.name)
        if pa.types.is_large_binary(f.type) or pa.types.is_large_string(f.type) or pa.types.is_large_list(f.type):
            raise InvalidSchemaError(
                f"column {f.name!r} has type {f.type}: large_* types are not supported (Spark reads binary/string/list)")
        if has_dictionary(f.type):
            raise InvalidSchemaError(
                f"column {f.name!r} has type {f.type}: dictionary-encoded columns are not supported "
                f"(give the value type; a producer's dictionary arrays must be decoded first)")
    return schema


_SIMPLE_TYPES = {
    "boolean": pa.bool_(), "bool": pa.bool_(),
    "tinyint": pa.int8(), "byte": pa.int8(), "int8": pa.int8(),
    "smallint": pa.int16(), "short": pa.int16(), "int16": pa.int16(),
    "int": pa.int32(), "integer": pa.int32(), "int32": pa.int32(),
    "bigint": pa.int64(), "long": pa.int64(), "int64": pa.int64(),
    "float": pa.float32(), "real": pa.float32(), "float32": pa.float32(),
    "double": pa.float64(), "float64": pa.float64(),
    "string": pa.string(), "utf8": pa.string(), "varchar": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(), "date32": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us"),
}


class _DDLParser:
    """Parses a Spark DDL string ("a INT, b ARRAY<STRING>, c STRUCT<x: DOUBLE>")."""

    _TOKEN = re.compile(r"\s*(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")

    def __init__(self, text: str):
        self.text = text
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = self._TOKEN.match(text, pos)
            if not m:
                raise InvalidSchemaError(f"cannot parse schema {text!r} at character {pos}: {text[pos:pos + 10]!r}")
            self.tokens.append(m.group(1))
            pos = m.end()
        self.i = 0

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expect: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expect is not None and tok.lower() != expect):
            raise InvalidSchemaError(
                f"cannot parse schema {self.text!r}: expected {expect or 'more'} but found {tok or 'the end'}")
        self.i += 1
        return tok

    def name(self) -> str:
        tok = self.take()
        return tok[1:-1] if tok.startswith("`") else tok

    def fields(self, sep_colon: bool) -> list[pa.Field]:
        out = []
        while True:
            name = self.name()
            if sep_colon and self.peek() == ":":
                self.take(":")
            typ = self.type()
            nullable = True
            if self.peek() and self.peek().lower() == "not":
                self.take("not")
                self.take("null")
                nullable = False
            out.append(pa.field(name, typ, nullable=nullable))
            if self.peek() != ",":
                return out
            self.take(",")

    def type(self) -> pa.DataType:
        tok = self.take().lower()
        if tok == "array":
            self.take("<")
            inner = self.type()
            self.take(">")
            return pa.list_(inner)
        if tok == "map":
            self.take("<")
            k = self.type()
            self.take(",")
            v = self.type()
            self.take(">")
            return pa.map_(k, v)
        if tok == "struct":
            self.take("<")
            fs = self.fields(sep_colon=True)
            self.take(">")
            return pa.struct(fs)
        if tok in ("decimal", "numeric", "dec"):
            p, s = 10, 0
            if self.peek() == "(":
                self.take("(")
                p = int(self.take())
                if self.peek() == ",":
                    self.take(",")
                    s = int(self.take())
                self.take(")")
            return pa.decimal128(p, s)
        if tok in ("varchar", "char") and self.peek() == "(":
            self.take("(")
            self.take()
            self.take(")")
            return pa.string()
        if tok in _SIMPLE_TYPES:
            return _SIMPLE_TYPES[tok]
        raise InvalidSchemaError(f"unknown type {tok!r} in schema {self.text!r}")

    def parse(self) -> pa.Schema:
        fs = self.fields(sep_colon=False)
        if self.peek() is not None:
            raise InvalidSchemaError(f"cannot parse schema {self.text!r}: unexpected {self.peek()!r}")
        return pa.schema(fs)


def _type_from_json(t: Any) -> pa.DataType:
    if isinstance(t, str):
        try:
            return _DDLParser(t).type()
        except InvalidSchemaError:
            raise InvalidSchemaError(f"unknown type {t!r} in JSON schema") from None
    if isinstance(t, dict):
        kind = t.get("type")
        if kind in ("array", "list"):
            return pa.list_(_type_from_json(t.get("elementType", t.get("items"))))
        if kind == "struct":
            return pa.struct([_field_from_json(f) for f in t["fields"]])
        if kind == "map":
            return pa.map_(_type_from_json(t["keyType"]), _type_from_json(t["valueType"]))
    raise InvalidSchemaError(f"cannot read type {t!r} in JSON schema")


def _field_from_json(f: Any) -> pa.Field:
    if not isinstance(f, dict) or "name" not in f or "type" not in f:
        raise InvalidSchemaError(f"a JSON schema field needs 'name' and 'type': {f!r}")
    return pa.field(f["name"], _type_from_json(f["type"]), nullable=bool(f.get("nullable", True)))


def parse_schema(spec: Any) -> pa.Schema:
    """A topic schema from None (Kafka shape), a pa.Schema, a Spark DDL string
    or a JSON description ``{"fields": [{"name": .., "type": ..}, ...]}``
    (Spark's ``StructType.json()`` output is accepted)."""
    if spec is None or spec == "" or spec == b"":
        return KAFKA_SCHEMA
    if isinstance(spec, pa.Schema):
        schema = spec
    elif isinstance(spec, (bytes, bytearray)):
        schema = schema_from_bytes(bytes(spec))
    elif isinstance(spec, str):
        text = spec.strip()
        if text.startswith("{"):
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InvalidSchemaError(f"schema JSON does not parse: {exc}") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("fields"), list):
                raise InvalidSchemaError("a JSON schema must be an object with a 'fields' list")
            schema = pa.schema([_field_from_json(f) for f in doc["fields"]])
        else:
            schema = _DDLParser(text).parse()
    else:
        raise InvalidSchemaError(f"cannot use {type(spec).__name__} as a schema")
    return validate_topic_schema(schema)


# ---------------------------------------------------------------- IPC
def encode_stream(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, schema) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue()


def decode_stream(data) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Zero-copy decode of an IPC stream held in ``data`` (bytes or pa.Buffer)."""
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    reader = ipc.open_stream(buf)
    return reader.schema, list(reader)


def records_crc32c(payload) -> int:
    """CRC-32C (Castagnoli) of a produce payload: the producer sends it with the
    records (``PartitionProduceData.records_crc32c``), the leader checks it."""
    return _crc32c.crc32c(payload)


def check_produced_crc(data: bytes, crc32c_sent: int | None, where: str) -> None:
    """The producer's CRC-32C of a produced payload must be there and match its
    bytes; CorruptRecordError naming both values otherwise."""
    if crc32c_sent is None:
        raise CorruptRecordError(f"{where}: the produce carries no records_crc32c (the producer computes the "
                                 f"CRC-32C of its records; the leader refuses records it cannot check)")
    crc = _crc32c.crc32c(data)
    if crc != crc32c_sent:
        raise CorruptRecordError(f"{where}: CRC-32C mismatch: the producer sent {crc32c_sent:08x}, "
                                 f"the {len(data)} bytes received hash to {crc:08x}")


def decode_untrusted(data, where: str, validate: bool = True) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Decode bytes from the wire that must be exactly one Arrow IPC stream whose
    batches all pass Arrow's full validation; CorruptRecordError naming the first
    problem otherwise (never an Arrow exception or a crash further on). Zero-copy.
    ``validate=False``: the batches are returned unvalidated, for a caller that
    validates many at once (:func:`validate_untrusted_many`)."""
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    decoded = _decode_stream_by_message(buf)
    if decoded is None:
        decoded = _decode_stream_reader(buf, where)
    if validate:
        validate_untrusted_batches(decoded[1], where)
    return decoded


def _decode_stream_reader(buf: pa.Buffer, where: str) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """Arrow's stream reader over the whole buffer: any stream it can read, and the
    error naming what is wrong with one it cannot."""
    source = pa.BufferReader(buf)
    try:
        reader = ipc.open_stream(source)
        schema, batches = reader.schema, list(reader)
    except ARROW_DECODE_ERRORS as exc:
        raise CorruptRecordError(f"{where}: records are not an Arrow IPC stream: {type(exc).__name__}: {exc}") \
            from None
    end = source.tell()
    if end != buf.size:
        raise CorruptRecordError(f"{where}: {buf.size - end} bytes follow the end of the Arrow IPC stream at "
                                 f"byte {end} (two streams in one entry?); send one stream per partition entry")
    return schema, batches


# Schema messages already parsed (their bytes -> the schema), for the decode below.
# Bounded: cleared when full (a broker sees a handful of topic schemas).
_parsed_schemas: dict[bytes, pa.Schema] = {}
_PARSED_SCHEMAS_MAX_ENTRIES = 256
_CONTINUATION = 0xFFFFFFFF


def _decode_stream_by_message(buf: pa.Buffer) -> tuple[pa.Schema, list[pa.RecordBatch]] | None:
    """The common stream (a schema message, record batch messages, the end marker or
    the buffer's end, nothing after) decoded one message at a time, the schema
    parsed once per distinct schema message; None for any other stream
    (dictionaries, the legacy framing, anything Arrow refuses, bytes after the end),
    which the stream reader then reads or names the problem of.

    Why: each Arrow call here gives the GIL up and takes it back, and beside a busy
    process's other threads each take-back waits for their switch interval (~1 ms);
    a one-batch stream costs 4 such hand-offs this way against the stream reader's 8
    (pyarrow 26, counted with a uprobe on ``PyEval_SaveThread``). A leader decodes a
    Produce's many small entries together instead (``broker/produce_decoding.py``).
    The batches are the same Arrow objects the reader makes (``read_record_batch``
    of each message, zero-copy), and validated the same way after."""
    size = buf.size
    if size < 8:
        return None
    view = memoryview(buf)
    cont, meta_len = _PREFIX.unpack_from(view, 0)
    if cont != _CONTINUATION or meta_len <= 0 or 8 + meta_len > size:
        return None
    schema_key = view[:8 + meta_len].tobytes()
    try:
        schema = _parsed_schemas.get(schema_key)
        if schema is None:
            msg = ipc.read_message(buf.slice(0, 8 + meta_len))
            if msg.type != "schema" or msg.body.size:
                return None
            schema = ipc.read_schema(msg)
            if any(has_dictionary(f.type) for f in schema):   # dictionary batches: the reader's path
                return None
            if len(_parsed_schemas) >= _PARSED_SCHEMAS_MAX_ENTRIES:
                _parsed_schemas.clear()
            _parsed_schemas[schema_key] = schema
        pos = 8 + meta_len
        batches = []
        while pos < size:
            if size - pos < 8:
                return None
            cont, meta_len = _PREFIX.unpack_from(view, pos)
            if cont != _CONTINUATION or meta_len < 0:
                return None
            if meta_len == 0:       # the end-of-stream marker: nothing may follow it
                pos += 8
                break
            msg = ipc.read_message(buf.slice(pos))
            if msg.type != "record batch":
                return None
            batches.append(ipc.read_record_batch(msg, schema))
            pos += 8 + meta_len + msg.body.size
    except ARROW_DECODE_ERRORS:
        return None
    return (schema, batches) if pos == size else None


def validate_untrusted_batches(batches, where: str) -> None:
    """Arrow's full validation (buffer sizes, offsets, null counts, UTF-8) of batches
    decoded from untrusted bytes; CorruptRecordError naming the first bad one."""
    for i, b in enumerate(batches):
        try:
            b.validate(full=True)
        except ARROW_DECODE_ERRORS as exc:
            raise CorruptRecordError(f"{where}: record batch {i} is not valid Arrow: {exc}") from None


def validate_untrusted_many(entries: list[tuple[str, pa.Schema, list[pa.RecordBatch]]]) \
        -> dict[int, CorruptRecordError]:
    """:func:`validate_untrusted_batches` of many decoded streams (``(where, schema,
    batches)``, e.g. a Produce's partitions): the error of each entry that fails,
    by its index.

    The batches of one schema object (the decode gives each distinct schema message
    one) are validated in one call, over one table of them all: each batch's own
    validation gives the GIL up and takes it back, and beside a busy broker's other
    threads each take-back waits ~1 ms (a Produce naming 8,000 partitions: seconds).
    Only when that call fails are those entries validated one by one, naming each
    bad one."""
    errors: dict[int, CorruptRecordError] = {}
    by_schema: dict[int, list[int]] = {}     # id of a schema the entries hold -> entries
    for i, (_where, schema, batches) in enumerate(entries):
        if batches:
            by_schema.setdefault(id(schema), []).append(i)
    for indexes in by_schema.values():
        schema = entries[indexes[0]][1]
        try:
            # Every column's chunks fully checked (buffer sizes, offsets, null counts,
            # UTF-8): what each batch's own full validation checks beyond what the
            # decode did (Arrow's IPC read refuses a column whose length is not its
            # batch's, and reads every batch with the stream's schema).
            pa.Table.from_batches([b for i in indexes for b in entries[i][2]], schema).validate(full=True)
            continue
        except ARROW_DECODE_ERRORS:
            pass        # one of them at least is bad: name each bad one
        for i in indexes:
            try:
                validate_untrusted_batches(entries[i][2], entries[i][0])
            except CorruptRecordError as exc:
                errors[i] = exc
    return errors


def conform_batch(batch: pa.RecordBatch, expected: pa.Schema, topic: str) -> pa.RecordBatch:
    """Check a produced batch against the stored schema; name the first wrong column.

    Field names and types must match exactly (order too); nullability is taken
    from the topic. A non-nullable column holding nulls is refused.
    """
    got = batch.schema
    if got.equals(expected):  # the usual case, in one call (a produce to 10,000 partitions checks 10,000)
        for i, e in enumerate(expected):
            if not e.nullable and batch.column(i).null_count:
                raise InvalidSchemaError(f"topic {topic!r}: column {e.name!r} is not nullable but holds nulls")
        return batch
    names = got.names
    if names != expected.names:
        missing = [n for n in expected.names if n not in names]
        extra = [n for n in names if n not in expected.names]
        if missing:
            raise InvalidSchemaError(f"topic {topic!r}: column {missing[0]!r} is missing from the batch")
        if extra:
            raise InvalidSchemaError(f"topic {topic!r}: column {extra[0]!r} is not in the topic's schema")
        raise InvalidSchemaError(f"topic {topic!r}: columns are in the order {names}, expected {expected.names}")
    for f, e in zip(got, expected):
        if not f.type.equals(e.type):
            raise InvalidSchemaError(
                f"topic {topic!r}: column {f.name!r} has type {f.type}, the topic expects {e.type}")
        if not e.nullable and batch.column(f.name).null_count:
            raise InvalidSchemaError(f"topic {topic!r}: column {f.name!r} is not nullable but holds nulls")
    if got.equals(expected):
        return batch
    return pa.RecordBatch.from_arrays(batch.columns, schema=expected)


def constant_timestamps(ts_ms: int, n: int) -> pa.Array:
    """``n`` copies of one timestamp, built without a Python object per row (and
    without ``pa.array``, whose first call imports pandas: seconds on a cold start)."""
    return pa.Array.from_buffers(TIMESTAMP_TYPE, n, [None, pa.py_buffer(np.full(n, ts_ms, dtype=np.int64))])


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# A Kafka-shaped topic's columns a producer may leave out (filled with nulls), as
# a Kafka ProducerRecord may have no key and no headers.
KAFKA_OPTIONAL_COLUMNS = ("key", "headers")


def _is_pandas_frame(data: Any) -> bool:
    # by name: importing pandas costs seconds and most callers never use it
    t = type(data)
    return t.__name__ == "DataFrame" and t.__module__.split(".")[0] == "pandas"


def _with_optional_kafka_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with the Kafka-shaped columns it leaves out (key, headers)
    added as nulls, in the topic's column order; other batches unchanged."""
    names = batch.schema.names
    missing = [n for n in KAFKA_OPTIONAL_COLUMNS if n not in names]
    if not missing or "value" not in names:
        return batch
    arrays, fields = [], []
    for f in KAFKA_SCHEMA:
        if f.name in names:
            arrays.append(batch.column(f.name))
            fields.append(batch.schema.field(f.name))
        else:
            arrays.append(pa.nulls(batch.num_rows, f.type))
            fields.append(f)
    rest = [n for n in names if n not in KAFKA_SCHEMA.names]  # timestamp, or a stray column conform_batch names
    for n in rest:
        arrays.append(batch.column(n))
        fields.append(batch.schema.field(n))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def to_record_batch(data: Any, topic_schema: pa.Schema, *, key: bytes | None = None,
                    timestamp_ms: int | None = None, topic: str = "") -> pa.RecordBatch:
    """Turn what a user hands the producer into one batch of the stored schema.

    ``data``: a RecordBatch, Table or pandas DataFrame with the topic's
    columns (``timestamp`` optional; ``key`` and ``headers`` optional for a
    Kafka-shaped topic), a list of dicts, or a bytes/str value (Kafka-shaped
    topics).
    """
    target = stored_schema(topic_schema)
    if isinstance(data, (bytes, bytearray, memoryview, str)):
        if not is_kafka_shaped(topic_schema):
            raise InvalidSchemaError(f"topic {topic!r} has its own schema; send a batch or dicts, not bytes")
        value = data.encode() if isinstance(data, str) else bytes(data)
        data = [{"key": key, "value": value, "headers": None}]
    if isinstance(data, list):
        if not data:
            raise InvalidSchemaError("cannot send an empty list of records")
        cols = {}
        for f in target:
            if f.name == "timestamp" and not any("timestamp" in r for r in data):
                continue
            try:
                cols[f.name] = pa.array([r.get(f.name) for r in data], type=f.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise InvalidSchemaError(f"topic {topic!r}: column {f.name!r}: {exc}") from None
        extra = set().union(*(r.keys() for r in data)) - set(target.names)
        if extra:
            raise InvalidSchemaError(f"topic {topic!r}: column {sorted(extra)[0]!r} is not in the topic's schema")
        data = pa.table(cols)
    if _is_pandas_frame(data):
        try:
            data = pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InvalidSchemaError(f"topic {topic!r}: cannot convert the DataFrame: {exc}") from None
    if isinstance(data, pa.Table):
        data = data.combine_chunks()
        batches = data.to_batches()
        data = batches[0] if len(batches) == 1 else pa.RecordBatch.from_arrays(
            [c.combine_chunks() for c in data.columns], names=data.column_names)
    if not isinstance(data, pa.RecordBatch):
        raise InvalidSchemaError(f"cannot send {type(data).__name__}: use a RecordBatch, Table, "
                                 "pandas DataFrame, list of dicts or bytes")
    if is_kafka_shaped(topic_schema):
        data = _with_optional_kafka_columns(data)
    if "timestamp" not in data.schema.names:
        ts = timestamp_ms if timestamp_ms is not None else now_ms()
        data = data.append_column(TIMESTAMP_FIELD, constant_timestamps(ts, data.num_rows))
    elif not data.schema.field("timestamp").type.equals(TIMESTAMP_TYPE):
        i = data.schema.get_field_index("timestamp")
        try:
            col = data.column(i).cast(TIMESTAMP_TYPE)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidSchemaError(f"topic {topic!r}: column 'timestamp': {exc}") from None
        data = data.set_column(i, TIMESTAMP_FIELD, col)
    # Cast safely where the user's types differ only in width/nullability.
    if data.schema.names == target.names and not data.schema.equals(target):
        try:
            data = data.cast(target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError):
            pass  # conform_batch names the column
    return conform_batch(data, target, topic)
