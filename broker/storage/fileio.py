"""Durable file helpers shared by the storage classes.

No format of its own. `atomic_write_bytes` is the one way any checkpoint or
rewritten file reaches disk: write `<path>.tmp`, flush, fsync, rename over
`<path>`, fsync the directory. A crash leaves either the old or the new file
under `<path>`, never a torn one; a leftover `.tmp` is ignored by readers and
removed on the next load.

Thread-safety: the functions hold no state but two process-wide settings, which
calls keep the GIL and the size of the writes that do (set once at start,
`set_gil_kept_file_calls`, `set_kept_write_max_bytes`); two writers of the same path
must be serialised by their caller (they share the tmp name).
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os

from replikafka.errors import CorruptRecordError

TMP_SUFFIX = ".tmp"
_LIBC = ctypes.CDLL(None, use_errno=True)
# mmap and munmap of a read-only mapping set up or drop page tables and do no I/O
# (pages are read when touched; none is ever dirty), so they are called keeping the
# GIL: a call that gives it up waits to take it back until the thread running
# Python reaches its switch interval, and a survivor serving a failover's first
# follower fetches maps thousands of idle-released segments beside busy threads.
# Opening an existing file, its size and closing a read-only descriptor usually touch
# only the kernel's caches of names and inodes; a small buffered write is a copy into
# the page cache. Kept calls for the same reason: a survivor's first write to, and first
# follower read of, thousands of idle-released partitions made each of these calls
# once a partition, and each waited a switch interval to take the GIL back. A small
# write waits on the device only when the kernel throttles writers (too many dirty
# pages) or the file system hangs; the whole broker then waits with it, and past
# zookeeper.session.timeout.ms its session expires and its leaderships move. Where log
# dirs sit on a file system that can hang (NFS), `set_gil_kept_file_calls(False)`
# makes every one of these calls give the GIL up: a hung call then stalls its thread.


class _LibcCalls:
    """The C library's file calls the storage makes through ctypes: through a
    ``ctypes.PyDLL`` they keep the GIL, through a ``ctypes.CDLL`` they give it up."""

    def __init__(self, lib):
        self.mmap = lib.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        self.munmap = lib.munmap
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.open = lib.open
        self.open.restype = ctypes.c_int
        self.open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
        self.lseek = lib.lseek
        self.lseek.restype = ctypes.c_int64
        self.lseek.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
        self.close = lib.close
        self.close.restype = ctypes.c_int
        self.close.argtypes = [ctypes.c_int]
        self.pwrite = lib.pwrite
        self.pwrite.restype = ctypes.c_ssize_t
        self.pwrite.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64]


_KEEPING_GIL = _LibcCalls(ctypes.PyDLL(None, use_errno=True))
_GIVING_GIL_UP = _LibcCalls(ctypes.CDLL(None, use_errno=True))   # its own handle: its own argtypes
_MAP_FAILED = ctypes.c_void_p(-1).value
# The calls above as set (`python.gil.kept.file.calls.enable`), and the writes of at
# most this many bytes that go through them (`python.gil.kept.write.max.bytes`).
_calls = _KEEPING_GIL
_kept_write_max_bytes = 64 * 1024


def set_kept_write_max_bytes(limit: int) -> None:
    """Process-wide: writes of at most ``limit`` bytes (`pwritev_all`) keep the GIL;
    0: every write gives it up (the broker's `python.gil.kept.write.max.bytes`)."""
    global _kept_write_max_bytes
    _kept_write_max_bytes = max(0, int(limit))


def set_gil_kept_file_calls(enabled: bool) -> None:
    """Process-wide: False makes every file call of this module give the GIL up (the
    opens, sizes, closes, mappings and small writes that keep it; the broker's
    `python.gil.kept.file.calls.enable`)."""
    global _calls
    _calls = _KEEPING_GIL if enabled else _GIVING_GIL_UP


def _checked(result: int, what: str, path: str | None = None) -> int:
    """``result`` of a C library call that returns -1 and sets errno on failure."""
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", *([path] if path is not None else []))
    return result


def open_keeping_gil(path: str, flags: int, mode: int = 0o644) -> int:
    """os.open(path, flags, mode) keeping the GIL (see above; unless `set_gil_kept_file_calls`
    turned that off): for existing files."""
    encoded = os.fsencode(path)
    while True:
        fd = _calls.open(encoded, flags | os.O_CLOEXEC, mode)
        if fd >= 0 or ctypes.get_errno() != errno.EINTR:
            return _checked(fd, "open", path)


def sync_filesystem(path: str) -> None:
    """Make every write to the file system holding `path` durable (syncfs(2); sync(2)
    where the C library has no syncfs): one call instead of an fsync per file, for a
    clean shutdown that must make thousands of logs durable at once."""
    syncfs = getattr(_LIBC, "syncfs", None)
    if syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}", path)
    finally:
        os.close(fd)


class _Mapping:
    """One read-only shared mapping, unmapped when the last buffer over it is gone."""

    __slots__ = ("address", "length")

    def __init__(self, address: int, length: int):
        self.address, self.length = address, length

    def __del__(self):
        _calls.munmap(self.address, self.length)


def map_file(path: str, min_size: int = 0, headroom: int = 0):
    """A read-only ``pyarrow.Buffer`` over the file at ``path``: its size now plus
    ``headroom`` bytes, which may reach past the file's end (``pa.memory_map`` maps only
    the current size): pages past the end read as the file grows under them (a shared
    mapping), and touching one that is still past the end raises SIGBUS, so a caller
    reads only bytes it knows are written. The mapping lives as long as any buffer
    sliced from it. The size is read from the descriptor mapped (no second lookup of
    the path: each system call gives the GIL up, and a busy broker's threads take it
    back one after the other); a file shorter than ``min_size`` (bytes the caller knows
    were written) raises CorruptRecordError naming both sizes."""
    import pyarrow as pa

    fd = open_keeping_gil(path, os.O_RDONLY)
    try:
        size = _checked(_calls.lseek(fd, 0, os.SEEK_END), "lseek", path)
        if size < min_size:
            raise CorruptRecordError(f"{path}: file holds {size} bytes, expected at least {min_size}")
        length = size + headroom
        if length <= 0:
            return pa.py_buffer(b"")
        address = _calls.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap: {os.strerror(err)}", path)
    finally:
        _calls.close(fd)        # a read-only descriptor: nothing to report on close
    return pa.foreign_buffer(address, length, base=_Mapping(address, length))


def fsync_dir(path: str) -> None:
    """fsync a directory so that creates, renames and unlinks in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: str) -> bool:
    """fsync a file by path (a fresh descriptor, so no race with a writer closing its
    own). False if the file no longer exists."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def write_all(fd: int, data) -> None:
    """os.write until every byte of `data` is written (regular files may write short)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


_IOV_MAX = 512   # well under Linux's 1024 iovecs per call


def pwritev_all(fd: int, pieces, position: int) -> int:
    """Write the concatenation of `pieces` (bytes-like objects) at `position` with
    os.pwritev, resuming after short writes. Returns the bytes written. At most
    `set_kept_write_max_bytes` bytes are written keeping the GIL (one ``pwrite`` of
    the pieces joined: a copy that size costs less than a take-back of the GIL), unless
    `set_gil_kept_file_calls` turned kept calls off."""
    size = sum(len(p) for p in pieces)
    if 0 < size <= _kept_write_max_bytes:
        return _pwrite_joined(fd, pieces, size, position)
    pending = [p for p in pieces if len(p)]
    total = 0
    i = 0
    while i < len(pending):
        n = os.pwritev(fd, pending[i:i + _IOV_MAX], position + total)
        total += n
        while n:
            size = len(pending[i])
            if n >= size:
                n -= size
                i += 1
            else:
                pending[i] = memoryview(pending[i]).cast("B")[n:]
                n = 0
    return total


def _pwrite_joined(fd: int, pieces, size: int, position: int) -> int:
    """`pwritev_all` of ``size`` bytes in one buffer: the one piece as it is if Arrow
    holds it, else the pieces joined."""
    import pyarrow as pa

    data = pieces[0] if len(pieces) == 1 and isinstance(pieces[0], pa.Buffer) else b"".join(pieces)
    address = data.address if isinstance(data, pa.Buffer) else ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    written = 0
    while written < size:
        n = _calls.pwrite(fd, address + written, size - written, position + written)
        if n < 0 and ctypes.get_errno() == errno.EINTR:
            continue
        _checked(n, "pwrite")
        if n == 0:
            raise OSError(errno.EIO, f"pwrite wrote nothing of {size - written} bytes at {position + written}")
        written += n
    return written


def write_new_file(path: str, data) -> int:
    """Create `path` holding `data` and return a write descriptor to it, without
    fsync. Never truncates an existing file in place (it might be mapped): an
    existing one is unlinked first, so the new file is a new inode."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, data)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_cache_file(path: str, data) -> None:
    """Rewrite a derived file (an index) without fsync: it is rebuilt from the data
    after a crash, and fsynced with its segment when the log flushes."""
    os.close(write_new_file(path, data))


def atomic_write_bytes(path: str, data, *, sync_dir: bool = True, durable: bool = True) -> None:
    """Replace `path` with `data` atomically and durably (tmp, fsync, rename, fsync dir).

    `sync_dir=False` leaves the directory fsync to the caller (who batches it).
    `durable=False` skips both fsyncs: after a crash `path` holds the old content,
    the new, or (the rename reached disk before the data) an empty file; for files
    whose loss is repaired (written again) by their owner.
    """
    tmp = path + TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if sync_dir and durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
