"""The file mechanics shared by the segment indexes: a flat file of fixed-width
numpy records, no header.

A missing file is an empty index (an index with no entries has no file).
Loaded whole with np.fromfile (a torn tail is noticed, not trusted); new
entries are kept in memory and appended to the file by `write_pending` (on
flush, seal and close), which saves a syscall per entry; `reset` rewrites the
file (no fsync: these files are caches, fsynced with their segment on flush
and rebuilt after an unclean stop).

An index bound by `lazy_check` (a log loaded from its clean-shutdown state)
reads its file on first use instead: a broker with 50,000 partitions reads
only the indexes it touches. If the file then fails the check, its entries are
dropped (a lookup scans from the segment start: slower, still correct).

Thread-safety: mutations are serialised by the owning Log's lock; readers take
the immutable (array, count) snapshot in `_state` and need no lock (a lazy
first load takes a module lock, so a reader's load never overwrites an entry
a writer added meanwhile).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable

import numpy as np

from .fileio import fsync_path, replace_cache_file

log = logging.getLogger(__name__)
_LAZY_LOAD_LOCK = threading.Lock()


class EntryFile:
    """Subclasses set DTYPE (a packed numpy record type)."""

    DTYPE: np.dtype

    def __init__(self, path: str, base_offset: int, lazy_check: Callable[[], str | None] | None = None):
        """`lazy_check`: read the file on first use, then run this sanity check."""
        self.path = path
        self.base_offset = base_offset
        # (array, valid entries), read as one snapshot; None until a lazy index is loaded.
        self._entries_state: tuple[np.ndarray, int] | None = \
            None if lazy_check is not None else (np.zeros(64, dtype=self.DTYPE), 0)
        self._lazy_check = lazy_check
        self._fd: int | None = None
        self._persisted = 0                # entries already in the file
        self._torn = False                 # file size was not a whole number of entries

    @property
    def _state(self) -> tuple[np.ndarray, int]:
        state = self._entries_state
        if state is None:
            state = self._load_lazily()
        return state

    @_state.setter
    def _state(self, state: tuple[np.ndarray, int]) -> None:
        self._entries_state = state

    def _load_lazily(self) -> tuple[np.ndarray, int]:
        with _LAZY_LOAD_LOCK:
            if self._entries_state is None:
                self.load()
                problem = self._lazy_check()
                if problem:
                    log.warning("%s: dropping the index (%s); lookups scan from the segment start",
                                self.path, problem)
                    self.reset([])     # the file goes too: later entries are not appended to bad ones
            return self._entries_state

    def load(self) -> None:
        """Read the file (missing = empty). Call sanity_check before trusting it."""
        size = self.DTYPE.itemsize
        if os.path.exists(self.path):
            raw = np.fromfile(self.path, dtype=np.uint8)
            usable = len(raw) - len(raw) % size
            entries = raw[:usable].view(self.DTYPE).copy()
            self._torn = len(raw) != usable
        else:
            entries = np.zeros(0, dtype=self.DTYPE)
            self._torn = False
        self._set(entries)

    def _torn_message(self) -> str:
        return f"{self.path}: size is not a multiple of {self.DTYPE.itemsize}"

    def __len__(self) -> int:
        return self._state[1]

    def _append_entry(self, entry: tuple) -> None:
        entries, n = self._state
        if n == len(entries):
            grown = np.zeros(max(64, 2 * len(entries)), dtype=self.DTYPE)
            grown[:n] = entries[:n]
            entries = grown
        entries[n] = entry
        self._state = (entries, n + 1)

    def write_pending(self) -> bool:
        """Append the entries not yet in the file. True if that created the file
        (its directory entry then needs an fsync)."""
        entries, n = self._state
        created = False
        if n > self._persisted:
            if self._fd is None:
                created = not os.path.exists(self.path)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, entries[self._persisted:n].tobytes())
            self._persisted = n
        return created

    def _keep_first(self, keep: int) -> None:
        """Drop every entry from index `keep` on (rewrites the file if any go)."""
        entries, n = self._state
        if keep != n:
            self.reset(entries[:keep].copy())

    def reset(self, entries: np.ndarray | list[tuple], *, file_holds_them: bool = False) -> None:
        """Replace all entries (raw fields, as stored) and rewrite the file (no
        entries: no file, which loads as empty). `file_holds_them`: the file already
        holds exactly these entries and is left alone."""
        arr = entries if isinstance(entries, np.ndarray) else np.array(entries, dtype=self.DTYPE)
        self._close_fd()
        if file_holds_them:
            pass
        elif len(arr):
            replace_cache_file(self.path, arr.tobytes())
        else:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self._torn = False
        self._set(arr)

    def rebuilt(self, entries: list[tuple]) -> None:
        """Take the entries recovery rebuilt from the data: as `reset`, but the file is
        left alone when it already holds exactly these (the usual case after a crash:
        every index entry is written with its batch). Rewriting both indexes of every
        recovered log cost two file creations or unlinks a log, most of a small log's
        recovery on a busy disk."""
        arr = np.array(entries, dtype=self.DTYPE)
        want = arr.tobytes()
        try:
            with open(self.path, "rb") as f:
                held = f.read(len(want) + 1)
        except FileNotFoundError:
            held = None
        self.reset(arr, file_holds_them=held == want or (held is None and not want))

    def _set(self, entries: np.ndarray) -> None:
        n = len(entries)
        cap = np.zeros(max(64, n), dtype=self.DTYPE)
        cap[:n] = entries
        self._state = (cap, n)
        self._persisted = n

    @property
    def has_fd(self) -> bool:
        return self._fd is not None

    def fsync(self) -> None:
        fsync_path(self.path)

    def close(self) -> None:
        if self._entries_state is not None:   # a lazy index never read has nothing pending:
            self.write_pending()              # closing it must not read it (2 files a log)
        self._close_fd()

    def close_keeping_pending(self) -> None:
        """Close the descriptor only: entries not yet in the file stay in memory and go
        with the next ``write_pending`` (a process out of descriptors cannot write them)."""
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
