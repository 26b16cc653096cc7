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

__all__ = ["round_buffers", "scratch_buffer", "release_buffers", "io_executor"]

_lock = threading.Lock()
#: Kept allocations by use ("rounds", "scratch"); each reused while big enough.
_kept: dict[str, npt.NDArray[np.uint8]] = {}
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _keep(name: str, nbytes: int) -> npt.NDArray[np.uint8]:
    """The kept allocation ``name``, grown to at least ``nbytes`` (old one freed first)."""
    with _lock:
        got = _kept.get(name)
        if got is None or len(got) < nbytes:
            _kept.pop(name, None)  # free the old one before allocating the new one
            got = _kept[name] = np.empty(nbytes, np.uint8)
        return got


def round_buffers(nbytes: int, count: int = 2) -> list[npt.NDArray[np.uint8]]:
    """``count`` buffers of ``nbytes`` carved from one cached allocation.

    The allocation is reused while it is big enough; so memory stays at what the
    largest call needed (two rounds of ``cb_buffer_size`` by default).
    """
    whole = _keep("rounds", nbytes * count)
    return [whole[i * nbytes : (i + 1) * nbytes] for i in range(count)]


def scratch_buffer(nbytes: int) -> npt.NDArray[np.uint8]:
    """A kept buffer of at least ``nbytes`` for packing a round's sends (see exchange)."""
    return _keep("scratch", nbytes)[:nbytes]


def release_buffers() -> None:
    """Free the cached round buffers, the packing buffer and the kept plans (local)."""
    from .plancache import clear_all  # (plancache imports nothing of ours but runs)

    with _lock:
        _kept.clear()
    clear_all()


def io_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's single I/O thread (backend calls release the GIL)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="collio-io")
        return _executor
