"""A checkpoint's pieces as arrays over a private map of its file: a load without a copy.

A piece that is one range of its array and lies in one of the array's chunks (a row
shard loaded as it was saved, an array stored whole) is one range of the file; a piece
across several chunks is their parts, each mapped in place.  A load of a file on a
local file system (hint ``checkpoint_map``) returns such a piece as an array over a
private map of the file, as ``np.load(mmap_mode="c")``, ``torch.load(mmap=True)`` and
safetensors do: the checksum pass over the mapped pages is the only read, and nothing
is copied.  A copy into new arrays costs a page fault per page first touched, more
than the read itself.

- The map is private (``MAP_PRIVATE``, copy-on-write): a write to a returned array
  changes this process's own copy of that page, never the file.
- One map per load and rank, over the range its mapped pieces span; the arrays keep it
  (numpy keeps an array's ``base``), and the last one gone unmaps it.  It holds no file
  descriptor: the file is open during the load only.
- collio's saves replace a target by rename, so arrays mapped from the checkpoint a save
  replaces keep their values (the replaced file's blocks stay allocated until its last
  map is gone).  Another program that truncates the file in place makes an access of a
  page past the new end fault (SIGBUS), as with ``np.memmap``; one that writes into the
  file in place may show through in pages the process has not written itself.
- Mapped without reserving swap for the whole range (``MAP_NORESERVE``): only pages the
  job writes become its own memory, as with any anonymous allocation under Linux's
  default overcommit.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
from typing import Any

import numpy as np
import numpy.typing as npt

from .._libc import libc
from ..backends.fdio import pread_zeros
from ..backends.localfile import open_regular
from ..backends.mapped import fs_name
from ..errors import BackendError
from ..layouts.arrays import ArrayLayout
from ..policy import maps_file
from ..runs import displacements
from .format import HUGE_PAGE

__all__ = ["FileMap", "Reader", "map_range", "map_runs", "maps", "pieces"]

I64 = npt.NDArray[np.int64]

#: Linux's ``MAP_NORESERVE`` (the mmap module does not name it)
_NORESERVE = 0x4000


@functools.cache
def _calls() -> tuple[Any, Any] | None:
    """libc's ``mmap`` and ``munmap`` (their own function objects: other parts of collio
    may type libc's shared ones otherwise), or None off Linux."""
    c = libc()
    if c is None or not sys.platform.startswith("linux"):
        return None
    try:
        mm, um = c["mmap"], c["munmap"]
    except AttributeError:  # pragma: no cover - every Linux libc has them
        return None
    mm.restype = ctypes.c_void_p
    mm.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int64]  # fmt: skip
    um.restype = ctypes.c_int
    um.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return mm, um


_FAILED = ctypes.c_void_p(-1).value
#: Linux's ``MAP_FIXED``
_FIXED = 0x10
#: The size of a huge page that maps a file's page cache at once (x86-64's 2 MiB).
HUGE = HUGE_PAGE


def _mapped(addr: Any, length: int, offset: int) -> int:
    """``mmap``'s result, or the :class:`BackendError` of its failure."""
    if addr is None or addr == _FAILED:
        err = ctypes.get_errno()
        raise BackendError(
            f"cannot map {length} bytes of the checkpoint at {offset}: {os.strerror(err)}",
            errno=err,
        )
    return int(addr)


class FileMap:
    """A private map of ``length`` bytes of the file ``fd`` from ``offset`` (a multiple of
    the page size), unmapped when the object goes.  Python's ``mmap.mmap`` would keep a
    duplicate of the descriptor open as long as any array over it lives."""

    def __init__(
        self, fd: int, offset: int, length: int, runs: tuple[I64, I64, I64] | None = None
    ) -> None:
        """With ``runs`` ``(at, file offset, length)``, page-aligned: ``length`` bytes of
        address space (no file's) starting on a :data:`HUGE` boundary, each run's bytes of
        the file mapped ``at`` into it (the chunks of pieces across several chunks, each
        where its bytes belong)."""
        self.addr: int = 0
        self.length = length if runs is None else length + HUGE
        calls = _calls()
        if calls is None:
            raise BackendError("hint checkpoint_map=enable: no private file maps on this system")
        mm, self._unmap = calls
        prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | _NORESERVE
        if runs is None:
            self.addr = _mapped(mm(None, length, prot, flags, fd, offset), length, offset)
            start = self.addr
        else:  # (the space first, PROT_NONE: a part not mapped faults, never shows memory)
            anon = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE
            self.addr = _mapped(mm(None, self.length, 0, anon, -1, 0), self.length, -1)
            start = -(-self.addr // HUGE) * HUGE
            for at, off, n in zip(*(r.tolist() for r in runs), strict=True):
                _mapped(mm(start + at, n, prot, flags | _FIXED, fd, off), n, off)
        self.__array_interface__ = {
            "data": (start, False), "shape": (length,), "typestr": "|u1", "version": 3,
        }  # fmt: skip

    def __del__(self) -> None:  # (one munmap: every run mapped into the space goes with it)
        if self.addr:
            self._unmap(self.addr, self.length)
            self.addr = 0


def maps(hint: str, fd: int) -> bool:
    """Whether a load maps the file ``fd``: hint ``checkpoint_map``, and for ``automatic``
    whether the file is on a local file system (one page cache), as ``mapped_reads``."""
    return maps_file(hint, local_fs=hint == "automatic" and fs_name(fd) is not None)


def map_range(fd: int, lo: int, hi: int) -> npt.NDArray[np.uint8]:
    """The bytes ``[lo, hi)`` of the file ``fd`` (``hi > lo``), privately mapped."""
    base = lo - lo % mmap.PAGESIZE
    whole: npt.NDArray[np.uint8] = np.asarray(FileMap(fd, base, hi - base))
    return whole[lo - base :]


def map_runs(fd: int, n: I64, runs: tuple[I64, I64, I64, I64]) -> tuple[npt.NDArray[np.uint8], I64]:
    """Pieces of ``n`` bytes, each made of the file's ``runs`` (as
    :meth:`~.chunks.Chunks.runs` gives them: file offset, length, piece, offset within
    the piece; each at the same offset within a page in the file as in its piece), each
    piece's runs mapped one after another into one space: the space's bytes, and where
    each piece starts in it.

    A piece whose longest run is a :data:`HUGE` page or more starts where that run lies
    at the same offset modulo :data:`HUGE` as in the file: the kernel can then map the
    whole huge pages within that run at once (where the file's cache is in huge pages),
    one fault each, where a run at another offset takes one per few pages.  A save
    places each large piece at the same offset modulo :data:`HUGE` in the file as in
    its array (:data:`.format.PLACE_MIN`), so in its files the piece then starts at its
    array offset modulo :data:`HUGE` and every run lies so, not only the longest.  Such pieces
    come first, each in a slot of a whole number of :data:`HUGE` pages (address space
    only, never memory); the others follow, each from its first page."""
    file, length, src, within = runs
    page = mmap.PAGESIZE
    longest = np.lexsort((-length, src))  # (per piece, its longest run first)
    first = longest[np.flatnonzero(np.r_[True, src[longest][1:] != src[longest][:-1]])]
    align = np.full(len(n), page, np.int64)
    align[src[first]] = np.where(length[first] >= HUGE, HUGE, page)
    shift = np.zeros(len(n), np.int64)
    shift[src[first]] = (file[first] - within[first]) % align[src[first]]
    slot = -(-(n + shift) // align) * align
    order = np.argsort(align < HUGE, kind="stable")  # (the huge slots first: each aligned)
    start = np.empty(len(n), np.int64)
    start[order] = displacements(slot[order]) + shift[order]
    vstart = start[src] + within
    skip = vstart % page
    ends = -(-(vstart + length) // page) * page
    at, off = vstart - skip, file - skip
    # (runs of one piece sharing a page: which follow each other in the file where they do)
    keep = np.ones(len(at), bool)
    keep[1:] = (src[1:] != src[:-1]) | (at[1:] >= ends[:-1])
    got: npt.NDArray[np.uint8] = np.asarray(FileMap(fd, 0, int(slot.sum()), (
        at[keep], off[keep], (ends - at)[keep])))  # fmt: skip
    return got, start


def pieces(
    buf: npt.NDArray[np.uint8], at: I64, lays: list[ArrayLayout], shapes: list[tuple[int, ...]]
) -> list[Any]:
    """Each layout's piece (of local shape ``shapes[k]``) as an array over ``buf`` from
    byte ``at[k]``, in the layout's memory order (a view of each: one per array, no bytes
    touched).  (numpy's ``order`` argument alone costs as much as the rest of an array's
    making: given for 'F' pieces only.)"""
    return [
        np.ndarray(shape, lay._dtype, buf, a) if lay._order != "F" else
        np.ndarray(shape, lay._dtype, buf, a, order="F")
        for a, lay, shape in zip(at.tolist(), lays, shapes, strict=True)
    ]  # fmt: skip


class Reader:
    """A local file read as the posix backend reads it (``pread``; zeros past the end,
    which then differ from their checksums), without opening it as a collio file."""

    name = "posix"

    def __init__(self) -> None:
        self.fd = -1

    def open(self, path: str) -> None:
        self.fd = open_regular(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))

    def read_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        # (``buf`` is flat bytes: one preadv reads it all, but where the file ends first;
        # a resharded load reads a few hundred small parts of pieces this way)
        if os.preadv(self.fd, [buf.data], offset) < len(buf):
            pread_zeros(self.fd, buf, offset)

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, max(length, 0), offset)

    def size(self) -> int:
        return os.lseek(self.fd, 0, os.SEEK_END)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
