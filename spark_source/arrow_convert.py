"""Arrow <-> Spark: output schemas, the read-side batch converter, the write-side
batch builder and a vectorised Kafka key partitioner.

Everything here works on whole Arrow arrays (casts, slices, numpy) — never a
Python loop over records.

Read side. A topic's stored batches hold its own columns plus ``timestamp``
(``timestamp[ms, UTC]``). Spark's Python data source accepts a
``pyarrow.RecordBatch`` only if its schema equals, field for field and
nullability included, ``to_arrow_schema(spark_schema, timezone="UTC")``; so the
:class:`OutputLayout` fixes the Spark schema once and :class:`BatchConverter`
builds exactly that Arrow schema from each fetched batch: data columns are cast
(a no-op when types already agree, e.g. ``binary``), ``timestamp`` is cast ms ->
us, ``offset`` is ``arange(base, base + n)``, and the constant columns
(``topic``, ``partition``, ``timestampType``) are zero-copy slices of cached
arrays.

Write side. :func:`to_stored_batch` turns a batch Spark hands the sink into the
topic's stored schema (casting ``string`` to ``binary``, ``timestamp[us]`` to
``timestamp[ms]``), and :func:`route_partitions` picks each row's partition:
the ``partition`` column, else Kafka's murmur2 of the key
(:func:`murmur2_array`, equal to the Java client's), else a deterministic
round-robin by row position.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from replikafka.records import TIMESTAMP_TYPE, is_kafka_shaped
from replikafka.errors import InvalidConfigError
from replikafka.spark.options import OptionError

SPARK_TIMESTAMP = pa.timestamp("us", tz="UTC")
CREATE_TIME, LOG_APPEND_TIME = 0, 1
METADATA_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestampType")
HEADERS_SPARK_TYPE = T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                               T.StructField("value", T.BinaryType())]))


class SchemaError(OptionError):
    """A topic schema or a user-given schema Spark cannot read as asked."""


class SinkColumnError(SchemaError):
    """A sink input column the topic cannot take; the message names the column."""

    def __init__(self, column: str, message: str):
        self.option = self.column = column
        InvalidConfigError.__init__(self, f"column '{column}': {message}")


#: Spark's Kafka sink: which Spark types each Kafka column accepts.
KAFKA_SINK_TYPES = {
    "key": (("string", "binary"), "key attribute type must be a string or binary"),
    "value": (("string", "binary"), "value attribute type must be a string or binary"),
    "topic": (("string",), "topic type must be a string"),
    "partition": (("tinyint", "smallint", "int", "bigint"), "partition attribute type must be an int"),
    "headers": (("array<struct<key:string,value:binary>>",),
                "headers attribute type must be an array<struct<key:string,value:binary>>"),
}


def check_sink_types(fields: list[tuple[str, str]], topic_schema: pa.Schema, topic: str) -> None:
    """Refuse, before anything is written, input columns whose Spark types a
    Kafka-shaped topic cannot take, as Spark's Kafka sink does (``fields``:
    ``(name, simpleString)``). Spark casts nothing; neither do we."""
    if not is_kafka_shaped(topic_schema):
        return
    for name, type_name in fields:
        allowed = KAFKA_SINK_TYPES.get(name)
        if allowed is not None and type_name not in allowed[0]:
            raise SinkColumnError(name, f"{allowed[1]} (writing to topic {topic!r}), got {type_name}; "
                                  f"cast it, e.g. CAST({name} AS {'STRING' if name != 'partition' else 'INT'})")


# ---------------------------------------------------------------- types
def spark_type(t: pa.DataType, column: str) -> T.DataType:
    """The Spark type that reads Arrow type ``t`` (column named for errors)."""
    if pa.types.is_boolean(t):
        return T.BooleanType()
    if pa.types.is_int8(t):
        return T.ByteType()
    if pa.types.is_int16(t) or pa.types.is_uint8(t):
        return T.ShortType()
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return T.IntegerType()
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return T.LongType()
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return T.FloatType()
    if pa.types.is_float64(t):
        return T.DoubleType()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return T.StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return T.BinaryType()
    if pa.types.is_date(t):
        return T.DateType()
    if pa.types.is_timestamp(t):
        return T.TimestampType() if t.tz else T.TimestampNTZType()
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise SchemaError("columns", f"column {column!r}: {t} has more than Spark's 38 digits")
        return T.DecimalType(t.precision, t.scale)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return T.ArrayType(spark_type(t.value_type, column), t.value_field.nullable)
    if pa.types.is_map(t):
        return T.MapType(spark_type(t.key_type, column), spark_type(t.item_type, column),
                         t.item_field.nullable)
    if pa.types.is_struct(t):
        return T.StructType([T.StructField(f.name, spark_type(f.type, f"{column}.{f.name}"), f.nullable)
                             for f in t])
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type, column)
    raise SchemaError("columns", f"column {column!r} has Arrow type {t}, which Spark cannot read")


def target_arrow_schema(schema: T.StructType) -> pa.Schema:
    """Exactly the Arrow schema Spark checks our batches against."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC")


# ---------------------------------------------------------------- read layout
@dataclass(frozen=True)
class OutputColumn:
    name: str
    kind: str            # "data" (a stored column of that name) or one of METADATA_COLUMNS


@dataclass(frozen=True)
class OutputLayout:
    """Which columns a read returns, their Spark schema, and what the broker must send."""
    columns: tuple[OutputColumn, ...]
    schema_json: str                       # the Spark StructType, as JSON (pickles small and safe)
    fetch_columns: tuple[str, ...]         # the broker-side projection (never empty)
    kafka_shaped: bool

    @property
    def spark_schema(self) -> T.StructType:
        return T.StructType.fromJson(__import__("json").loads(self.schema_json))

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]


def full_columns(topic_schema: pa.Schema) -> list[tuple[str, T.StructField]]:
    """Every column a read of this topic can return, in the default order,
    with ``headers`` (Kafka-shaped topics) last."""
    if is_kafka_shaped(topic_schema):
        return [("data", T.StructField("key", T.BinaryType())),
                ("data", T.StructField("value", T.BinaryType())),
                ("topic", T.StructField("topic", T.StringType())),
                ("partition", T.StructField("partition", T.IntegerType())),
                ("offset", T.StructField("offset", T.LongType())),
                ("timestamp", T.StructField("timestamp", T.TimestampType())),
                ("timestampType", T.StructField("timestampType", T.IntegerType())),
                ("data", T.StructField("headers", HEADERS_SPARK_TYPE))]
    out = [("data", T.StructField(f.name, spark_type(f.type, f.name), f.nullable)) for f in topic_schema]
    return out + [("topic", T.StructField("topic", T.StringType())),
                  ("partition", T.StructField("partition", T.IntegerType())),
                  ("offset", T.StructField("offset", T.LongType())),
                  ("timestamp", T.StructField("timestamp", T.TimestampType()))]


def output_layout(topic_schema: pa.Schema, *, include_headers: bool = False,
                  columns: tuple[str, ...] | None = None,
                  user_schema: T.StructType | None = None) -> OutputLayout:
    """The read's columns: all of them (``headers`` only with ``include_headers``),
    or those named by the ``columns`` option, or those of a schema the user
    gave with ``.schema(...)`` (which must agree with the topic's types)."""
    import json
    kafka = is_kafka_shaped(topic_schema)
    available = {f.name: (kind, f) for kind, f in full_columns(topic_schema)}
    if not kafka and include_headers:
        raise OptionError("includeHeaders", "applies to Kafka-shaped topics only; this topic has its own schema "
                          f"({', '.join(topic_schema.names)})")
    if user_schema is not None and columns is not None:
        names = [f.name for f in user_schema.fields]
        if list(names) != list(columns):
            raise OptionError("columns", f"contradicts the schema given with .schema(...) ({', '.join(names)})")
    if user_schema is not None:
        chosen = []
        for f in user_schema.fields:
            if f.name not in available:
                raise SchemaError("columns", f"the schema given with .schema(...) has column {f.name!r}; this topic "
                                  f"has {', '.join(available)}")
            kind, ours = available[f.name]
            if f.dataType.simpleString() != ours.dataType.simpleString():
                raise SchemaError("columns", f"column {f.name!r} is {ours.dataType.simpleString()} in this topic, "
                                  f"not {f.dataType.simpleString()} as the schema given with .schema(...) says")
            chosen.append((kind, f))
    elif columns is not None:
        chosen = []
        for name in columns:
            if name not in available:
                raise OptionError("columns", f"names {name!r}; this topic has {', '.join(available)}")
            chosen.append(available[name])
    else:
        chosen = [(k, f) for k, f in full_columns(topic_schema) if include_headers or f.name != "headers" or not kafka]
    fetch = [f.name for k, f in chosen if k == "data"]
    if any(k == "timestamp" for k, _ in chosen):
        fetch.append("timestamp")
    if not fetch:
        fetch = ["timestamp"]          # something small, to learn the record count
    schema = T.StructType([f for _, f in chosen])
    return OutputLayout(tuple(OutputColumn(f.name, k) for k, f in chosen), json.dumps(schema.jsonValue()),
                        tuple(fetch), kafka)


# ---------------------------------------------------------------- read conversion
class BatchConverter:
    """Fetched batches (stored columns, projected) -> Spark's exact Arrow schema.

    One per task (it caches constant columns); not thread-safe.
    """

    def __init__(self, layout: OutputLayout, topic: str, partition: int, timestamp_type: int):
        self.layout = layout
        self.target = target_arrow_schema(layout.spark_schema)
        self.topic = topic
        self.partition = partition
        self.timestamp_type = timestamp_type
        self._const: dict[str, pa.Array] = {}

    def _constant(self, kind: str, n: int) -> pa.Array:
        arr = self._const.get(kind)
        if arr is None or len(arr) < n:
            size = max(n, 2 * len(arr) if arr is not None else 4096)
            if kind == "topic":
                arr = pa.repeat(pa.scalar(self.topic, pa.string()), size)
            elif kind == "partition":
                arr = pa.array(np.full(size, self.partition, dtype=np.int32))
            else:
                arr = pa.array(np.full(size, self.timestamp_type, dtype=np.int32))
            self._const[kind] = arr
        return arr.slice(0, n)

    def convert(self, batch: pa.RecordBatch, base_offset: int) -> pa.RecordBatch:
        """``batch`` holds records ``base_offset .. base_offset + num_rows - 1``."""
        n = batch.num_rows
        arrays = []
        for col, field in zip(self.layout.columns, self.target):
            kind = col.kind
            if kind == "data":
                arr = batch.column(col.name)
                if col.name == "headers" and self.layout.kafka_shaped:
                    arr = empty_lists_to_null(arr)
            elif kind == "offset":
                arr = pa.array(np.arange(base_offset, base_offset + n, dtype=np.int64))
            elif kind == "timestamp":
                arr = batch.column("timestamp")
            else:
                arr = self._constant(kind, n)
            if not arr.type.equals(field.type):
                arr = arr.cast(field.type)
            arrays.append(arr)
        return pa.RecordBatch.from_arrays(arrays, schema=self.target)


def empty_lists_to_null(arr: pa.Array) -> pa.Array:
    """Spark's Kafka source returns null ``headers`` for a record with no headers
    (its consumer gives an empty header array, which Spark turns into null)."""
    import pyarrow.compute as pc
    empty = pc.equal(pc.list_value_length(arr), 0)
    if not pc.any(empty).as_py():
        return arr
    return pc.if_else(empty, pa.nulls(len(arr), arr.type), arr)


# ---------------------------------------------------------------- write side
#: Columns a sink input may carry besides the topic's own.
SINK_CONTROL_COLUMNS = ("topic", "partition", "timestamp")
#: Read-side columns the broker assigns; a DataFrame read from a topic may carry them: ignored.
SINK_IGNORED_COLUMNS = ("offset", "timestampType")


def check_sink_input(names: list[str], topic_schema: pa.Schema, topic: str) -> None:
    """Refuse input columns the topic cannot store, naming the column."""
    stored = set(topic_schema.names)
    for n in names:
        if n not in stored and n not in SINK_CONTROL_COLUMNS and n not in SINK_IGNORED_COLUMNS:
            raise SinkColumnError(n, f"is not a column of topic {topic!r} "
                              f"({', '.join(topic_schema.names)}) nor one of {', '.join(SINK_CONTROL_COLUMNS)}")
    if is_kafka_shaped(topic_schema):
        if "value" not in names:
            raise SinkColumnError("value", f"writing to Kafka-shaped topic {topic!r} needs a 'value' column")
        return
    for f in topic_schema:
        if f.name not in names and not f.nullable:
            raise SinkColumnError(f.name, f"topic {topic!r} needs column {f.name!r} (not nullable)")


def to_stored_batch(batch: pa.RecordBatch, topic_schema: pa.Schema, topic: str,
                    now_ms: int | None = None) -> pa.RecordBatch:
    """Spark's batch -> the topic's stored schema (its columns, then ``timestamp``)."""
    n = batch.num_rows
    names = batch.schema.names
    arrays = []
    fields = []
    for f in topic_schema:
        if f.name in names:
            arr = batch.column(names.index(f.name))
            if not arr.type.equals(f.type):
                try:
                    arr = arr.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                    raise SinkColumnError(f.name, f"column {f.name!r} of type {arr.type} cannot be stored as "
                                      f"{f.type} in topic {topic!r}: {exc}") from None
            if not f.nullable and arr.null_count:
                raise SinkColumnError(f.name, f"column {f.name!r} holds nulls but is not nullable in topic {topic!r}")
        else:
            arr = pa.nulls(n, f.type)
        arrays.append(arr)
        fields.append(f)
    stamp = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    if "timestamp" in names:
        ts = batch.column(names.index("timestamp"))
        if pa.types.is_timestamp(ts.type):
            ts = ts.cast(pa.timestamp("ms", tz=ts.type.tz), safe=False).cast(TIMESTAMP_TYPE)
        else:
            raise SinkColumnError("timestamp", f"input column 'timestamp' has type {ts.type}, not a timestamp")
        if ts.null_count:
            ts = ts.fill_null(pa.scalar(stamp, TIMESTAMP_TYPE))
    else:
        ts = pa.array(np.full(n, stamp, dtype=np.int64)).cast(TIMESTAMP_TYPE)
    arrays.append(ts)
    fields.append(pa.field("timestamp", TIMESTAMP_TYPE, nullable=False))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


# ---------------------------------------------------------------- partitioning
_M = np.uint32(0x5BD1E995)


def murmur2_array(keys: pa.Array) -> np.ndarray:
    """Kafka's murmur2 of every value of a binary/string array, as uint32
    (nulls give an unspecified value: mask them). Vectorised across rows; loops
    only over 4-byte word positions of the longest key."""
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type) or pa.types.is_large_binary(keys.type):
        keys = keys.cast(pa.binary())
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    bufs = keys.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=keys.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, dtype=np.uint8)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    h = (np.uint32(0x9747B28C) ^ lengths.astype(np.uint32)).astype(np.uint32)
    max_words = int(lengths.max()) // 4 if n else 0
    for j in range(max_words):
        rows = np.nonzero(lengths >= 4 * (j + 1))[0]
        at = starts[rows] + 4 * j
        k = (data[at].astype(np.uint32) | (data[at + 1].astype(np.uint32) << np.uint32(8))
             | (data[at + 2].astype(np.uint32) << np.uint32(16)) | (data[at + 3].astype(np.uint32) << np.uint32(24)))
        k = k * _M
        k ^= k >> np.uint32(24)
        k = k * _M
        h[rows] = (h[rows] * _M) ^ k
    rest = lengths & 3
    tail = starts + (lengths & ~3)
    for r, shift in ((3, 16), (2, 8)):
        rows = np.nonzero(rest >= r)[0]
        h[rows] ^= data[tail[rows] + (r - 1)].astype(np.uint32) << np.uint32(shift)
    rows = np.nonzero(rest >= 1)[0]
    h[rows] ^= data[tail[rows]].astype(np.uint32)
    h[rows] = h[rows] * _M
    h ^= h >> np.uint32(13)
    h = h * _M
    h ^= h >> np.uint32(15)
    return h


#: Rows without a key or partition go round-robin in runs of this many rows.
ROUND_ROBIN_RUN_ROWS = 4096


def route_partitions(batch: pa.RecordBatch, num_partitions: int, *, task_id: int, first_row: int) -> np.ndarray:
    """Each row's partition (int32), deterministically: the ``partition``
    column where set, else murmur2 of a non-null ``key`` (Kafka's default
    partitioner), else round-robin in runs of rows starting at ``task_id``.
    ``first_row`` is the row's position within the task's input (so a replay of
    the same input routes the same way)."""
    n = batch.num_rows
    names = batch.schema.names
    row = np.arange(first_row, first_row + n, dtype=np.int64)
    out = ((task_id + row // ROUND_ROBIN_RUN_ROWS) % num_partitions).astype(np.int32)
    if "key" in names:
        keys = batch.column(names.index("key"))
        if not (pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type)
                or pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
            keys = keys.cast(pa.string())    # a topic of its own schema with a non-binary 'key' column
        if keys.null_count < n:
            h = murmur2_array(keys)
            valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            hashed = ((h & np.uint32(0x7FFFFFFF)) % np.uint32(num_partitions)).astype(np.int32)
            out = np.where(valid, hashed, out)
    if "partition" in names:
        col = batch.column(names.index("partition"))
        if col.null_count < n:
            if not pa.types.is_integer(col.type):
                raise SinkColumnError("partition", f"input column 'partition' has type {col.type}, not an integer")
            vals = col.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            bad = valid & ((vals < 0) | (vals >= num_partitions))
            if bad.any():
                raise SinkColumnError("partition", f"input column 'partition' holds {int(vals[bad][0])}; the topic has "
                                  f"partitions 0..{num_partitions - 1}")
            out = np.where(valid, vals, out).astype(np.int32)
    return out
