"""Log.read_stored (the one read path) and clip_stored (exact ranges, buffer-level
projection): stored batches come out verbatim, zero-copy over the segment
mappings; a projection keeps only the selected columns' buffers, never re-encoded."""
from __future__ import annotations

import pyarrow as pa
import pytest

from replikafka.broker.storage import Log, LogConfig, ManualClock, clip_stored

from replikafka.errors import CorruptRecordError
from storage_testlib import SCHEMA, T0, fill, open_log, value

TS = pa.timestamp("ms", tz="UTC")
NESTED = pa.schema([
    ("key", pa.binary()),
    ("payload", pa.struct([("a", pa.int32()), ("tags", pa.list_(pa.string()))])),
    ("score", pa.float64()),
    ("labels", pa.list_(pa.struct([("k", pa.string()), ("v", pa.int64())]))),
    ("timestamp", TS),
])


def _nested_batch(first: int, n: int) -> pa.RecordBatch:
    rows = range(first, first + n)
    return pa.record_batch([
        pa.array([None if r % 4 == 0 else b"k%d" % r for r in rows], pa.binary()),
        pa.array([None if r % 5 == 0 else {"a": r, "tags": None if r % 3 == 0 else [f"t{r}", None]}
                  for r in rows], NESTED.field("payload").type),
        pa.array([None if r % 2 else r / 2 for r in rows], pa.float64()),
        pa.array([[{"k": f"l{r}", "v": r}] if r % 3 else None for r in rows], NESTED.field("labels").type),
        pa.array([T0 + r for r in rows], pa.int64()).view(TS),
    ], schema=NESTED)


def _inside(buf: pa.Buffer, outer: pa.Buffer) -> bool:
    return outer.address <= buf.address and buf.address + buf.size <= outer.address + outer.size


def _buffers(batch: pa.RecordBatch) -> list[pa.Buffer]:
    out = []
    for col in batch.columns:
        out.extend(b for b in col.buffers() if b is not None)
    return out


def test_read_stored_returns_whole_stored_messages_zero_copy(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 12)                        # 60 records in 5-record batches, several segments
    got = log.read_stored(7, 10**6, 33)
    assert [b.base_offset for b in got.batches] == [5, 10, 15, 20, 25, 30]
    assert got.end_offset == 33
    for sb in got.batches:
        seg = next(s for s in log.segments() if s.base_offset <= sb.base_offset < s.next_offset)
        mapped = seg.buffer()
        assert _inside(sb.message, mapped), "a stored message is a slice of the segment mapping"
        assert all(_inside(b, sb.message) for b in _buffers(sb.batch)), "the batch is decoded in place"
        assert pa.ipc.read_message(sb.message).body.size > 0
    assert got.size_bytes == sum(b.message.size for b in got.batches)
    clipped = clip_stored(got.batches, 7, got.end_offset)
    assert [c.first_offset for c in clipped] == [7, 10, 15, 20, 25, 30]
    assert sum(c.batch.num_rows for c in clipped) == 26
    assert [c.verbatim is not None for c in clipped] == [False, True, True, True, True, False]
    assert pa.Table.from_batches([c.batch for c in clipped]).column("value").to_pylist() == \
        [f"value-{o}".encode() for o in range(7, 33)]


def test_reads_at_the_log_end_use_the_mapping_made_before_the_append(tmp_path):
    """A follower or tailing consumer reads each batch right after its append: the
    active segment's mapping reaches past the file's end, so the new bytes are read
    through the mapping already made, not a new one each time."""
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20))
    fill(log, 1)
    first = log.read_stored(0, 10**6).batches[0].message
    seg = log.segments()[-1]
    mapped = seg._buf
    assert mapped.size > seg.size                                # headroom past the end
    assert seg.buffer().size == seg.size                         # callers see the committed bytes
    fill(log, 3)
    got = log.read_stored(5, 10**6).batches
    assert [b.base_offset for b in got] == [5, 10, 15]
    assert all(_inside(b.message, mapped) for b in got), "read through the earlier mapping"
    assert seg._buf is mapped and _inside(first, mapped)
    assert pa.Table.from_batches([b.batch for b in got]).column("value").to_pylist() == \
        [value(o) for o in range(5, 20)]
    log.roll()                                                   # sealed: mapped to its size
    seg._buf = None
    assert seg.buffer().size == seg._buf.size == seg.size


def test_read_stored_byte_budget_and_empty_range(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 6)
    one = log.read_stored(0, 1)
    assert len(one.batches) == 1 and one.end_offset == 5, "at least one batch, even over budget"
    two = log.read_stored(0, one.size_bytes * 2)
    assert len(two.batches) == 2 and two.end_offset == 10
    none = log.read_stored(30, 10**6)
    assert none.batches == [] and none.end_offset == 30
    assert log.read_raw(3, 10**6).data == b"".join([log.schema_message,
                                                    *(b.message for b in log.read_stored(3, 10**6).batches)])


def test_projection_selects_buffers_of_nested_and_nullable_columns(tmp_path):
    log = Log.open(str(tmp_path / "n-0"), LogConfig(segment_bytes=1 << 20), NESTED, clock=ManualClock(T0))
    expected = []
    for first in (0, 50, 100):
        b = _nested_batch(first, 50)
        log.append([b], leader_epoch=0)
        expected.append(b)
    want = pa.Table.from_batches(expected).slice(20, 110)
    got = log.read_stored(20, 10**6, 130)
    for cols in (["payload", "labels"], ["score"], ["labels", "key", "timestamp"], ["payload"]):
        clipped = clip_stored(got.batches, 20, 130, cols)
        assert [c.first_offset for c in clipped] == [20, 50, 100]
        assert all(c.verbatim is None for c in clipped), "a projection is never the stored message"
        table = pa.Table.from_batches([c.batch for c in clipped])
        assert table.schema.names == cols
        assert table.equals(want.select(cols)), cols
        for c, sb in zip(clipped, got.batches):
            assert all(_inside(buf, sb.message) for buf in _buffers(c.batch)), \
                f"{cols}: every buffer sent is the stored one (no re-encoding)"
        # What goes on the wire is only the selected columns' buffers.
        whole = clip_stored(got.batches[1:2], 50, 100)[0].batch
        part = clip_stored(got.batches[1:2], 50, 100, cols)[0].batch
        assert pa.ipc.get_record_batch_size(part) < pa.ipc.get_record_batch_size(whole)
        assert sum(b.size for b in _buffers(part)) == sum(
            b.size for name in cols for b in whole.column(name).buffers() if b is not None)
    assert clip_stored(got.batches, 20, 130, ["score"])[1].batch.column(0).null_count == 25


def test_clip_outside_range_drops_batches(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 4)
    got = log.read_stored(0, 10**6)
    assert clip_stored(got.batches, 10, 10) == []
    assert [c.batch.num_rows for c in clip_stored(got.batches, 4, 6)] == [1, 1]
    assert SCHEMA.names == clip_stored(got.batches, 0, 20)[0].batch.schema.names


def test_a_batch_damaged_on_disk_is_never_read_and_the_sound_ones_before_it_are(tmp_path):
    """Bit rot after the append (a value byte changed under the live mapping, the stored
    CRC kept): reads stop before the damaged batch; a read starting in it fails naming it."""
    log = open_log(tmp_path / "t-0")
    fill(log, 12)
    seg = next(s for s in log.segments() if s.base_offset <= 17 < s.next_offset)
    with open(seg.path, "r+b") as f:
        data = f.read()
        at = data.index(value(17))
        f.seek(at + len(value(17)) - 1)
        f.write(bytes([data[at + len(value(17)) - 1] ^ 0x01]))
    got = log.read_stored(0, 10**6, 40)
    assert [b.base_offset for b in got.batches] == [0, 5, 10] and got.end_offset == 15
    for start in (15, 17):
        with pytest.raises(CorruptRecordError, match="batch at offset 15.*CRC-32C mismatch on read"):
            log.read_stored(start, 10**6, 40)
    assert [b.base_offset for b in log.read_stored(20, 10**6, 40).batches][:2] == [20, 25]


def _damage(seg, offset: int) -> None:
    """Flip the last byte of the value of `offset` in `seg`'s data file, under the live mapping."""
    with open(seg.path, "r+b") as f:
        data = f.read()
        at = data.index(value(offset)) + len(value(offset)) - 1
        f.seek(at)
        f.write(bytes([data[at] ^ 0x01]))


def test_each_stored_batch_is_checked_once_per_mapping_and_again_after_a_release(tmp_path, monkeypatch):
    """The CRC check costs a hash of every body byte and a header parse: a read pays it
    only for batches not yet checked under the segment's current mapping. Releasing
    the mapping (as the Log does when idle) forgets the checks, so damage done after
    the first read is caught by the first read after the release."""
    from replikafka.broker.storage import batch_format as bf
    calls = []
    real = bf.check_stored_crc
    monkeypatch.setattr(bf, "check_stored_crc", lambda *a, **k: (calls.append(a[1]), real(*a, **k))[1])
    log = open_log(tmp_path / "t-0")
    fill(log, 12)
    assert len(log.read_stored(0, 10**6, 60).batches) == 12 and len(calls) == 12
    log.read_stored(0, 10**6, 60)
    log.read_stored(22, 10**6, 40)
    assert len(calls) == 12                       # nothing hashed twice
    seg = next(s for s in log.segments() if s.base_offset <= 17 < s.next_offset)
    _damage(seg, 17)
    seg.release()
    with pytest.raises(CorruptRecordError, match="batch at offset 15.*CRC-32C mismatch on read"):
        log.read_stored(15, 10**6, 40)
    got = log.read_stored(0, 10**6, 40)           # the sound batches before it still go out
    assert [b.base_offset for b in got.batches] == [0, 5, 10]


def test_verified_spans_merge_and_forget():
    from replikafka.broker.storage.segment import VerifiedSpans
    v = VerifiedSpans()
    assert not v.covers(0, 1)
    g = v.generation
    v.add(100, 200, g)
    v.add(300, 400, g)
    assert v.spans == [(100, 200), (300, 400)]
    assert v.covers(100, 200) and v.covers(150, 200) and not v.covers(150, 250) and not v.covers(50, 120)
    v.add(200, 300, g)                            # touching both: one span
    assert v.spans == [(100, 400)] and v.covers(100, 400)
    v.add(0, 50, g)
    v.add(450, 500, g)
    assert v.spans == [(0, 50), (100, 400), (450, 500)]
    v.add(40, 460, g)
    assert v.spans == [(0, 500)]
    v.clear()
    assert v.spans == [] and not v.covers(0, 10)
    v.add(0, 10, g)                               # checked under the released mapping: dropped
    assert v.spans == []


def test_an_idle_segment_out_of_descriptors_still_gives_back_its_file_and_mapping(tmp_path, monkeypatch):
    """Releasing idle logs is how a process at its descriptor limit gets descriptors back;
    writing a segment's pending index entries needs one. Out of them (EMFILE), the release
    still closes the data file and drops the mapping, and the entries stay in memory until
    the next release writes them: the index loses nothing."""
    import errno
    import os as _os

    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20, index_interval_bytes=1))
    fill(log, 4)
    log.read_stored(0, 10**6)                         # mapped
    seg = log.segments()[-1]
    index_path = seg.offset_index.path
    assert seg.holds_resources and not _os.path.exists(index_path)     # entries pending in memory
    real_open = _os.open

    def out_of_descriptors(path, *a, **kw):
        if str(path).endswith((".index", ".timeindex")):
            raise OSError(errno.EMFILE, "Too many open files", path)
        return real_open(path, *a, **kw)
    monkeypatch.setattr(_os, "open", out_of_descriptors)
    assert log.release_for_cap()
    assert not seg.holds_resources                    # data file closed, mapping dropped
    assert not _os.path.exists(index_path)
    monkeypatch.setattr(_os, "open", real_open)
    fill(log, 1)                                      # used again, then released with descriptors to spare
    entries = list(seg.offset_index.entries())
    assert len(entries) == 4                          # one per batch after the first
    assert log.release_for_cap() and _os.path.getsize(index_path) == 8 * len(entries)   # none lost
    assert [b.base_offset for b in log.read_stored(0, 10**6).batches] == [0, 5, 10, 15, 20]
