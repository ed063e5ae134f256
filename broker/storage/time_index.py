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

File handling, buffering and thread-safety: `entry_file` (mutations under the
owning Log's lock; lookups lock-free on a snapshot).
"""
from __future__ import annotations

import numpy as np

from .entry_file import EntryFile

ENTRY_SIZE = 12
_DTYPE = np.dtype([("ts", "<i8"), ("rel", "<u4")])   # packed: itemsize 12
assert _DTYPE.itemsize == ENTRY_SIZE


class TimeIndex(EntryFile):
    """`<base>.timeindex` of one segment (format and thread-safety: module doc)."""

    DTYPE = _DTYPE

    def sanity_check(self, next_offset: int) -> str | None:
        """None if plausible for a segment whose records end before `next_offset`."""
        if self._torn:
            return self._torn_message()
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
        self._append_entry((max_timestamp_ms, batch_offset - self.base_offset))
        return True

    def truncate_to(self, offset: int) -> None:
        """Drop entries for batches at or after `offset` (rewrites the file)."""
        entries, n = self._state
        self._keep_first(int(np.searchsorted(entries["rel"][:n], offset - self.base_offset, side="left")))
