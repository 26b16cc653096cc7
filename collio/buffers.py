"""Round buffers, kept across calls and files.

Fresh memory costs a page fault per page on first touch (measured here: about
1.3 ms per MiB in a VM), so the two round buffers an aggregator needs are kept
and reused; :func:`release_buffers` returns them to the system.  The I/O thread
that overlaps backend requests with the next round's exchange lives here too.
"""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
import numpy.typing as npt

__all__ = [
    "PAGE",
    "round_buffers",
    "window_of",
    "scratch_buffer",
    "release_buffers",
    "io_executor",
    "flush_executor",
]

#: Alignment of kept buffers (and of direct I/O requests, see the posix backend).
PAGE = 4096
_lock = threading.Lock()
#: Kept allocations by use ("rounds", "scratch"); each reused while big enough.
_kept: dict[str, npt.NDArray[np.uint8]] = {}
_executors: dict[str, concurrent.futures.ThreadPoolExecutor] = {}


def _keep(name: str, nbytes: int) -> npt.NDArray[np.uint8]:
    """The kept allocation ``name``, grown to at least ``nbytes`` (old one freed first)."""
    with _lock:
        got = _kept.get(name)
        if got is None or len(got) < nbytes:
            _kept.pop(name, None)  # free the old one before allocating the new one
            raw = np.empty(nbytes + PAGE, np.uint8)
            skip = -raw.ctypes.data % PAGE  # page-aligned start: direct I/O can use it
            got = _kept[name] = raw[skip : skip + nbytes]
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


def window_of(buf: npt.NDArray[np.uint8], offset: int, nbytes: int) -> npt.NDArray[np.uint8]:
    """The ``nbytes`` of a round buffer that hold file bytes from ``offset``: the byte for
    file offset ``o`` sits at an address congruent to ``o`` modulo :data:`PAGE`."""
    skip = offset % PAGE
    return buf[skip : skip + nbytes]


def scratch_buffer(nbytes: int, use: str = "scratch") -> npt.NDArray[np.uint8]:
    """A kept, page-aligned buffer of ``nbytes`` for ``use``: packing a round's sends
    (``"scratch"``, see exchange) or direct writes from unaligned memory (``"bounce"``)."""
    return _keep(use, nbytes)[:nbytes]


def release_buffers() -> None:
    """Free the cached round buffers, the packing buffer and the kept plans (local)."""
    from .plancache import clear_all  # (plancache imports nothing of ours but runs)

    with _lock:
        _kept.clear()
    clear_all()


def _thread(name: str) -> concurrent.futures.ThreadPoolExecutor:
    """The process's single thread ``collio-<name>``, made when first asked for."""
    with _lock:
        pool = _executors.get(name)
        if pool is None:
            pool = _executors[name] = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"collio-{name}"
            )
        return pool


def io_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's single I/O thread (backend calls release the GIL)."""
    return _thread("io")


def flush_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's flush thread: one early ``fdatasync`` at a time, whichever file
    (:class:`~collio.backends.fsync.EarlyFlush`)."""
    return _thread("flush")
