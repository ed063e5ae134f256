"""Topic schemas, batch conformance and IPC helpers (replikafka.records)."""
import pyarrow as pa
import pytest

from replikafka import records as R
from replikafka.errors import InvalidSchemaError, InvalidTopicError


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
