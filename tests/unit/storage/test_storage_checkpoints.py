"""OffsetCheckpointFile: Kafka's format, round trip, malformed files, atomic replacement."""
from __future__ import annotations

import os

import pytest

from replikafka.broker.storage import OffsetCheckpointFile
from replikafka.broker.storage import fileio
from replikafka.errors import StorageError


def test_round_trip_and_exact_format(tmp_path):
    cp = OffsetCheckpointFile(str(tmp_path / "replication-offset-checkpoint"))
    assert cp.read() == {}
    offsets = {("orders", 0): 120, ("orders", 1): 7, ("a.b-c_d", 12): 0}
    cp.write(offsets)
    assert cp.read() == offsets
    text = open(cp.path).read()
    assert text == "0\n3\na.b-c_d 12 0\norders 0 120\norders 1 7\n"
    cp.write({})
    assert cp.read() == {} and open(cp.path).read() == "0\n0\n"


@pytest.mark.parametrize("content,why", [
    ("", "missing version"),
    ("1\n0\n", "unsupported version"),
    ("0\nx\n", "not a number"),
    ("0\n2\nt 0 1\n", "count 2 but 1"),
    ("0\n1\nt 0\n", "expected 'topic partition offset'"),
    ("0\n1\nt zero 5\n", "non-numeric"),
])
def test_malformed_file_names_the_file_and_line(tmp_path, content, why):
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_text(content)
    with pytest.raises(StorageError, match=why) as err:
        OffsetCheckpointFile(str(path)).read()
    assert str(path) in str(err.value)


def test_topic_names_with_whitespace_are_refused(tmp_path):
    with pytest.raises(ValueError):
        OffsetCheckpointFile(str(tmp_path / "cp")).write({("bad topic", 0): 1})


def test_a_failed_write_leaves_the_old_file_and_no_tmp(tmp_path, monkeypatch):
    cp = OffsetCheckpointFile(str(tmp_path / "log-start-offset-checkpoint"))
    cp.write({("t", 0): 5})

    def failing_fsync(fd):
        raise OSError("disk gone")
    monkeypatch.setattr(fileio.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk gone"):
        cp.write({("t", 0): 99})
    monkeypatch.undo()
    assert cp.read() == {("t", 0): 5}
    assert os.listdir(tmp_path) == ["log-start-offset-checkpoint"]


def test_a_failed_rename_leaves_the_old_file_and_no_tmp(tmp_path, monkeypatch):
    cp = OffsetCheckpointFile(str(tmp_path / "cp"))
    cp.write({("t", 0): 5})

    def failing_replace(src, dst):
        raise OSError("rename failed")
    monkeypatch.setattr(fileio.os, "replace", failing_replace)
    with pytest.raises(OSError):
        cp.write({("t", 0): 6})
    monkeypatch.undo()
    assert cp.read() == {("t", 0): 5} and os.listdir(tmp_path) == ["cp"]


def test_the_new_content_arrives_only_by_rename(tmp_path, monkeypatch):
    """The real file is never opened for writing: the tmp file is written, fsynced,
    then renamed over it, and the directory is fsynced."""
    cp = OffsetCheckpointFile(str(tmp_path / "cp"))
    cp.write({("t", 0): 1})
    events = []
    real_open, real_replace, real_fsync_dir = os.open, os.replace, fileio.fsync_dir

    def spy_open(path, flags, *a):
        if flags & os.O_WRONLY:
            events.append(("open-for-write", os.path.basename(path)))
        return real_open(path, flags, *a)

    def spy_replace(src, dst):
        events.append(("rename", os.path.basename(src), os.path.basename(dst)))
        return real_replace(src, dst)

    def spy_fsync_dir(path):
        events.append(("fsync-dir",))
        return real_fsync_dir(path)
    monkeypatch.setattr(fileio.os, "open", spy_open)
    monkeypatch.setattr(fileio.os, "replace", spy_replace)
    monkeypatch.setattr(fileio, "fsync_dir", spy_fsync_dir)
    cp.write({("t", 0): 2})
    assert events == [("open-for-write", "cp.tmp"), ("rename", "cp.tmp", "cp"), ("fsync-dir",)]


def test_a_leftover_tmp_file_is_ignored(tmp_path):
    cp = OffsetCheckpointFile(str(tmp_path / "cp"))
    cp.write({("t", 0): 3})
    (tmp_path / "cp.tmp").write_text("0\n1\nt 0 garbage-from-a-crash")
    assert cp.read() == {("t", 0): 3}
    cp.write({("t", 0): 4})
    assert cp.read() == {("t", 0): 4} and not (tmp_path / "cp.tmp").exists()
