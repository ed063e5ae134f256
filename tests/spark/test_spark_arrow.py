"""Arrow <-> Spark conversion, the vectorised partitioner and the sink's
deterministic chunking (pure: no cluster, no Spark session)."""
from __future__ import annotations

import datetime as dt
import random

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from replikafka.client.partitioner import murmur2, partition_for_key
from replikafka.records import HEADER_TYPE, KAFKA_SCHEMA, TIMESTAMP_TYPE, parse_schema, stored_schema
from replikafka.spark.arrow_convert import (BatchConverter, SchemaError, check_sink_input, murmur2_array,
                                            output_layout, route_partitions, target_arrow_schema, to_stored_batch)
from replikafka.spark.options import OptionError
from replikafka.spark.writer import PartitionChunker, chunk_producer_id, encode_chunks

OWN = parse_schema("id BIGINT NOT NULL, name STRING, score DOUBLE, tags ARRAY<STRING>, at TIMESTAMP")


def stored_kafka(n: int, ts0: int = 1_700_000_000_000) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([b"k%d" % i for i in range(n)], pa.binary()), pa.array([b"v" * (i % 7) for i in range(n)], pa.binary()),
         pa.array([[{"key": "h", "value": b"x"}] if i % 2 else None for i in range(n)], HEADER_TYPE),
         pa.array(np.arange(ts0, ts0 + n, dtype=np.int64)).cast(TIMESTAMP_TYPE)],
        schema=stored_schema(KAFKA_SCHEMA))


# ---------------------------------------------------------------- layouts
def test_kafka_shaped_layout_is_sparks_kafka_schema():
    layout = output_layout(KAFKA_SCHEMA)
    assert layout.spark_schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,"
                                                  "offset:bigint,timestamp:timestamp,timestampType:int>")
    assert layout.fetch_columns == ("key", "value", "timestamp")
    with_headers = output_layout(KAFKA_SCHEMA, include_headers=True)
    assert with_headers.names[-1] == "headers"
    assert with_headers.fetch_columns == ("key", "value", "headers", "timestamp")


def test_own_schema_layout_is_topic_columns_then_metadata():
    layout = output_layout(OWN)
    assert layout.names == ["id", "name", "score", "tags", "at", "topic", "partition", "offset", "timestamp"]
    assert layout.spark_schema["id"].nullable is False
    assert layout.spark_schema["tags"].dataType == T.ArrayType(T.StringType())
    with pytest.raises(OptionError) as info:
        output_layout(OWN, include_headers=True)
    assert info.value.option == "includeHeaders"


def test_columns_option_projects_and_names_unknown_columns():
    layout = output_layout(KAFKA_SCHEMA, columns=("value", "offset"))
    assert layout.names == ["value", "offset"] and layout.fetch_columns == ("value",)
    assert output_layout(KAFKA_SCHEMA, columns=("partition", "offset")).fetch_columns == ("timestamp",)
    with pytest.raises(OptionError) as info:
        output_layout(KAFKA_SCHEMA, columns=("value", "nope"))
    assert info.value.option == "columns" and "'nope'" in str(info.value)


def test_user_schema_is_a_projection_that_must_agree_on_types():
    user = T.StructType([T.StructField("name", T.StringType()), T.StructField("offset", T.LongType())])
    layout = output_layout(OWN, user_schema=user)
    assert layout.names == ["name", "offset"] and layout.fetch_columns == ("name",)
    with pytest.raises(SchemaError, match="'name' is string"):
        output_layout(OWN, user_schema=T.StructType([T.StructField("name", T.IntegerType())]))
    with pytest.raises(SchemaError, match="'zzz'"):
        output_layout(OWN, user_schema=T.StructType([T.StructField("zzz", T.IntegerType())]))


# ---------------------------------------------------------------- read conversion
def test_converted_batches_match_sparks_arrow_schema_exactly():
    layout = output_layout(KAFKA_SCHEMA, include_headers=True)
    conv = BatchConverter(layout, "events", 2, 1)
    out = conv.convert(stored_kafka(10), 500)
    assert out.schema.equals(target_arrow_schema(layout.spark_schema))
    assert out.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert out.schema.field("key").type == pa.binary() and out.schema.field("topic").type == pa.string()
    assert out.column("offset").to_pylist() == list(range(500, 510))
    assert set(out.column("partition").to_pylist()) == {2}
    assert set(out.column("timestampType").to_pylist()) == {1}
    assert set(out.column("topic").to_pylist()) == {"events"}
    assert out.column("timestamp")[3].as_py() == dt.datetime.fromtimestamp(1_700_000_000.003, dt.timezone.utc)
    assert out.column("headers")[1].as_py() == [{"key": "h", "value": b"x"}]


def test_converter_reuses_constant_columns_across_sizes():
    conv = BatchConverter(output_layout(KAFKA_SCHEMA), "t", 0, 0)
    for n in (3, 9000, 5, 20000):
        out = conv.convert(stored_kafka(n), 7)
        assert out.num_rows == n and out.column("offset")[n - 1].as_py() == 7 + n - 1
        assert out.column("topic").null_count == 0


def test_own_schema_conversion():
    n = 4
    stored = pa.RecordBatch.from_arrays(
        [pa.array(range(n), pa.int64()), pa.array(["a", None, "c", "d"]), pa.array([1.5] * n),
         pa.array([["x"], [], None, ["y", "z"]], pa.list_(pa.string())),
         pa.array([0, 1, 2, 3], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
         pa.array([10, 11, 12, 13], pa.int64()).cast(TIMESTAMP_TYPE)], schema=stored_schema(OWN))
    layout = output_layout(OWN)
    out = BatchConverter(layout, "scores", 0, 0).convert(stored, 0)
    assert out.schema.equals(target_arrow_schema(layout.spark_schema))
    assert out.column("tags").to_pylist() == [["x"], [], None, ["y", "z"]]


# ---------------------------------------------------------------- partitioner
def test_murmur2_array_equals_kafkas_murmur2():
    rnd = random.Random(7)
    keys = [bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 40))) for _ in range(3000)]
    keys += [b"", b"a", b"ab", b"abc", b"abcd", "ключ".encode()]
    got = murmur2_array(pa.array(keys, pa.binary()))
    want = np.array([murmur2(k) & 0xFFFFFFFF for k in keys], dtype=np.uint32)
    assert (got == want).all()
    sliced = pa.array(keys, pa.binary()).slice(100, 50)
    assert (murmur2_array(sliced) == want[100:150]).all()


def test_route_partitions_key_partition_and_round_robin():
    keys = [b"user-%d" % i for i in range(50)] + [None] * 10
    batch = pa.record_batch([pa.array(keys, pa.binary()), pa.array([b"v"] * 60)], names=["key", "value"])
    parts = route_partitions(batch, 7, task_id=3, first_row=0)
    assert [int(p) for p in parts[:50]] == [partition_for_key(k, 7) for k in keys[:50]]
    assert set(parts[50:].tolist()) == {3}
    explicit = batch.append_column("partition", pa.array([5] * 30 + [None] * 30, pa.int32()))
    parts = route_partitions(explicit, 7, task_id=3, first_row=0)
    assert set(parts[:30].tolist()) == {5} and parts[40] == partition_for_key(keys[40], 7)
    bad = batch.append_column("partition", pa.array([9] * 60, pa.int32()))
    with pytest.raises(SchemaError, match="'partition' holds 9"):
        route_partitions(bad, 7, task_id=0, first_row=0)
    keyless = pa.record_batch([pa.array([b"v"] * 10000)], names=["value"])
    parts = route_partitions(keyless, 3, task_id=1, first_row=0)
    assert set(parts.tolist()) == {1, 2, 0}


# ---------------------------------------------------------------- sink conversion
def test_to_stored_batch_casts_sparks_types_to_the_topic():
    t = pa.array([1_700_000_000_123_456], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    spark_batch = pa.record_batch([pa.array(["k"], pa.string()), pa.array([b"v"]), t, pa.array([1], pa.int32())],
                                  names=["key", "value", "timestamp", "partition"])
    stored = to_stored_batch(spark_batch, KAFKA_SCHEMA, "t")
    assert stored.schema.equals(stored_schema(KAFKA_SCHEMA))
    assert stored.column("key").to_pylist() == [b"k"]
    assert stored.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123]
    assert stored.column("headers").null_count == 1
    now = to_stored_batch(pa.record_batch([pa.array([b"v"])], names=["value"]), KAFKA_SCHEMA, "t", now_ms=42)
    assert now.column("timestamp").cast(pa.int64()).to_pylist() == [42]


def test_sink_input_columns_are_checked_by_name():
    check_sink_input(["key", "value", "offset", "timestampType", "topic"], KAFKA_SCHEMA, "t")
    with pytest.raises(SchemaError, match="needs a 'value' column"):
        check_sink_input(["key"], KAFKA_SCHEMA, "t")
    with pytest.raises(SchemaError, match="'extra'"):
        check_sink_input(["value", "extra"], KAFKA_SCHEMA, "t")
    with pytest.raises(SchemaError, match="'id'"):
        check_sink_input(["name"], OWN, "t")
    with pytest.raises(SchemaError, match="'id'.*nulls"):
        to_stored_batch(pa.record_batch([pa.array([None], pa.int64())], names=["id"]), OWN, "t")


# ---------------------------------------------------------------- chunking
def test_chunks_depend_on_rows_not_on_how_they_arrived():
    rows = stored_kafka(1000)

    def chunks(split_points):
        ch = PartitionChunker(128)
        out = []
        prev = 0
        for cut in split_points + [1000]:
            out += list(ch.add(rows.slice(prev, cut - prev)))
            prev = cut
        out += list(ch.finish())
        return [(i, b.column("key").to_pylist()) for i, b in out]

    a = chunks([1, 500, 501, 900])
    b = chunks([333, 334, 999])
    assert a == b
    assert [i for i, _ in a] == list(range(8)) and len(a[-1][1]) == 1000 - 7 * 128


def test_oversized_chunks_are_halved_with_stable_labels_and_ids():
    batch = stored_kafka(64).set_column(1, "value", pa.array([b"x" * 1000] * 64))
    pieces = encode_chunks("t", 0, 5, batch, "stream:q:3:1", limit_bytes=20_000)
    assert [c.label for c in pieces] == ["5.0.0", "5.0.1", "5.1.0", "5.1.1"]
    assert all(len(c.payload) <= 20_000 for c in pieces)
    assert sum(c.batch.num_rows for c in pieces) == 64
    again = encode_chunks("t", 0, 5, batch.slice(0), "stream:q:3:1", limit_bytes=20_000)
    assert [c.producer_id for c in again] == [c.producer_id for c in pieces]
    with pytest.raises(Exception, match="max.message.bytes"):
        encode_chunks("t", 0, 0, batch.slice(0, 1), "x", limit_bytes=100)


def test_chunk_producer_ids_are_stable_distinct_and_above_broker_ids():
    ids = {chunk_producer_id("stream:q:%d:0" % b, "t", p, str(k)) for b in range(20) for p in range(4) for k in range(20)}
    assert len(ids) == 20 * 4 * 20
    assert all((1 << 62) <= i < (1 << 63) for i in ids)
    assert chunk_producer_id("a", "t", 0, "1") == chunk_producer_id("a", "t", 0, "1")


def test_empty_headers_read_back_as_null():
    """KafkaMicroBatchSourceSuite "read Kafka transactional messages / headers" (includeHeaders):
    Spark's source returns null headers for a record produced with an empty header list."""
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"a", b"b", b"c"]), pa.array([b"1", b"2", b"3"]),
         pa.array([[], [{"key": "h", "value": b"x"}], None], HEADER_TYPE),
         pa.array([1, 2, 3], pa.int64()).cast(TIMESTAMP_TYPE)], schema=stored_schema(KAFKA_SCHEMA))
    out = BatchConverter(output_layout(KAFKA_SCHEMA, include_headers=True), "t", 0, 0).convert(batch, 0)
    assert out.column("headers").to_pylist() == [None, [{"key": "h", "value": b"x"}], None]


def test_sink_types_are_sparks_kafka_sink_types_naming_the_column():
    """KafkaSinkSuite "write to stream with bad schema" / "batch - unsupported save modes": key and
    value must be string or binary, topic a string, partition an int; the error names the column."""
    from replikafka.spark.arrow_convert import SinkColumnError, check_sink_types
    check_sink_types([("key", "string"), ("value", "binary"), ("partition", "int"), ("topic", "string")],
                     KAFKA_SCHEMA, "t")
    for column, spark_type in [("key", "int"), ("value", "bigint"), ("topic", "int"), ("partition", "string"),
                               ("headers", "array<string>")]:
        with pytest.raises(SinkColumnError) as info:
            check_sink_types([("value", "string"), (column, spark_type)], KAFKA_SCHEMA, "t")
        assert str(info.value).startswith(f"INVALID_CONFIG: column '{column}': ") and spark_type in str(info.value)
        assert "option 'topic'" not in str(info.value)
    check_sink_types([("key", "int")], OWN, "own")                       # a topic of its own schema: its types
    with pytest.raises(SinkColumnError, match="column 'extra': is not a column of topic"):
        check_sink_input(["value", "extra"], KAFKA_SCHEMA, "t")


def test_a_non_binary_key_column_routes_by_its_text():
    """A topic of its own schema may have an int 'key' column: routed by murmur2 of its text
    (it used to fail with 'buffer is smaller than requested size')."""
    batch = pa.record_batch([pa.array([1, 2, 3, 1], pa.int64())], names=["key"])
    routes = route_partitions(batch, 8, task_id=0, first_row=0)
    as_text = route_partitions(pa.record_batch([pa.array(["1", "2", "3", "1"])], names=["key"]), 8, task_id=0,
                               first_row=0)
    assert routes.tolist() == as_text.tolist() and routes[0] == routes[3]
