"""One segment of a partition log: `<20-digit base offset>.arrows` plus its indexes.

On disk the data file is an Arrow IPC *stream*::

    schema message | batch message | batch message | ... [| end-of-stream marker]

Every batch message is a stored batch as defined in `batch_format` (custom
metadata carries the base offset, record count, epoch, max timestamp, CRC and
producer fields). Batch i+1 starts at offset base(i) + count(i): offsets are
dense and never stored per record. Only a *sealed* segment (one that has been
rolled) ends with the end-of-stream marker, so `pyarrow.ipc.open_stream`
reads any complete segment. Beside it: `<base>.index` (`OffsetIndex`) and
`<base>.timeindex` (`TimeIndex`), both rebuildable caches.

Writes are positional: one pwritev per message at the committed size (the
message's pieces: its metadata plus zero-copy views of the batch buffers).

Resources are held only while used: the write descriptor is opened by the first
append, the mapping by the first read, the index files' descriptors by their
first write; `release` gives all of them back (the Log calls it when idle), so
a broker's descriptors and mappings follow its busy partitions, not its count
of partitions.

Bit rot: a read checks each stored batch against the CRC-32C in its header
(`batches_from(verify_crc=True)`), once per mapping of the segment: the spans
of batch positions already checked are kept (`VerifiedSpans`) and forgotten
whenever the mapping is dropped (`release`, the Log's idle release, after
`log.idle.release.ms`) or the file replaced (`_rewrite`, truncation makes a new
segment object, a reopen a new Log). So reading the same bytes again does not
hash them again, and damage that appears later is caught by the first read
after the segment is next mapped.

mmap safety: reads hand out zero-copy slices of a `pa.memory_map` of the data
file, so a data file never shrinks in place (touching a mapped page past EOF
raises SIGBUS). It only grows by appends; any truncation writes the kept
prefix to a new file and renames it over (a new inode: old mappings stay
valid). An unsealed segment's mapping reaches `MAP_HEADROOM_BYTES` past the
file's end, so bytes appended later are read through it (a shared mapping sees
the file grow); reads stay below the committed size, so no page past the end is
touched. The mapping is re-created lazily when a read needs bytes beyond it.

Thread-safety: mutations (append, seal, truncate_to, recover, delete) must be
serialised by the caller (the Log's lock). Reads (`buffer`, `batches_from`,
`read_header`, `message`) may run concurrently with appends: they only look at
bytes below the committed size and re-map under a small lock of their own.
"""
from __future__ import annotations

import bisect
import errno
import logging
import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import pyarrow as pa

from replikafka.errors import CorruptRecordError, InvalidSchemaError, StorageError

from . import batch_format as bf
from .fileio import (TMP_SUFFIX, fsync_dir, fsync_path, map_file, open_keeping_gil, pwritev_all,
                     write_new_file)
from .offset_index import OffsetIndex
from .time_index import TimeIndex

log = logging.getLogger(__name__)

DATA_SUFFIX = ".arrows"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
MAX_RELATIVE_OFFSET = 0xFFFFFFFF     # relative offsets are u32 in both indexes
MAX_SEGMENT_POSITION = 0xFFFFFFFF    # positions are u32 in the offset index
#: How far past the file's end an unsealed segment's mapping reaches, in bytes (virtual
#: address space only: no page past the end is touched). Mapping the exact size meant a
#: new mapping, and the old one's touched pages torn down, for each read at the log's end
#: (each follower fetch): 0.5 ms a time with a 1 MB batch, a fifth of a leader's CPU.
MAP_HEADROOM_BYTES = 64 << 20


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class StoredBatchRef:
    """One stored batch of a segment: where it lies, its stored message (zero-copy
    over the mapping) and its RecordBatch (zero-copy too), decoded as it was framed
    or, for a reader that sends the message on (a follower's fetch), by Arrow on
    first use only: each Arrow call gives the GIL up and takes it back.
    Thread-safe: two threads decoding at once each get an equal batch, one is kept."""

    __slots__ = ("base_offset", "record_count", "position", "size", "message", "_schema", "_batch")

    def __init__(self, base_offset: int, record_count: int, position: int, size: int, message: pa.Buffer,
                 schema: pa.Schema, batch: pa.RecordBatch | None = None):
        self.base_offset, self.record_count, self.position, self.size = base_offset, record_count, position, size
        self.message, self._schema, self._batch = message, schema, batch

    @property
    def batch(self) -> pa.RecordBatch:
        if self._batch is None:
            self._batch = bf.read_stored_message(self.message, self._schema, f"batch at offset {self.base_offset}")
        return self._batch


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """What `LogSegment.recover` found."""

    valid_batches: int
    truncated_bytes: int     # bytes removed from the end of the data file
    reason: str | None       # why the scan stopped early (None: clean end)


class VerifiedSpans:
    """Disjoint, sorted ``[start, end)`` spans of data-file positions whose stored
    batches passed the CRC check under the current mapping (reads are mostly
    sequential, so a few spans cover a segment). ``clear`` forgets them all and
    bumps ``generation``; an ``add`` made with an older generation is dropped (a
    reader that checked bytes of a mapping released meanwhile). Thread-safe."""

    __slots__ = ("_spans", "generation", "_lock")

    def __init__(self):
        self._spans: tuple[list[int], list[int]] = ([], [])    # (starts, ends), replaced whole, never mutated
        self.generation = 0
        self._lock = threading.Lock()

    def covers(self, start: int, end: int) -> bool:
        starts, ends = self._spans
        i = bisect.bisect_right(starts, start) - 1
        return i >= 0 and ends[i] >= end

    def add(self, start: int, end: int, generation: int) -> None:
        with self._lock:
            if generation != self.generation:
                return
            starts, ends = list(self._spans[0]), list(self._spans[1])
            i = bisect.bisect_left(ends, start)          # first span that ends at or after start
            j = bisect.bisect_right(starts, end)         # spans before j start at or before end
            if i < j:                                    # overlapping or touching spans merge
                start, end = min(start, starts[i]), max(end, ends[j - 1])
            starts[i:j], ends[i:j] = [start], [end]
            self._spans = (starts, ends)

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._spans = ([], [])

    @property
    def spans(self) -> list[tuple[int, int]]:
        return list(zip(*self._spans))


class LogSegment:
    """One segment's data file and indexes (format and thread-safety: module doc).

    A LogSegment object that is deleted or replaced by `truncate_to` is
    *retired*: it never maps its path again, but a mapping it already holds
    keeps serving readers that still reference it."""

    def __init__(self, directory: str, base_offset: int, schema: pa.Schema, schema_size: int,
                 index_interval_bytes: int, created_ms: int, lazy_indexes: bool = False):
        self.dir = directory
        self.base_offset = base_offset
        name = os.path.join(directory, segment_file_name(base_offset))
        self.path = name + DATA_SUFFIX
        self.offset_index = OffsetIndex(name + INDEX_SUFFIX, base_offset, lazy_check=(
            lambda: self.offset_index.sanity_check(self.schema_size, self.data_end)) if lazy_indexes else None)
        self.time_index = TimeIndex(name + TIMEINDEX_SUFFIX, base_offset, lazy_check=(
            lambda: self.time_index.sanity_check(self.next_offset)) if lazy_indexes else None)
        self.schema = schema
        self.schema_size = schema_size        # the schema message; batches start here
        self.size = schema_size               # committed bytes, end-of-stream marker included
        self.next_offset = base_offset        # offset after the last record
        self.sealed = False
        self.created_ms = created_ms          # for roll by segment.ms
        self._index_interval = index_interval_bytes
        self._bytes_since_index_entry = 0
        self._fd: int | None = None
        self._buf: pa.Buffer | None = None    # current read-only mapping of the data file
        self._map_lock = threading.Lock()
        self._retired = False                 # deleted or replaced by a truncated copy
        self._verified = VerifiedSpans()      # batch positions whose CRC was checked (module doc)
        # (base offset, position) of the last batch appended: a read at or after it (a
        # follower or consumer at the log's end, the common case) starts there instead
        # of framing forward from the sparse offset index's entry. Set after the append
        # is committed; every batch before it holds offsets below its base.
        self._last_append: tuple[int, int] | None = None

    # ---- creation and loading --------------------------------------------------
    @classmethod
    def create(cls, directory: str, base_offset: int, schema: pa.Schema, schema_msg: bytes,
               index_interval_bytes: int, created_ms: int, new_dir: bool = False) -> "LogSegment":
        """A new empty segment: the data file holds only the schema message.
        `new_dir`: the directory was just created (no old index file to remove)."""
        seg = cls(directory, base_offset, schema, len(schema_msg), index_interval_bytes, created_ms)
        # No fsync here (the log's next flush fsyncs the file and the directory);
        # a schema message torn by a crash is repaired by recovery. The write
        # descriptor is opened again by the first append (descriptors are held
        # only while a segment is in use), and empty indexes are absent files.
        os.close(write_new_file(seg.path, schema_msg))
        if not new_dir:
            seg.offset_index.reset([])
            seg.time_index.reset([])
        return seg

    @classmethod
    def open_existing(cls, directory: str, base_offset: int, schema: pa.Schema,
                      index_interval_bytes: int, created_ms: int) -> "LogSegment":
        """Bind to existing files without reading them yet (see load_trusted / recover)."""
        seg = cls(directory, base_offset, schema, 0, index_interval_bytes, created_ms)
        seg.size = os.path.getsize(seg.path)
        return seg

    @classmethod
    def from_state(cls, directory: str, schema: pa.Schema, state: list[int], index_interval_bytes: int,
                   created_ms: int) -> "LogSegment":
        """Bind to existing files described by `state()` as recorded at a clean shutdown:
        nothing is read (the indexes load on first use)."""
        base, size, next_offset, sealed, schema_size, since_entry = state
        seg = cls(directory, base, schema, schema_size, index_interval_bytes, created_ms, lazy_indexes=True)
        seg.size, seg.next_offset, seg.sealed = size, next_offset, bool(sealed)
        seg._bytes_since_index_entry = since_entry
        return seg

    def state(self) -> list[int]:
        """What `from_state` needs: [base offset, size, next offset, sealed, schema
        message size, bytes since the last offset index entry]."""
        return [self.base_offset, self.size, self.next_offset, int(self.sealed), self.schema_size,
                self._bytes_since_index_entry]

    def read_file_schema(self) -> pa.Schema:
        """The schema message at the start of the data file; sets schema_size.

        Raises CorruptRecordError if it is torn or unreadable."""
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) == 8:
                meta_len = int.from_bytes(head[4:8], "little", signed=True)
                if 0 < meta_len <= bf.MAX_METADATA_LENGTH:
                    head += f.read(meta_len)
        schema, size = bf.read_schema_message(head, len(head), f"{self.path}")
        self.schema_size = size
        return schema

    def _starts_with(self, head: bytes) -> bool:
        with open(self.path, "rb") as f:
            return f.read(len(head)) == head

    def check_schema(self, schema: pa.Schema) -> None:
        if not schema.equals(self.schema, check_metadata=False):
            raise InvalidSchemaError(f"{self.path} holds schema {schema} but the log's schema is "
                                     f"{self.schema}")

    def load_trusted(self, next_segment_base: int | None) -> str | None:
        """Load a segment that needs no scan (clean shutdown, or below the recovery
        point). Returns None on success, or why it must be recovered instead.

        A middle segment ends where the next one starts; the last segment's end
        is found by framing the batches after its last index entry."""
        try:
            self.check_schema(self.read_file_schema())
        except CorruptRecordError as e:
            return e.message
        self.offset_index.load()
        problem = self.offset_index.sanity_check(self.schema_size, self.size)
        if problem:
            return problem
        if next_segment_base is not None:
            self.next_offset = next_segment_base
            self.sealed = True
        else:
            problem = self._scan_tail()
            if problem:
                return problem
        self.time_index.load()
        problem = self.time_index.sanity_check(self.next_offset)
        if problem:
            return problem
        return None

    def _scan_tail(self) -> str | None:
        """Frame the batches after the last index entry to find next_offset and
        whether the segment is sealed. Returns a problem string if the tail is torn."""
        entry = self.offset_index.last_entry()
        offset, pos = entry if entry else (self.base_offset, self.schema_size)
        limit = self.size
        buf = self._map(limit)
        while pos < limit:
            try:
                info = bf.peek_message(buf, pos, limit, f"{self.path} position {pos}")
            except CorruptRecordError as e:
                return e.message
            if info is None:
                if pos + len(bf.END_OF_STREAM) != limit:
                    return f"{self.path}: bytes after the end-of-stream marker at {pos}"
                self.sealed = True
                break
            offset += info.record_count
            pos += info.size
        self.next_offset = offset
        self._bytes_since_index_entry = self.data_end - (entry[1] if entry else self.schema_size)
        return None

    def recover(self, on_batch: Callable[[bf.BatchHeader], None] | None = None,
                schema_msg: bytes | None = None) -> RecoveryResult:
        """Validate every batch from the start, cut the file at the first invalid byte,
        and rebuild both indexes.

        Stops at the first batch that fails `decode_batch` (framing, CRC, Arrow,
        base offset contiguous from this segment's base, record count, max
        timestamp). A valid end-of-stream marker ends the scan with the segment
        sealed; bytes after it are dropped. `on_batch` sees every valid header in
        order (the Log rebuilds its leader-epoch cache from it). `schema_msg`: the
        log's own schema message; a file starting with exactly those bytes needs no
        parse of its schema (a tenth of a small segment's recovery).
        """
        limit = os.path.getsize(self.path)
        try:
            if schema_msg is not None and self._starts_with(schema_msg):
                self.schema_size = len(schema_msg)
            else:
                self.check_schema(self.read_file_schema())
        except CorruptRecordError as e:
            # A torn or unreadable schema message: nothing in the file is usable.
            schema_msg = schema_msg if schema_msg is not None else bf.schema_message(self.schema)
            self._rewrite(0, b"", schema_msg=schema_msg)
            self.schema_size = len(schema_msg)
            self._reset_after_recovery(len(schema_msg), self.base_offset, False, 0, [], [])
            log.warning("recovery of %s: dropped all %d bytes: %s", self.path, limit, e.message)
            return RecoveryResult(0, limit, e.message)
        buf = self._map(limit)
        reason = None
        offset_entries: list[tuple[int, int]] = []
        time_entries: list[tuple[int, int]] = []
        pos, offset, batches, max_ts = self.schema_size, self.base_offset, 0, -1
        since_entry, sealed = 0, False
        while pos < limit:
            where = f"{self.path} position {pos}"
            try:
                decoded = bf.decode_batch(buf, pos, limit, self.schema, where, offset)
            except CorruptRecordError as e:
                reason = e.message
                break
            if decoded is None:
                sealed = True
                break
            header = decoded.header
            if header.next_offset - self.base_offset > MAX_RELATIVE_OFFSET + 1:
                reason = f"{where}: offset beyond the segment's u32 relative range"
                break
            if since_entry > self._index_interval:
                offset_entries.append((offset - self.base_offset, pos))
                since_entry = 0
            if header.max_timestamp_ms > max_ts:
                max_ts = header.max_timestamp_ms
                time_entries.append((max_ts, offset - self.base_offset))
            if on_batch is not None:
                on_batch(header)
            pos += decoded.size
            since_entry += decoded.size
            offset = header.next_offset
            batches += 1
        valid_end = pos + (len(bf.END_OF_STREAM) if sealed else 0)
        if valid_end != limit:
            reason = reason or f"{self.path}: bytes after the end-of-stream marker at {pos}"
            self._rewrite(valid_end, b"")
        self._reset_after_recovery(valid_end, offset, sealed, since_entry, offset_entries,
                                   time_entries)
        truncated = limit - valid_end
        if reason:
            log.warning("recovery of %s stopped after %d valid batches (%d bytes dropped): %s",
                        self.path, batches, truncated, reason)
        return RecoveryResult(batches, truncated, reason)

    def _reset_after_recovery(self, size: int, next_offset: int, sealed: bool, since_entry: int,
                              offset_entries, time_entries) -> None:
        self.size = size
        self.next_offset = next_offset
        self.sealed = sealed
        self._last_append = None
        self._bytes_since_index_entry = since_entry
        self.offset_index.rebuilt(offset_entries)
        self.time_index.rebuilt(time_entries)
        self._close_fd()

    # ---- properties ----------------------------------------------------------
    @property
    def data_end(self) -> int:
        """Position after the last batch (before the end-of-stream marker, if any)."""
        return self.size - len(bf.END_OF_STREAM) if self.sealed else self.size

    @property
    def record_count(self) -> int:
        return self.next_offset - self.base_offset

    @property
    def is_empty(self) -> bool:
        return self.next_offset == self.base_offset

    @property
    def max_timestamp_ms(self) -> int:
        return self.time_index.max_timestamp_ms

    # ---- appending -----------------------------------------------------------
    def _open_for_append(self) -> None:
        """The write descriptor, opened on first use (released by `release`)."""
        if self._fd is None:
            self._fd = open_keeping_gil(self.path, os.O_WRONLY)   # an existing file (fileio: why kept)

    def can_hold(self, message_size: int, last_offset: int, segment_bytes: int) -> bool:
        """Whether a batch of `message_size` bytes ending at `last_offset` fits, or the
        segment must roll first. An empty segment takes any one batch."""
        if last_offset - self.base_offset > MAX_RELATIVE_OFFSET:
            return False
        if self.is_empty:
            return self.size + message_size <= MAX_SEGMENT_POSITION
        return self.size + message_size <= segment_bytes

    def append(self, message: bf.EncodedMessage) -> bf.BatchHeader:
        """Append one stored batch (encoded and validated); an unsealed message is
        sealed (CRC computed) first. Returns the header as written."""
        if self.sealed or self._retired:
            raise StorageError(f"{self.path}: append to a sealed or retired segment")
        self._open_for_append()
        pos = self.size
        if not message.sealed:
            message = message.seal(message.body_crc())
        try:
            pwritev_all(self._fd, message.pieces, pos)
        except OSError as e:
            self._undo_torn_append(pos)
            raise StorageError(f"{self.path}: write failed at position {pos}: {e}") from e
        header = message.header
        # Index entries are added after the data, so they never point past it.
        if self._bytes_since_index_entry > self._index_interval:
            self.offset_index.append(header.base_offset, pos)
            self._bytes_since_index_entry = 0
        self.time_index.maybe_append(header.max_timestamp_ms, header.base_offset)
        self._bytes_since_index_entry += message.size
        self.next_offset = header.next_offset
        self.size = pos + message.size
        self._last_append = (header.base_offset, pos)
        return header

    def _undo_torn_append(self, committed_size: int) -> None:
        """Drop a partially written message (without shrinking the mapped file)."""
        try:
            self._rewrite(committed_size, b"")
            self._open_for_append()
        except OSError:
            log.exception("%s: could not remove a torn append; recovery will", self.path)

    def seal(self) -> None:
        """Write the end-of-stream marker: the segment is now read-only."""
        if self.sealed:
            return
        self._open_for_append()
        pwritev_all(self._fd, [bf.END_OF_STREAM], self.size)
        self.size += len(bf.END_OF_STREAM)
        self.sealed = True
        self.close()

    # ---- reading -------------------------------------------------------------
    def _map(self, need_end: int) -> pa.Buffer:
        """A read-only mapping of the data file covering [0, need_end). The active
        segment's reaches ``MAP_HEADROOM_BYTES`` past the file's end, so reads of the
        bytes appended since need no new mapping until then (module doc)."""
        buf = self._buf
        if buf is not None and buf.size >= need_end:
            return buf
        with self._map_lock:
            buf = self._buf
            if buf is None or buf.size < need_end:
                if self._retired:
                    # The path now holds another file (or none): the reader's view is stale.
                    raise FileNotFoundError(errno.ENOENT, "segment was deleted or replaced", self.path)
                buf = map_file(self.path, min_size=need_end, headroom=0 if self.sealed else MAP_HEADROOM_BYTES)
                self._buf = buf
        return buf

    def buffer(self) -> pa.Buffer:
        """The mapped data file's committed bytes."""
        return self._map(self.size).slice(0, self.size)

    def batches_from(self, offset: int, end_offset: int | None = None,
                     limit: int | None = None, verify_crc: bool = False,
                     decode: bool = True) -> Iterator[StoredBatchRef]:
        """Stored batches from the one containing `offset`, stopping before `end_offset`
        and before position `limit` (default: the committed data end).

        Starts at the offset index entry at or below `offset` and frames forward
        with Arrow, decoding each batch (`batch_format.read_trusted`; the bytes were
        validated when appended or recovered); with ``decode=False`` (a reader that
        sends the stored messages on) by their metadata alone, without an Arrow call
        (`batch_format.peek_message`), a batch decoded only if its ``batch`` is used. With
        `verify_crc`, each batch yielded is first checked against its stored CRC
        (bit rot since then raises CorruptRecordError, not a crash further on),
        unless it was already checked under this mapping (module doc)."""
        limit = self.data_end if limit is None else limit
        end_offset = self.next_offset if end_offset is None else end_offset
        entry = self.offset_index.lookup(offset)
        base, pos = entry if entry else (self.base_offset, self.schema_size)
        tail = self._last_append     # read after `limit`: a batch past it is past the limit too
        if tail is not None and base < tail[0] <= offset:
            base, pos = tail
        if pos >= limit:
            return
        verified = self._verified
        generation = verified.generation      # read before mapping: a release in between voids our checks
        buf = self._map(limit)
        schema = self.schema
        while pos < limit and base < end_offset:
            batch = None
            if decode:
                got = bf.read_trusted(buf, pos, limit, schema, f"{self.path} position {pos}")
                if got is None:
                    return
                batch, size = got
                n = batch.num_rows
            else:
                info = bf.peek_message(buf, pos, limit, f"{self.path} position {pos}")
                if info is None:
                    return
                size, n = info.size, info.record_count
            if base + n > offset:
                if verify_crc and not verified.covers(pos, pos + size):
                    bf.check_stored_crc(buf, pos, pos + size, f"{self.path} position {pos} (batch at offset {base})")
                    verified.add(pos, pos + size, generation)
                yield StoredBatchRef(base, n, pos, size, buf.slice(pos, size), schema, batch)
            base += n
            pos += size

    def read_header(self, ref: StoredBatchRef) -> bf.BatchHeader:
        """The stored header (custom metadata) of a batch."""
        got = bf.read_header(self._map(ref.position + ref.size), ref.position,
                             ref.position + ref.size, f"{self.path} position {ref.position}")
        if got is None:
            raise CorruptRecordError(f"{self.path} position {ref.position}: end-of-stream marker")
        return got[0]

    # ---- truncation ------------------------------------------------------------
    def truncate_to(self, offset: int, encoder: bf.BatchEncoder) -> "LogSegment":
        """Keep only records below `offset` (base_offset < offset < next_offset);
        returns the segment object that now owns the files.

        A batch that straddles `offset` is re-encoded with its first rows (same
        epoch and producer fields, new count, CRC and max timestamp). The kept
        bytes go to a new file renamed over the old one, unsealed: it becomes
        the active segment. This object is retired, not changed: readers still
        holding it keep a consistent old picture (its index with its mapping)
        and never pair its index with the new file.
        """
        ref = next(self.batches_from(offset), None)
        if ref is None:
            raise StorageError(f"{self.path}: no batch contains offset {offset}")
        tail = b""
        header = None
        if offset > ref.base_offset:
            whole = self.read_header(ref)
            kept = ref.batch.slice(0, offset - ref.base_offset)
            header = bf.BatchHeader(whole.base_offset, kept.num_rows, whole.leader_epoch,
                                    bf.max_timestamp_ms(kept), whole.producer_id,
                                    whole.producer_epoch, whole.base_sequence)
            msg = encoder.encode([(kept, header)])[0]
            header, tail = msg.header, msg.to_bytes()
        offset_entries = [(o - self.base_offset, p) for o, p in self.offset_index.entries()
                          if p < ref.position]
        time_entries = [(t, o - self.base_offset) for t, o in self.time_index.entries()
                        if o < ref.base_offset]
        self._retire()
        self._rewrite(ref.position, tail)
        seg = LogSegment(self.dir, self.base_offset, self.schema, self.schema_size,
                         self._index_interval, self.created_ms)
        seg.size = ref.position + len(tail)
        seg.next_offset = offset
        seg.offset_index.reset(offset_entries)
        seg.time_index.reset(time_entries)
        if header is not None:
            seg.time_index.maybe_append(header.max_timestamp_ms, header.base_offset)
        seg._bytes_since_index_entry = seg.size - (offset_entries[-1][1] if offset_entries
                                                   else seg.schema_size)
        return seg

    def _retire(self) -> None:
        """This object no longer owns its path (deleted or replaced): close the
        descriptors and never map the path again. A mapping it already holds
        stays valid for readers still using it."""
        self._retired = True
        self.close()

    def _rewrite(self, keep: int, tail: bytes, schema_msg: bytes | None = None) -> None:
        """Replace the data file by its first `keep` bytes + `tail` (or, with
        `schema_msg`, by schema_msg + tail) through a new inode: never shrink in place."""
        tmp = self.path + TMP_SUFFIX
        try:
            with open(tmp, "wb") as dst:
                if schema_msg is not None:
                    dst.write(schema_msg)
                else:
                    with open(self.path, "rb") as src:
                        remaining = keep
                        while remaining:
                            chunk = src.read(min(remaining, 1 << 20))
                            if not chunk:
                                raise StorageError(f"{self.path}: shorter than {keep} bytes")
                            dst.write(chunk)
                            remaining -= len(chunk)
                dst.write(tail)
                dst.flush()
                os.fsync(dst.fileno())
        except BaseException:
            # A partial copy (ENOSPC: the usual reason) must not hold space on the full disk.
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        self._close_fd()
        os.replace(tmp, self.path)
        self._verified.clear()
        if not self._retired:
            with self._map_lock:
                self._buf = None    # map the new file on the next read
        fsync_dir(self.dir)

    # ---- durability and lifecycle ----------------------------------------------
    def write_pending_index_entries(self) -> bool:
        """Put index entries kept in memory into the index files (under the Log's lock).
        True if an index file was created (the directory needs an fsync)."""
        created = self.offset_index.write_pending()
        return self.time_index.write_pending() or created

    def fsync(self) -> None:
        """fsync the data file and both indexes by path: safe to run without the
        Log's lock, against a concurrent close or delete."""
        fsync_path(self.path)
        self.offset_index.fsync()
        self.time_index.fsync()

    def flush(self) -> None:
        """write_pending_index_entries + fsync (caller holds the Log's lock)."""
        self.write_pending_index_entries()
        self.fsync()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Release file descriptors; existing mappings stay valid for their holders."""
        self._close_fd()
        self.offset_index.close()
        self.time_index.close()

    def release(self) -> bool:
        """An idle segment gives back its descriptors and its mapping (under the
        Log's lock). The next append or read opens or maps again; readers still
        holding slices of the old mapping keep it alive. True if writing the
        pending index entries created an index file (the directory needs an fsync).

        The data file's descriptor and the mapping go first, and a process out of
        descriptors (EMFILE, ENFILE) keeps the pending index entries in memory for the
        next release or flush (the indexes are caches) and gives back the rest anyway:
        writing them needs a descriptor, and releasing idle logs is how a broker at
        its limit gets descriptors back."""
        self._close_fd()
        with self._map_lock:
            self._buf = None
            self._verified.clear()      # the next mapping checks every batch again
        try:
            created = self.write_pending_index_entries()
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            self.offset_index.close_keeping_pending()
            self.time_index.close_keeping_pending()
            return False
        self.close()
        return created

    @property
    def holds_resources(self) -> bool:
        """Whether a descriptor or a mapping is open (see `release`)."""
        return (self._fd is not None or self._buf is not None or self.offset_index.has_fd
                or self.time_index.has_fd)

    def delete(self) -> None:
        """Unlink the segment's files (safe while mapped: the inode lives on until
        unmapped). Readers holding this object keep any mapping it already has."""
        self._retired = True
        self._close_fd()
        self.offset_index.delete()
        self.time_index.delete()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        state = "sealed" if self.sealed else "active"
        return (f"LogSegment({self.path}, offsets [{self.base_offset}, {self.next_offset}), "
                f"{self.size} bytes, {state})")
