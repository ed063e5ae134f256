"""Time index of one segment: `<base offset>.timeindex`.

On disk: a flat array of 12-byte entries, no header::

    i64 little-endian  the segment's largest record timestamp so far (ms)
    u32 little-endian  offset, relative to the segment's base, of the batch that
                       raised the maximum to that value

An entry is appended whenever a batch raises the segment's maximum timestamp,
so timestamps strictly increase along the file. Every record in batches before
the entry's batch is older than the entry's timestamp, which makes "earliest
record at or after T" a lookup plus a short forward scan. The last entry is
the segment's max timestamp (used by time retention). Like the offset index it
is a cache, rebuilt after an unclean stop or when `sanity_check` fails.

New entries are kept in memory and written by `write_pending` (on flush, seal
and close). In memory: numpy arrays searched with np.searchsorted. Mutations are
serialised by the owning Log's lock; lookups read an immutable snapshot and
need no lock.
"""
from __future__ import annotations

import os

import numpy as np

from .fileio import fsync_path, replace_cache_file

ENTRY_SIZE = 12
_DTYPE = np.dtype([("ts", "<i8"), ("rel", "<u4")])   # packed: itemsize 12
assert _DTYPE.itemsize == ENTRY_SIZE


class TimeIndex:
    """`<base>.timeindex` of one segment (format and thread-safety: module doc)."""

    def __init__(self, path: str, base_offset: int):
        self.path = path
        self.base_offset = base_offset
        self._state = (np.zeros(64, dtype=_DTYPE), 0)
        self._fd: int | None = None
        self._persisted = 0                # entries already in the file
        self._torn = False

    # ---- loading ---------------------------------------------------------------
    def load(self) -> None:
        if os.path.exists(self.path):
            raw = np.fromfile(self.path, dtype=np.uint8)
            usable = len(raw) - len(raw) % ENTRY_SIZE
            entries = raw[:usable].view(_DTYPE).copy()
            self._torn = len(raw) != usable
        else:
            entries = np.zeros(0, dtype=_DTYPE)
            self._torn = False
        self._set(entries)

    def sanity_check(self, next_offset: int) -> str | None:
        """None if plausible for a segment whose records end before `next_offset`."""
        if self._torn:
            return f"{self.path}: size is not a multiple of {ENTRY_SIZE}"
        entries, n = self._state
        if n == 0:
            return None
        ts, rel = entries["ts"][:n], entries["rel"][:n].astype(np.int64)
        if n > 1 and (np.any(np.diff(ts) <= 0) or np.any(np.diff(rel) <= 0)):
            return f"{self.path}: entries are not strictly increasing"
        if int(ts[0]) < 0 or self.base_offset + int(rel[-1]) >= next_offset:
            return f"{self.path}: entry outside the segment's records"
        return None

    # ---- queries ---------------------------------------------------------------
    def __len__(self) -> int:
        return self._state[1]

    @property
    def max_timestamp_ms(self) -> int:
        entries, n = self._state
        return int(entries["ts"][n - 1]) if n else -1

    def entries(self) -> list[tuple[int, int]]:
        """(timestamp ms, absolute offset) pairs."""
        entries, n = self._state
        return [(int(t), self.base_offset + int(r)) for t, r in entries[:n]]

    def lookup(self, timestamp_ms: int) -> tuple[int, int] | None:
        """Largest entry with timestamp <= `timestamp_ms`, as (timestamp, absolute
        offset of its batch); None if every entry is newer."""
        entries, n = self._state
        if n == 0:
            return None
        i = int(np.searchsorted(entries["ts"][:n], timestamp_ms, side="right")) - 1
        if i < 0:
            return None
        return int(entries["ts"][i]), self.base_offset + int(entries["rel"][i])

    # ---- mutation --------------------------------------------------------------
    def maybe_append(self, max_timestamp_ms: int, batch_offset: int) -> bool:
        """Record that the batch at `batch_offset` raised the max timestamp; no-op if it
        did not."""
        entries, n = self._state
        if max_timestamp_ms < 0 or (n and max_timestamp_ms <= entries["ts"][n - 1]):
            return False
        if n == len(entries):
            grown = np.zeros(2 * len(entries), dtype=_DTYPE)
            grown[:n] = entries[:n]
            entries = grown
        entries[n] = (max_timestamp_ms, batch_offset - self.base_offset)
        self._state = (entries, n + 1)
        return True

    def write_pending(self) -> None:
        """Append the entries not yet in the file."""
        entries, n = self._state
        if n > self._persisted:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, entries[self._persisted:n].tobytes())
            self._persisted = n

    def truncate_to(self, offset: int) -> None:
        """Drop entries for batches at or after `offset`; rewrites the file (no fsync: a cache, fsynced with its segment on flush)."""
        entries, n = self._state
        keep = int(np.searchsorted(entries["rel"][:n], offset - self.base_offset, side="left"))
        if keep != n:
            self.reset(entries[:keep].copy())

    def reset(self, entries: np.ndarray | list[tuple[int, int]]) -> None:
        """Replace all entries, given as (timestamp, relative offset), atomically."""
        arr = entries if isinstance(entries, np.ndarray) else np.array(entries, dtype=_DTYPE)
        self._close_fd()
        replace_cache_file(self.path, arr.tobytes())
        self._torn = False
        self._set(arr)

    def _set(self, entries: np.ndarray) -> None:
        n = len(entries)
        cap = np.zeros(max(64, n), dtype=_DTYPE)
        cap[:n] = entries
        self._state = (cap, n)
        self._persisted = n

    def fsync(self) -> None:
        fsync_path(self.path)

    def close(self) -> None:
        self.write_pending()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        self._close_fd()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
