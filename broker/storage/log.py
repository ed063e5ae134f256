"""One partition's log: a directory `[topic]-[partition]/` of segments.

On disk, per partition directory::

    <20-digit base offset>.arrows      Arrow IPC stream segments (see `segment`)
    <20-digit base offset>.index       sparse offset index  (see `offset_index`)
    <20-digit base offset>.timeindex   time index           (see `time_index`)
    leader-epoch-checkpoint            epoch history        (see `leader_epoch_cache`)
    partition.metadata                 the topic id (KIP-516): "version: 0\ntopic_id: <id>\n"

Offsets are dense: the record at row r of the stored batch with base offset b
has offset b + r. Segment i+1's base offset is segment i's end offset. The
last segment is the active one (appends go there); the others are sealed.

Thread-safety: thread-safe. One lock serialises every mutation (append,
roll, truncation, retention, close, and `release_if_idle` / `release_for_cap`,
which give an idle log's descriptors and mappings back: they reopen on the next
use; the second only if the lock is free, for the broker's cap on open logs,
`OpenLogs`). Readers take no lock: they read one
immutable `_View` (segment tuple, log start, log end) published after each
mutation and read zero-copy from the segments' mappings. Data files never
shrink in place and a truncated or deleted segment object is retired (it keeps
its mapping, never maps the replacement file), so a reader racing a
truncation sees the old or the new records, never a mix of one file's index
and another's bytes; a reader whose view went stale retries on the new view.
fsync runs outside the mutation lock (serialised by a flush lock).
"""
from __future__ import annotations

import bisect
import logging
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from replikafka.errors import (CorruptRecordError, InvalidConfigError, InvalidOffsetError,
                               InvalidRequestError, InvalidSchemaError, OffsetOutOfRangeError,
                               RecordTooLargeError, StorageError)

from replikafka.records import conform_batch, has_dictionary

from . import batch_format as bf
from . import raw_streams
from .clock import SYSTEM_CLOCK
from .fileio import TMP_SUFFIX, atomic_write_bytes, fsync_dir
from .leader_epoch_cache import LEADER_EPOCH_CHECKPOINT, LeaderEpochFileCache
from .log_config import LogConfig
from .open_logs import OpenLogs
from .segment import DATA_SUFFIX, LogSegment, StoredBatchRef

log = logging.getLogger(__name__)

_SEGMENT_FILE = re.compile(r"^(\d{20})(\.arrows|\.index|\.timeindex)$")
_INT32_MAX = 2**31 - 1
TIMESTAMP_COLUMN = "timestamp"
PARTITION_METADATA_FILE = "partition.metadata"


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append wrote."""

    first_offset: int
    last_offset: int           # first_offset - 1 when nothing was appended
    record_count: int
    max_timestamp_ms: int
    size_bytes: int            # stored bytes written
    headers: tuple = ()        # append_raw: the appended batches' headers (for producer state)


@dataclass(frozen=True, slots=True)
class LogReadResult:
    """Records read by `Log.read`."""

    batches: list              # list[pa.RecordBatch], zero-copy, first row at first_offset
    first_offset: int
    record_count: int
    size_bytes: int            # stored size of the batches the slices come from


class StoredBytes:
    """An IPC stream held as zero-copy pieces: the schema message, then stored batch
    messages as slices of the segments' mappings (a mapping stays valid while a slice
    of it lives, even after a truncation or deletion: data files never shrink in
    place). What a follower fetch sends: the wire answer joins the pieces once
    (`replica_fetch_codec.encode`), with no join of its own here. `bytes()` joins
    them (a consumer's protobuf answer, tests, the in-process simulation). Immutable."""

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: Sequence = ()):
        self.pieces = tuple(pieces)
        self.size = sum(len(p) for p in self.pieces)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)

    def __repr__(self) -> str:
        return f"StoredBytes({len(self.pieces)} pieces, {self.size} bytes)"


@dataclass(frozen=True, slots=True)
class RawReadResult:
    """Stored batches read by `Log.read_raw`, for a follower's `append_raw`."""

    stored: StoredBytes        # IPC stream: schema message + whole stored batch messages; empty if none
    first_offset: int          # base offset of the first batch (may be below the requested offset)
    record_count: int
    last_epoch: int            # leader epoch of the last batch, -1 if none

    @property
    def data(self) -> bytes:
        """The stream as one `bytes` (a copy: the fetch path sends `stored` as is)."""
        return bytes(self.stored)


# One stored batch as `Log.read_stored` returns it: the segment's own reference
# (`message`: the stored IPC message verbatim, zero-copy over the mapping; `batch`:
# its RecordBatch, buffers inside `message`, decoded when framed or on first use).
StoredBatch = StoredBatchRef


@dataclass(frozen=True, slots=True)
class StoredReadResult:
    """What `Log.read_stored` returns: whole stored batches, oldest first."""

    batches: list              # list[StoredBatch]
    end_offset: int            # the requested range ends here (exclusive): the last batch may go past it
    size_bytes: int            # stored size of the batches


@dataclass(frozen=True, slots=True)
class ClippedBatch:
    """A batch cut to a reader's exact range by `clip_stored`."""

    first_offset: int
    batch: pa.RecordBatch
    verbatim: StoredBatch | None   # the stored batch, when this is all of it, unprojected


def clip_stored(stored: Sequence[StoredBatch], start: int, end: int,
                projection: Sequence[str] | None = None) -> list[ClippedBatch]:
    """The stored batches cut to exactly [start, end), then projected. Only the edge
    batches are sliced; a projection selects the columns' buffers (zero-copy). A batch
    left whole and unprojected keeps its stored message (`verbatim`) to send as is."""
    out = []
    for sb in stored:
        lo = max(start - sb.base_offset, 0)
        hi = min(end - sb.base_offset, sb.record_count)
        if hi <= lo:
            continue
        batch = sb.batch
        whole = lo == 0 and hi == sb.record_count
        if not whole:
            batch = batch.slice(lo, hi - lo)
        if projection is not None:
            batch = batch.select(list(projection))
        out.append(ClippedBatch(sb.base_offset + lo, batch, sb if whole and projection is None else None))
    return out


@dataclass(frozen=True, slots=True)
class _View:
    """What a reader needs, published atomically after every mutation."""

    segments: tuple[LogSegment, ...]
    bases: tuple[int, ...]
    log_start: int
    log_end: int


def _check_body_crcs(computed: Sequence[int], sent: Sequence[int]) -> None:
    for i, (got, want) in enumerate(zip(computed, sent)):
        if got != want:
            raise CorruptRecordError(f"batch {i}: CRC-32C mismatch: the producer sent {want:08x}, its body "
                                     f"as received hashes to {got:08x}")


def validate_schema(schema: pa.Schema) -> None:
    """A log schema needs a `timestamp` column of timestamp[ms] and no dictionary
    types (a dictionary batch would break one-message-per-batch framing)."""
    idx = schema.get_field_index(TIMESTAMP_COLUMN)
    if idx < 0:
        raise InvalidSchemaError(f"the log schema needs a '{TIMESTAMP_COLUMN}' column: {schema}")
    ts_type = schema.field(idx).type
    if not pa.types.is_timestamp(ts_type) or ts_type.unit != "ms":
        raise InvalidSchemaError(f"'{TIMESTAMP_COLUMN}' must be timestamp[ms], not {ts_type}")

    for field in schema:
        if has_dictionary(field.type):
            raise InvalidSchemaError(f"column {field.name!r} uses a dictionary type ({field.type}), "
                                     f"which the log does not store")


def _validate_config(config: LogConfig) -> None:
    if not 0 < config.segment_bytes <= _INT32_MAX:
        raise InvalidConfigError(f"segment_bytes must be in [1, {_INT32_MAX}], got {config.segment_bytes}")
    if config.segment_ms <= 0:
        raise InvalidConfigError(f"segment_ms must be positive, got {config.segment_ms}")
    if config.index_interval_bytes < 0:
        raise InvalidConfigError(f"index_interval_bytes must be >= 0, got {config.index_interval_bytes}")
    if config.max_message_bytes <= 0:
        raise InvalidConfigError(f"max_message_bytes must be positive, got {config.max_message_bytes}")
    if config.flush_interval_messages <= 0 or config.flush_interval_ms < 0:
        raise InvalidConfigError("flush_interval_messages must be positive and flush_interval_ms >= 0")
    if config.message_timestamp_type not in ("CreateTime", "LogAppendTime"):
        raise InvalidConfigError(f"message_timestamp_type must be CreateTime or LogAppendTime, "
                                 f"got {config.message_timestamp_type!r}")


def _next_sequence(sequence: int, increment: int) -> int:
    """Producer sequences wrap to 0 after int32 max, as in Kafka."""
    return (sequence + increment) % (_INT32_MAX + 1)


def _nothing() -> None:
    pass


class Log:
    """One partition's log (layout and thread-safety: module doc). Create with `Log.open`."""

    def __init__(self, directory: str, config: LogConfig, schema: pa.Schema, clock,
                 schema_msg: bytes | None = None, epoch_entries: list | None = None,
                 open_logs: OpenLogs | None = None):
        self._dir = directory
        self._config = config
        self._schema = schema
        self._schema_msg = bf.schema_message(schema) if schema_msg is None else schema_msg
        self._clock = clock
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._encoder = bf.shared_encoder(schema, self._schema_msg)
        self._ts_index = schema.get_field_index(TIMESTAMP_COLUMN)
        self._topic = os.path.basename(os.path.normpath(directory)).rsplit("-", 1)[0]   # for error messages
        self._epoch_cache = LeaderEpochFileCache(os.path.join(directory, LEADER_EPOCH_CHECKPOINT), epoch_entries)
        self._topic_id: str | None = None   # partition.metadata, once read or written ("" = none)
        self._segments: list[LogSegment] = []      # replaced, never mutated in place
        self._published_segments: list[LogSegment] | None = None
        self._log_start = 0
        self._leo = 0
        self._recovery_point = 0
        self._generation = 0            # bumped when offsets below the LEO are rewritten
        self._dir_dirty = False         # files created or renamed since the last directory fsync
        self._parent_dir_dirty = False  # this directory was created since the last flush
        self._last_used_ms = clock.time_ms()   # last append or read (idle logs release files and maps)
        self._open_logs = open_logs     # the broker's cap on logs holding files and maps (None: no cap)
        self._registered = False        # counted in _open_logs since the last release
        self._last_flush_ms = clock.time_ms()
        self._closed = False
        self._closing = False
        self._view = _View((), (), 0, 0)
        self.load_stats: dict[str, int] = {}
        # Called (under this log's lock) when its recovery point or log start moved: the
        # log manager rewrites its checkpoints only then, instead of reading every log's
        # offsets each pass to compare (50,000 logs a second held a tenth of a broker's GIL).
        self.on_offsets_moved: Callable[[], None] = _nothing

    # ---- opening -----------------------------------------------------------------
    @classmethod
    def open(cls, dir: str, config: LogConfig, schema: pa.Schema | None, recovery_point: int = 0,
             log_start_offset: int = 0, clock=None, clean: bool = False,
             open_logs: OpenLogs | None = None) -> "Log":
        """Open (or create) the log in `dir`.

        `schema` includes the `timestamp` column; None means "the schema stored in
        the existing segments" (for loading logs whose topic schema is not at hand).
        Unless `clean` (the log dir had a clean-shutdown marker), every segment
        from the one holding `recovery_point` onwards is scanned and validated;
        the log is cut at the first invalid batch (see `LogSegment.recover`).
        """
        _validate_config(config)
        try:
            os.mkdir(dir)
            created = True      # a new log: nothing to list or read in it
        except FileExistsError:
            created = False
        except FileNotFoundError:
            os.makedirs(dir, exist_ok=True)
            created = True
        bases = [] if created else cls._list_segments(dir)
        if schema is None:
            if not bases:
                raise InvalidSchemaError(f"{dir}: no schema given and no segment to read one from")
            schema = LogSegment.open_existing(dir, bases[0], pa.schema([]), 0, 0).read_file_schema()
        validate_schema(schema)
        self = cls(dir, config, schema, clock or SYSTEM_CLOCK, epoch_entries=[] if created else None,
                   open_logs=open_logs)
        if created:
            self._topic_id = ""
        # A new directory's entry in the log dir is made durable by the first flush.
        self._parent_dir_dirty = created
        self._load(bases, recovery_point, log_start_offset, clean)
        return self

    @classmethod
    def from_state(cls, dir: str, config: LogConfig, schema: pa.Schema, schema_msg: bytes, state: dict,
                   clock=None, open_logs: OpenLogs | None = None) -> "Log":
        """The log described by `state()` at a clean shutdown, without reading its files
        (`schema` is already validated; its segments' indexes load on first use)."""
        clock = clock or SYSTEM_CLOCK
        self = cls(dir, config, schema, clock, schema_msg, state["epochs"], open_logs)
        now = clock.time_ms()
        interval = config.index_interval_bytes
        segs = [LogSegment.from_state(dir, schema, st, interval, now) for st in state["segments"]]
        if segs[-1].sealed:
            segs.append(self._new_segment(segs[-1].next_offset))
        self._segments = segs
        self._leo = self._recovery_point = segs[-1].next_offset
        self._log_start = state["start"]
        self._topic_id = state.get("topic_id")
        self.load_stats = dict(trusted_segments=len(segs), recovered_segments=0, recovered_batches=0,
                               truncated_bytes=0, deleted_segments=0)
        self._publish()
        return self

    def state(self) -> dict | None:
        """The log as `from_state` needs it, taken after `close()`; None if it is not
        wholly flushed (then the next start loads it from its files)."""
        with self._lock:
            if not self._closed or self._recovery_point != self._leo or self._epoch_cache.dirty:
                return None
            out = dict(start=self._log_start, segments=[s.state() for s in self._segments],
                       epochs=[list(e) for e in self._epoch_cache.entries()])
            if self._topic_id is not None:
                out["topic_id"] = self._topic_id
            return out

    # ---- topic id (partition.metadata) ---------------------------------------
    @property
    def topic_id(self) -> str:
        """The topic id this log belongs to ("" if never recorded): a re-created topic
        of the same name has another id, so its replicas never adopt this log."""
        if self._topic_id is None:
            try:
                with open(os.path.join(self._dir, PARTITION_METADATA_FILE)) as f:
                    found = [v.strip() for k, _, v in (ln.partition(":") for ln in f) if k.strip() == "topic_id"]
            except FileNotFoundError:
                found = []
            self._topic_id = found[0] if found else ""
        return self._topic_id

    def set_topic_id(self, topic_id: str) -> None:
        """Record the topic id. Not fsynced (thousands of partitions are created at
        once): a file lost in a crash reads as no topic id and is written again by
        the next LeaderAndIsr, as Kafka flushes partition.metadata with the log."""
        if self.topic_id == topic_id:
            return
        atomic_write_bytes(os.path.join(self._dir, PARTITION_METADATA_FILE),
                           f"version: 0\ntopic_id: {topic_id}\n".encode(), durable=False)
        self._topic_id = topic_id

    @staticmethod
    def _list_segments(dir: str) -> list[int]:
        """Base offsets of the data files; removes leftover tmp files and orphan indexes."""
        names = os.listdir(dir)
        data = {int(m.group(1)) for n in names if (m := _SEGMENT_FILE.match(n)) and m.group(2) == DATA_SUFFIX}
        for name in names:
            m = _SEGMENT_FILE.match(name)
            orphan = m is not None and m.group(2) != DATA_SUFFIX and int(m.group(1)) not in data
            if name.endswith(TMP_SUFFIX) or orphan:
                os.unlink(os.path.join(dir, name))
        return sorted(data)

    def _load(self, bases: list[int], recovery_point: int, log_start_offset: int, clean: bool) -> None:
        stats = dict(trusted_segments=0, recovered_segments=0, recovered_batches=0,
                     truncated_bytes=0, deleted_segments=0)
        now = self._clock.time_ms()
        segs = [LogSegment.open_existing(self._dir, b, self._schema, self._config.index_interval_bytes, now)
                for b in bases]
        kept: list[LogSegment] = []
        recovered: list[LogSegment] = []
        i = 0
        # Segments wholly below the recovery point (all of them after a clean
        # shutdown) are trusted: indexes loaded and sanity-checked, no scan.
        while i < len(segs):
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            if not (clean or (next_base is not None and next_base <= recovery_point)):
                break
            problem = segs[i].load_trusted(next_base)
            if problem is not None:
                log.warning("%s: cannot trust segment %d, recovering from it: %s",
                            self._dir, bases[i], problem)
                break
            kept.append(segs[i])
            stats["trusted_segments"] += 1
            i += 1
        # The rest is scanned; the first segment that ends early ends the log. Epoch
        # entries from where the scan starts are rebuilt from the scanned batches
        # (the file may hold entries a crash kept from being rewritten).
        scanned_from = bases[i] if i < len(segs) else None
        if scanned_from is not None:
            self._epoch_cache.truncate_from_end(scanned_from, durable=False)
        while i < len(segs):
            seg = segs[i]
            if kept and seg.base_offset != kept[-1].next_offset:
                break      # a gap: this and every later segment is unreachable
            result = seg.recover(self._on_recovered_batch, self._schema_msg)
            stats["recovered_segments"] += 1
            stats["recovered_batches"] += result.valid_batches
            stats["truncated_bytes"] += result.truncated_bytes
            if kept and not kept[-1].sealed:
                kept[-1].seal()    # its end-of-stream marker was torn; the log continues
            kept.append(seg)
            recovered.append(seg)
            i += 1
        for seg in segs[i:]:
            log.warning("%s: deleting segment %d, past the end of the valid log", self._dir, seg.base_offset)
            seg.delete()
            stats["deleted_segments"] += 1
        if kept and kept[-1].sealed and kept[-1].is_empty:
            # An empty sealed segment (a marker written into an empty active one):
            # the new active segment takes its place and its file name.
            empty = kept.pop()
            empty.delete()
            recovered = [seg for seg in recovered if seg is not empty]
            stats["deleted_segments"] += 1
        if not kept:
            kept = [self._new_segment(max(log_start_offset, bases[0] if bases else 0))]
        elif kept[-1].sealed:
            kept = kept + [self._new_segment(kept[-1].next_offset)]
        if stats["deleted_segments"]:
            self._dir_dirty = True
        self._segments = kept
        self._leo = self._segments[-1].next_offset
        self._log_start = max(log_start_offset, self._segments[0].base_offset)
        # Loading fsyncs nothing (at 50,000 partitions an fsync each is minutes): as
        # in Kafka, what the scan validated stays above the recovery point, so a
        # crash before the next flush scans it again; new or deleted files make
        # the directory dirty for that flush.
        self._recovery_point = self._leo if not recovered else min(recovery_point, self._leo)
        self._epoch_cache.truncate_from_end(self._leo, durable=False)
        for seg in self._segments:
            seg.release()      # a loaded log holds no descriptor or mapping until used
        if self._log_start > self._leo:
            # Unflushed data below the checkpointed log start was lost: start afresh there.
            self._truncate_fully_locked(self._log_start)
        self._epoch_cache.truncate_from_start(self._log_start)
        self.load_stats = stats
        self._publish()

    def _on_recovered_batch(self, header: bf.BatchHeader) -> None:
        self._epoch_cache.assign(header.leader_epoch, header.base_offset)

    # ---- properties ----------------------------------------------------------
    @property
    def dir(self) -> str:
        return self._dir

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def leader_epoch_cache(self) -> LeaderEpochFileCache:
        return self._epoch_cache

    @property
    def log_start_offset(self) -> int:
        return self._view.log_start

    @property
    def log_end_offset(self) -> int:
        return self._view.log_end

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._view.segments)

    def segments(self) -> tuple[LogSegment, ...]:
        """The current segments, oldest first (a snapshot)."""
        return self._view.segments

    def update_config(self, config: LogConfig) -> None:
        """Apply changed topic settings (retention, roll, flush) from now on."""
        _validate_config(config)
        with self._lock:
            self._config = config

    # ---- appending -----------------------------------------------------------
    def append(self, batches: Sequence[pa.RecordBatch], leader_epoch: int, producer_id: int = -1,
               producer_epoch: int = -1, base_sequence: int = -1,
               body_crc32c: Sequence[int] | None = None,
               sent_messages: Sequence[bf.PlainMessage | None] | None = None) -> AppendInfo:
        """Leader append: assign offsets from the log end, stamp `leader_epoch`.

        Each non-empty input batch becomes one stored batch. All batches are
        encoded and size-checked before any byte is written, so a
        RecordTooLargeError appends nothing. `body_crc32c` (a Flight append): the
        producer's CRC-32C of each batch's IPC body; the CRC the log computes to
        store the batch must equal it, else CorruptRecordError and nothing is
        appended (no pass over the data beyond the log's own, except where
        LogAppendTime replaces the timestamps: then the producer's bodies are
        hashed first). `sent_messages` (a Produce): per batch, the producer's IPC
        message that batch was read from and validated as (`bf.PlainMessage`), or
        None; it is stored verbatim with this log's header (`BatchEncoder.encode`),
        unless LogAppendTime replaces the timestamps.
        """
        # The one schema check of a produce (naming the first wrong column; nullability
        # from the topic), before anything is encoded.
        batches = [conform_batch(batch, self._schema, self._topic) for batch in batches]
        if body_crc32c is not None:
            if len(body_crc32c) != len(batches) or any(b.num_rows == 0 for b in batches):
                raise InvalidRequestError(f"an append of {len(batches)} batches with {len(body_crc32c)} "
                                          f"CRC-32C values (one per non-empty batch)")
            if self._config.message_timestamp_type == "LogAppendTime":
                unsealed = self._encoder.encode([(b, bf.BatchHeader(0, b.num_rows, leader_epoch))
                                                 for b in batches], seal=False)
                _check_body_crcs([m.body_crc() for m in unsealed], body_crc32c)
                body_crc32c = None
        if sent_messages is not None and len(sent_messages) != len(batches):
            raise InvalidRequestError(f"an append of {len(batches)} batches with {len(sent_messages)} "
                                      f"messages (one per batch)")
        batches, sent_messages = self._prepare(batches, sent_messages)
        with self._lock:
            self._check_open()
            first = offset = self._leo
            sequence = base_sequence
            items = []
            for batch in batches:
                items.append((batch, bf.BatchHeader(offset, batch.num_rows, leader_epoch,
                                                    bf.max_timestamp_ms(batch), producer_id,
                                                    producer_epoch, sequence)))
                offset += batch.num_rows
                if sequence >= 0:
                    sequence = _next_sequence(sequence, batch.num_rows)
            messages = self._encoder.encode(items, messages=sent_messages)
            if body_crc32c is not None:
                _check_body_crcs([m.header.crc32c for m in messages], body_crc32c)
            for m in messages:
                if m.size > self._config.max_message_bytes:
                    raise RecordTooLargeError(
                        f"a batch of {m.header.record_count} records is {m.size} bytes, over "
                        f"max.message.bytes {self._config.max_message_bytes}")
            # As in Kafka, the epoch is recorded before the data it starts.
            self._epoch_cache.assign(leader_epoch, first)
            size = self._write_messages(messages)
            info = AppendInfo(first, self._leo - 1, self._leo - first,
                              max(m.header.max_timestamp_ms for m in messages), size)
        self._maybe_flush_by_messages()
        return info

    def _prepare(self, batches: Sequence[pa.RecordBatch], sent_messages: Sequence[bf.PlainMessage | None] | None) \
            -> tuple[list[pa.RecordBatch], list[bf.PlainMessage | None] | None]:
        """The non-empty batches, with the one LogAppendTime stamp of a produce, and
        their producer's messages (none once the timestamps are replaced)."""
        kept = [j for j, batch in enumerate(batches) if batch.num_rows]
        if not kept:
            raise InvalidRequestError("an append needs at least one record")
        out = [batches[j] for j in kept]
        sent = None if sent_messages is None else [sent_messages[j] for j in kept]
        if self._config.message_timestamp_type == "LogAppendTime":
            now = pa.scalar(self._clock.time_ms(), pa.int64())
            ts_type = self._schema.field(self._ts_index).type
            field = self._schema.field(self._ts_index)
            out = [b.set_column(self._ts_index, field, pa.repeat(now, b.num_rows).view(ts_type))
                   for b in out]
            sent = None
        return out, sent

    def append_raw(self, data: bytes | pa.Buffer | StoredBytes,
                   checked: raw_streams.CheckedStream | None = None) -> AppendInfo:
        """Follower append of an IPC stream produced by `read_raw` on the leader
        (over the wire a `pa.Buffer`; in-process, as the simulation passes it, the
        leader's `StoredBytes`, joined here).

        Every batch is validated (framing, CRC, Arrow, contiguous offsets) before
        anything is written; the first must start at this log's end offset. The
        messages are appended verbatim and the epoch cache follows their epochs.
        ``checked``: the same stream as `raw_streams.check_raw_streams` checked it
        with others; its messages are taken as they are if it was checked against
        this log's own schema message, else the stream is checked here.
        """
        if checked is not None and checked.schema_message == self._schema_msg:
            decoded = list(checked.messages)
        else:
            if isinstance(data, StoredBytes):
                data = bytes(data)
            buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
            decoded = self._validate_raw(buf)
        with self._lock:
            self._check_open()
            if not decoded:
                return AppendInfo(self._leo, self._leo - 1, 0, -1, 0)
            first = decoded[0].header.base_offset
            if first != self._leo:
                raise InvalidOffsetError(f"append_raw data starts at offset {first} but the log "
                                         f"ends at {self._leo}")
            for m in decoded:
                self._epoch_cache.assign(m.header.leader_epoch, m.header.base_offset)
            size = self._write_messages(decoded)
            info = AppendInfo(first, self._leo - 1, self._leo - first,
                              max(m.header.max_timestamp_ms for m in decoded), size,
                              tuple(m.header for m in decoded))
        self._maybe_flush_by_messages()
        return info

    def _validate_raw(self, buf: pa.Buffer) -> list[bf.EncodedMessage]:
        limit = buf.size
        if limit == 0:
            return []
        pos = len(self._schema_msg)
        # A memoryview comparison keeps the GIL (``Buffer.equals`` gives it up and takes it back).
        if limit < pos or memoryview(buf).cast("B")[:pos] != self._schema_msg:
            # Not this log's own schema message, byte for byte (the leader's log was written
            # with the same one): parse it, and refuse it unless the schemas are equal.
            schema, pos = bf.read_schema_message(buf, limit, "append_raw data")
            if not schema.equals(self._schema, check_metadata=False):
                raise InvalidSchemaError(f"append_raw data has schema {schema}, the log has {self._schema}")
        out = []
        expected = None
        while pos < limit:
            decoded = bf.decode_batch(buf, pos, limit, self._schema, f"append_raw data position {pos}",
                                      expected)
            if decoded is None:
                if pos + len(bf.END_OF_STREAM) != limit:
                    raise CorruptRecordError(f"append_raw data: bytes after the end-of-stream marker at {pos}")
                break
            out.append(bf.EncodedMessage.verbatim(decoded.header, buf.slice(pos, decoded.size),
                                                  decoded.size))
            expected = decoded.header.next_offset
            pos += decoded.size
        return out

    def _write_messages(self, messages: Sequence[bf.EncodedMessage]) -> int:
        """Append messages to the active segment, rolling as needed. Caller holds
        the lock. Publishes the new log end even if a later write fails."""
        now = self._clock.time_ms()
        self._mark_used(now)
        written = 0
        try:
            for m in messages:
                seg = self._segments[-1]
                if (not seg.can_hold(m.size, m.header.last_offset, self._config.segment_bytes)
                        or self._roll_due(seg, now)):
                    seg = self._roll_locked(now)
                seg.append(m)
                self._leo = m.header.next_offset
                written += m.size
        finally:
            self._publish()
        return written

    @property
    def last_used_ms(self) -> int:
        """When the log was last appended to or read (the clock's ms)."""
        return self._last_used_ms

    def _mark_used(self, now_ms: int) -> None:
        """An append or read is starting: note when, and count the log among those
        holding files and maps (`open_logs`) if it is not counted yet."""
        self._last_used_ms = now_ms
        if not self._registered and self._open_logs is not None:
            self._registered = True
            self._open_logs.register(self)

    def release_if_idle(self, now_ms: int, idle_ms: int) -> bool:
        """If neither written nor read for `idle_ms`, give back every segment's
        descriptors and mapping (they reopen on the next use). True if it did."""
        if now_ms - self._last_used_ms < idle_ms:
            return False
        if not self._registered and not any(seg.holds_resources for seg in self._segments):
            return False    # given back already, nothing opened since: no lock (a pass looks at every log)
        with self._lock:
            return self._release_locked()

    def release_for_cap(self) -> bool:
        """Give back every segment's descriptors and mapping now, for the broker's cap on
        open logs (`open_logs`), unless another thread holds the log's lock (it is
        being used). False if it was busy."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._release_locked()
            return True
        finally:
            self._lock.release()

    def _release_locked(self) -> bool:
        self._registered = False
        self._forget_open()
        if self._closed or self._closing:
            return False
        released = False
        for seg in self._segments:
            if seg.holds_resources:
                if seg.release():
                    self._dir_dirty = True
                released = True
        return released

    def _maybe_flush_by_messages(self) -> None:
        if self._leo - self._recovery_point >= self._config.flush_interval_messages:
            self.flush()

    # ---- rolling -------------------------------------------------------------
    def _roll_due(self, seg: LogSegment, now_ms: int) -> bool:
        return not seg.is_empty and now_ms - seg.created_ms >= self._config.segment_ms

    def roll(self) -> LogSegment:
        """Seal the active segment and start a new one at the log end (no-op when
        the active segment is empty). Returns the active segment."""
        with self._lock:
            self._check_open()
            seg = self._roll_locked(self._clock.time_ms())
            self._publish()
            return seg

    def roll_if_due(self, now_ms: int | None = None) -> bool:
        """Roll if the active segment is older than segment_ms (and not empty)."""
        now = self._clock.time_ms() if now_ms is None else now_ms
        if not self._roll_due(self._segments[-1], now):
            return False   # checked first without the lock: maintenance passes over every log each second
        with self._lock:
            if self._closed or self._closing or not self._roll_due(self._segments[-1], now):
                return False
            self._roll_locked(now)
            self._publish()
            return True

    def _roll_locked(self, now_ms: int) -> LogSegment:
        active = self._segments[-1]
        if active.is_empty:
            return active
        active.seal()
        seg = self._new_segment(self._leo, now_ms)
        self._segments = self._segments + [seg]
        return seg

    def _new_segment(self, base_offset: int, now_ms: int | None = None) -> LogSegment:
        seg = LogSegment.create(self._dir, base_offset, self._schema, self._schema_msg,
                                self._config.index_interval_bytes,
                                self._clock.time_ms() if now_ms is None else now_ms,
                                new_dir=not self._segments and self._parent_dir_dirty)
        self._dir_dirty = True
        return seg

    # ---- reading -------------------------------------------------------------
    def read(self, start_offset: int, max_bytes: int, max_offset_exclusive: int | None = None,
             columns: list[str] | None = None) -> LogReadResult:
        """Records from `start_offset` (exactly: the first stored batch is sliced)
        up to `max_offset_exclusive` (default: the log end), zero-copy.

        Stops before a stored batch that would take the total past `max_bytes`,
        but always returns at least one (part of a) batch. `columns` projects;
        `timestamp` is kept only if listed. start == max offset gives an empty
        result; start below the log start or above the log end raises
        OffsetOutOfRangeError.
        """
        projection = None if columns is None else self.check_columns(columns)
        return self._on_current_view(lambda view: self._read_view(
            view, start_offset, max_bytes, max_offset_exclusive, projection))

    def _on_current_view(self, read):
        """Run `read(view)` on the current view, lock-free. If a concurrent truncation
        or deletion pulled files from under the view (a missing or rewritten file),
        wait for that mutation to finish by taking the lock once, then retry on the
        view it published. The same error on an unchanged view is real: raise it."""
        self._mark_used(self._clock.time_ms())
        for _ in range(3):
            view = self._view
            try:
                return read(view)
            except (OSError, CorruptRecordError):
                with self._lock:
                    pass
                if self._view is view:
                    raise
        return read(self._view)

    def _read_view(self, view: _View, start: int, max_bytes: int, max_offset: int | None,
                   projection: list[str] | None) -> LogReadResult:
        stored = self._read_stored_view(view, start, max_bytes, max_offset, True)
        batches = [b.batch for b in clip_stored(stored.batches, start, stored.end_offset, projection)]
        return LogReadResult(batches, start, max(stored.end_offset - start, 0), stored.size_bytes)

    def read_stored(self, start_offset: int, max_bytes: int,
                    max_offset_exclusive: int | None = None, decode: bool = True) -> StoredReadResult:
        """The stored batches holding [start_offset, max_offset_exclusive) (default: to
        the log end), whole and verbatim: zero-copy slices of the segments' mappings.
        The one read path: consumers' and followers' fetches and Flight all read here.

        The first batch may begin below `start_offset` and the last may end past the
        max offset (`clip_stored` cuts them for a reader wanting the exact range).
        Stops before a batch that would take the stored size past `max_bytes`, but
        returns at least one. start == max offset gives none; start below the log
        start or above the log end raises OffsetOutOfRangeError. Each batch is checked
        against its stored CRC: the read stops before a damaged one, and a read that
        starts at one raises CorruptRecordError naming its offset. ``decode=False``: for
        a reader that sends the messages on (`read_raw`), each batch is decoded only
        if its ``batch`` is used (`LogSegment.batches_from`)."""
        return self._on_current_view(lambda view: self._read_stored_view(view, start_offset, max_bytes,
                                                                         max_offset_exclusive, decode))

    def _read_stored_view(self, view: _View, start: int, max_bytes: int,
                          max_offset: int | None, decode: bool) -> StoredReadResult:
        self._check_range(start, view)
        end = view.log_end if max_offset is None else min(max_offset, view.log_end)
        out: list[StoredBatch] = []
        size = 0
        offset = start
        for seg in self._segments_from(view, start):
            if offset >= end:
                break
            try:
                for ref in seg.batches_from(offset, end, verify_crc=True, decode=decode):  # never a rotten batch
                    if out and size + ref.size > max_bytes:
                        return StoredReadResult(out, min(offset, end), size)
                    out.append(ref)
                    size += ref.size
                    offset = ref.base_offset + ref.record_count
            except CorruptRecordError:
                if not out:
                    raise
                # The sound batches before the damaged one go out; the read that starts at
                # the damaged one fails, naming it (as a Kafka consumer stops at a bad CRC).
                return StoredReadResult(out, min(offset, end), size)
        return StoredReadResult(out, min(offset, end) if out else start, size)

    def read_raw(self, start_offset: int, max_bytes: int) -> RawReadResult:
        """Whole stored batch messages from the one containing `start_offset`, as an
        IPC stream (schema message first) for replica fetch; at least one batch.
        At the log end: data b"" and record_count 0."""
        stored = self.read_stored(start_offset, max_bytes, decode=False)
        if not stored.batches:
            return RawReadResult(StoredBytes(), start_offset, 0, -1)
        # The last batch's epoch from the epoch cache (built from the same headers),
        # not by parsing its header again: that parse was a third of a follower fetch.
        # No join: the pieces go to the wire as they are (`StoredBytes`).
        return RawReadResult(StoredBytes([self._schema_msg, *(b.message for b in stored.batches)]),
                             stored.batches[0].base_offset, sum(b.record_count for b in stored.batches),
                             self._epoch_cache.epoch_for_offset(stored.batches[-1].base_offset))

    @property
    def schema_message(self) -> bytes:
        """The IPC schema message every segment (and a raw read) starts with."""
        return self._schema_msg

    def _segments_from(self, view: _View, offset: int) -> Sequence[LogSegment]:
        i = max(0, bisect.bisect_right(view.bases, offset) - 1)
        return view.segments[i:]

    def _check_range(self, offset: int, view: _View) -> None:
        if offset < view.log_start or offset > view.log_end:
            raise OffsetOutOfRangeError(f"offset {offset} is outside the log's range "
                                        f"[{view.log_start}, {view.log_end}] of {self._dir}")

    def check_columns(self, columns) -> list[str]:
        """`columns` as a list, or InvalidRequestError naming the ones the log lacks."""
        unknown = [c for c in columns if self._schema.get_field_index(c) < 0]
        if unknown:
            raise InvalidRequestError(f"unknown column(s) {unknown}; the log has {self._schema.names}")
        return list(columns)

    def batch_headers(self, from_offset: int = 0) -> Iterator[bf.BatchHeader]:
        """Headers of the stored batches holding offsets >= `from_offset`, oldest first
        (for rebuilding producer state). Iterates a snapshot; a truncation or
        deletion running meanwhile may make it raise."""
        view = self._view
        start = max(from_offset, view.log_start)
        for seg in self._segments_from(view, start):
            for ref in seg.batches_from(start, view.log_end):
                yield seg.read_header(ref)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the earliest record with timestamp >= `timestamp_ms`,
        at or after the log start; None if there is none."""
        return self._on_current_view(lambda view: self._offset_for_timestamp(view, timestamp_ms))

    def _offset_for_timestamp(self, view: _View, timestamp_ms: int) -> tuple[int, int] | None:
        for seg in view.segments:
            if seg.max_timestamp_ms < timestamp_ms or seg.next_offset <= view.log_start:
                continue
            entry = seg.time_index.lookup(timestamp_ms)
            scan_from = max(view.log_start, entry[1] if entry else seg.base_offset)
            for ref in seg.batches_from(scan_from, view.log_end):
                if bf.max_timestamp_ms(ref.batch) < timestamp_ms:
                    continue
                lo = max(scan_from - ref.base_offset, 0)
                ts = ref.batch.column(self._ts_index).slice(lo).view(pa.int64())
                i = pc.index(pc.greater_equal(ts, timestamp_ms), True).as_py()
                if i >= 0:
                    return ref.base_offset + lo + i, ts[i].as_py()
        return None

    # ---- truncation and deletion --------------------------------------------------
    def truncate_to(self, offset: int) -> bool:
        """Remove every record at or after `offset` (follower truncation). Returns
        False if `offset` >= the log end (nothing to do)."""
        if offset < 0:
            raise InvalidOffsetError(f"cannot truncate {self._dir} to negative offset {offset}")
        with self._lock:
            self._check_open()
            if offset >= self._leo:
                return False
            if offset <= self._segments[0].base_offset:
                self._truncate_fully_locked(offset)
                self._publish()
                return True
            kept = [s for s in self._segments if s.base_offset < offset]
            doomed = self._segments[len(kept):]
            last = kept[-1]
            if last.next_offset > offset:
                kept[-1] = last.truncate_to(offset, self._encoder)
            else:
                # The new active segment may take a doomed segment's file name.
                self._delete_segment_files(doomed)
                doomed = []
                kept.append(self._new_segment(offset))
            self._segments = kept
            self._leo = offset
            self._log_start = min(self._log_start, offset)
            self._recovery_point = min(self._recovery_point, offset)
            self.on_offsets_moved()
            self._generation += 1
            self._epoch_cache.truncate_from_end(offset)
            self._publish()
            self._delete_segment_files(doomed)
            return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the log, empty, at `offset`."""
        if offset < 0:
            raise InvalidOffsetError(f"cannot restart {self._dir} at negative offset {offset}")
        with self._lock:
            self._check_open()
            self._truncate_fully_locked(offset)
            self._publish()

    def _truncate_fully_locked(self, offset: int) -> None:
        self._delete_segment_files(self._segments)
        self._segments = [self._new_segment(offset)]
        self._leo = self._log_start = self._recovery_point = offset
        self.on_offsets_moved()
        self._generation += 1
        self._epoch_cache.clear()

    def delete_records_before(self, offset: int) -> int:
        """Advance the log start to `offset` (records below become unreadable) and
        delete sealed segments wholly below it. Returns the log start offset."""
        with self._lock:
            self._check_open()
            if offset > self._leo:
                raise OffsetOutOfRangeError(f"cannot delete records before {offset}: beyond the "
                                            f"log end offset {self._leo} of {self._dir}")
            if offset > self._log_start:
                doomed = [s for s in self._segments[:-1] if s.next_offset <= offset]
                self._log_start = offset
                self.on_offsets_moved()
                self._segments = self._segments[len(doomed):]
                self._epoch_cache.truncate_from_start(self._log_start)
                self._publish()
                self._delete_segment_files(doomed)
            return self._log_start

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete the oldest sealed segments that break retention.ms (their newest
        record is older), retention.bytes (the log is larger) or lie wholly below
        the log start. Never deletes the active segment. Returns how many."""
        if len(self._segments) == 1:
            return 0       # only the active segment, which retention never deletes (checked without the lock)
        now = self._clock.time_ms() if now_ms is None else now_ms
        with self._lock:
            if self._closed or self._closing:
                return 0
            sealed = self._segments[:-1]
            doomed = 0
            cfg = self._config
            if cfg.retention_ms >= 0:
                while doomed < len(sealed) and self._newest_ms(sealed[doomed]) < now - cfg.retention_ms:
                    doomed += 1
            if cfg.retention_bytes >= 0:
                excess = sum(s.size for s in self._segments[doomed:]) - cfg.retention_bytes
                while doomed < len(sealed) and excess - sealed[doomed].size >= 0:
                    excess -= sealed[doomed].size
                    doomed += 1
            while doomed < len(sealed) and sealed[doomed].next_offset <= self._log_start:
                doomed += 1
            if not doomed:
                return 0
            self._segments = self._segments[doomed:]
            self._log_start = max(self._log_start, self._segments[0].base_offset)
            self.on_offsets_moved()
            self._epoch_cache.truncate_from_start(self._log_start)
            self._publish()     # before unlinking: readers of the new view never miss a file
            self._delete_segment_files(sealed[:doomed])
            return doomed

    @staticmethod
    def _newest_ms(seg: LogSegment) -> int:
        """A segment's newest record timestamp; its file's mtime when no record has one."""
        ts = seg.max_timestamp_ms
        if ts >= 0:
            return ts
        try:
            return int(os.path.getmtime(seg.path) * 1000)
        except FileNotFoundError:
            return -1

    def _delete_segment_files(self, doomed: Sequence[LogSegment]) -> None:
        for seg in doomed:
            seg.delete()
        if doomed:
            self._dir_dirty = True

    # ---- durability and lifecycle ----------------------------------------------
    def flush(self, up_to: int | None = None, sync_parent: bool = True, fsync: bool = True) -> None:
        """fsync everything below `up_to` (default: the log end) and advance the
        recovery point. The fsyncs run outside the mutation lock. `sync_parent=False`:
        the caller fsyncs the log dir holding this log's directory (once for many).
        `fsync=False`: the caller makes the whole file system durable (one syncfs)
        before anything records the new recovery point (a clean shutdown's close)."""
        with self._flush_lock:
            # The epoch history must be durable before the recovery point passes
            # the batches that started an epoch (recovery only re-reads past it);
            # its rename is made durable by this flush's directory fsync.
            epoch_written = self._epoch_cache.flush(sync_dir=False, durable=fsync)
            with self._lock:
                target = self._leo if up_to is None else min(up_to, self._leo)
                dir_dirty, self._dir_dirty = self._dir_dirty or epoch_written, False
                parent_dirty = self._parent_dir_dirty and sync_parent
                self._parent_dir_dirty = False
                if target <= self._recovery_point and not dir_dirty and not parent_dirty:
                    return
                segs = [s for s in self._segments
                        if s.next_offset > self._recovery_point and s.base_offset < target]
                for seg in segs:
                    if seg.write_pending_index_entries():
                        dir_dirty = True
                generation = self._generation
            if fsync:
                for seg in segs:
                    seg.fsync()
                if dir_dirty:
                    fsync_dir(self._dir)
                if parent_dirty:
                    fsync_dir(os.path.dirname(os.path.abspath(self._dir)))
            with self._lock:
                # A truncation meanwhile may have rewritten offsets below target.
                if self._generation == generation and target > self._recovery_point:
                    self._recovery_point = target
                    self.on_offsets_moved()
                self._last_flush_ms = self._clock.time_ms()

    def flush_if_due(self, now_ms: int | None = None) -> bool:
        """Flush when flush_interval_ms has passed with unflushed data, or when
        rolled segments are still unflushed (Kafka flushes those after a roll)."""
        if self._leo == self._recovery_point:
            return False   # nothing unflushed (checked first without the lock, as roll_if_due)
        now = self._clock.time_ms() if now_ms is None else now_ms
        with self._lock:
            if self._closed or self._closing:
                return False
            unflushed = self._leo > self._recovery_point
            rolled_unflushed = self._recovery_point < self._segments[-1].base_offset
            timed = unflushed and now - self._last_flush_ms >= self._config.flush_interval_ms
            if not (timed or rolled_unflushed):
                return False
            up_to = None if timed else self._segments[-1].base_offset
        self.flush(up_to)
        return True

    def close(self, sync_parent: bool = True, fsync: bool = True) -> None:
        """Flush and release file descriptors. The active segment stays unsealed
        so appends continue after the next open. `sync_parent`, `fsync`: as in `flush`."""
        with self._lock:
            if self._closed or self._closing:
                return
            self._closing = True       # refuse mutations from now on
        # Outside the mutation lock: flush takes the flush lock first, then this one.
        self.flush(sync_parent=sync_parent, fsync=fsync)
        with self._lock:
            for seg in self._segments:
                seg.close()
            self._closed = True
            self._forget_open()

    def _forget_open(self) -> None:
        """Closed: no longer counted among the logs holding files and maps."""
        if self._open_logs is not None:
            self._open_logs.forget(self)

    def abandon(self) -> None:
        """Stop using this log without writing (its log dir failed): refuse every mutation
        from now on and release file descriptors, ignoring errors. No flush, no seal."""
        with self._lock:
            self._closing = True
            for seg in self._segments:
                try:
                    seg.close()
                except OSError:
                    pass
            self._closed = True
            self._forget_open()

    def delete(self) -> None:
        """Close and remove the whole partition directory. The directory is first
        renamed to `<dir>.<id>-delete` so a crash mid-removal never leaves a
        half-deleted log that would load again."""
        with self._lock:
            for seg in self._segments:
                seg.close()
            self._closed = True
            self._forget_open()
            parent = os.path.dirname(os.path.abspath(self._dir))
            doomed = f"{self._dir}.{uuid.uuid4().hex}-delete"
            os.replace(self._dir, doomed)
            fsync_dir(parent)
            shutil.rmtree(doomed, ignore_errors=True)
            self._segments = []
            self._view = _View((), (), self._log_start, self._leo)

    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise StorageError(f"the log {self._dir} is closed")

    def _publish(self) -> None:
        # self._segments is copy-on-write: a new list means the segments changed.
        old = self._view
        if self._segments is self._published_segments:
            segs, bases = old.segments, old.bases
        else:
            segs = tuple(self._segments)
            bases = tuple(s.base_offset for s in segs)
            self._published_segments = self._segments
        self._view = _View(segs, bases, self._log_start, self._leo)

    def __repr__(self) -> str:
        v = self._view
        return f"Log({self._dir}, offsets [{v.log_start}, {v.log_end}), {len(v.segments)} segments)"
