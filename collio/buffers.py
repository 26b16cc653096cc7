"""Round buffers, kept across calls and files.

Fresh memory costs a page fault per page on first touch, so the round buffers an
aggregator needs are kept and reused; :func:`free_buffers` returns them to the system.
"""

from __future__ import annotations

import threading

import numpy as np
import numpy.typing as npt

__all__ = [
    "PAGE",
    "round_buffers",
    "window_of",
    "scratch_buffer",
    "free_buffers",
]

#: Alignment of kept buffers (and of direct I/O requests, see the posix backend).
PAGE = 4096
_lock = threading.Lock()
#: Kept allocations by use ("rounds", "scratch"); each reused while big enough.
_kept: dict[str, npt.NDArray[np.uint8]] = {}


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


def free_buffers() -> None:
    """Local: free the kept round, packing and bounce buffers (made again when needed)."""
    with _lock:
        _kept.clear()
