"""ENOSPC in the middle of an append (issue 10: "no torn tail is left by an ENOSPC, or
recovery repairs it").

The disk is simulated at the one place the segment writes data: `pwritev_all` writes
the first `budget` bytes of the message, as a file system that runs out of space part
way does, then raises OSError(ENOSPC). Two cases:

- the undo has room (the disk freed up, or only the append's own pages were short):
  the torn bytes are removed at once, nothing is left past the committed size;
- the undo fails too (the disk is still full: the undo writes the kept bytes to a new
  file): the torn bytes stay on disk past the committed size, readers never see them,
  and the next open (clean shutdown marker or not) cuts them off.

After either, every byte of every segment passes the engine's full recovery scan
(framing, CRC-32C, Arrow, contiguous offsets) with nothing to drop, and every record
appended before the failure reads back once.
"""
from __future__ import annotations

import errno
import os
import shutil

import pytest

from replikafka.broker.storage import segment as segment_mod
from replikafka.errors import StorageError

from storage_testlib import fill, make_batch, open_log, read_values, value


class _DiskFullAfter:
    """pwritev_all that writes only the first `budget` bytes of what it is given,
    then fails with ENOSPC (as a file system running out of space part way)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.calls = 0

    def __call__(self, fd, pieces, position):
        self.calls += 1
        data = b"".join(bytes(p) for p in pieces)
        os.pwrite(fd, data[:self.budget], position)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _rewrite_on_a_full_disk(self, keep, tail, schema_msg=None):
    # The undo writes the kept bytes to a new file: on a full disk that fails too.
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path + ".tmp")


def _deep_scan(log_dir, tmp_path) -> dict:
    """The engine's full recovery scan of a copy (the original is left untouched):
    what it had to drop, and the log end it found."""
    copy = tmp_path / "scan"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(log_dir, copy)
    log = open_log(copy, recovery_point=0)
    try:
        return dict(log.load_stats, log_end_offset=log.log_end_offset, values=read_values(log))
    finally:
        log.close()


def _filled(tmp_path):
    log = open_log(tmp_path / "t-0")
    fill(log, 7)            # 35 records over several segments, the last one active
    return log


@pytest.mark.parametrize("budget", [1, 100, 600])
def test_enospc_mid_append_is_undone_when_the_undo_has_room(tmp_path, monkeypatch, budget):
    log = _filled(tmp_path)
    leo, seg = log.log_end_offset, log.segments()[-1]
    committed = seg.size
    disk = _DiskFullAfter(budget)
    monkeypatch.setattr(segment_mod, "pwritev_all", disk)
    with pytest.raises(StorageError, match="No space left on device"):
        log.append([make_batch(leo, 5)], leader_epoch=0)
    assert disk.calls == 1
    # The torn bytes were removed at once: the file ends where the last whole batch does.
    assert os.path.getsize(seg.path) == committed == log.segments()[-1].size
    assert log.log_end_offset == leo
    assert read_values(log) == [value(o) for o in range(leo)]
    scan = _deep_scan(log.dir, tmp_path)
    assert scan["truncated_bytes"] == 0 and scan["log_end_offset"] == leo
    # The disk has room again: the log goes on where it stopped, with no gap.
    monkeypatch.undo()
    fill(log, 2)
    assert read_values(log) == [value(o) for o in range(leo + 10)]
    log.close()
    reopened = open_log(tmp_path / "t-0", recovery_point=0)
    assert reopened.load_stats["truncated_bytes"] == 0
    assert read_values(reopened) == [value(o) for o in range(leo + 10)]
    reopened.close()


@pytest.mark.parametrize("clean", [False, True], ids=["unclean", "clean-marker"])
def test_enospc_whose_undo_fails_too_leaves_a_tail_that_recovery_cuts(tmp_path, monkeypatch, clean):
    log = _filled(tmp_path)
    leo, seg = log.log_end_offset, log.segments()[-1]
    committed = seg.size
    monkeypatch.setattr(segment_mod, "pwritev_all", _DiskFullAfter(600))
    monkeypatch.setattr(segment_mod.LogSegment, "_rewrite", _rewrite_on_a_full_disk)
    with pytest.raises(StorageError, match="No space left on device"):
        log.append([make_batch(leo, 5)], leader_epoch=0)
    # The torn bytes are on disk past the committed size; readers stop at the committed size.
    assert os.path.getsize(seg.path) == committed + 600
    assert log.log_end_offset == leo
    assert read_values(log) == [value(o) for o in range(leo)]
    monkeypatch.undo()
    # The broker stops (the log dir went offline: no flush, no checkpoints), then starts again.
    # With the clean-shutdown marker the last segment is trusted only after its tail frames whole.
    reopened = open_log(tmp_path / "t-0", recovery_point=0 if not clean else leo, clean=clean)
    assert reopened.load_stats["truncated_bytes"] == 600, reopened.load_stats
    assert reopened.log_end_offset == leo
    assert os.path.getsize(reopened.segments()[-1].path) == committed
    assert read_values(reopened) == [value(o) for o in range(leo)]
    # Every segment now passes the full scan (CRC of every batch) with nothing to drop,
    # and the log takes appends again at the offset after the last whole batch.
    fill(reopened, 2)
    scan = _deep_scan(reopened.dir, tmp_path)
    assert scan["truncated_bytes"] == 0 and scan["log_end_offset"] == leo + 10
    assert scan["values"] == [value(o) for o in range(leo + 10)]
    reopened.close()


def test_a_failed_undo_leaves_no_partial_copy_on_the_full_disk(tmp_path, monkeypatch):
    """The undo's new file is removed when writing it fails, so a full disk is not
    made fuller by a partial copy of the segment."""
    log = _filled(tmp_path)
    leo, seg = log.log_end_offset, log.segments()[-1]
    monkeypatch.setattr(segment_mod, "pwritev_all", _DiskFullAfter(300))
    real_fsync = os.fsync

    def fsync_full(fd):   # the copy's data cannot be made durable: the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(segment_mod.os, "fsync", fsync_full)
    with pytest.raises(StorageError, match="No space left on device"):
        log.append([make_batch(leo, 5)], leader_epoch=0)
    monkeypatch.setattr(segment_mod.os, "fsync", real_fsync)
    assert not [n for n in os.listdir(log.dir) if n.endswith(".tmp")], os.listdir(log.dir)
    assert os.path.getsize(seg.path) > seg.size       # the torn tail is still there: recovery's job
    monkeypatch.undo()
    reopened = open_log(tmp_path / "t-0", recovery_point=0)
    assert reopened.load_stats["truncated_bytes"] == 300
    assert read_values(reopened) == [value(o) for o in range(leo)]
    reopened.close()


@pytest.mark.parametrize("disk", ["full", "writable"])
def test_an_offline_log_dir_gets_no_clean_shutdown_marker(tmp_path, monkeypatch, disk):
    """A log dir taken offline by an ENOSPC (KIP-112) is left as a crash leaves it: the
    broker's clean shutdown writes no clean-shutdown marker there (its logs were
    abandoned, not closed: a marker would have the next start trust a torn tail), and a
    full disk there does not stop the shutdown of the other dirs. The next start
    recovers that dir's logs from their files."""
    from replikafka.broker.storage import CLEAN_SHUTDOWN_FILE, LogManager, ManualClock
    from replikafka.broker.storage import log_manager as lm_mod

    from storage_testlib import SCHEMA, T0, TINY

    full, other = tmp_path / "full", tmp_path / "other"
    lm = LogManager([str(full), str(other)], TINY, clock=ManualClock(T0))
    logs = {p: lm.get_or_create_log("t", p, SCHEMA) for p in range(2)}
    in_full = next(p for p, lg in logs.items() if os.path.dirname(lg.dir) == str(full))
    for lg in logs.values():
        fill(lg, 7)
    leo = logs[in_full].log_end_offset
    monkeypatch.setattr(segment_mod, "pwritev_all", _DiskFullAfter(600))
    monkeypatch.setattr(segment_mod.LogSegment, "_rewrite", _rewrite_on_a_full_disk)
    with pytest.raises(StorageError):
        logs[in_full].append([make_batch(leo, 5)], leader_epoch=0)
    monkeypatch.undo()
    assert lm.fail_dir(str(full), "ENOSPC") == [("t", in_full)]
    if disk == "full":
        real = lm_mod.atomic_write_bytes

        def no_space_in_full(path, data, **kw):
            if path.startswith(str(full)):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            real(path, data, **kw)
        monkeypatch.setattr(lm_mod, "atomic_write_bytes", no_space_in_full)
    lm.close()
    monkeypatch.undo()
    assert not (full / CLEAN_SHUTDOWN_FILE).exists()
    assert (other / CLEAN_SHUTDOWN_FILE).exists()
    lm = LogManager([str(full), str(other)], TINY, clock=ManualClock(T0))
    log = lm.get_log("t", in_full)
    assert log.load_stats["truncated_bytes"] == 600, log.load_stats
    assert log.log_end_offset == leo
    assert read_values(log) == [value(o) for o in range(leo)]
    lm.close()
