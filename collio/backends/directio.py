"""Direct I/O (``O_DIRECT``) beside the page cache, for the hint ``direct_write``."""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

from ..buffers import PAGE, scratch_buffer
from .fdio import pwrite_all

__all__ = ["DIRECT_MIN", "direct_possible", "open_direct", "write_split"]

#: Direct I/O (hint ``direct_write``) for the page-aligned middle of requests this big.
DIRECT_MIN = 1 << 20
#: Bytes per direct write from a buffer that is not page-aligned (copied first).
_BOUNCE = 8 << 20


def write_split(
    fd: int, dfd: int, buf: npt.NDArray[np.uint8], offset: int, name: str = "the file"
) -> int:
    """Write all of ``buf`` at ``offset``: its page-aligned middle through ``dfd`` (opened
    ``O_DIRECT``; -1: none) when that is at least 1 MiB and ``buf`` sits at the same
    offset within a page as the file bytes, the rest through ``fd`` (the page cache).

    The two never share a page, so the page cache stays coherent (Linux flushes and
    drops cached pages a direct write covers).  Returns the bytes written direct;
    raises :class:`BackendError` on a short write.
    """
    view = memoryview(buf).cast("B")  # type: ignore[arg-type]
    total = len(view)
    if dfd < 0 or total < DIRECT_MIN:  # (all through the page cache)
        pwrite_all(fd, view, offset, name)
        return 0
    parts = [(fd, 0, total)]
    if dfd >= 0 and total >= DIRECT_MIN:
        a = -(-offset // PAGE) * PAGE - offset  # relative to offset
        b = (offset + total) // PAGE * PAGE - offset
        if b - a >= DIRECT_MIN:
            parts = [(fd, 0, a), (dfd, a, b), (fd, b, total)]
    for d, lo, hi in parts:
        if hi <= lo:
            continue
        if d == dfd and (buf.ctypes.data + lo) % PAGE:
            _bounced(dfd, buf[lo:hi], offset + lo, name)
            continue
        pwrite_all(d, view[lo:hi], offset + lo, name)
    return parts[1][2] - parts[1][1] if len(parts) == 3 else 0


def _bounced(dfd: int, buf: npt.NDArray[np.uint8], offset: int, name: str) -> None:
    """Write ``buf`` (page-aligned in the file, not in memory) with ``O_DIRECT`` through a
    kept page-aligned buffer, :data:`_BOUNCE` bytes at a time: numpy's copy costs less
    than the page cache's (a user's array handed to the no-shuffle path starts 16 bytes
    into a page)."""
    step = min(_BOUNCE, len(buf))
    bounce = scratch_buffer(step, "bounce")
    for lo in range(0, len(buf), step):
        n = min(step, len(buf) - lo)
        bounce[:n] = buf[lo : lo + n]
        pwrite_all(dfd, bounce[:n], offset + lo, name)


def open_direct(name: str) -> int:
    """A second descriptor with ``O_DIRECT``, or -1 where the system or file system has none."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return -1
    try:
        return os.open(name, os.O_WRONLY | flag)
    except OSError:  # (tmpfs and some FUSE file systems refuse O_DIRECT)
        return -1


def direct_possible(name: str) -> bool:
    """Whether the existing file ``name`` can be opened with ``O_DIRECT`` here."""
    fd = open_direct(name)
    if fd >= 0:
        os.close(fd)
    return fd >= 0
