"""fsync of a file or directory by path, for backends and benchmarks that store many files."""

from __future__ import annotations

import errno
import os

__all__ = ["fsync_path"]


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
