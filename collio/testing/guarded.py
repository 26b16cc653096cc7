"""Arrays with inaccessible pages between them, for tests of a batch's memory span.

A batch's buffer (:func:`collio.batch.span`) reaches from the lowest item's first
byte to the highest item's last one, over memory no item owns.  Items placed by
:func:`guarded_like` sit in one anonymous mapping, each ending right before a
``PROT_NONE`` page and starting right after one: any read or write of the span
outside the items' own bytes faults (the process dies with SIGSEGV), where an
ordinary heap would let it pass unnoticed.  :func:`far_apart` puts two arrays as far
apart as a small heap array and a large mapped one are (terabytes), with nothing
accessible between them.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._libc import libc

__all__ = ["far_apart", "guarded", "guarded_like"]

_PROT_NONE = 0
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE


def guarded(sizes: Sequence[int], *, descending: bool = True) -> list[npt.NDArray[np.uint8]]:
    """uint8 arrays of ``sizes`` bytes, each between two ``PROT_NONE`` pages (the first
    at the highest address when ``descending``, so a batch's lowest item is its last)."""
    page = mmap.PAGESIZE
    spans = [max(1, -(-n // page)) for n in sizes]
    mm = mmap.mmap(-1, page * (sum(spans) + len(spans) + 1))
    whole = np.frombuffer(mm, np.uint8)
    base = whole.ctypes.data
    fn = libc()
    if fn is None:
        raise OSError("no C library to call mprotect")
    fn.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    out: list[npt.NDArray[np.uint8]] = [whole[:0]] * len(sizes)
    at = 0  # the guard page before each array
    for i in range(len(sizes))[::-1] if descending else range(len(sizes)):
        if fn.mprotect(base + at * page, page, _PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
        end = (at + 1 + spans[i]) * page  # the next guard page: the array ends right before it
        out[i] = whole[end - sizes[i] : end]
        at += 1 + spans[i]
    if fn.mprotect(base + at * page, page, _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")
    return out


def guarded_like(arrays: Sequence[Any]) -> list[np.ndarray[Any, Any]]:
    """Copies of ``arrays`` (same shape, dtype and memory order: Fortran-ordered ones
    stay so) in :func:`guarded` memory (the first at the highest address)."""
    arrs = [np.asarray(a) for a in arrays]
    raw = guarded([a.nbytes for a in arrs])
    out = []
    for a, r in zip(arrs, raw, strict=True):
        fortran = a.flags.f_contiguous and not a.flags.c_contiguous
        g: np.ndarray[Any, Any] = np.ndarray(
            a.shape, a.dtype, buffer=r, order="F" if fortran else "C"
        )
        g[...] = a
        out.append(g)
    return out


def far_apart(nbytes: int, gap: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """Two writable uint8 arrays of ``nbytes`` each, the second starting ``gap`` bytes
    (rounded up to pages) after the first ends, with ``PROT_NONE`` pages between.

    The address range is reserved read-only (a private mapping that cannot be written
    takes no memory or swap), then only the two arrays' pages are made writable, so a
    gap of tens of terabytes costs nothing.  The arrays keep the mapping alive.
    """
    from ..batch import span

    page = mmap.PAGESIZE
    size, hole = -(-max(nbytes, 1) // page) * page, -(-gap // page) * page
    mm = mmap.mmap(-1, 2 * size + hole, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    base = np.frombuffer(mm, np.uint8).ctypes.data
    fn = libc()
    if fn is None:
        raise OSError("no C library to call mprotect")
    fn.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for at, prot in ((0, _PROT_RW), (size, _PROT_NONE), (size + hole, _PROT_RW)):
        if fn.mprotect(base + at, hole if prot == _PROT_NONE else size, prot) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    first = span(base, nbytes, writable=True, holds=mm)
    return first, span(base + size + hole, nbytes, writable=True, holds=mm)
