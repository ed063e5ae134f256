"""Topic schemas, batch conformance and IPC helpers (replikafka.records)."""
import pyarrow as pa
import pytest

from replikafka import records as R
from replikafka.errors import CorruptRecordError, InvalidSchemaError, InvalidTopicError


def test_default_schema_is_kafkas_shape_and_stored_batches_add_timestamp():
    assert R.parse_schema(None) == R.KAFKA_SCHEMA
    stored = R.stored_schema(R.KAFKA_SCHEMA)
    assert stored.names == ["key", "value", "headers", "timestamp"]
    assert stored.field("timestamp").type == pa.timestamp("ms", tz="UTC")
    assert R.topic_schema_of(stored) == R.KAFKA_SCHEMA
    assert R.is_kafka_shaped(R.KAFKA_SCHEMA)


def test_spark_ddl_and_json_schemas():
    s = R.parse_schema("id BIGINT, name STRING NOT NULL, tags ARRAY<STRING>, pos STRUCT<x: DOUBLE, y: DOUBLE>, "
                       "amount DECIMAL(10,2), attrs MAP<STRING, INT>")
    assert s.field("id").type == pa.int64() and not s.field("name").nullable
    assert s.field("tags").type == pa.list_(pa.string())
    assert s.field("pos").type == pa.struct([("x", pa.float64()), ("y", pa.float64())])
    assert s.field("amount").type == pa.decimal128(10, 2)
    j = R.parse_schema('{"fields": [{"name": "a", "type": "int", "nullable": false}, '
                       '{"name": "b", "type": {"type": "array", "elementType": "string"}}]}')
    assert j == pa.schema([pa.field("a", pa.int32(), nullable=False), ("b", pa.list_(pa.string()))])
    assert R.schema_from_bytes(R.schema_to_bytes(s)) == s


@pytest.mark.parametrize("spec, message", [
    ("a NOTATYPE", "unknown type"),
    ("a INT,", "expected more"),
    ("offset BIGINT", "reserved"),
    ("a INT, a STRING", "twice"),
    ('{"fields": 3}', "'fields' list"),
    ("{not json", "does not parse"),
])
def test_bad_schemas_are_refused_with_the_reason(spec, message):
    with pytest.raises(InvalidSchemaError, match=message):
        R.parse_schema(spec)


def test_large_types_are_refused_because_spark_reads_plain_ones():
    with pytest.raises(InvalidSchemaError, match="large_"):
        R.parse_schema(pa.schema([("v", pa.large_binary())]))


@pytest.mark.parametrize("column", [pa.dictionary(pa.int8(), pa.string()),
                                    pa.list_(pa.dictionary(pa.int32(), pa.binary())),
                                    pa.struct([("k", pa.dictionary(pa.int8(), pa.string()))])])
def test_dictionary_columns_are_refused_because_a_stored_batch_is_one_message(column):
    """A stored batch is one IPC record-batch message; a dictionary column would need a
    dictionary message beside it, so a topic may not have one (a small batch would be
    stored without its dictionary and could not be read back)."""
    with pytest.raises(InvalidSchemaError, match="dictionary-encoded columns are not supported"):
        R.parse_schema(pa.schema([("v", column)]))
    with pytest.raises(InvalidSchemaError, match="dictionary-encoded"):
        R.parse_schema(pa.schema([("v", column)]).serialize().to_pybytes())


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "x" * 250, "bad/name"])
def test_illegal_topic_names(name):
    with pytest.raises(InvalidTopicError):
        R.validate_topic_name(name)


def test_conform_batch_names_the_wrong_column():
    stored = R.stored_schema(R.parse_schema("id BIGINT, name STRING"))
    good = R.to_record_batch([{"id": 1, "name": "a"}], R.topic_schema_of(stored), timestamp_ms=5)
    assert R.conform_batch(good, stored, "t") is good
    wrong_type = good.set_column(0, "id", pa.array(["x"]))
    with pytest.raises(InvalidSchemaError, match="column 'id' has type string"):
        R.conform_batch(wrong_type, stored, "t")
    with pytest.raises(InvalidSchemaError, match="column 'name' is missing"):
        R.conform_batch(good.drop_columns(["name"]), stored, "t")
    with pytest.raises(InvalidSchemaError, match="'extra' is not in the topic"):
        R.conform_batch(good.append_column("extra", pa.array([1])), stored, "t")


def test_to_record_batch_accepts_tables_dicts_and_bytes_and_adds_timestamps():
    kafka = R.to_record_batch(b"v", R.KAFKA_SCHEMA, key=b"k", timestamp_ms=1000)
    assert kafka.to_pylist()[0]["key"] == b"k" and kafka.column("timestamp").cast(pa.int64()).to_pylist() == [1000]
    typed = R.parse_schema("id BIGINT")
    t = R.to_record_batch(pa.table({"id": pa.array([1, 2], pa.int32())}), typed, timestamp_ms=7)
    assert t.schema.field("id").type == pa.int64()  # a safe widening cast
    with pytest.raises(InvalidSchemaError, match="its own schema"):
        R.to_record_batch(b"raw", typed)
    with pytest.raises(InvalidSchemaError, match="'nope'"):
        R.to_record_batch([{"id": 1, "nope": 2}], typed)


def test_ipc_round_trip_is_zero_copy_decodable():
    b = R.to_record_batch([{"id": i} for i in range(5)], R.parse_schema("id BIGINT"), timestamp_ms=1)
    data = R.encode_stream(b.schema, [b, b])
    schema, batches = R.decode_stream(data)
    assert schema == b.schema and [x.num_rows for x in batches] == [5, 5]


def _stream(schema: pa.Schema, batches, end_marker: bool = True) -> bytes:
    data = R.encode_stream(schema, batches).to_pybytes()
    return data if end_marker else data[:-8]


def _reader_decode(data):
    """What Arrow's stream reader makes of `data` (the decode's other path)."""
    return R._decode_stream_reader(pa.py_buffer(data), "t")


@pytest.mark.parametrize("shape", ["one", "three", "none", "no end marker", "nested"])
def test_the_decode_by_message_reads_what_the_stream_reader_reads(shape):
    schema = R.stored_schema(R.parse_schema("id BIGINT, name STRING, tags ARRAY<STRUCT<k: STRING, v: BINARY>>"))
    rows = [{"id": i, "name": None if i % 2 else "é" * i, "tags": [{"k": "a", "v": None}] * (i % 3),
             "timestamp": i} for i in range(7)]
    b = pa.RecordBatch.from_pylist(rows, schema=schema)
    batches = {"one": [b], "three": [b, b.slice(2, 3), b.slice(6)], "none": [], "no end marker": [b, b],
               "nested": [b.slice(1, 4)]}[shape]
    data = _stream(schema, batches, end_marker=shape != "no end marker")
    fast = R._decode_stream_by_message(pa.py_buffer(data))
    assert fast is not None
    slow = _reader_decode(data)
    assert fast[0].equals(slow[0]) and len(fast[1]) == len(slow[1]) == len(batches)
    assert all(f.equals(s) for f, s in zip(fast[1], slow[1]))
    again = R._decode_stream_by_message(pa.py_buffer(data))
    assert again[0] is fast[0]          # the schema message parsed once
    assert R.decode_untrusted(data, "t")[0].equals(schema)


def test_streams_the_decode_by_message_leaves_to_the_stream_reader():
    """Dictionary columns, bytes after the end marker, a torn message and garbage:
    the reader's path decodes what it can and names the problem of the rest, as
    before the faster decode."""
    dict_schema = pa.schema([("c", pa.dictionary(pa.int8(), pa.string()))])
    dict_batch = pa.record_batch([pa.array(["a", "b", "a"]).dictionary_encode()], schema=dict_schema)
    dict_stream = _stream(dict_schema, [dict_batch])
    assert R._decode_stream_by_message(pa.py_buffer(dict_stream)) is None
    assert R.decode_untrusted(dict_stream, "t")[1][0].equals(dict_batch)
    schema = R.stored_schema(R.parse_schema("id BIGINT"))
    good = _stream(schema, [pa.RecordBatch.from_pylist([{"id": 1, "timestamp": 0}], schema=schema)])
    for data, error in ((good + good, "bytes follow the end of the Arrow IPC stream"),
                        (good[:-20], "not an Arrow IPC stream"),
                        (b"\x00" * 40, "not an Arrow IPC stream"),
                        (b"", "not an Arrow IPC stream")):
        assert R._decode_stream_by_message(pa.py_buffer(data)) is None
        with pytest.raises(CorruptRecordError, match=error):
            R.decode_untrusted(data, "t-0")


def _with_record_count(data: bytes, rows: int) -> bytes:
    """`data` (a one-batch stream) with its RecordBatch's length field set to `rows`
    (its columns keep their own lengths): a batch that disagrees with its columns."""
    from replikafka.broker.storage import batch_format as bf
    schema_size = 8 + int.from_bytes(data[4:8], "little")
    meta = data[schema_size + 8:]
    f = bf._fb_fields(meta, int.from_bytes(meta[:4], "little"))
    rb = bf._fb_fields(meta, f[2] + int.from_bytes(meta[f[2]:f[2] + 4], "little"))
    at = schema_size + 8 + rb[0]
    return data[:at] + rows.to_bytes(8, "little") + data[at + 8:]


def test_validating_many_streams_names_each_bad_one_and_only_those():
    """``validate_untrusted_many`` validates a Produce's partitions together, one Arrow
    call for them all; a bad entry is named with its own place and the others pass.
    A batch whose row count disagrees with its columns' lengths (which a table of
    batches would check only as sums) is refused by the decode itself, on both paths."""
    schema = R.stored_schema(R.parse_schema("v BINARY, s STRING"))
    one = pa.RecordBatch.from_pylist([{"v": b"x", "s": "a", "timestamp": 0}], schema=schema)
    good = _stream(schema, [one])
    bad_offsets = bytearray(good)
    bad_offsets[bad_offsets.rfind(b"x") - 8] = 0x7f                 # v's end offset, past its data
    bad_utf8 = bytearray(good)
    bad_utf8[bad_utf8.rfind(b"a")] = 0xff                           # s is not UTF-8
    entries = []
    for i, data in enumerate([good, bytes(bad_offsets), good, bytes(bad_utf8), good]):
        s, batches = R.decode_untrusted(data, f"t-{i}", validate=False)
        entries.append((f"t-{i}", s, batches))
    errors = R.validate_untrusted_many(entries)
    assert sorted(errors) == [1, 3]
    for i, exc in errors.items():
        assert str(exc).startswith(f"CORRUPT_MESSAGE: t-{i}: record batch 0 is not valid Arrow")
    assert R.validate_untrusted_many([e for i, e in enumerate(entries) if i not in errors]) == {}
    # Among good ones, a fault only the full validation sees (UTF-8) is found too.
    assert sorted(R.validate_untrusted_many([entries[0], entries[3], entries[2]])) == [1]
    for rows in (2, 0):
        miscounted = _with_record_count(good, rows)
        assert R._decode_stream_by_message(pa.py_buffer(miscounted)) is None
        with pytest.raises(CorruptRecordError, match="Array length did not match record batch length"):
            R.decode_untrusted(miscounted, "t-9", validate=False)
