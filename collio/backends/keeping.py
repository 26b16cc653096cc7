"""What a rank's own write of a file will overwrite, kept so that the write can be taken back.

A repeated small call writes before the ranks agree on it (:mod:`collio.speculate`) and
takes the write back if the agreement says it must not stand: the bytes it covered
below the file's end go back, and the file is cut back to its size before the call.
A time series' next step lies past the end and keeps nothing; so does a step that the
other ranks' writes of the same call have already passed, which lies in a hole (zeros
never written: :func:`~collio.backends.fdio.data_from`) and is not read.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import numpy.typing as npt

from ..runs import Runs
from .fdio import data_from, pread_zeros, pwrite_all

__all__ = ["HOLE_MIN", "KEEP_RUNS", "Before", "keep_one", "keep_runs", "put_back"]

#: A write of at most this many runs may be taken back (one pread and pwrite each).
KEEP_RUNS = 16
#: A range of at least this many bytes (a page) below the file's end is asked whether
#: it is a hole before its bytes are read: reading a hole makes the kernel allocate and
#: zero its pages (and read ahead into the other ranks' ranges), several times what
#: the lseek costs; a smaller range shares its block with the bytes beside it.
HOLE_MIN = 4 << 10


@dataclasses.dataclass(slots=True)
class Before:
    """What a write keeps: the file's size, (offset, old bytes), and the (offset, length)
    of the holes it did not read.  (Not frozen: a frozen dataclass's ``__init__`` costs a
    guessed small write a call per field.)"""

    size: int
    old: list[tuple[int, npt.NDArray[np.uint8]]]
    zeros: tuple[tuple[int, int], ...] = ()


def keep_one(fd: int, size: int, offset: int, nbytes: int, limit: int) -> Before | None:
    """Local: what a write of ``nbytes`` at ``offset`` into the file ``fd`` of ``size``
    bytes overwrites; None when that is more than ``limit`` bytes to read."""
    if offset >= size or not nbytes:  # (a time series' next step)
        return Before(size, [])
    end = min(offset + nbytes, size)
    at = data_from(fd, offset, end) if end - offset >= HOLE_MIN else offset
    if end - at > limit:
        return None
    zeros = ((offset, at - offset),) if at > offset else ()
    if at == end:
        return Before(size, [], zeros)
    buf = np.empty(end - at, np.uint8)
    pread_zeros(fd, buf, at)
    return Before(size, [(at, buf)], zeros)


def keep_runs(fd: int, size: int, runs: Runs, limit: int) -> Before | None:
    """Local: :func:`keep_one` of several runs (at most :data:`KEEP_RUNS`, else None)."""
    if len(runs.file) == 1:
        return keep_one(fd, size, int(runs.file[0]), int(runs.length[0]), limit)
    if len(runs.file) > KEEP_RUNS:
        return None
    offs: list[int] = runs.file.tolist()
    lens: list[int] = runs.length.tolist()
    below = [max(0, min(m, size - f)) for f, m in zip(offs, lens, strict=True)]
    if sum(below) > limit:
        return None
    old = []
    for f, m in zip(offs, below, strict=True):
        if m:
            buf = np.empty(m, np.uint8)
            pread_zeros(fd, buf, f)
            old.append((f, buf))
    return Before(size, old)


def put_back(fd: int, kept: Before, size: int, name: str) -> None:
    """Local: write the kept bytes (and zeros for the kept holes) back below ``size``,
    the file's agreed size before the call (bytes at or past it are cut off), then cut
    the file to ``size`` if it grew."""
    for f, old in kept.old:
        n = max(0, min(len(old), size - f))
        if n:
            pwrite_all(fd, old[:n], f, name)
    for f, m in kept.zeros:
        n = max(0, min(m, size - f))
        if n:
            pwrite_all(fd, np.zeros(n, np.uint8), f, name)
    if os.lseek(fd, 0, os.SEEK_END) > size:
        os.ftruncate(fd, size)
