"""The broker's logs across its log dirs.

On disk, per log dir::

    [topic]-[partition]/                 one Log each (see `log`)
    [topic]-[partition].<id>-delete/     a log being deleted (removed at load)
    replication-offset-checkpoint        high watermarks (written for the replica manager)
    recovery-point-offset-checkpoint     per partition: offsets below are fsynced
    log-start-offset-checkpoint          per partition: the log start offset
    .kafka_cleanshutdown                 present only between a clean close and the next load;
                                         holds the logs' state at the close (JSON, below)
    .lock                                flock'd while a LogManager owns the dir

At construction every partition dir is loaded; a dir without the clean
marker is recovered from its checkpointed recovery points. The marker is
deleted once loading is done and written again by `close()`. The marker
holds what a clean start needs of every log, so that start reads no file of
any partition that was in it (50,000 partitions start in seconds; their
indexes load on first use)::

    {"version": 1, "schemas": [<base64 schema message>, ...],
     "logs": {"<topic>-<partition>": {"schema": <index into schemas>, "start": <log start>,
              "segments": [[base, size, next offset, sealed, schema size, bytes since index entry], ...],
              "epochs": [[epoch, start offset], ...], "topic_id": "<id>"}}}

An empty or unreadable marker (an older broker's) still means a clean
shutdown: those logs are loaded from their files without recovery. Loading and
creating logs fsync nothing per partition (each log's first flush makes its
new files and directory durable), and a log holds descriptors and mappings
only while used: `do_work` releases those of logs idle for `idle_release_ms`,
so open files and mappings follow the busy partitions, not the partition count;
and at most `open_logs_max` logs hold them at once (`open_logs`): using one more
releases the least recently used ones, so a burst of writes to more partitions
than the process may open files for does not run out of descriptors.

`do_work(now_ms)` is one pass of background maintenance (retention,
time-based roll, time-based flush, idle release, checkpoints);
`start_background` runs it on a stoppable daemon thread.

Thread-safety: thread-safe. A lock guards the table of logs; each Log is
itself thread-safe; do_work may run concurrently with get/create/delete.
"""
from __future__ import annotations

import base64
import concurrent.futures
import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
from typing import Callable

import pyarrow as pa

from replikafka.errors import InvalidTopicError, StorageError, UnknownTopicOrPartitionError
from replikafka.records import validate_topic_name
from replikafka.broker.bulk_work import paused_gc

from .checkpoints import (LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT,
                          REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile, TopicPartition)
from .clock import SYSTEM_CLOCK
from . import batch_format as bf
from .fileio import atomic_write_bytes, fsync_dir, sync_filesystem
from .log import Log, validate_schema
from .log_config import LogConfig
from .open_logs import OpenLogs, derived_max_logs

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
CLEAN_STATE_VERSION = 1
LOCK_FILE = ".lock"
_PARTITION_DIR = re.compile(r"^(.+)-(\d{1,9})$")
#: Suffix of a directory found in a log dir that is not a partition log: moved aside, never loaded.
STRAY_SUFFIX = "-stray"
_NOT_LOGS = ("lost+found",)


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> TopicPartition | None:
    """(topic, partition) of a partition log dir name; None if the name is not one
    (the topic by Kafka's rule, the same check every wire entry point makes)."""
    m = _PARTITION_DIR.match(name)
    if not m or name.endswith("-delete"):
        return None
    try:
        validate_topic_name(m.group(1))
    except InvalidTopicError:
        return None
    return m.group(1), int(m.group(2))


def _move_aside(parent: str, name: str) -> None:
    """A directory that is not a partition log: log it and rename it out of the way, so a
    bad name never stops the broker from starting (and is never loaded or deleted)."""
    src = os.path.join(parent, name)
    dst = os.path.join(parent, f"{name}.{int(time.time() * 1000)}{STRAY_SUFFIX}")
    try:
        os.rename(src, dst)
        log.error("%s is not a partition log (<topic>-<partition>): moved aside to %s", src, dst)
    except OSError as exc:
        log.error("%s is not a partition log and cannot be moved aside (%s): ignored", src, exc)


class _LogDir:
    """One log dir: its path, lock and checkpoint files."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StorageError(f"log dir {self.path} is in use by another process") from None
        self.high_watermarks = OffsetCheckpointFile(os.path.join(self.path, REPLICATION_OFFSET_CHECKPOINT))
        self.recovery_points = OffsetCheckpointFile(os.path.join(self.path, RECOVERY_POINT_CHECKPOINT))
        self.log_starts = OffsetCheckpointFile(os.path.join(self.path, LOG_START_OFFSET_CHECKPOINT))
        self.clean_marker = os.path.join(self.path, CLEAN_SHUTDOWN_FILE)
        self.last_written: dict[str, dict] = {}   # checkpoint name -> last content (skip rewrites)

    def release(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None


class LogManager:
    """Owns the log dirs and every partition Log in them. Thread-safe."""

    def __init__(self, log_dirs: list[str], default_config: LogConfig = LogConfig(), *,
                 topic_config: Callable[[str], LogConfig] | None = None,
                 topic_schema: Callable[[str], pa.Schema | None] | None = None,
                 clock=None, idle_release_ms: int = 60_000, load_threads: int = 8,
                 open_logs_max: int = 0):
        """Lock and load every log dir.

        `topic_config(topic)` gives a topic's LogConfig (default: `default_config`).
        `idle_release_ms`: a log neither written nor read for this long gives back
        its descriptors and mappings (ms).
        `topic_schema(topic)` gives its schema; None (or no callable) means the
        schema stored in the log's own segments.
        `load_threads`: logs read (and recovered) from their files at once, per log dir,
        and logs flushed at once by `close()`.
        `open_logs_max`: at most this many logs hold files and maps at once (`OpenLogs`);
        0 derives it from the process's open-file limit and the kernel's map limit.
        """
        if not log_dirs:
            raise StorageError("no log dirs configured")
        self._topic_config = topic_config or (lambda topic: default_config)
        self._topic_schema = topic_schema or (lambda topic: None)
        self._clock = clock or SYSTEM_CLOCK
        self._idle_release_ms = idle_release_ms
        self.open_logs = OpenLogs(open_logs_max or derived_max_logs())
        self._load_threads = max(1, load_threads)
        self._lock = threading.RLock()
        self._logs: dict[TopicPartition, Log] = {}
        # Set when a log's recovery point or log start moved, or the set of logs changed:
        # do_work writes the recovery-point and log-start checkpoints only then. An Event,
        # not a method of this manager, so that a log refers to no table of logs (no cycle:
        # a dropped log's mappings go with its last reference).
        self._checkpoints_stale = threading.Event()
        self._checkpoints_stale.set()
        self._log_dir_of: dict[TopicPartition, _LogDir] = {}
        self._dirs: list[_LogDir] = []
        self._offline_dirs: set[str] = set()    # KIP-112: dirs taken offline by an I/O error
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        try:
            for path in log_dirs:
                self._dirs.append(_LogDir(path))
            with paused_gc():     # every log's objects at once (broker/bulk_work.py)
                for d in self._dirs:
                    self._load_dir(d)
        except BaseException:
            for d in self._dirs:
                d.release()
            raise

    # ---- loading -----------------------------------------------------------------
    def _load_dir(self, d: _LogDir) -> None:
        started = time.monotonic()
        clean = os.path.exists(d.clean_marker)
        states, state_schemas = self._read_clean_state(d) if clean else ({}, [])
        recovery_points = d.recovery_points.read()
        log_starts = d.log_starts.read()
        schemas: dict[str, pa.Schema | None] = {}   # asked once per topic, not once per partition
        configs: dict[str, LogConfig] = {}
        from_state = 0
        from_files: list[tuple[TopicPartition, str]] = []    # opened (and recovered) by the pool below
        for name in sorted(os.listdir(d.path)):
            full = os.path.join(d.path, name)
            state = states.get(name)
            if state is None and not os.path.isdir(full):
                continue
            if name.endswith("-delete"):
                shutil.rmtree(full, ignore_errors=True)     # a deletion interrupted by a crash
                continue
            if name.endswith(STRAY_SUFFIX) or name in _NOT_LOGS:
                continue
            tp = parse_partition_dir(name)
            if tp is None:
                _move_aside(d.path, name)
                continue
            if tp in self._logs:
                raise StorageError(f"partition {tp} has a log in both {self._log_dir_of[tp].path} "
                                   f"and {d.path}")
            if tp[0] not in configs:
                configs[tp[0]] = self._topic_config(tp[0])
            if state is not None:
                schema, schema_msg = state_schemas[state["schema"]]
                self._logs[tp] = self._adopt(Log.from_state(full, configs[tp[0]], schema, schema_msg, state,
                                                            clock=self._clock, open_logs=self.open_logs))
                self._log_dir_of[tp] = d
                from_state += 1
                continue
            if tp[0] not in schemas:
                schemas[tp[0]] = self._topic_schema(tp[0])
            from_files.append((tp, full))

        def open_from_files(tp: TopicPartition, full: str) -> Log | None:
            schema = schemas[tp[0]]
            if schema is None and not Log._list_segments(full):
                # A log of an unknown (deleted) topic that never got a segment: nothing to keep.
                log.warning("removing %s: empty log of a topic whose schema is unknown", full)
                shutil.rmtree(full, ignore_errors=True)
                return None
            return Log.open(full, configs[tp[0]], schema, recovery_point=recovery_points.get(tp, 0),
                            log_start_offset=log_starts.get(tp, 0), clock=self._clock, clean=clean,
                            open_logs=self.open_logs)

        # Reading and recovering logs waits on the disk far more than it computes (a cold
        # directory read each): several at once, as Kafka's num.recovery.threads.per.data.dir.
        with concurrent.futures.ThreadPoolExecutor(self._load_threads, thread_name_prefix="log-load") as pool:
            opened = [(tp, pool.submit(open_from_files, tp, full)) for tp, full in from_files]
            for tp, done in opened:
                log_ = done.result()
                if log_ is not None:
                    self._logs[tp] = self._adopt(log_)
                    self._log_dir_of[tp] = d
        if clean:
            os.unlink(d.clean_marker)
            fsync_dir(d.path)
        log.info("loaded %d logs from %s in %.3fs (%s)", sum(1 for v in self._log_dir_of.values() if v is d),
                 d.path, time.monotonic() - started,
                 f"clean shutdown, {from_state} from its recorded state" if clean else "recovered")

    @staticmethod
    def _read_clean_state(d: _LogDir) -> tuple[dict[str, dict], list[tuple[pa.Schema, bytes]]]:
        """The logs' state recorded in the clean-shutdown marker (format: module doc):
        (dir name -> state, [(schema, schema message)]); empty if the marker holds none
        or cannot be used (those logs then load from their files)."""
        try:
            with open(d.clean_marker, "rb") as f:
                raw = f.read()
            if not raw:
                return {}, []
            doc = json.loads(raw)
            if doc.get("version") != CLEAN_STATE_VERSION:
                raise ValueError(f"version {doc.get('version')!r}")
            schemas = []
            for text in doc["schemas"]:
                msg = base64.b64decode(text)
                schema, size = bf.read_schema_message(msg, len(msg), d.clean_marker)
                validate_schema(schema)
                schemas.append((schema, msg[:size]))
            return doc["logs"], schemas
        except Exception as exc:     # never fatal: the logs' own files are the truth
            log.warning("%s: cannot use the recorded log state (%s); loading the logs from their files",
                        d.clean_marker, exc)
            return {}, []

    def _clean_state(self, d: _LogDir) -> bytes:
        """The clean-shutdown marker's content for dir `d` (after every log closed)."""
        schemas: dict[bytes, int] = {}
        logs: dict[str, dict] = {}
        for tp, log_ in self._logs.items():
            if self._log_dir_of[tp] is not d:
                continue
            state = log_.state()
            if state is None:
                continue
            state["schema"] = schemas.setdefault(log_.schema_message, len(schemas))
            logs[partition_dir_name(*tp)] = state
        return json.dumps(dict(version=CLEAN_STATE_VERSION,
                               schemas=[base64.b64encode(m).decode() for m in schemas],
                               logs=logs), separators=(",", ":")).encode()

    # ---- logs ----------------------------------------------------------------------
    @property
    def log_dirs(self) -> list[str]:
        return [d.path for d in self._dirs]

    def get_log(self, topic: str, partition: int) -> Log | None:
        with self._lock:
            return self._logs.get((topic, partition))

    def logs(self) -> dict[TopicPartition, Log]:
        with self._lock:
            return dict(self._logs)

    def get_or_create_log(self, topic: str, partition: int, schema: pa.Schema,
                          config: LogConfig | None = None) -> Log:
        """The partition's log, created empty in the least-loaded log dir if absent."""
        validate_topic_name(topic)
        if partition < 0:
            raise InvalidTopicError(f"illegal partition {topic!r}/{partition}")
        with self._lock:
            self._check_open()
            tp = (topic, partition)
            existing = self._logs.get(tp)
            if existing is not None:
                return existing
            online = [x for x in self._dirs if x.path not in self._offline_dirs]
            if not online:
                raise StorageError("every log dir is offline")
            d = online[0] if len(online) == 1 else \
                min(online, key=lambda x: sum(1 for v in self._log_dir_of.values() if v is x))
            path = os.path.join(d.path, partition_dir_name(topic, partition))
            log_ = Log.open(path, config or self._topic_config(topic), schema, clock=self._clock,
                            open_logs=self.open_logs)
            self._logs[tp] = self._adopt(log_)
            self._log_dir_of[tp] = d
            return log_

    # ---- log dir failure (KIP-112) ----------------------------------------------------
    def dir_of(self, topic: str, partition: int) -> str | None:
        with self._lock:
            d = self._log_dir_of.get((topic, partition))
            return d.path if d is not None else None

    def fail_dir(self, path: str, reason: str) -> list[TopicPartition]:
        """Take log dir ``path`` offline after an I/O error: its logs leave service (closed
        without flushing: the disk failed; recovery repairs any torn tail at the next start)
        and no new log goes there. Returns the partitions it held (empty if already offline)."""
        with self._lock:
            if path in self._offline_dirs:
                return []
            self._offline_dirs.add(path)
            gone = [tp for tp, d in self._log_dir_of.items() if d.path == path]
            logs = [self._logs.pop(tp) for tp in gone]
            self._checkpoints_stale.set()
            for tp in gone:
                self._log_dir_of.pop(tp)
        log.error("log dir %s is offline (%s): %d partitions leave service until the broker restarts",
                  path, reason, len(gone))
        for log_ in logs:
            log_.abandon()
        return gone

    def online_dirs(self) -> list[str]:
        with self._lock:
            return [d.path for d in self._dirs if d.path not in self._offline_dirs]

    def delete_log(self, topic: str, partition: int) -> None:
        with self._lock:
            tp = (topic, partition)
            log_ = self._logs.pop(tp, None)
            if log_ is None:
                raise UnknownTopicOrPartitionError(f"no log for {topic}-{partition}")
            self._log_dir_of.pop(tp)
            self._checkpoints_stale.set()
        log_.delete()

    # ---- checkpoints -------------------------------------------------------------
    def _adopt(self, log_: Log) -> Log:
        """A log joining the table: it marks the checkpoints stale whenever its offsets move."""
        log_.on_offsets_moved = self._checkpoints_stale.set
        self._checkpoints_stale.set()
        return log_

    def checkpoint_recovery_points(self) -> None:
        self._checkpoint(RECOVERY_POINT_CHECKPOINT, lambda d: d.recovery_points,
                         lambda lg: lg.recovery_point)

    def checkpoint_log_start_offsets(self) -> None:
        self._checkpoint(LOG_START_OFFSET_CHECKPOINT, lambda d: d.log_starts,
                         lambda lg: lg.log_start_offset)

    def checkpoint_high_watermarks(self, high_watermarks: dict[TopicPartition, int]) -> None:
        """Write the replica manager's high watermarks, each into its log's dir."""
        with self._lock:
            online = [d for d in self._dirs if d.path not in self._offline_dirs]
            if len(self._dirs) == len(online) == 1 and high_watermarks.keys() <= self._log_dir_of.keys():
                per_dir = {online[0]: high_watermarks}     # the one dir holds them all: no split (50,000 lookups)
            else:
                per_dir = {d: {} for d in online}
                for tp, hw in high_watermarks.items():
                    d = self._log_dir_of.get(tp)
                    if d is not None and d in per_dir:
                        per_dir[d][tp] = hw
        for d, offsets in per_dir.items():
            self._write_if_changed(d, REPLICATION_OFFSET_CHECKPOINT, d.high_watermarks, offsets)

    def read_high_watermarks(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for d in self._dirs:
            out.update(d.high_watermarks.read())
        return out

    def _checkpoint(self, name: str, file_of, value_of) -> None:
        with self._lock:
            per_dir: dict[_LogDir, dict] = {d: {} for d in self._dirs if d.path not in self._offline_dirs}
            for tp, log_ in self._logs.items():
                per_dir[self._log_dir_of[tp]][tp] = value_of(log_)
        for d, offsets in per_dir.items():
            self._write_if_changed(d, name, file_of(d), offsets)

    @staticmethod
    def _write_if_changed(d: _LogDir, name: str, file: OffsetCheckpointFile, offsets: dict) -> None:
        # Unchanged content is not rewritten: a checkpoint costs two fsyncs.
        if d.last_written.get(name) == offsets and file.exists():
            return
        file.write(offsets)
        d.last_written[name] = dict(offsets)

    # ---- background work -------------------------------------------------------------
    def do_work(self, now_ms: int | None = None) -> dict[str, int]:
        """One maintenance pass over every log: retention, time-based roll,
        time-based flush (and flush of rolled segments), release of idle logs'
        descriptors and mappings, then the recovery-point
        and log-start checkpoints if an offset they hold moved (or a file is missing).
        Returns counts of what it did."""
        now = self._clock.time_ms() if now_ms is None else now_ms
        done = dict(deleted_segments=0, rolled=0, flushed=0, released=0)
        for log_ in self.logs().values():
            try:
                done["deleted_segments"] += log_.enforce_retention(now)
                done["rolled"] += log_.roll_if_due(now)
                done["flushed"] += log_.flush_if_due(now)
                done["released"] += log_.release_if_idle(now, self._idle_release_ms)
            except (OSError, StorageError):
                log.exception("maintenance of %s failed", log_.dir)
        online = [d for d in self._dirs if d.path not in self._offline_dirs]
        if self._checkpoints_stale.is_set() or not all(d.recovery_points.exists() and d.log_starts.exists()
                                              for d in online):
            self._checkpoints_stale.clear()   # before reading the offsets: a move meanwhile marks it again
            try:
                self.checkpoint_recovery_points()
                self.checkpoint_log_start_offsets()
            except BaseException:
                self._checkpoints_stale.set()   # not written: the next pass tries again
                raise
        return done

    def start_background(self, interval_ms: int = 1000) -> None:
        """Run do_work every `interval_ms` on a daemon thread until stop_background."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._background_loop, args=(interval_ms,),
                                            name="log-manager", daemon=True)
            self._thread.start()

    def _background_loop(self, interval_ms: int) -> None:
        while not self._stop.wait(interval_ms / 1000):
            try:
                self.do_work()
            except Exception:
                log.exception("log manager background pass failed")

    def stop_background(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    # ---- shutdown ------------------------------------------------------------------
    def close(self) -> None:
        """Clean shutdown: stop maintenance, flush and close every log, write the
        checkpoints, then the clean-shutdown marker in each online dir. An offline dir
        (KIP-112) is left as a crash leaves it: its logs were abandoned, not closed, so
        the next start must recover them from their files, and its disk may be full."""
        self.stop_background()
        with self._lock:
            if self._closed:
                return
            # Each log writes what it holds in memory (index entries, its epoch history)
            # without an fsync, and each log dir's file system is then synced once
            # (syncfs) before the checkpoints and the marker record the logs as
            # flushed: a clean shutdown of 50,000 just-created logs made 150,000
            # fsyncs (data file, both indexes, directory), 80 s on the shared disk.
            with concurrent.futures.ThreadPoolExecutor(self._load_threads, thread_name_prefix="log-close") as pool:
                for done in [pool.submit(log_.close, sync_parent=False, fsync=False)
                             for log_ in self._logs.values()]:
                    done.result()
            online = [d for d in self._dirs if d.path not in self._offline_dirs]
            for d in online:
                sync_filesystem(d.path)
            self.checkpoint_recovery_points()
            self.checkpoint_log_start_offsets()
            for d in online:
                atomic_write_bytes(d.clean_marker, self._clean_state(d))
            for d in self._dirs:
                d.release()
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the log manager is closed")

    def __enter__(self) -> "LogManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
