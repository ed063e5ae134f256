"""Assembling the consumer's Arrow table from a Fetch answer (IPC stream)."""
import numpy as np
import pyarrow as pa
import pytest

from replikafka import errors as E
from replikafka.client.consumer import output_schema, records_to_table
from replikafka.records import KAFKA_SCHEMA, TIMESTAMP_TYPE, encode_stream, stored_schema

TOPIC_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def stream(n_batches=2, rows=5, start=0):
    schema = stored_schema(TOPIC_SCHEMA)
    batches = []
    for b in range(n_batches):
        ids = list(range(start + b * rows, start + (b + 1) * rows))
        batches.append(pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"n{i}" for i in ids]),
                                        pa.array([1000 + i for i in ids], pa.int64()).cast(TIMESTAMP_TYPE)],
                                       schema=schema))
    return encode_stream(schema, batches).to_pybytes()


def test_offsets_are_base_plus_row_index_across_batches():
    schema = output_schema(TOPIC_SCHEMA)
    table, nxt = records_to_table(stream(), 100, 100, 1000, "t", 3, schema)
    assert table.schema.equals(schema)
    assert table.column_names == ["id", "name", "topic", "partition", "offset", "timestamp"]
    assert table.column("offset").to_pylist() == list(range(100, 110))
    assert table.column("id").to_pylist() == list(range(10))
    assert set(table.column("partition").to_pylist()) == {3} and set(table.column("topic").to_pylist()) == {"t"}
    assert table.column("timestamp").type == TIMESTAMP_TYPE
    assert nxt == 110


def test_rows_before_the_fetch_offset_and_from_the_high_watermark_are_dropped():
    schema = output_schema(TOPIC_SCHEMA)
    table, nxt = records_to_table(stream(), 100, 103, 107, "t", 0, schema)
    assert table.column("offset").to_pylist() == [103, 104, 105, 106]
    assert table.column("id").to_pylist() == [3, 4, 5, 6]
    assert nxt == 107
    assert records_to_table(stream(), 100, 100, 100, "t", 0, schema) == (None, 100)


def test_empty_records_mean_nothing_new():
    assert records_to_table(b"", 0, 42, 50, "t", 0, output_schema(TOPIC_SCHEMA)) == (None, 42)


def test_projection_orders_columns_and_fills_what_the_broker_left_out():
    schema = output_schema(TOPIC_SCHEMA, ["name"])
    assert schema.names == ["name", "topic", "partition", "offset", "timestamp"]
    table, _ = records_to_table(stream(1), 0, 0, 10, "t", 0, schema)
    assert table.column("name").to_pylist() == [f"n{i}" for i in range(5)]
    with pytest.raises(E.InvalidSchemaError) as info:
        output_schema(TOPIC_SCHEMA, ["nope"])
    assert "'nope'" in str(info.value)


def test_offset_column_is_built_without_python_lists():
    n = 200_000
    schema = stored_schema(KAFKA_SCHEMA)
    from replikafka.records import HEADER_TYPE
    b = pa.record_batch([pa.nulls(n, pa.binary()), pa.array(np.zeros(n, dtype="S1").tolist(), pa.binary()),
                         pa.nulls(n, HEADER_TYPE), pa.array(np.zeros(n, dtype=np.int64)).cast(TIMESTAMP_TYPE)],
                        schema=schema)
    table, nxt = records_to_table(encode_stream(schema, [b]).to_pybytes(), 5, 5, 10 ** 9, "t", 0,
                                  output_schema(KAFKA_SCHEMA))
    offsets = table.column("offset").to_numpy()
    assert offsets[0] == 5 and offsets[-1] == n + 4 and nxt == n + 5
    assert np.all(np.diff(offsets) == 1)
