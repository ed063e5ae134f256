"""LogManager: log dirs, loading with and without a clean shutdown, maintenance, checkpoints."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from replikafka.broker.storage import (CLEAN_SHUTDOWN_FILE, LogConfig, LogManager, ManualClock,
                                       OffsetCheckpointFile)
from replikafka.errors import InvalidTopicError, StorageError, UnknownTopicOrPartitionError

from storage_testlib import SCHEMA, T0, TINY, fill, make_batch, read_values, value


def manager(dirs, clock=None, config=TINY, **kw) -> LogManager:
    return LogManager([str(d) for d in dirs], config, clock=clock or ManualClock(T0), **kw)


def test_create_spreads_logs_over_dirs_and_close_writes_checkpoints(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    lm = manager([a, b])
    logs = {p: lm.get_or_create_log("orders", p, SCHEMA) for p in range(4)}
    assert lm.get_or_create_log("orders", 0, SCHEMA) is logs[0]
    assert sorted(os.path.dirname(log.dir) for log in logs.values()) == [str(a), str(a), str(b), str(b)]
    for log in logs.values():
        fill(log, 3)
    logs[1].delete_records_before(4)
    lm.close()
    for d in (a, b):
        assert (d / CLEAN_SHUTDOWN_FILE).exists()
    rp = {**OffsetCheckpointFile(str(a / "recovery-point-offset-checkpoint")).read(),
          **OffsetCheckpointFile(str(b / "recovery-point-offset-checkpoint")).read()}
    assert rp == {("orders", p): 15 for p in range(4)}
    starts = {**OffsetCheckpointFile(str(a / "log-start-offset-checkpoint")).read(),
              **OffsetCheckpointFile(str(b / "log-start-offset-checkpoint")).read()}
    assert starts[("orders", 1)] == 4 and starts[("orders", 0)] == 0


def test_clean_restart_skips_recovery_and_removes_the_marker(tmp_path):
    lm = manager([tmp_path])
    fill(lm.get_or_create_log("t", 0, SCHEMA), 8)
    lm.close()
    lm = manager([tmp_path])
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    log = lm.get_log("t", 0)
    assert log.load_stats["recovered_segments"] == 0
    assert read_values(log)[-1] == b"value-39"
    lm.close()


CRASHING_BROKER = """
import os, sys
sys.path.insert(0, {testdir!r})
from replikafka.broker.storage import LogManager, ManualClock
from storage_testlib import SCHEMA, T0, TINY, fill
lm = LogManager([{logdir!r}], TINY, clock=ManualClock(T0))
log = lm.get_or_create_log("t", 0, SCHEMA)
fill(log, 6)
log.flush()
lm.checkpoint_recovery_points()      # recovery point 30 on disk
fill(log, 4)
print(log.segments()[-1].path)
sys.stdout.flush()
os._exit(0)                          # die without close(): no clean-shutdown marker
"""


def test_unclean_restart_recovers_from_the_recovery_point(tmp_path):
    script = CRASHING_BROKER.format(testdir=os.path.dirname(__file__), logdir=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    active = out.stdout.strip()
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    with open(active, "ab") as f:
        f.write(b"\xff\xff\xff\xff\x10\x00\x00\x00torn")    # a torn write at the end
    lm = manager([tmp_path])
    log = lm.get_log("t", 0)
    assert log.log_end_offset == 50
    assert log.load_stats["truncated_bytes"] == 12
    assert 0 < log.load_stats["recovered_segments"] < len(log.segments())
    assert read_values(log) == [f"value-{o}".encode() for o in range(50)]
    lm.close()


def test_schema_comes_from_disk_or_from_the_provider(tmp_path):
    lm = manager([tmp_path])
    fill(lm.get_or_create_log("t", 0, SCHEMA), 2)
    lm.close()
    seen = []
    # After a clean shutdown the recorded state says it: the provider is not asked.
    lm = manager([tmp_path], topic_schema=lambda topic: seen.append(topic) or SCHEMA)
    assert seen == [] and lm.get_log("t", 0).schema.equals(SCHEMA)
    lm.close()
    os.unlink(tmp_path / CLEAN_SHUTDOWN_FILE)       # as after a crash: loaded from the files
    lm = manager([tmp_path], topic_schema=lambda topic: seen.append(topic) or SCHEMA)
    assert seen == ["t"] and lm.get_log("t", 0).schema.equals(SCHEMA)
    lm.close()
    lm = manager([tmp_path])
    assert lm.get_log("t", 0).schema.equals(SCHEMA)
    lm.close()


def _picture(log):
    return (log.log_start_offset, log.log_end_offset, log.recovery_point,
            [(s.base_offset, s.size, s.next_offset, s.sealed, s.offset_index.entries(), s.time_index.entries())
             for s in log.segments()], log.leader_epoch_cache.entries(), log.topic_id, read_values(log))


def test_clean_start_from_the_recorded_state_reads_no_partition_file(tmp_path):
    lm = manager([tmp_path])
    log = lm.get_or_create_log("t", 0, SCHEMA)
    fill(log, 4, epoch=1)
    fill(log, 5, epoch=3)
    log.delete_records_before(7)
    log.set_topic_id("id-1")
    lm.get_or_create_log("t", 1, SCHEMA)           # empty
    lm.close()
    assert b'"t-0"' in (tmp_path / CLEAN_SHUTDOWN_FILE).read_bytes()
    lm = manager([tmp_path])
    log = lm.get_log("t", 0)
    # Nothing of the partition was read: its indexes are still unloaded.
    assert all(s.offset_index._entries_state is None for s in log.segments())
    assert log.load_stats["trusted_segments"] == len(log.segments())
    from_state = _picture(log)
    assert from_state[-1] == [f"value-{o}".encode() for o in range(7, 45)] and from_state[-2] == "id-1"
    assert [tuple(e) for e in from_state[-3]] == [(1, 7), (3, 20)]
    fill(log, 2, epoch=3)                            # it appends and rolls on as before
    assert read_values(log)[-1] == b"value-54" and lm.get_log("t", 1).log_end_offset == 0
    lm.close()
    lm = manager([tmp_path])
    picture = _picture(lm.get_log("t", 0))
    lm.close()
    (tmp_path / CLEAN_SHUTDOWN_FILE).write_bytes(b"")   # an older broker's marker: loaded from the files
    lm = manager([tmp_path])
    assert _picture(lm.get_log("t", 0)) == picture      # which say the same
    lm.close()


def test_an_unusable_recorded_state_loads_the_logs_from_their_files(tmp_path):
    lm = manager([tmp_path])
    fill(lm.get_or_create_log("t", 0, SCHEMA), 4)
    lm.close()
    (tmp_path / CLEAN_SHUTDOWN_FILE).write_bytes(b'{"version": 1, "schemas": ["%%%"')   # torn, or an older broker's
    lm = manager([tmp_path])
    log = lm.get_log("t", 0)
    assert log.load_stats["recovered_segments"] == 0 and log.segments()[0].offset_index._entries_state is not None
    assert read_values(log)[-1] == b"value-19"
    lm.close()


def test_a_recorded_states_damaged_index_is_dropped_on_first_use(tmp_path):
    lm = manager([tmp_path])
    log = lm.get_or_create_log("t", 0, SCHEMA)
    fill(log, 8)
    lm.close()
    first = log.segments()[0]
    assert first.offset_index.entries()
    with open(first.offset_index.path, "wb") as f:
        f.write(b"\xff" * 16)                   # entries past the data
    lm = manager([tmp_path])
    log = lm.get_log("t", 0)
    assert read_values(log) == [f"value-{o}".encode() for o in range(40)]
    assert log.segments()[0].offset_index.entries() == [] and not os.path.exists(first.offset_index.path)
    lm.close()


def test_topic_config_provider_is_used(tmp_path):
    big = LogConfig(segment_bytes=10**6)
    lm = manager([tmp_path], topic_config=lambda t: big if t == "big" else TINY)
    assert lm.get_or_create_log("big", 0, SCHEMA).config is big
    assert lm.get_or_create_log("small", 0, SCHEMA).config is TINY
    lm.close()


def test_delete_log(tmp_path):
    lm = manager([tmp_path])
    fill(lm.get_or_create_log("gone", 3, SCHEMA), 2)
    lm.get_or_create_log("kept", 0, SCHEMA)
    lm.delete_log("gone", 3)
    assert lm.get_log("gone", 3) is None and not (tmp_path / "gone-3").exists()
    with pytest.raises(UnknownTopicOrPartitionError):
        lm.delete_log("gone", 3)
    lm.close()
    assert ("gone", 3) not in OffsetCheckpointFile(str(tmp_path / "recovery-point-offset-checkpoint")).read()


def test_half_deleted_dirs_are_removed_and_strays_ignored(tmp_path):
    lm = manager([tmp_path])
    fill(lm.get_or_create_log("t", 0, SCHEMA), 1)
    lm.close()
    (tmp_path / "t-1.0123abcd-delete").mkdir()
    (tmp_path / "t-1.0123abcd-delete" / "00000000000000000000.arrows").write_bytes(b"x")
    (tmp_path / "not a partition").mkdir()
    lm = manager([tmp_path])
    assert set(lm.logs()) == {("t", 0)}
    assert not (tmp_path / "t-1.0123abcd-delete").exists()
    lm.close()


def test_a_log_dir_is_owned_by_one_manager(tmp_path):
    lm = manager([tmp_path])
    with pytest.raises(StorageError, match="in use"):
        manager([tmp_path])
    lm.close()
    manager([tmp_path]).close()


def test_illegal_topic_names(tmp_path):
    lm = manager([tmp_path])
    for topic, p in [("a b", 0), ("", 0), ("x/y", 0), ("ok", -1)]:
        with pytest.raises(InvalidTopicError):
            lm.get_or_create_log(topic, p, SCHEMA)
    lm.close()


def test_high_watermark_checkpoint_round_trip(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    lm = manager([a, b])
    lm.get_or_create_log("t", 0, SCHEMA)
    lm.get_or_create_log("t", 1, SCHEMA)
    lm.checkpoint_high_watermarks({("t", 0): 10, ("t", 1): 20, ("unknown", 0): 5})
    assert lm.read_high_watermarks() == {("t", 0): 10, ("t", 1): 20}
    lm.close()


def test_high_watermark_checkpoint_of_one_dir(tmp_path):
    """One log dir: the replica manager's dict is written as it is when every partition
    in it has a log here, and without the others when not."""
    lm = manager([tmp_path / "a"])
    for p in range(3):
        lm.get_or_create_log("t", p, SCHEMA)
    lm.checkpoint_high_watermarks({("t", 0): 10, ("t", 1): 20, ("t", 2): 30})
    assert lm.read_high_watermarks() == {("t", 0): 10, ("t", 1): 20, ("t", 2): 30}
    lm.checkpoint_high_watermarks({("t", 0): 11, ("t", 2): 31, ("gone", 0): 5})
    assert lm.read_high_watermarks() == {("t", 0): 11, ("t", 2): 31}
    lm.close()


def test_a_checkpoint_file_is_kafkas_text_sorted_and_refuses_a_topic_name_it_cannot_hold(tmp_path):
    f = OffsetCheckpointFile(str(tmp_path / "replication-offset-checkpoint"))
    f.write({("b", 10): 7, ("a", 2): 0, ("b", 9): 12345678901})
    assert (tmp_path / "replication-offset-checkpoint").read_bytes() == b"0\n3\na 2 0\nb 9 12345678901\nb 10 7\n"
    assert f.read() == {("a", 2): 0, ("b", 9): 12345678901, ("b", 10): 7}
    for name in ("a b", "", "tab\there"):
        with pytest.raises(ValueError, match="cannot be checkpointed"):
            f.write({("ok", 0): 1, (name, 0): 1, ("ok", 1): 2})
    assert f.read() == {("a", 2): 0, ("b", 9): 12345678901, ("b", 10): 7}, "a refused write leaves the file"


def test_do_work_applies_retention_roll_flush_and_checkpoints(tmp_path):
    clock = ManualClock(T0)
    config = LogConfig(segment_bytes=2048, segment_ms=10_000, retention_ms=60_000,
                       flush_interval_ms=5_000)
    lm = manager([tmp_path], clock=clock, config=config)
    log = lm.get_or_create_log("t", 0, SCHEMA)
    fill(log, 8)                                   # timestamps ~T0, several segments
    first = lm.do_work()
    assert first["flushed"] == 1                    # rolled segments are flushed promptly
    assert log.recovery_point == log.segments()[-1].base_offset
    assert OffsetCheckpointFile(str(tmp_path / "recovery-point-offset-checkpoint")).read() == \
        {("t", 0): log.recovery_point}
    clock.advance(10_000)
    second = lm.do_work()
    assert second["rolled"] == 1 and second["flushed"] == 1
    assert log.recovery_point == log.log_end_offset == 40
    clock.advance(60_000)
    log.append([make_batch(40, 1, ts0=clock.time_ms() - 40)], 0)
    third = lm.do_work()
    assert third["deleted_segments"] >= 1
    assert log.log_start_offset == 40
    assert OffsetCheckpointFile(str(tmp_path / "log-start-offset-checkpoint")).read() == {("t", 0): 40}
    lm.close()


def test_do_work_writes_the_offset_checkpoints_only_after_an_offset_moved(tmp_path, monkeypatch):
    """A pass reads every log's recovery point and log start only when one moved (or the
    set of logs changed, or a file is gone), not each second for 50,000 idle logs."""
    lm = manager([tmp_path])
    a, b = lm.get_or_create_log("t", 0, SCHEMA), lm.get_or_create_log("t", 1, SCHEMA)
    fill(a, 2)
    read = []
    checkpoint = LogManager._checkpoint
    monkeypatch.setattr(LogManager, "_checkpoint", lambda self, name, *rest: read.append(name) or
                        checkpoint(self, name, *rest))
    recovery = OffsetCheckpointFile(str(tmp_path / "recovery-point-offset-checkpoint"))
    starts = OffsetCheckpointFile(str(tmp_path / "log-start-offset-checkpoint"))
    lm.do_work()                                   # new logs: written
    assert len(read) == 2 and recovery.read() == {("t", 0): 0, ("t", 1): 0}
    lm.do_work()
    fill(b, 1)                                     # appended, not flushed: no checkpointed offset moved
    lm.do_work()
    assert len(read) == 2
    a.flush()                                      # a's recovery point moved
    lm.do_work()
    assert len(read) == 4 and recovery.read() == {("t", 0): a.log_end_offset, ("t", 1): 0}
    a.delete_records_before(3)                     # a's log start moved
    lm.do_work()
    assert len(read) == 6 and starts.read() == {("t", 0): 3, ("t", 1): 0}
    os.unlink(recovery.path)                       # a lost file is written again
    lm.do_work()
    assert len(read) == 8 and recovery.read() == {("t", 0): a.log_end_offset, ("t", 1): 0}
    lm.delete_log("t", 1)                          # the set of logs changed
    lm.do_work()
    assert len(read) == 10 and recovery.read() == {("t", 0): a.log_end_offset}
    lm.do_work()
    assert len(read) == 10
    fill(a, 1)
    a.flush()
    monkeypatch.setattr(LogManager, "_checkpoint", lambda self, name, *rest: (_ for _ in ()).throw(
        OSError(5, "Input/output error", recovery.path)))
    with pytest.raises(OSError):                   # a failed write is tried again on the next pass
        lm.do_work()
    monkeypatch.setattr(LogManager, "_checkpoint", lambda self, name, *rest: read.append(name) or
                        checkpoint(self, name, *rest))
    lm.do_work()
    assert len(read) == 12 and recovery.read() == {("t", 0): a.log_end_offset}
    lm.close()


def test_background_thread_runs_and_stops(tmp_path):
    lm = manager([tmp_path], config=LogConfig(segment_bytes=2048, flush_interval_ms=0))
    log = lm.get_or_create_log("t", 0, SCHEMA)
    lm.start_background(interval_ms=10)
    fill(log, 3)
    deadline = time.monotonic() + 10
    while log.recovery_point < 15 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.recovery_point == 15
    lm.stop_background()
    assert lm._thread is None
    lm.close()


def _open_files_under(root) -> set[str]:
    """Paths under `root` this process holds open (descriptors) or mapped."""
    root = str(root)
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root) and not target.endswith(".lock"):
            held.add(target)
    with open("/proc/self/maps") as f:
        held |= {line.split()[-1] for line in f if line.rstrip().endswith(".arrows") and root in line}
    return held


def test_descriptors_and_mappings_follow_use_not_partition_count(tmp_path):
    clock = ManualClock(T0)
    lm = manager([tmp_path], clock=clock, idle_release_ms=1000)
    logs = [lm.get_or_create_log("t", p, SCHEMA) for p in range(20)]
    assert _open_files_under(tmp_path) == set()          # created: nothing held
    fill(logs[3], 6)                                     # several segments (TINY rolls)
    read_values(logs[3])
    assert {os.path.dirname(p) for p in _open_files_under(tmp_path)} == {logs[3].dir}
    clock.advance(999)
    assert lm.do_work()["released"] == 0                 # not idle for long enough yet
    clock.advance(1)
    assert lm.do_work()["released"] == 1
    assert _open_files_under(tmp_path) == set()
    fill(logs[3], 1)                                     # reopened on use
    assert read_values(logs[3])[-1] == b"value-34"
    lm.close()
    del logs    # closed logs keep their mappings for readers still holding them
    lm = manager([tmp_path], clock=clock)
    assert _open_files_under(tmp_path) == set()          # loading holds nothing either
    assert read_values(lm.get_log("t", 3))[-1] == b"value-34"
    lm.close()


def test_a_pass_skips_logs_given_back_already_but_not_one_holding_a_file_again(tmp_path, monkeypatch):
    """Each maintenance pass looks at every log (50,000 of them each second): one that
    gave its files and maps back and opened none since is passed over without its lock;
    one holding a descriptor again, even one its use did not count, gives it back."""
    clock = ManualClock(T0)
    lm = manager([tmp_path], clock=clock, idle_release_ms=1000)
    logs = [lm.get_or_create_log("t", p, SCHEMA) for p in range(5)]
    for lg in logs:
        fill(lg, 1)
    clock.advance(1000)
    assert lm.do_work()["released"] == 5
    locked = []
    real = type(logs[0])._release_locked
    monkeypatch.setattr(type(logs[0]), "_release_locked", lambda self: locked.append(self) or real(self))
    clock.advance(5000)
    assert lm.do_work()["released"] == 0 and locked == []
    logs[2]._segments[-1]._open_for_append()         # a descriptor opened outside an append or read
    assert lm.do_work()["released"] == 1 and locked == [logs[2]]
    assert _open_files_under(tmp_path) == set()
    lm.close()


def test_a_clean_close_syncs_each_file_system_once_instead_of_fsyncing_every_log(tmp_path, monkeypatch):
    """Closing thousands of logs: each writes what it holds without an fsync, then one
    syncfs per log dir, before the checkpoints and the clean-shutdown marker."""
    from replikafka.broker.storage import log_manager as lm_module
    lm = LogManager([str(tmp_path / "a"), str(tmp_path / "b")], TINY)
    for p in range(30):
        fill(lm.get_or_create_log("t", p, SCHEMA), 3)
    events: list[str] = []
    real_fsync, real_sync = os.fsync, lm_module.sync_filesystem
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(lm_module, "sync_filesystem", lambda path: (events.append("syncfs"), real_sync(path))[1])
    lm.close()
    monkeypatch.undo()
    assert events.count("syncfs") == 2
    first_sync = events.index("syncfs")
    # Before the syncs nothing; after, only the checkpoints and the markers (2 fsyncs each).
    assert first_sync == 0 and events.count("fsync") <= 2 * 2 * 3, events
    with LogManager([str(tmp_path / "a"), str(tmp_path / "b")], TINY) as again:
        assert all(lg.load_stats["recovered_segments"] == 0 for lg in again.logs().values())
        assert [read_values(again.get_log("t", p)) for p in range(30)] == [[value(o) for o in range(15)]] * 30


def test_at_most_open_logs_max_logs_hold_files_the_least_recently_used_give_theirs_back(tmp_path):
    """A burst of use of more logs than the cap (a producer spraying partitions within the
    idle window): past `open_logs_max` logs holding files and maps, the least recently used
    give theirs back at once, down to 90% of the cap; every log stays readable and writable
    (it reopens on its next use) and nothing written is lost."""
    clock = ManualClock(T0)
    lm = manager([tmp_path], clock=clock, idle_release_ms=3_600_000, open_logs_max=10)
    logs = [lm.get_or_create_log("t", p, SCHEMA) for p in range(40)]
    for i, lg in enumerate(logs):
        clock.advance(1)           # each used later than the one before
        fill(lg, 2)
        holding = {os.path.dirname(p) for p in _open_files_under(tmp_path)}
        assert len(holding) <= 10, (i, len(holding))
        assert logs[i].dir in holding                    # the log in use is never the one released
    assert len(lm.open_logs) <= 10 and lm.open_logs.released >= 30
    holding = {os.path.dirname(p) for p in _open_files_under(tmp_path)}
    assert holding <= {lg.dir for lg in logs[-10:]}     # the most recently used ones keep theirs
    # Reads count as use too, and every log still holds what was written to it.
    assert [read_values(lg) for lg in logs] == [[value(o) for o in range(10)]] * 40
    assert len({os.path.dirname(p) for p in _open_files_under(tmp_path)}) <= 10
    fill(logs[0], 1)
    assert read_values(logs[0])[-1] == value(14)
    lm.close()
    assert len(lm.open_logs) == 0
    with manager([tmp_path], clock=clock) as again:
        assert [read_values(again.get_log("t", p)) for p in range(1, 40)] == [[value(o) for o in range(10)]] * 39


def test_a_log_busy_in_another_thread_is_not_released_for_the_cap_and_stays_counted(tmp_path):
    from replikafka.broker.storage.open_logs import OpenLogs
    clock = ManualClock(T0)
    lm = manager([tmp_path], clock=clock, idle_release_ms=3_600_000, open_logs_max=2)
    a, b, c = (lm.get_or_create_log("t", p, SCHEMA) for p in range(3))
    fill(a, 1)
    clock.advance(1)
    fill(b, 1)
    clock.advance(1)
    import threading
    held, done = threading.Event(), threading.Event()

    def hold_a():
        with a._lock:               # another thread in the middle of an append to `a`
            held.set()
            done.wait(10)
    t = threading.Thread(target=hold_a)
    t.start()
    held.wait(10)
    fill(c, 1)                      # over the cap: `a` is the least recently used, but busy
    assert a.dir in {os.path.dirname(p) for p in _open_files_under(tmp_path)}
    assert a in lm.open_logs._logs and len(lm.open_logs) == 2
    done.set()
    t.join()
    assert isinstance(lm.open_logs, OpenLogs)
    lm.close()


def test_the_derived_cap_follows_the_open_file_limit_and_the_map_limit():
    from replikafka.broker.storage.open_logs import RESERVED_DESCRIPTORS, derived_max_logs
    assert derived_max_logs(20_000, 65_530) == 20_000 - RESERVED_DESCRIPTORS
    assert derived_max_logs(1 << 20, 65_530) == 65_530 - RESERVED_DESCRIPTORS
    assert derived_max_logs(256, 65_530) == 16             # a tiny limit still leaves some room
    assert derived_max_logs() >= 16


def test_out_of_descriptors_is_told_apart_from_a_failed_disk():
    import errno
    from replikafka.broker.storage.open_logs import is_resource_exhaustion
    assert is_resource_exhaustion(OSError(errno.EMFILE, "Too many open files"))
    wrapped = StorageError("write failed")
    wrapped.__cause__ = OSError(errno.ENFILE, "File table overflow")
    assert is_resource_exhaustion(wrapped)
    assert not is_resource_exhaustion(OSError(errno.EIO, "Input/output error"))
    assert not is_resource_exhaustion(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_resource_exhaustion(StorageError("no cause"))
