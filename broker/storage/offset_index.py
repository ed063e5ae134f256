"""Sparse offset index of one segment: `<base offset>.index`.

On disk: a flat array of 8-byte entries, no header::

    u32 little-endian  offset relative to the segment's base offset
    u32 little-endian  file position of the stored batch that starts at that offset

Entries point at batch starts, strictly increasing in both fields. The segment
adds one at least every `index_interval_bytes` of appended data, so a lookup
lands within that many bytes of any batch. The index is a cache: it is derived
from the segment and rebuilt after an unclean stop or when it fails
`sanity_check`. New entries are kept in memory and written to the file by
`write_pending` (on flush, seal and close), which saves a syscall per entry;
after a crash the unwritten ones are rebuilt with the rest.

In memory the entries live in numpy arrays (loaded with np.fromfile, searched
with np.searchsorted). Appends and truncations are serialised by the owning
Log's lock; lookups from other threads read an immutable (arrays, count)
snapshot and are safe without a lock.
"""
from __future__ import annotations

import os

import numpy as np

from .fileio import fsync_path, replace_cache_file

ENTRY_SIZE = 8
_DTYPE = np.dtype([("rel", "<u4"), ("pos", "<u4")])


class OffsetIndex:
    """`<base>.index` of one segment (format and thread-safety: module doc)."""

    def __init__(self, path: str, base_offset: int):
        self.path = path
        self.base_offset = base_offset
        self._state = (np.zeros(64, dtype=_DTYPE), 0)   # (array, valid entries) read as one snapshot
        self._fd: int | None = None
        self._persisted = 0                # entries already in the file
        self._torn = False                 # file size was not a whole number of entries

    # ---- loading ---------------------------------------------------------------
    def load(self) -> None:
        """Read the file (missing = empty). Call sanity_check before trusting it."""
        if os.path.exists(self.path):
            raw = np.fromfile(self.path, dtype=np.uint8)
            usable = len(raw) - len(raw) % ENTRY_SIZE
            entries = raw[:usable].view(_DTYPE).copy()
            self._torn = len(raw) != usable
        else:
            entries = np.zeros(0, dtype=_DTYPE)
            self._torn = False
        self._set(entries)

    def sanity_check(self, data_start: int, data_end: int) -> str | None:
        """None if the entries are plausible for a data file whose batches lie in
        [data_start, data_end); otherwise what is wrong."""
        if self._torn:
            return f"{self.path}: size is not a multiple of {ENTRY_SIZE}"
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
    def __len__(self) -> int:
        return self._state[1]

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
        entries, n = self._state
        if n == len(entries):
            grown = np.zeros(max(64, 2 * len(entries)), dtype=_DTYPE)
            grown[:n] = entries[:n]
            entries = grown
        entries[n] = (offset - self.base_offset, position)
        self._state = (entries, n + 1)

    def write_pending(self) -> None:
        """Append the entries not yet in the file."""
        entries, n = self._state
        if n > self._persisted:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, entries[self._persisted:n].tobytes())
            self._persisted = n

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or beyond `position`; rewrites the file (no fsync: a cache, fsynced with its segment on flush)."""
        entries, n = self._state
        keep = int(np.searchsorted(entries["pos"][:n], position, side="left"))
        if keep != n:
            self.reset(entries[:keep].copy())

    def reset(self, entries: np.ndarray | list[tuple[int, int]]) -> None:
        """Replace all entries, given as (relative offset, position), and rewrite the
        file (no fsync: a cache, fsynced with its segment on flush)."""
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
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

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
