"""Round buffers, kept across calls and files, one set per thread.

Fresh memory costs a page fault per page on first touch, so the round buffers an
aggregator needs are kept and reused; :func:`free_buffers` returns them to the system.
Each thread has its own: two threads may be in calls at once on files of their own
communicators (an ``async_save`` beside the job's own writes, a nonblocking call's
thread beside a blocking one), and one buffer shared by their rounds would carry one
call's bytes into the other's file.
"""

from __future__ import annotations

import threading
from threading import get_ident

import numpy as np
import numpy.typing as npt

__all__ = [
    "PAGE",
    "round_buffers",
    "rounds_allocation",
    "window_of",
    "scratch_buffer",
    "free_buffers",
]

#: Alignment of kept buffers (and of direct I/O requests, see the posix backend).
PAGE = 4096
_lock = threading.Lock()
#: Kept allocations by thread and use ("rounds", "scratch", "bounce"); each reused while
#: big enough.  A thread changes only its own entries, :func:`free_buffers` all of them.
_kept: dict[tuple[int, str], npt.NDArray[np.uint8]] = {}


def _keep(name: str, nbytes: int) -> npt.NDArray[np.uint8]:
    """This thread's kept allocation ``name``, grown to at least ``nbytes`` (old one freed
    first).  Growing it also lets go of the allocations of threads that have ended."""
    key = (get_ident(), name)
    got = _kept.get(key)  # (no lock: no other thread changes this thread's entries)
    if got is not None and len(got) >= nbytes:
        return got
    with _lock:
        _kept.pop(key, None)  # free the old one before allocating the new one
        alive = {t.ident for t in threading.enumerate()}
        for ended in [k for k in _kept if k[0] not in alive]:
            del _kept[ended]
        raw = np.empty(nbytes + PAGE, np.uint8)
        skip = -raw.ctypes.data % PAGE  # page-aligned start: direct I/O can use it
        got = _kept[key] = raw[skip : skip + nbytes]
    return got


def round_buffers(nbytes: int, count: int = 2) -> list[npt.NDArray[np.uint8]]:
    """``count`` page-aligned buffers of ``nbytes + PAGE`` carved from one cached allocation.

    The extra page lets a round start at the same offset within a page as its
    file offset (:func:`window_of`), so that direct I/O can write its aligned
    middle from the buffer.  The allocation is reused while it is big enough; so
    memory stays at what the largest call needed (two rounds of
    ``cb_buffer_size`` by default).
    """
    step = -(-nbytes // PAGE) * PAGE + PAGE
    whole = _keep("rounds", step * count)
    return [whole[i * step : (i + 1) * step] for i in range(count)]


def rounds_allocation(nbytes: int, count: int = 2) -> npt.NDArray[np.uint8]:
    """The kept allocation :func:`round_buffers` carves its buffers from (its first starts
    at its start): the same object while it is kept, so that a caller that keeps views
    of it makes them again only when it is another."""
    return _keep("rounds", (-(-nbytes // PAGE) * PAGE + PAGE) * count)


def window_of(buf: npt.NDArray[np.uint8], offset: int, nbytes: int) -> npt.NDArray[np.uint8]:
    """The ``nbytes`` of a round buffer that hold file bytes from ``offset``: the byte for
    file offset ``o`` sits at an address congruent to ``o`` modulo :data:`PAGE`."""
    skip = offset % PAGE
    return buf[skip : skip + nbytes]


def scratch_buffer(nbytes: int, use: str = "scratch") -> npt.NDArray[np.uint8]:
    """A kept, page-aligned buffer of ``nbytes`` for ``use``: packing a round's sends
    (``"scratch"``, see exchange) or direct writes from unaligned memory (``"bounce"``)."""
    return _keep(use, nbytes)[:nbytes]


def free_buffers() -> None:
    """Local: free every thread's kept round, packing and bounce buffers (made again when
    needed; a call in another thread keeps what it holds until it returns)."""
    with _lock:
        _kept.clear()
