"""Splitting big producer inputs into appends under max.message.bytes."""
import pyarrow as pa
import pytest

from replikafka import errors as E
from replikafka.client.accumulator import ipc_size
from replikafka.client.producer import parse_acks, split_batch


def batch(n, width=100):
    return pa.record_batch({"i": pa.array(range(n), pa.int64()),
                            "v": pa.array([b"x" * (width + i % 7) for i in range(n)], pa.binary())})


def test_small_input_is_one_piece():
    b = batch(10)
    assert split_batch(b, 1 << 20) == [b]
    assert split_batch(b.slice(0, 0), 100) == []


def test_big_input_is_split_in_order_under_the_target():
    b = batch(20_000)
    pieces = split_batch(b, 100_000)
    assert all(ipc_size(p) <= 100_000 for p in pieces)
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches([b]))
    assert len(pieces) <= ipc_size(b) // 100_000 + 2  # pieces are near the target, not halves


def test_slices_share_the_input_buffers():
    b = batch(5_000)
    pieces = split_batch(b, 50_000)
    data = b.column("v").buffers()[2].address
    assert all(p.column("v").buffers()[2].address == data for p in pieces)


def test_first_piece_fills_the_room_left_in_an_open_batch():
    b = batch(2_000)
    pieces = split_batch(b, 100_000, first_target=10_000)
    assert ipc_size(pieces[0]) <= 10_000 and pieces[0].num_rows > 0
    assert all(ipc_size(p) <= 100_000 for p in pieces[1:])
    assert sum(p.num_rows for p in pieces) == 2_000


def test_first_target_smaller_than_a_record_starts_a_new_batch():
    b = batch(3, width=1000)
    pieces = split_batch(b, 100_000, first_target=100)
    assert len(pieces) == 1 and pieces[0].num_rows == 3


def test_sizes_are_what_the_ipc_stream_takes():
    from replikafka.records import HEADER_TYPE, encode_stream
    n = 5_000
    b = pa.record_batch([pa.nulls(n, pa.binary()), pa.array([b"v" * 100] * n, pa.binary()), pa.nulls(n, HEADER_TYPE)],
                        names=["key", "value", "headers"])
    for piece in split_batch(b, 100_000):
        # a slice of an all-null list column writes whole child buffers: nbytes would undercount
        assert len(encode_stream(piece.schema, [piece])) <= 100_000 + len(piece.schema.serialize()) + 64


def test_a_record_over_the_limit_is_refused():
    b = pa.record_batch({"v": pa.array([b"x" * 10, b"y" * 5000], pa.binary())})
    with pytest.raises(E.RecordTooLargeError):
        split_batch(b, 1000)
    # over the batch target but within the hard limit: alone in its piece
    pieces = split_batch(b, 1000, limit=10_000)
    assert [p.num_rows for p in pieces] == [1, 1]


@pytest.mark.parametrize("text, acks", [("all", -1), ("-1", -1), (-1, -1), ("1", 1), (1, 1), (0, 0), ("ALL", -1)])
def test_parse_acks(text, acks):
    assert parse_acks(text) == acks


def test_parse_acks_rejects_others():
    with pytest.raises(E.InvalidConfigError):
        parse_acks("2")
