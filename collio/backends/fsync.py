"""fsync of a file or directory by path, and early writeback, for backends that store files."""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import os
from collections.abc import Iterable
from typing import Any

from .._libc import libc
from ..errors import BackendError
from ..threads import flush_executor

__all__ = [
    "EarlyFlush",
    "fallocate",
    "fdatasync",
    "fsync_files",
    "fsync_path",
    "start_writeback",
    "sync_file_range",
    "SYNC_FILE_RANGE_WRITE",
]

SYNC_FILE_RANGE_WRITE = 2


def _libc_call(name: str, *argtypes: Any) -> Any:
    """libc's function ``name`` returning an int, or None where libc lacks it."""
    fn = getattr(libc(), name, None)
    if fn is None:
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


#: Linux's sync_file_range(fd, offset, nbytes, flags), or None where libc lacks it.
sync_file_range = _libc_call(
    "sync_file_range", ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint
)

#: Linux's fallocate(fd, mode, offset, nbytes), or None where libc lacks it.  Called
#: directly, not as ``posix_fallocate``, whose fallback where the file system cannot
#: allocate writes a zero into every block.
fallocate = _libc_call("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


#: What :class:`EarlyFlush` calls (``os.fdatasync``, ``os.fsync`` where there is none);
#: a module attribute so that fault-injection tests can make it fail on one rank.
fdatasync = getattr(os, "fdatasync", os.fsync)


def _fdatasync(fd: int) -> None:
    fdatasync(fd)


class EarlyFlush:
    """Make a file durable while it is still being written: ``fdatasync`` in a background
    thread, started after a large write whenever the previous one has finished.

    Where the storage keeps written data in a volatile cache (a virtual disk's host,
    a drive's write cache), a flush takes time in proportion to what reached the
    cache since the last one.  A single fsync at the end (``sync()``, ``close()``)
    starts that work only when every byte is written; flushing while the call still
    shuffles and writes overlaps most of it with the call (``collio-bench --compare
    collio,collio-noflush`` measures the gain on a given storage; docs/design.md).

    A flush's error is kept and reported by :meth:`wait`, that is by the next
    ``sync()`` (or ``close()``), as a :class:`~collio.errors.BackendError` saying that
    data written before it may not be durable; no flush starts after a failed one
    until then.  It is not raised by a later write: the failed flush covered earlier
    calls' data, and the kernel tells each descriptor of a writeback error only once,
    so the fsync of that ``sync()`` would otherwise report success.
    """

    __slots__ = ("fd", "path", "future", "count", "error", "pending")

    #: Bytes written since the last flush before another starts: a flush after every
    #: small write (a time series of 1 MiB calls) costs each call a device flush in the
    #: background, more than the final fsync it spares.
    AFTER = 4 << 20

    def __init__(self, fd: int, path: str = "") -> None:
        self.fd = fd
        self.path = path
        self.pending = 0  # bytes written since the last flush started
        self.future: concurrent.futures.Future[None] | None = None
        #: Flushes started since the last :meth:`take_count`.
        self.count = 0
        #: The first failed flush since the last :meth:`wait`: none starts while set.
        self.error: BaseException | None = None

    def kick(self, nbytes: int, *, now: bool = False) -> None:
        """``nbytes`` were written: start a flush once :data:`AFTER` bytes were written since
        the last one (with ``now``, at once: the caller knows it wrote), unless one is
        running or one failed (kept for :meth:`wait`)."""
        self.pending += nbytes
        if self.pending < self.AFTER and not now:
            return
        fut = self.future
        if fut is not None:
            if not fut.done():
                return
            self.future = None
            self.error = self.error or fut.exception()
        if self.error is None:
            self.future = flush_executor().submit(_fdatasync, self.fd)
            self.count += 1
            self.pending = 0

    def wait(self) -> BackendError | None:
        """Wait for the running flush, if any; the error of a failed one since the last
        call (reported once), as a BackendError, else None.  Flushes start again."""
        fut, self.future = self.future, None
        exc = self.error or (fut.exception() if fut is not None else None)
        self.error = None
        if exc is None:
            return None
        code = getattr(exc, "errno", None)
        why = getattr(exc, "strerror", None) or str(exc)
        return BackendError(
            f"early flush (fdatasync) of {self.path or 'the file'!r} failed: {why}; data "
            "written before this sync may not be durable",
            errno=code if isinstance(code, int) else errno.EIO,
        )

    def take_count(self) -> int:
        """Flushes started since the last call (for the statistics)."""
        n, self.count = self.count, 0
        return n


def start_writeback(path: str) -> None:
    """Start writing a file's dirty pages to disk, without waiting (Linux; else nothing).

    A later fsync then has less left to do, and the disk works while the caller
    goes on (other ranks still storing, the next round).
    """
    if sync_file_range is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)
    finally:
        os.close(fd)


def fsync_path(path: str) -> bool:
    """fsync a file or directory; False when it does not exist (an unstored chunk)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)
    return True


def fsync_files(paths: Iterable[str]) -> None:
    """fsync the files that exist among ``paths``, then the directories holding them
    (so new files' names are durable too); missing files (never stored) are skipped."""
    dirs = {os.path.dirname(p) for p in paths if fsync_path(p)}
    for d in sorted(dirs):
        fsync_path(d)
