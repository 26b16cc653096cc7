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

__all__ = ["round_buffers", "release_buffers", "io_executor"]

_lock = threading.Lock()
_buffers: list[npt.NDArray[np.uint8]] = []
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def round_buffers(nbytes: int) -> list[npt.NDArray[np.uint8]]:
    """Two buffers of at least ``nbytes`` (the same ones as last time when big enough)."""
    global _buffers
    with _lock:
        if not _buffers or len(_buffers[0]) < nbytes:
            _buffers = []  # free the old pair before allocating the new one
            _buffers = [np.empty(nbytes, np.uint8), np.empty(nbytes, np.uint8)]
        return [b[:nbytes] for b in _buffers]


def release_buffers() -> None:
    """Free the cached round buffers."""
    global _buffers
    with _lock:
        _buffers = []


def io_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's single I/O thread (backend calls release the GIL)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="collio-io")
        return _executor
