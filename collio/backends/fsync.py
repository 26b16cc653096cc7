"""fsync of a file or directory by path, and early writeback, for backends that store files."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterable
from typing import Any

from .._libc import libc

__all__ = [
    "fsync_files",
    "fsync_path",
    "start_writeback",
    "sync_file_range",
    "SYNC_FILE_RANGE_WRITE",
]

SYNC_FILE_RANGE_WRITE = 2


def _libc_sync_file_range() -> Any:
    fn = getattr(libc(), "sync_file_range", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


#: Linux's sync_file_range(fd, offset, nbytes, flags), or None where libc lacks it.
sync_file_range = _libc_sync_file_range()


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
