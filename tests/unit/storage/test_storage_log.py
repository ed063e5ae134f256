"""Log: one partition across segments (tiny segment.bytes, so every test rolls)."""
from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest

from replikafka.broker.storage import EpochEntry, Log, LogConfig, ManualClock, batch_format as bf
from replikafka.errors import (CorruptRecordError, InvalidConfigError, InvalidOffsetError,
                               InvalidRequestError, InvalidSchemaError, OffsetOutOfRangeError,
                               RecordTooLargeError, StorageError)

from storage_testlib import SCHEMA, T0, TINY, TS, fill, make_batch, open_log, read_values, value


def values(first: int, end: int, salt: str = "") -> list[bytes]:
    return [value(o, salt) for o in range(first, end)]


# ---- append and read ---------------------------------------------------------------
def test_append_assigns_dense_offsets_across_segments(tmp_path):
    log = open_log(tmp_path / "t-0")
    info = log.append([make_batch(0, 5), make_batch(5, 3)], leader_epoch=0)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 7, 8)
    assert info.max_timestamp_ms == T0 + 7 and info.size_bytes > 0
    fill(log, 20)
    assert log.log_end_offset == 108
    assert len(log.segments()) > 5, "tiny segment.bytes must roll"
    assert read_values(log) == values(0, 108)
    bases = [s.base_offset for s in log.segments()]
    assert bases == sorted(bases) and all(s.sealed for s in log.segments()[:-1])
    for a, b in zip(log.segments(), log.segments()[1:]):
        assert a.next_offset == b.base_offset
        assert a.size <= TINY.segment_bytes


def test_read_slices_inside_stored_batches(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 10)                                   # batches of 5
    r = log.read(7, 10**6, 18)
    assert r.first_offset == 7 and r.record_count == 11
    assert [b.num_rows for b in r.batches] == [3, 5, 3]
    assert [v for b in r.batches for v in b.column("value").to_pylist()] == values(7, 18)
    one = log.read(12, 10**6, 13)
    assert one.record_count == 1 and one.batches[0].column("value").to_pylist() == [value(12)]


def test_read_max_bytes_stops_between_batches_but_returns_at_least_one(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 10)
    first = log.read(0, 1, None)
    assert first.record_count == 5 and len(first.batches) == 1
    assert first.size_bytes > 1
    two = log.read(0, first.size_bytes * 2, None)
    assert two.record_count == 10
    assert log.read(0, first.size_bytes * 2 - 1, None).record_count == 5


def test_read_projects_columns(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 3)
    r = log.read(2, 10**6, None, columns=["value"])
    assert all(b.schema.names == ["value"] for b in r.batches)
    r = log.read(2, 10**6, None, columns=["timestamp", "key"])
    assert r.batches[0].schema.names == ["timestamp", "key"]
    assert r.batches[0].column("timestamp")[0].value == T0 + 2
    with pytest.raises(InvalidRequestError, match="nope"):
        log.read(0, 100, None, columns=["value", "nope"])


def test_read_bounds(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 4)
    assert log.read(20, 100, None).batches == []           # at the log end: empty
    assert log.read(7, 100, 7).record_count == 0            # start == max offset: empty
    assert log.read(3, 10**6, 99).record_count == 17        # max offset beyond LEO is clamped
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 21 .*\[0, 20\]"):
        log.read(21, 100, None)
    log.delete_records_before(6)
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 5 .*\[6, 20\]"):
        log.read(5, 100, None)
    with pytest.raises(OffsetOutOfRangeError):
        log.read_raw(21, 100)


def test_reads_are_zero_copy_views_of_the_segment_mapping(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20))
    log.append([make_batch(0, 1000)], 0)
    log.roll()
    seg = log.segments()[0]
    mapping = seg.buffer()
    batch = log.read(0, 10**6, None).batches[0]
    data = batch.column("value").buffers()[2]
    assert mapping.address <= data.address < mapping.address + mapping.size


def test_append_checks_schema_and_size_and_appends_nothing_on_error(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=4096, max_message_bytes=2000))
    fill(log, 1)
    wrong = pa.record_batch([pa.array([b"x"])], names=["value"])
    with pytest.raises(InvalidSchemaError):
        log.append([make_batch(5, 1), wrong], 0)
    with pytest.raises(RecordTooLargeError, match="max.message.bytes 2000"):
        log.append([make_batch(5, 2), make_batch(7, 200)], 0)
    with pytest.raises(InvalidRequestError):
        log.append([make_batch(5, 0)], 0)
    assert log.log_end_offset == 5 and read_values(log) == values(0, 5)


def test_empty_input_batches_are_skipped(tmp_path):
    log = open_log(tmp_path / "t-0")
    info = log.append([make_batch(0, 0), make_batch(0, 2), make_batch(0, 0)], 0)
    assert info.record_count == 2 and len(list(log.batch_headers())) == 1


def test_headers_carry_epoch_producer_and_sequences(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append([make_batch(0, 3), make_batch(3, 4)], leader_epoch=2, producer_id=9,
               producer_epoch=1, base_sequence=2**31 - 5)
    log.append([make_batch(7, 2)], leader_epoch=2)
    headers = list(log.batch_headers())
    assert [(h.base_offset, h.record_count, h.leader_epoch) for h in headers] == [(0, 3, 2), (3, 4, 2), (7, 2, 2)]
    assert [h.base_sequence for h in headers] == [2**31 - 5, 2**31 - 2, -1]     # wraps like Kafka
    assert [h.producer_id for h in headers] == [9, 9, -1]
    assert [h.base_offset for h in log.batch_headers(4)] == [3, 7]


def test_log_append_time_replaces_timestamps(tmp_path):
    clock = ManualClock(T0 + 10**6)
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=2048, message_timestamp_type="LogAppendTime"),
                   clock=clock)
    info = log.append([make_batch(0, 3)], 0)
    assert info.max_timestamp_ms == T0 + 10**6
    stamps = log.read(0, 10**6, None).batches[0].column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [T0 + 10**6] * 3


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_append_checks_the_producers_body_crcs_and_appends_nothing_on_a_mismatch(tmp_path, timestamp_type):
    """A Flight append carries the producer's CRC-32C of each batch body: the log stores
    a batch only if the body it writes hashes to it (LogAppendTime: the body received)."""
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=4096, message_timestamp_type=timestamp_type))
    fill(log, 1)
    batches = [make_batch(5, 3), make_batch(8, 2)]
    crcs = bf.body_crc32c(batches, SCHEMA)
    bad = [crcs[0], crcs[1] ^ 1]
    with pytest.raises(CorruptRecordError, match="batch 1: CRC-32C mismatch"):
        log.append(batches, 0, body_crc32c=bad)
    with pytest.raises(InvalidRequestError, match="one per non-empty batch"):
        log.append(batches, 0, body_crc32c=crcs[:1])
    assert log.log_end_offset == 5
    info = log.append(batches, 0, body_crc32c=crcs)
    assert (info.first_offset, info.record_count) == (5, 5) and read_values(log) == values(0, 10)
    if timestamp_type == "CreateTime":    # the stored CRC is the producer's: the body went as sent
        assert [h.crc32c for h in log.batch_headers(5)] == crcs


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_a_producers_message_is_stored_verbatim_with_the_logs_header(tmp_path, timestamp_type):
    """A Produce hands the log, per batch, the producer's IPC message it was read from:
    the log stores that message's RecordBatch and body as sent (not a serialisation
    of the batch) with its own header; the same bytes as Arrow's serialisation of the
    same batch. LogAppendTime replaces the timestamps, so the batch is serialised."""
    clock = ManualClock(T0 + 10**6)
    cfg = LogConfig(segment_bytes=4096, message_timestamp_type=timestamp_type)
    verbatim, serialised = open_log(tmp_path / "a-0", cfg, clock=clock), open_log(tmp_path / "b-0", cfg, clock=clock)
    batch = make_batch(0, 3)
    verbatim.append([batch], 0, sent_messages=[bf.plain_message(batch.serialize())])
    serialised.append([batch], 0)
    assert bytes(verbatim.read_raw(0, 10**6).data) == bytes(serialised.read_raw(0, 10**6).data)
    # Another batch's message of as many rows: what is stored is the message's data.
    sent = make_batch(3, 3, salt="as sent")
    info = verbatim.append([make_batch(3, 3)], 0, sent_messages=[bf.plain_message(sent.serialize())])
    assert info.record_count == 3
    stored = read_values(verbatim, 3)
    assert stored == (values(3, 6, "as sent") if timestamp_type == "CreateTime" else values(3, 6))
    with pytest.raises(InvalidRequestError, match="one per batch"):
        verbatim.append([make_batch(6, 1), make_batch(7, 1)], 0, sent_messages=[None])
    assert verbatim.log_end_offset == 6


def test_epoch_cache_follows_appends(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 2, epoch=1)
    fill(log, 2, epoch=1)
    fill(log, 1, epoch=4)
    assert log.leader_epoch_cache.entries() == [EpochEntry(1, 0), EpochEntry(4, 20)]
    assert log.leader_epoch_cache.end_offset_for(1, log.log_end_offset) == (1, 20)


# ---- sealed segments are plain Arrow -----------------------------------------------------
def test_sealed_segments_open_with_plain_pyarrow(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 12)
    seen = []
    for seg in log.segments()[:-1]:
        reader = pa.ipc.open_stream(seg.path)        # a file path, no replikafka code
        assert reader.schema.equals(SCHEMA)
        for batch, meta in reader.iter_batches_with_custom_metadata():
            assert int(meta[b"rk.base_offset"]) == seg.base_offset + len(seen) - len(
                [v for s in log.segments() if s.base_offset < seg.base_offset for v in range(s.record_count)])
            seen.extend(batch.column("value").to_pylist())
    assert seen == values(0, log.segments()[-1].base_offset)


# ---- replication path ----------------------------------------------------------------------
def test_append_raw_of_read_raw_reproduces_identical_bytes(tmp_path):
    leader = open_log(tmp_path / "leader" / "t-0")
    fill(leader, 4, epoch=1)
    leader.append([make_batch(20, 7)], leader_epoch=3, producer_id=5, producer_epoch=0, base_sequence=0)
    fill(leader, 5, epoch=3)
    follower = open_log(tmp_path / "follower" / "t-0")
    offset = 0
    while offset < leader.log_end_offset:
        raw = leader.read_raw(offset, 1500)
        assert raw.first_offset == offset and raw.record_count > 0
        info = follower.append_raw(raw.data)
        assert info.first_offset == offset
        assert raw.last_epoch == follower.leader_epoch_cache.latest_epoch
        offset += raw.record_count
    assert follower.log_end_offset == leader.log_end_offset
    assert follower.leader_epoch_cache.entries() == leader.leader_epoch_cache.entries()
    assert list(follower.batch_headers()) == list(leader.batch_headers())
    assert follower.read_raw(0, 10**9).data == leader.read_raw(0, 10**9).data
    leader_files = {os.path.basename(s.path): open(s.path, "rb").read() for s in leader.segments()}
    follower_files = {os.path.basename(s.path): open(s.path, "rb").read() for s in follower.segments()}
    assert follower_files == leader_files      # same config: byte-identical segments


def test_append_raw_takes_the_logs_own_schema_message_as_is_and_parses_any_other(tmp_path, monkeypatch):
    """A follower's append compares the stream's schema message with its log's own, byte
    for byte; another one is parsed: accepted when the schemas are equal but for their
    metadata, refused (nothing written) when they differ, torn ones named."""
    leader = open_log(tmp_path / "a" / "t-0")
    fill(leader, 3, epoch=1)
    raw = leader.read_raw(0, 10**6).data
    own = bf.schema_message(SCHEMA)
    assert raw.startswith(own)
    batches = raw[len(own):]
    parsed = []
    real_parse = bf.read_schema_message
    monkeypatch.setattr(bf, "read_schema_message", lambda *a: parsed.append(1) or real_parse(*a))
    assert open_log(tmp_path / "own" / "t-0").append_raw(pa.py_buffer(raw)).record_count == 15
    assert parsed == []                       # its own schema message, bytes over 0x7f included: not parsed
    follower = open_log(tmp_path / "b" / "t-0")
    tagged = bf.schema_message(SCHEMA.with_metadata({"origin": "another writer"}))
    assert tagged != own
    assert follower.append_raw(tagged + batches).record_count == 15
    other = bf.schema_message(pa.schema([("value", pa.binary()), ("key", pa.binary()), ("timestamp", TS)]))
    assert len(other) == len(own) and other != own
    follower = open_log(tmp_path / "c" / "t-0")
    with pytest.raises(InvalidSchemaError, match="append_raw data has schema"):
        follower.append_raw(other + batches)
    with pytest.raises(CorruptRecordError, match="torn schema message"):
        follower.append_raw(own[:len(own) // 2])
    assert follower.log_end_offset == 0
    assert len(parsed) == 3


def test_a_raw_read_sends_the_stored_messages_without_decoding_them(tmp_path, monkeypatch):
    """A follower's fetch (`read_raw`) frames the stored messages by their metadata and
    sends them on: no Arrow call decodes a batch (each gives the GIL up). A read with
    ``decode=False`` decodes a batch only when it is used, once; a consumer's read
    decodes as it frames."""
    log = open_log(tmp_path / "t-0")
    fill(log, 6)
    calls = []
    for name in ("read_stored_message", "read_trusted"):
        real = getattr(bf, name)
        monkeypatch.setattr(bf, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    raw = log.read_raw(0, 10**6)
    assert raw.record_count == 30 and calls == []
    lazy = log.read_stored(0, 10**6, decode=False)
    assert calls == []
    assert [b.batch.num_rows for b in lazy.batches] == [b.batch.num_rows for b in lazy.batches] == [5] * 6
    assert calls == ["read_stored_message"] * 6
    calls.clear()
    assert [b.batch.num_rows for b in log.read_stored(0, 10**6).batches] == [5] * 6
    assert calls == ["read_trusted"] * 6
    assert read_values(log) == values(0, 30)


def test_read_raw_starts_at_the_batch_holding_the_offset(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 4, epoch=2)
    raw = log.read_raw(7, 1)
    assert (raw.first_offset, raw.record_count, raw.last_epoch) == (5, 5, 2)
    reader = pa.ipc.open_stream(raw.data)
    assert reader.read_next_batch().column("value").to_pylist() == values(5, 10)
    empty = log.read_raw(20, 100)
    assert (empty.data, empty.record_count, empty.first_offset) == (b"", 0, 20)


def test_reads_at_the_log_end_start_at_the_last_appended_batch_and_stay_exact(tmp_path):
    """A read at or after the last appended batch starts there (not by framing forward
    from the sparse index), and returns exactly the batch holding the offset, across
    appends, a truncation and a reopen; the last batch's epoch comes from the epoch cache."""
    log = open_log(tmp_path / "t-0", LogConfig(index_interval_bytes=1 << 20))   # one index entry: none
    fill(log, 3, epoch=1)                                                      # [0, 15) in 5s
    log.append([make_batch(15, 5)], leader_epoch=4)

    def starts(offset):
        raw = log.read_raw(offset, 1)
        return raw.first_offset, raw.record_count, raw.last_epoch

    assert [starts(o) for o in (0, 4, 5, 14, 15, 17, 19)] == \
        [(0, 5, 1), (0, 5, 1), (5, 5, 1), (10, 5, 1), (15, 5, 4), (15, 5, 4), (15, 5, 4)]
    assert [b.base_offset for b in log.read_stored(12, 10**6).batches] == [10, 15]
    log.truncate_to(12)
    assert starts(11) == (10, 2, 1) and log.log_end_offset == 12
    log.append([make_batch(12, 3)], leader_epoch=5)
    assert [starts(o) for o in (11, 12, 14)] == [(10, 2, 1), (12, 3, 5), (12, 3, 5)]
    log.close()
    log = open_log(tmp_path / "t-0", LogConfig(index_interval_bytes=1 << 20))
    assert [starts(o) for o in (3, 11, 13)] == [(0, 5, 1), (10, 2, 1), (12, 3, 5)]


def test_append_raw_validates_before_writing(tmp_path):
    leader = open_log(tmp_path / "a" / "t-0")
    fill(leader, 3, epoch=1)
    follower = open_log(tmp_path / "b" / "t-0")
    with pytest.raises(InvalidOffsetError, match="starts at offset 5 but the log ends at 0"):
        follower.append_raw(leader.read_raw(5, 10**6).data)
    data = bytearray(leader.read_raw(0, 10**6).data)
    data[-30] ^= 0x55
    with pytest.raises(CorruptRecordError, match="CRC"):
        follower.append_raw(bytes(data))
    assert follower.log_end_offset == 0
    other = pa.schema([("value", pa.binary()), ("timestamp", TS)])
    foreign = bf.schema_message(other) + bytes(data[len(bf.schema_message(SCHEMA)):])
    with pytest.raises(InvalidSchemaError):
        follower.append_raw(foreign)
    assert follower.append_raw(b"").record_count == 0
    assert follower.append_raw(pa.py_buffer(leader.read_raw(0, 10**6).data)).record_count == 15


# ---- truncation --------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [0, 3, 5, 12, 23, 24, 25, 37, 49])
def test_truncate_to_then_append_continues(tmp_path, target):
    log = open_log(tmp_path / "t-0")
    fill(log, 10, epoch=1)
    fill(log, 2, epoch=2)                            # epoch 2 starts at 50
    assert log.truncate_to(target)
    assert log.log_end_offset == target
    assert read_values(log) == values(0, target)
    assert all(e.start_offset < target for e in log.leader_epoch_cache.entries())
    fill(log, 3, epoch=3, salt="new")
    assert read_values(log, target) == values(target, target + 15, "new")
    for clean in (False, True):
        log.close()
        log = open_log(tmp_path / "t-0", clean=clean)
        assert read_values(log) == values(0, target) + values(target, target + 15, "new")
    assert log.leader_epoch_cache.latest_epoch == 3


def test_truncate_to_across_segment_boundaries_deletes_files(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 12)
    before = len(log.segments())
    assert not log.truncate_to(60) and not log.truncate_to(200)      # at/after LEO: no-op
    log.truncate_to(11)
    assert len(log.segments()) < before
    names = sorted(n for n in os.listdir(log.dir) if n.endswith(".arrows"))
    assert names == sorted(os.path.basename(s.path) for s in log.segments())
    assert log.recovery_point <= 11


def test_truncate_fully_and_start_at(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 6, epoch=1)
    log.truncate_fully_and_start_at(500)
    assert (log.log_start_offset, log.log_end_offset, len(log.segments())) == (500, 500, 1)
    assert log.leader_epoch_cache.entries() == []
    log.append([make_batch(500, 2)], 7)
    assert read_values(log) == values(500, 502)
    log.close()
    log = open_log(tmp_path / "t-0", log_start_offset=500)
    assert (log.log_start_offset, log.log_end_offset) == (500, 502)


def test_delete_records_before(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 12, epoch=1)
    first_bases = [s.base_offset for s in log.segments()]
    assert log.delete_records_before(23) == 23
    assert log.log_start_offset == 23
    assert all(s.next_offset > 23 for s in log.segments())
    assert len(log.segments()) < len(first_bases)
    assert read_values(log) == values(23, 60)
    assert log.leader_epoch_cache.entries() == [EpochEntry(1, 23)]
    assert log.delete_records_before(10) == 23        # never moves backwards
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(61)
    log.delete_records_before(60)                     # everything: the active segment stays
    assert log.log_start_offset == 60 and len(log.segments()) >= 1
    assert log.read(60, 100, None).record_count == 0


# ---- retention, roll, flush --------------------------------------------------------------------
def test_retention_by_time_uses_record_timestamps(tmp_path):
    clock = ManualClock(T0)
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=2048, retention_ms=1000), clock=clock)
    fill(log, 6)                                      # timestamps T0 .. T0+29
    log.append([make_batch(30, 5, ts0=T0 + 5000)], 0)  # newest records, far newer
    fill(log, 2)
    assert log.enforce_retention(T0 + 500) == 0       # nothing is a second old yet
    deleted = log.enforce_retention(T0 + 1035)        # segments newest < T0+35 expire
    assert deleted > 0
    assert all(s.max_timestamp_ms >= T0 + 35 for s in log.segments()[:-1])
    assert log.log_start_offset == log.segments()[0].base_offset
    assert read_values(log)[:0] == [] and log.log_start_offset <= 30
    deleted_all = log.enforce_retention(T0 + 10**9)
    assert deleted_all >= 1 and len(log.segments()) == 1      # the active segment stays
    assert log.log_end_offset == 45


def test_retention_by_size_keeps_the_newest(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=2048, retention_bytes=5000))
    fill(log, 20)
    assert log.size_bytes > 5000
    n = log.enforce_retention()
    assert n > 0 and log.size_bytes <= 5000 + 2048
    assert log.size_bytes - log.segments()[0].size < 5000    # one more deletion would be too many
    assert read_values(log) == values(log.log_start_offset, 100)


def test_retention_disabled(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=2048, retention_ms=-1, retention_bytes=-1))
    fill(log, 10)
    assert log.enforce_retention(T0 + 10**12) == 0


def test_roll_by_segment_ms(tmp_path):
    clock = ManualClock(T0)
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=10**6, segment_ms=1000), clock=clock)
    fill(log, 3)
    assert len(log.segments()) == 1
    clock.advance(999)
    fill(log, 1)
    assert len(log.segments()) == 1
    clock.advance(1)
    fill(log, 1)                                      # the append rolls first
    assert [s.base_offset for s in log.segments()] == [0, 20]
    clock.advance(1000)
    assert log.roll_if_due() and [s.base_offset for s in log.segments()] == [0, 20, 25]
    clock.advance(5000)
    assert not log.roll_if_due()                      # the active segment is empty


def test_roll_is_a_noop_on_an_empty_active_segment(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=10**6))
    fill(log, 1)
    log.roll()
    log.roll()
    assert [s.base_offset for s in log.segments()] == [0, 5]


def test_flush_by_messages_moves_the_recovery_point(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=2048, flush_interval_messages=12))
    assert log.recovery_point == 0
    fill(log, 2)
    assert log.recovery_point == 0                    # 10 unflushed < 12
    fill(log, 1)
    assert log.recovery_point == 15
    fill(log, 2)
    assert log.recovery_point == 15
    fill(log, 1)
    assert log.recovery_point == 30


def test_flush_if_due_by_time_and_after_roll(tmp_path):
    clock = ManualClock(T0)
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=2048, flush_interval_ms=1000), clock=clock)
    fill(log, 1)
    assert not log.flush_if_due()
    clock.advance(1000)
    assert log.flush_if_due() and log.recovery_point == 5
    fill(log, 6)                                      # rolls: sealed segments are unflushed
    assert log.flush_if_due()
    assert log.recovery_point == log.segments()[-1].base_offset
    assert not log.flush_if_due()
    log.flush()
    assert log.recovery_point == log.log_end_offset == 35


# ---- timestamps --------------------------------------------------------------------------------
def test_offset_for_timestamp(tmp_path):
    log = open_log(tmp_path / "t-0")
    stamps = [100, 300, 200, 400, 500, 500, 600, 650, 700, 900, 800, 1000]
    for i in range(0, len(stamps), 3):
        log.append([make_batch(i, 3, ts=[T0 + t for t in stamps[i:i + 3]])], 0)
    assert log.offset_for_timestamp(T0) == (0, T0 + 100)
    assert log.offset_for_timestamp(T0 + 250) == (1, T0 + 300)
    assert log.offset_for_timestamp(T0 + 500) == (4, T0 + 500)
    assert log.offset_for_timestamp(T0 + 750) == (9, T0 + 900)
    assert log.offset_for_timestamp(T0 + 1000) == (11, T0 + 1000)
    assert log.offset_for_timestamp(T0 + 1001) is None
    log.delete_records_before(5)
    assert log.offset_for_timestamp(T0) == (5, T0 + 500)


# ---- reopening -------------------------------------------------------------------------------------
def test_clean_reopen_skips_the_scan(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 9)
    log.close()
    clean = open_log(tmp_path / "t-0", clean=True, recovery_point=45)
    assert clean.load_stats["recovered_segments"] == 0
    assert clean.load_stats["trusted_segments"] == len(clean.segments())
    assert read_values(clean) == values(0, 45)
    clean.close()
    unclean = open_log(tmp_path / "t-0", recovery_point=0)
    assert unclean.load_stats["recovered_segments"] == len(unclean.segments())
    assert unclean.load_stats["recovered_batches"] == 9
    # Loading fsyncs nothing: what the scan validated stays above the recovery
    # point (scanned again after another crash) until the next flush.
    assert unclean.recovery_point == 0
    unclean.flush()
    assert unclean.recovery_point == 45


def test_unclean_reopen_scans_only_from_the_recovery_point(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 12)
    bases = [s.base_offset for s in log.segments()]
    log.close()
    log = open_log(tmp_path / "t-0", recovery_point=bases[3] + 1)
    assert log.load_stats["trusted_segments"] == 3
    assert log.load_stats["recovered_segments"] == len(bases) - 3


def test_unclean_reopen_leaves_index_files_holding_the_rebuilt_entries(tmp_path):
    """Recovery rebuilds both indexes from the data; a file already holding exactly
    those entries is left in place (two file creations or unlinks per recovered log
    otherwise), a wrong or missing one is written again."""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=256)
    log = open_log(tmp_path / "t-0", config)
    fill(log, 10)
    log.flush()
    seg = log.segments()[-1]
    paths = [seg.offset_index.path, seg.time_index.path]
    held = [open(p, "rb").read() for p in paths]
    assert all(held), "both indexes have entries"
    for i, p in enumerate(paths):      # a second name for each file: survives a replacement
        os.link(p, tmp_path / f"kept-{i}")
    log = open_log(tmp_path / "t-0", config)       # no clean shutdown: scanned
    assert log.load_stats["recovered_segments"] == 1
    assert [os.path.samefile(p, tmp_path / f"kept-{i}") for i, p in enumerate(paths)] == [True, True]
    assert [open(p, "rb").read() for p in paths] == held
    assert read_values(log, 17) == values(17, 50)
    log.abandon()
    with open(paths[0], "r+b") as f:   # a wrong entry, and a time index lost
        f.write(b"\x07" * 8)
    os.unlink(paths[1])
    log = open_log(tmp_path / "t-0", config)
    assert [open(p, "rb").read() for p in paths] == held
    assert read_values(log, 17) == values(17, 50)
    fill(log, 1)
    assert read_values(log) == values(0, 55)


def test_a_crashed_log_whose_scan_gives_back_the_same_epochs_does_not_write_them_again(tmp_path):
    """Loading a crashed log drops the epoch entries past where its scan starts and
    re-assigns them from the batches: the same history, so its close (or first flush)
    leaves the checkpoint alone (an fsynced rewrite of every log's file otherwise);
    a history the scan changed is written."""
    log = open_log(tmp_path / "t-0")
    fill(log, 2, epoch=0)
    fill(log, 2, epoch=3)
    log.close()
    path = log.leader_epoch_cache.path
    os.link(path, tmp_path / "kept")
    log = open_log(tmp_path / "t-0")        # unclean: every segment scanned
    assert log.load_stats["recovered_segments"] > 0 and not log.leader_epoch_cache.dirty
    log.close()
    assert os.path.samefile(path, tmp_path / "kept")
    assert log.leader_epoch_cache.entries() == [EpochEntry(0, 0), EpochEntry(3, 10)]
    with open(path, "w") as f:            # a history the batches contradict
        f.write("0\n1\n0 0\n")
    log = open_log(tmp_path / "t-0")
    assert log.leader_epoch_cache.dirty
    log.close()
    assert open(path).read() == "0\n2\n0 0\n3 10\n"


def test_closing_a_log_loaded_from_its_clean_state_reads_none_of_its_indexes(tmp_path):
    """Indexes of a log loaded from the clean-shutdown state load on first use; a log
    closed without use does not read them (at 50,000 partitions that was two file
    reads per log in every SIGTERM's shutdown)."""
    from replikafka.broker.storage import LogManager
    with LogManager([str(tmp_path / "d")], TINY) as lm:
        fill(lm.get_or_create_log("t", 0, SCHEMA), 7)
    index = [n for n in os.listdir(tmp_path / "d" / "t-0") if n.endswith(".index")][0]
    with open(tmp_path / "d" / "t-0" / index, "ab") as f:
        f.write(b"\x01" * 3)           # torn: a read of it would drop the file
    with LogManager([str(tmp_path / "d")], TINY) as lm:
        assert lm.get_log("t", 0).load_stats["trusted_segments"] > 0
    assert index in os.listdir(tmp_path / "d" / "t-0")
    with LogManager([str(tmp_path / "d")], TINY) as lm:
        assert read_values(lm.get_log("t", 0)) == values(0, 35)
    assert index not in os.listdir(tmp_path / "d" / "t-0"), "a read drops the torn index"


def test_reopen_with_garbage_at_the_tail(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 7)
    path = log.segments()[-1].path
    log.close()
    with open(path, "ab") as f:
        f.write(b"\xff\xff\xff\xff" + os.urandom(100))
    log = open_log(tmp_path / "t-0")
    assert log.log_end_offset == 35 and log.load_stats["truncated_bytes"] == 104
    fill(log, 1)
    assert read_values(log) == values(0, 40)


def test_schema_is_read_from_disk_and_checked(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 3)
    log.close()
    log = Log.open(str(tmp_path / "t-0"), TINY, None, clean=True)
    assert log.schema.equals(SCHEMA) and read_values(log) == values(0, 15)
    log.close()
    other = pa.schema([("value", pa.binary()), ("timestamp", TS)])
    with pytest.raises(InvalidSchemaError):
        Log.open(str(tmp_path / "t-0"), TINY, other, clean=True)
    with pytest.raises(InvalidSchemaError):    # recovery too: the file's schema message is not the log's
        Log.open(str(tmp_path / "t-0"), TINY, other)
    with pytest.raises(InvalidSchemaError):
        Log.open(str(tmp_path / "empty-0"), TINY, None)


@pytest.mark.parametrize("schema", [
    pa.schema([("value", pa.binary())]),
    pa.schema([("value", pa.binary()), ("timestamp", pa.timestamp("us", tz="UTC"))]),
    pa.schema([("value", pa.dictionary(pa.int32(), pa.string())), ("timestamp", TS)]),
    pa.schema([("v", pa.list_(pa.dictionary(pa.int8(), pa.string()))), ("timestamp", TS)]),
])
def test_unsupported_schemas_are_refused(tmp_path, schema):
    with pytest.raises(InvalidSchemaError):
        Log.open(str(tmp_path / "t-0"), TINY, schema)


@pytest.mark.parametrize("bad", [dict(segment_bytes=0), dict(segment_bytes=2**31),
                                 dict(index_interval_bytes=-1), dict(message_timestamp_type="Now"),
                                 dict(flush_interval_messages=0), dict(max_message_bytes=0)])
def test_bad_configs_are_refused(tmp_path, bad):
    with pytest.raises(InvalidConfigError):
        Log.open(str(tmp_path / "t-0"), LogConfig(**bad), SCHEMA)


def test_leftover_tmp_and_orphan_index_files_are_removed(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 4)
    log.close()
    d = tmp_path / "t-0"
    (d / "00000000000000000005.arrows.tmp").write_bytes(b"half a rewrite")
    (d / "00000000000000099999.index").write_bytes(b"")
    log = open_log(d, clean=True)
    assert not (d / "00000000000000000005.arrows.tmp").exists()
    assert not (d / "00000000000000099999.index").exists()
    assert read_values(log) == values(0, 20)


def test_close_and_delete(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 4)
    log.close()
    with pytest.raises(StorageError, match="closed"):
        fill(log, 1)
    log.close()                                       # idempotent
    log = open_log(tmp_path / "t-0")
    log.delete()
    assert os.listdir(tmp_path) == []


# ---- concurrency and mmap safety -----------------------------------------------------------------
def test_held_batches_survive_truncation_retention_and_deletion(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=2048, retention_bytes=0))
    fill(log, 10)
    held = log.read(0, 10**9, None).batches
    log.truncate_to(30)
    log.enforce_retention()
    fill(log, 4, salt="new")
    log.delete()
    # Every held batch still points at its original (now unlinked) inode.
    assert [v for b in held for v in b.column("value").to_pylist()] == values(0, 50)


def test_concurrent_readers_see_a_consistent_prefix(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=4096, index_interval_bytes=512))
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                end = log.log_end_offset
                start = log.log_start_offset
                try:
                    got = read_values(log, start, end)
                except OffsetOutOfRangeError:
                    assert log.log_start_offset > start     # deleted meanwhile: fine
                    continue
                assert got == values(start, end)
        except BaseException as e:       # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(150):
        fill(log, 1)
        if i % 40 == 39:
            log.delete_records_before(log.log_end_offset - 50)
            log.enforce_retention()
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert log.log_end_offset == 750


def test_concurrent_reads_during_truncation_return_correct_records(tmp_path):
    """Readers racing truncations and rewrites of the active segment: every record
    returned is the one at its offset (values name their offsets), nothing raises
    but OffsetOutOfRangeError for offsets the truncation removed."""
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=3000, index_interval_bytes=300))
    fill(log, 10)
    errors: list[BaseException] = []
    stop = threading.Event()
    reads = [0]

    def reader(seed: int):
        import random
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                start = rng.randrange(0, log.log_end_offset + 1)
                try:
                    r = log.read(start, rng.choice([1, 2000, 10**6]), None)
                except OffsetOutOfRangeError:
                    continue
                got = [v for b in r.batches for v in b.column("value").to_pylist()]
                assert got == values(start, start + r.record_count)
                reads[0] += 1
        except BaseException as e:       # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for i in range(25):
        log.truncate_to(max(0, log.log_end_offset - 3 - i % 11))     # often mid-batch
        fill(log, 2)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert reads[0] > 0
    assert read_values(log) == values(0, log.log_end_offset)


def test_end_of_stream_marker_in_an_empty_active_segment(tmp_path):
    """Found by the recovery fuzz: an empty active segment that gained an
    end-of-stream marker must not leave two segments with one base offset."""
    log = open_log(tmp_path / "t-0")
    fill(log, 3)
    log.roll()
    active = log.segments()[-1].path
    log.close()
    with open(active, "ab") as f:
        f.write(bf.END_OF_STREAM + b"junk")
    log = open_log(tmp_path / "t-0")
    bases = [s.base_offset for s in log.segments()]
    assert len(bases) == len(set(bases)) and log.log_end_offset == 15
    fill(log, 1)
    log.close()
    log = open_log(tmp_path / "t-0", clean=True)
    assert read_values(log) == values(0, 20)
