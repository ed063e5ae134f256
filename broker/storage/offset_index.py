"""Sparse offset index of one segment: `<base offset>.index`.

On disk: a flat array of 8-byte entries, no header::

    u32 little-endian  offset relative to the segment's base offset
    u32 little-endian  file position of the stored batch that starts at that offset

Entries point at batch starts, strictly increasing in both fields. The segment
adds one at least every `index_interval_bytes` of appended data, so a lookup
lands within that many bytes of any batch. The index is a cache: it is derived
from the segment and rebuilt after an unclean stop or when it fails
`sanity_check`. File handling, buffering and thread-safety: `entry_file`
(appends and truncations under the owning Log's lock; lookups lock-free on a
snapshot).
"""
from __future__ import annotations

import numpy as np

from .entry_file import EntryFile

ENTRY_SIZE = 8
_DTYPE = np.dtype([("rel", "<u4"), ("pos", "<u4")])


class OffsetIndex(EntryFile):
    """`<base>.index` of one segment (format and thread-safety: module doc)."""

    DTYPE = _DTYPE

    def sanity_check(self, data_start: int, data_end: int) -> str | None:
        """None if the entries are plausible for a data file whose batches lie in
        [data_start, data_end); otherwise what is wrong."""
        if self._torn:
            return self._torn_message()
        entries, n = self._state
        if n == 0:
            return None
        rel, pos = entries["rel"][:n], entries["pos"][:n]
        if n > 1 and (np.any(np.diff(rel.astype(np.int64)) <= 0) or np.any(np.diff(pos.astype(np.int64)) <= 0)):
            return f"{self.path}: entries are not strictly increasing"
        if int(pos[0]) < data_start or int(pos[-1]) >= data_end:
            return f"{self.path}: positions outside the data [{data_start}, {data_end})"
        return None

    # ---- queries ---------------------------------------------------------------
    def entries(self) -> list[tuple[int, int]]:
        """(absolute offset, position) pairs."""
        entries, n = self._state
        return [(self.base_offset + int(r), int(p)) for r, p in entries[:n]]

    def last_entry(self) -> tuple[int, int] | None:
        entries, n = self._state
        if n == 0:
            return None
        return self.base_offset + int(entries["rel"][n - 1]), int(entries["pos"][n - 1])

    def lookup(self, offset: int) -> tuple[int, int] | None:
        """Largest entry whose offset <= `offset`, as (absolute offset, position); None if none."""
        entries, n = self._state
        if n == 0:
            return None
        rel = offset - self.base_offset
        if rel < 0:
            return None
        i = int(np.searchsorted(entries["rel"][:n], min(rel, 0xFFFFFFFF), side="right")) - 1
        if i < 0:
            return None
        return self.base_offset + int(entries["rel"][i]), int(entries["pos"][i])

    # ---- mutation --------------------------------------------------------------
    def append(self, offset: int, position: int) -> None:
        self._append_entry((offset - self.base_offset, position))

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or beyond `position` (rewrites the file)."""
        entries, n = self._state
        self._keep_first(int(np.searchsorted(entries["pos"][:n], position, side="left")))
