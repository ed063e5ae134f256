"""A follower's fetched streams checked together (raw_streams) and the segment writes
that keep the GIL (fileio): same bytes stored, same errors, fewer Arrow calls."""
from __future__ import annotations

import errno
import os

import pyarrow as pa
import pyarrow.ipc
import pytest

from replikafka.broker.storage import Log, LogConfig, ManualClock
from replikafka.broker.storage import batch_format as bf
from replikafka.broker.storage import fileio, raw_streams
from replikafka.errors import CorruptRecordError, InvalidSchemaError

from storage_testlib import SCHEMA, fill, open_log, read_values

WIDE = LogConfig(segment_bytes=1 << 20, index_interval_bytes=256)


def _leaders(tmp_path, n: int) -> list[bytes]:
    """The streams ``n`` leaders' `read_raw` gives a follower at offset 0: one to three
    batches each, the values salted by partition."""
    out = []
    for p in range(n):
        log = open_log(tmp_path / f"leader-{p}", WIDE)
        fill(log, 1 + p % 3, per_batch=1 + p % 4, epoch=p % 2, salt=f"p{p}-")
        out.append(log.read_raw(0, 1 << 20).data)
        log.close()
    return out


def test_streams_are_read_by_arrow_once_and_stored_as_alone(tmp_path, monkeypatch):
    """Twenty partitions' streams: one Arrow read for all of them, no Arrow read of
    any batch while appending, and each follower stores exactly the bytes (and
    serves the values) that the same append checked alone stores."""
    streams = _leaders(tmp_path, 20)
    opened, batch_reads = [], []
    real_open, real_read = pyarrow.ipc.open_stream, pyarrow.ipc.read_record_batch
    monkeypatch.setattr(pyarrow.ipc, "open_stream", lambda src: opened.append(1) or real_open(src))
    monkeypatch.setattr(pyarrow.ipc, "read_record_batch", lambda *a: batch_reads.append(1) or real_read(*a))
    checked = raw_streams.check_raw_streams([pa.py_buffer(s) for s in streams])
    assert len(opened) == 1 and all(c is not None for c in checked)
    together = [open_log(tmp_path / f"together-{p}", WIDE) for p in range(20)]
    for log, data, c in zip(together, streams, checked):
        log.append_raw(pa.py_buffer(data), c)
    assert not batch_reads                                    # the group's read was the only one
    monkeypatch.setattr(pyarrow.ipc, "read_record_batch", real_read)
    for p, (log, data) in enumerate(zip(together, streams)):
        alone = open_log(tmp_path / f"alone-{p}", WIDE)
        alone.append_raw(data)
        assert log.read_raw(0, 1 << 20).data == alone.read_raw(0, 1 << 20).data == data
        assert read_values(log) == read_values(alone) and log.log_end_offset == alone.log_end_offset
        assert log.leader_epoch_cache.latest_epoch == alone.leader_epoch_cache.latest_epoch


def test_a_damaged_stream_is_left_to_the_log_which_names_what_is_wrong(tmp_path):
    """A body byte flipped in one stream: that stream alone gets None (the others of
    its schema are still checked together), and the log's own check refuses it,
    naming the CRC mismatch, with nothing written."""
    streams = _leaders(tmp_path, 4)
    damaged = bytearray(streams[2])
    damaged[-16] ^= 0x01                  # inside the last batch's body (before the end marker)
    checked = raw_streams.check_raw_streams([*streams[:2], bytes(damaged), streams[3]])
    assert [c is None for c in checked] == [False, False, True, False]
    log = open_log(tmp_path / "follower", WIDE)
    with pytest.raises(CorruptRecordError, match="CRC-32C mismatch"):
        log.append_raw(bytes(damaged), checked[2])
    assert log.log_end_offset == 0


def test_a_group_arrow_refuses_is_left_to_the_log(tmp_path, monkeypatch):
    """If Arrow refuses a group's one stream, every stream of it gets None: each is
    then checked alone, which names its own fault (here none: all append)."""
    streams = _leaders(tmp_path, 3)

    def refuse(schema_message, messages):
        raise pa.ArrowInvalid("refused")
    monkeypatch.setattr(bf, "read_one_stream", refuse)
    assert raw_streams.check_raw_streams(streams) == [None, None, None]
    for p, data in enumerate(streams):
        log = open_log(tmp_path / f"follower-{p}", WIDE)
        log.append_raw(data, None)
        assert log.read_raw(0, 1 << 20).data == data


def test_a_stream_checked_against_another_schema_is_checked_by_the_log(tmp_path):
    """A `CheckedStream` whose schema message is not the log's own is not trusted:
    the log checks the stream itself and refuses another schema."""
    other_schema = pa.schema([("value", pa.binary()), ("timestamp", SCHEMA.field("timestamp").type)])
    stamps = pa.array([5], pa.int64()).view(other_schema.field("timestamp").type)
    streams = []
    for p in range(raw_streams.GROUP_MIN_STREAMS):
        other = Log.open(str(tmp_path / f"other-{p}"), WIDE, other_schema, clock=ManualClock(0))
        other.append([pa.record_batch([pa.array([b"x%d" % p]), stamps], schema=other_schema)], leader_epoch=0)
        streams.append(other.read_raw(0, 1 << 20).data)
    checked = raw_streams.check_raw_streams(streams)
    assert all(c is not None and c.schema_message != bf.schema_message(SCHEMA) for c in checked)
    log = open_log(tmp_path / "follower", WIDE)
    with pytest.raises(InvalidSchemaError):
        log.append_raw(streams[0], checked[0])
    assert log.log_end_offset == 0


def test_a_large_stream_and_too_few_of_a_schema_are_left_to_the_log(tmp_path, monkeypatch):
    """A stream over GROUPED_STREAM_MAX_BYTES is checked alone (zero-copy, not copied
    into a group); so is a stream with fewer than GROUP_MIN_STREAMS of its schema
    (a group that small costs more CPU than it saves)."""
    streams = _leaders(tmp_path, 6)
    big = max(range(6), key=lambda i: len(streams[i]))
    monkeypatch.setattr(raw_streams, "GROUPED_STREAM_MAX_BYTES", len(streams[big]) - 1)
    got = raw_streams.check_raw_streams(streams)
    assert [c is None for c in got] == [len(s) > len(streams[big]) - 1 for s in streams]
    assert sum(c is not None for c in got) >= raw_streams.GROUP_MIN_STREAMS
    monkeypatch.undo()
    few = streams[:raw_streams.GROUP_MIN_STREAMS - 1]

    def framed_twice(*a, **kw):
        raise AssertionError("framed here and again by the log")
    # Too few to make a group: not even framed here (the log frames them).
    monkeypatch.setattr(bf, "check_framed", framed_twice)
    assert raw_streams.check_raw_streams(few) == [None] * len(few)


# ---- writes and opens that keep the GIL ----------------------------------------------
def test_small_writes_keep_the_gil_and_large_ones_and_a_zero_limit_give_it_up(tmp_path, monkeypatch):
    """A write of at most the limit goes through the C library's pwrite (not
    ``os.pwritev``, which gives the GIL up), whatever its pieces; a larger one, and
    every one once the limit is 0, through ``os.pwritev``; the file holds the same."""
    calls = []
    real = os.pwritev
    monkeypatch.setattr(fileio.os, "pwritev", lambda *a: calls.append(1) or real(*a))
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        pieces = [b"head", memoryview(b"-view-"), pa.py_buffer(b"arrow"), b""]
        assert fileio.pwritev_all(fd, pieces, 3) == 15 and not calls
        assert fileio.pwritev_all(fd, [pa.py_buffer(b"ONE")], 0) == 3 and not calls
        big = b"x" * (64 * 1024 + 1)
        assert fileio.pwritev_all(fd, [big], 18) == len(big) and calls == [1]
        monkeypatch.setattr(fileio, "_kept_write_max_bytes", 0)
        assert fileio.pwritev_all(fd, [b"tail"], 18 + len(big)) == 4 and calls == [1, 1]
        assert os.pread(fd, 100, 0)[:22] == b"ONEhead-view-arrowxxxx"
        assert os.pread(fd, 4, 18 + len(big)) == b"tail" and os.path.getsize(tmp_path / "f") == 22 + len(big)
    finally:
        os.close(fd)


def test_kept_calls_raise_oserror_with_the_errno(tmp_path):
    """A failed kept call raises the OSError ``os`` would (its errno and subclass),
    which the storage's error handling (disk full, out of descriptors) keys on."""
    fd = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as info:
            fileio.pwritev_all(fd, [b"data"], 0)
        assert info.value.errno == errno.EBADF
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError):
        fileio.open_keeping_gil(str(tmp_path / "missing"), os.O_WRONLY)
    with pytest.raises(FileNotFoundError):
        fileio.map_file(str(tmp_path / "missing"))
    fd = fileio.open_keeping_gil(str(tmp_path / "ro"), os.O_WRONLY)
    try:
        assert fileio.pwritev_all(fd, [b"ok"], 0) == 2
    finally:
        os.close(fd)
    assert fileio.map_file(str(tmp_path / "ro")).to_pybytes() == b"ok"


_FILE_CALLS = ("open", "lseek", "close", "mmap", "munmap", "pwrite")


def test_every_kept_call_can_be_made_to_give_the_gil_up(tmp_path, monkeypatch):
    """python.gil.kept.file.calls.enable=false (log dirs on a file system that can hang):
    the reopen, the small write and the read mapping's open, size, map, unmap and close
    all go through ``ctypes.CDLL``'s calls, which give the GIL up (ctypes marks the
    ones that keep it, ``PyDLL``'s, with FUNCFLAG_PYTHONAPI); the file and its mapping
    hold the same."""
    import ctypes
    import gc
    keeps = ctypes._FUNCFLAG_PYTHONAPI
    assert all(getattr(fileio._KEEPING_GIL, n)._flags_ & keeps for n in _FILE_CALLS)
    assert not any(getattr(fileio._GIVING_GIL_UP, n)._flags_ & keeps for n in _FILE_CALLS)
    used = []
    for name in _FILE_CALLS:
        real = getattr(fileio._GIVING_GIL_UP, name)
        monkeypatch.setattr(fileio._GIVING_GIL_UP, name, lambda *a, n=name, f=real: used.append(n) or f(*a))
    monkeypatch.setattr(fileio, "_calls", fileio._KEEPING_GIL)
    path = str(tmp_path / "segment")
    open(path, "wb").close()
    fileio.set_gil_kept_file_calls(False)
    fd = fileio.open_keeping_gil(path, os.O_WRONLY)
    try:
        assert fileio.pwritev_all(fd, [b"abc", pa.py_buffer(b"def")], 0) == 6
    finally:
        os.close(fd)
    mapped = fileio.map_file(path)
    assert mapped.to_pybytes() == b"abcdef"
    del mapped
    gc.collect()
    assert set(used) == set(_FILE_CALLS)
    fileio.set_gil_kept_file_calls(True)
    assert fileio._calls is fileio._KEEPING_GIL


def test_the_broker_setting_sets_the_limit():
    """python.gil.kept.write.max.bytes and python.gil.kept.file.calls.enable reach the
    storage's calls (tune_process)."""
    import gc
    import sys
    from replikafka.broker.config import BrokerConfig
    from replikafka.broker.server import tune_process
    before = fileio._kept_write_max_bytes, sys.getswitchinterval(), gc.get_threshold(), fileio._calls
    try:
        tune_process(BrokerConfig.from_dict({"broker.id": 1, "zookeeper.connect": "zk:1", "log.dirs": "/tmp/x",
                                             "python.gil.kept.write.max.bytes": 0,
                                             "python.gil.kept.file.calls.enable": "false"}))
        assert fileio._kept_write_max_bytes == 0 and fileio._calls is fileio._GIVING_GIL_UP
    finally:       # tune_process's other settings are the process's: put them back too
        fileio._calls = before[3]
        fileio.set_kept_write_max_bytes(before[0])
        sys.setswitchinterval(before[1])
        gc.set_threshold(*before[2])
