"""Leader-epoch history of one partition: `leader-epoch-checkpoint` (Kafka KIP-101/279).

On disk, Kafka's format, text::

    0                          version
    N                          number of entries
    <epoch> <start offset>     N lines, epochs and start offsets increasing

Entry (e, s) means: leader epoch e wrote its first record at offset s. The
file is rewritten (tmp, fsync, rename, fsync dir) at once on a truncation or
log-start move; a new epoch (`assign`) and a load's truncation (`truncate_from_end`
with durable=False) are written by the log's next flush, before its recovery
point passes them.

Thread-safety: all methods take the cache's own lock; safe to share.
"""
from __future__ import annotations

import os
import threading
from typing import NamedTuple

from replikafka.errors import StorageError

from .fileio import atomic_write_bytes

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
_VERSION = 0


class EpochEntry(NamedTuple):
    """Leader `epoch` wrote its first record at `start_offset`."""

    epoch: int
    start_offset: int


class LeaderEpochFileCache:
    """A partition's epoch -> start offset history, kept in memory and in its
    checkpoint file (format: module doc). Thread-safe."""

    def __init__(self, path: str, entries: list[tuple[int, int]] | None = None):
        """`entries`: the history as the file holds it, known without reading it
        (a log loaded from its clean-shutdown state)."""
        self.path = path
        self._lock = threading.Lock()
        self._entries: list[EpochEntry] = self._load() if entries is None else [EpochEntry(*e) for e in entries]
        # What the file holds: a change that ends where it began (a crashed log's load
        # drops the entries past where its scan starts and re-assigns the same ones
        # from the batches) is not written again. Before, the first flush or the
        # close of every log recovered after a crash rewrote and fsynced this file.
        self._on_disk = list(self._entries)
        self._dirty = False

    # ---- file ------------------------------------------------------------------
    def _load(self) -> list[EpochEntry]:
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = [ln for ln in f.read().splitlines() if ln.strip()]
        except FileNotFoundError:
            return []

        def bad(why: str) -> StorageError:
            return StorageError(f"malformed leader-epoch checkpoint {self.path}: {why}")

        if len(lines) < 2 or lines[0].strip() != str(_VERSION):
            raise bad("missing or unsupported version line")
        try:
            count = int(lines[1])
            entries = [EpochEntry(*map(int, ln.split())) for ln in lines[2:]]
        except (ValueError, TypeError):
            raise bad("an entry is not 'epoch start_offset'") from None
        if len(entries) != count:
            raise bad(f"count {count} but {len(entries)} entries")
        for a, b in zip(entries, entries[1:]):
            if not (a.epoch < b.epoch and a.start_offset <= b.start_offset):
                raise bad(f"entries {a} and {b} are not increasing")
        return entries

    def _write(self, sync_dir: bool = True, durable: bool = True) -> None:
        lines = [str(_VERSION), str(len(self._entries))]
        lines += [f"{e.epoch} {e.start_offset}" for e in self._entries]
        atomic_write_bytes(self.path, ("\n".join(lines) + "\n").encode(), sync_dir=sync_dir, durable=durable)
        self._on_disk = list(self._entries)
        self._dirty = False

    def _changed(self) -> bool:
        """Under the lock: the entries differ from the file's."""
        if self._dirty and self._entries == self._on_disk:
            self._dirty = False
        return self._dirty

    # ---- queries ---------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        """An assign or truncation not written to the file yet."""
        with self._lock:
            return self._changed()

    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        with self._lock:
            return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch whose range contains `offset`; UNDEFINED_EPOCH if before the first."""
        with self._lock:
            epoch = UNDEFINED_EPOCH
            for e in self._entries:
                if e.start_offset > offset:
                    break
                epoch = e.epoch
            return epoch

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for an OffsetsForLeaderEpoch request (KIP-279), as Kafka's
        LeaderEpochFileCache.endOffsetFor:

        - requested is the latest epoch: (requested, log_end_offset);
        - otherwise the largest known epoch <= requested, ending where the next
          higher epoch starts; if no known epoch is <= requested, (requested, start
          of the first higher epoch): that data is gone, start from there;
        - UNDEFINED (-1, -1) for an undefined request, an empty cache, or a
          requested epoch above every known one.
        """
        with self._lock:
            if requested_epoch == UNDEFINED_EPOCH or not self._entries:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if requested_epoch == self._entries[-1].epoch:
                return requested_epoch, log_end_offset
            higher = next((e for e in self._entries if e.epoch > requested_epoch), None)
            if higher is None:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            floor = None
            for e in self._entries:
                if e.epoch > requested_epoch:
                    break
                floor = e
            if floor is None:
                return requested_epoch, higher.start_offset
            return floor.epoch, higher.start_offset

    # ---- mutation --------------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`. An epoch not above the latest
        is ignored. Returns whether the cache changed (and was checkpointed)."""
        if epoch < 0 or start_offset < 0:
            return False
        with self._lock:
            if self._entries and epoch <= self._entries[-1].epoch:
                return False
            # Kafka keeps offsets monotonic: a newer epoch starting below an older
            # entry's start replaces that entry (only after an unclean history).
            while self._entries and self._entries[-1].start_offset > start_offset:
                self._entries.pop()
            self._entries.append(EpochEntry(epoch, start_offset))
            # Not written here: a partition becoming leader (thousands at once in a
            # failover) must not wait for an fsync each. The batches carry their
            # epoch, recovery re-assigns epochs from the batches it scans, and the
            # log flushes this file before its recovery point passes the new epoch
            # (Log.flush), so nothing below the recovery point depends on it.
            self._dirty = True
            return True

    def flush(self, sync_dir: bool = True, durable: bool = True) -> bool:
        """Write the checkpoint (tmp, fsync, rename) if an assign changed it; True if
        it did. `sync_dir=False`: the caller fsyncs the directory (the log's flush);
        `durable=False`: no fsync at all (the caller syncs the whole file system)."""
        with self._lock:
            if self._changed():
                self._write(sync_dir, durable)
                return True
            return False

    def truncate_from_end(self, end_offset: int, durable: bool = True) -> None:
        """Drop entries starting at or after `end_offset` (the log was truncated there).

        `durable=False` (log loading) only marks the file dirty: what it drops is
        re-derived by every later load (entries at or past the first segment that
        load scans are rebuilt from the batches), and the log flushes the file
        before its recovery point passes the offsets concerned."""
        with self._lock:
            kept = [e for e in self._entries if e.start_offset < end_offset]
            if len(kept) != len(self._entries):
                self._entries = kept
                if durable:
                    self._write()
                else:
                    self._dirty = True

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: drop entries wholly below it and move
        the epoch that contains it to start there."""
        with self._lock:
            below = [e for e in self._entries if e.start_offset <= start_offset]
            if not below or (len(below) == 1 and below[0].start_offset == start_offset):
                return
            rest = self._entries[len(below):]
            self._entries = [EpochEntry(below[-1].epoch, start_offset)] + rest
            self._write()

    def clear(self) -> None:
        with self._lock:
            if self._entries or not os.path.exists(self.path):
                self._entries = []
                self._write()
