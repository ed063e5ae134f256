"""LogSegment: append, read, seal, load, recover, truncate."""
from __future__ import annotations

import os

import pyarrow as pa
import pytest

from replikafka.broker.storage import LogSegment, batch_format as bf
from replikafka.broker.storage.fileio import map_file
from replikafka.errors import CorruptRecordError

from storage_testlib import SCHEMA, T0, make_batch

SCHEMA_MSG = bf.schema_message(SCHEMA)


def new_segment(tmp_path, base=100, interval=256) -> LogSegment:
    return LogSegment.create(str(tmp_path), base, SCHEMA, SCHEMA_MSG, interval, created_ms=T0)


def append_batches(seg: LogSegment, sizes: list[int], epoch: int = 1) -> None:
    enc = bf.BatchEncoder(SCHEMA)
    for n in sizes:
        batch = make_batch(seg.next_offset, n)
        h = bf.BatchHeader(seg.next_offset, n, epoch, bf.max_timestamp_ms(batch))
        seg.append(enc.encode([(batch, h)])[0])


def all_values(seg: LogSegment, start=None) -> list[bytes]:
    out = []
    for ref in seg.batches_from(seg.base_offset if start is None else start):
        out.extend(ref.batch.column("value").to_pylist())
    return out


def test_new_segment_holds_only_the_schema(tmp_path):
    seg = new_segment(tmp_path)
    assert seg.path.endswith("00000000000000000100.arrows")
    assert open(seg.path, "rb").read() == SCHEMA_MSG
    assert seg.is_empty and seg.size == len(SCHEMA_MSG) and not seg.sealed
    assert list(seg.batches_from(100)) == []


def test_append_and_read_back(tmp_path):
    seg = new_segment(tmp_path)
    append_batches(seg, [3, 4, 5])
    assert (seg.base_offset, seg.next_offset, seg.record_count) == (100, 112, 12)
    assert seg.size == os.path.getsize(seg.path)
    refs = list(seg.batches_from(104))
    assert [(r.base_offset, r.record_count) for r in refs] == [(103, 4), (107, 5)]
    assert all_values(seg) == [f"value-{o}".encode() for o in range(100, 112)]
    assert seg.read_header(refs[0]).leader_epoch == 1
    assert refs[0].message.size == refs[0].size and refs[0].message.equals(seg.buffer().slice(refs[0].position,
                                                                                             refs[0].size))


def test_index_entries_are_added_every_interval(tmp_path):
    seg = new_segment(tmp_path, interval=1000)
    append_batches(seg, [5] * 10)          # ~900 bytes each
    entries = seg.offset_index.entries()
    assert len(entries) >= 3
    # Every entry points at the start of the batch with that base offset.
    for offset, pos in entries:
        ref = next(seg.batches_from(offset))
        assert (ref.base_offset, ref.position) == (offset, pos)
    gaps = [b[1] - a[1] for a, b in zip(entries, entries[1:])]
    assert all(gap <= 1000 + 1000 for gap in gaps)
    assert seg.time_index.max_timestamp_ms == T0 + seg.next_offset - 1


def test_sealed_segment_is_a_complete_arrow_stream(tmp_path):
    seg = new_segment(tmp_path)
    append_batches(seg, [2, 3])
    seg.seal()
    assert seg.sealed and open(seg.path, "rb").read().endswith(bf.END_OF_STREAM)
    reader = pa.ipc.open_stream(seg.path)
    batch, meta = reader.read_next_batch_with_custom_metadata()
    assert batch.column("value").to_pylist() == [b"value-100", b"value-101"]
    assert meta[b"rk.base_offset"] == b"100"
    assert reader.read_next_batch().num_rows == 3
    with pytest.raises(StopIteration):
        reader.read_next_batch()
    with pytest.raises(Exception):
        seg.append(bf.encode_batch(make_batch(105, 1), bf.BatchHeader(105, 1, 1, T0 + 105)))


def test_load_trusted_finds_the_end_of_the_active_segment(tmp_path):
    seg = new_segment(tmp_path, interval=500)
    append_batches(seg, [5] * 6)
    seg.close()
    again = LogSegment.open_existing(str(tmp_path), 100, SCHEMA, 500, T0)
    assert again.load_trusted(next_segment_base=None) is None
    assert (again.next_offset, again.sealed, again.size) == (130, False, seg.size)
    assert again.offset_index.entries() == seg.offset_index.entries()
    assert again.time_index.entries() == seg.time_index.entries()
    append_batches(again, [2])
    assert all_values(again)[-2:] == [b"value-130", b"value-131"]


def test_load_trusted_reports_a_torn_tail(tmp_path):
    seg = new_segment(tmp_path)
    append_batches(seg, [5, 5])
    seg.close()
    with open(seg.path, "ab") as f:
        f.write(b"\xff\xff\xff\xff\x40\x00")
    again = LogSegment.open_existing(str(tmp_path), 100, SCHEMA, 256, T0)
    assert "torn" in again.load_trusted(next_segment_base=None)


def test_recover_rebuilds_the_same_indexes(tmp_path):
    seg = new_segment(tmp_path, interval=300)
    append_batches(seg, [5] * 8)
    seg.close()
    expected = (seg.offset_index.entries(), seg.time_index.entries())
    os.unlink(seg.offset_index.path)
    with open(seg.time_index.path, "wb") as f:
        f.write(b"junk")
    again = LogSegment.open_existing(str(tmp_path), 100, SCHEMA, 300, T0)
    result = again.recover()
    assert (result.valid_batches, result.truncated_bytes, result.reason) == (8, 0, None)
    assert (again.offset_index.entries(), again.time_index.entries()) == expected
    assert again.next_offset == 140


def test_recover_cuts_at_the_first_bad_batch(tmp_path):
    seg = new_segment(tmp_path)
    append_batches(seg, [5, 5, 5])
    seg.close()
    third = list(seg.batches_from(110))[0]
    data = bytearray(open(seg.path, "rb").read())
    data[third.position + third.size - 10] ^= 0xFF      # inside the third body
    open(seg.path, "wb").write(bytes(data))
    again = LogSegment.open_existing(str(tmp_path), 100, SCHEMA, 256, T0)
    result = again.recover()
    assert result.valid_batches == 2 and "CRC" in result.reason
    assert again.next_offset == 110 and again.size == third.position
    assert os.path.getsize(again.path) == third.position


def test_recover_keeps_a_sealed_segment_and_drops_bytes_after_its_marker(tmp_path):
    seg = new_segment(tmp_path)
    append_batches(seg, [5, 5])
    seg.seal()
    sealed_size = seg.size
    with open(seg.path, "ab") as f:
        f.write(b"trailing junk")
    again = LogSegment.open_existing(str(tmp_path), 100, SCHEMA, 256, T0)
    result = again.recover()
    assert again.sealed and again.next_offset == 110
    assert result.truncated_bytes == len(b"trailing junk")
    assert os.path.getsize(again.path) == sealed_size


def test_recover_a_segment_with_a_torn_schema(tmp_path):
    seg = new_segment(tmp_path)
    seg.close()
    with open(seg.path, "r+b") as f:
        f.truncate(20)
    again = LogSegment.open_existing(str(tmp_path), 100, SCHEMA, 256, T0)
    result = again.recover()
    assert result.valid_batches == 0 and result.reason
    assert open(again.path, "rb").read() == SCHEMA_MSG
    append_batches(again, [1])
    assert all_values(again) == [b"value-100"]


def test_truncate_at_a_batch_boundary_and_mid_batch(tmp_path):
    seg = new_segment(tmp_path)
    append_batches(seg, [5, 5, 5])
    enc = bf.BatchEncoder(SCHEMA)
    seg = seg.truncate_to(110, enc)
    assert seg.next_offset == 110 and all_values(seg)[-1] == b"value-109"
    seg = seg.truncate_to(107, enc)       # inside the second batch: re-encoded with 2 rows
    assert seg.next_offset == 107
    assert all_values(seg) == [f"value-{o}".encode() for o in range(100, 107)]
    last = list(seg.batches_from(105))[0]
    h = seg.read_header(last)
    assert (h.base_offset, h.record_count, h.max_timestamp_ms) == (105, 2, T0 + 106)
    assert seg.time_index.max_timestamp_ms == T0 + 106
    append_batches(seg, [3])
    seg.close()
    again = LogSegment.open_existing(str(tmp_path), 100, SCHEMA, 256, T0)
    assert again.recover().valid_batches == 3 and again.next_offset == 110


def test_truncation_never_shrinks_a_mapped_file(tmp_path):
    seg = new_segment(tmp_path)
    append_batches(seg, [5, 5, 5])
    held = [r.batch for r in seg.batches_from(100)]      # zero-copy views of the mapping
    inode = os.stat(seg.path).st_ino
    new = seg.truncate_to(103, bf.BatchEncoder(SCHEMA))
    assert os.stat(seg.path).st_ino != inode             # a new file replaced the old one
    # The old mapping is intact: touching every byte of the held batches is safe.
    assert held[2].column("value").to_pylist() == [f"value-{o}".encode() for o in range(110, 115)]
    # The retired object still reads its old, consistent picture; the new one the new file.
    assert all_values(seg) == [f"value-{o}".encode() for o in range(100, 115)]
    assert all_values(new) == [f"value-{o}".encode() for o in range(100, 103)]


def test_a_deleted_segment_never_maps_a_new_file_at_its_path(tmp_path):
    seg = new_segment(tmp_path)
    append_batches(seg, [5, 5])
    seg.close()
    stale = LogSegment.open_existing(str(tmp_path), 100, SCHEMA, 256, T0)
    assert stale.load_trusted(next_segment_base=110) is None    # a middle segment: not mapped
    stale.delete()
    fresh = new_segment(tmp_path)                          # same base offset, same file name
    append_batches(fresh, [1])
    with pytest.raises(FileNotFoundError):
        list(stale.batches_from(100))


def test_a_data_file_shorter_than_its_batches_is_refused_by_name(tmp_path):
    """Mapping reads the file's size from the descriptor it maps: a file cut short
    behind the broker's back (a disk or an operator) is refused, naming both sizes,
    never mapped and read past its end."""
    seg = new_segment(tmp_path)
    append_batches(seg, [5, 5])
    seg.release()                                        # the next read maps again
    os.truncate(seg.path, seg.size - 10)
    with pytest.raises(CorruptRecordError, match=rf"holds {seg.size - 10} bytes, expected at least {seg.size}"):
        list(seg.batches_from(100))


def test_map_file_maps_the_size_read_from_its_descriptor_plus_headroom(tmp_path):
    path = str(tmp_path / "data")
    with open(path, "wb") as f:
        f.write(b"0123456789")
    buf = map_file(path, headroom=4096)
    assert buf.size == 10 + 4096 and buf.slice(0, 10).to_pybytes() == b"0123456789"
    assert map_file(path, min_size=10).size == 10
    with pytest.raises(CorruptRecordError, match="holds 10 bytes, expected at least 11"):
        map_file(path, min_size=11)
    open(path, "wb").close()
    assert map_file(path).size == 0                      # an empty file, no headroom: nothing to map


def test_can_hold(tmp_path):
    seg = new_segment(tmp_path)
    assert seg.can_hold(10**6, 100, segment_bytes=1000)          # empty: any one batch
    append_batches(seg, [1])
    assert not seg.can_hold(2000, 101, segment_bytes=1000)
    assert seg.can_hold(10, 101, segment_bytes=10**6)
    assert not seg.can_hold(10, 100 + 2**32, segment_bytes=10**6)   # relative offset overflow
