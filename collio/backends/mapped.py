"""Reads straight out of the page cache: each rank copies its own runs from a mapped file.

On a local file system one node's page cache holds the file, and every rank on the node
shares it: the two-phase read only adds copies to it (the aggregator's buffer, a message,
the rank's array) and makes the ranks wait for each other.  Mapping the file and copying
the rank's runs with numpy is one copy, with no messages and no waiting.

Network and parallel file systems (NFS, Lustre, GPFS, BeeGFS, CephFS, FUSE mounts)
keep the shuffle: there the page cache is per node and small reads are expensive, which
is what the two-phase read is for.  The hint ``mapped_reads`` (``automatic`` /
``enable`` / ``disable``) overrides the choice.  As with any map, a file truncated by
another program while a rank copies from it faults (SIGBUS); collio itself never
shrinks a file it has open.

The copy is vectorised: runs are grouped by length (a handful of distinct lengths for
any array layout: full blocks and edge blocks), and each group is one numpy gather and
one scatter, or a single ``np.take`` into the array when memory follows the file.  The
file is mapped in windows of :data:`WINDOW` bytes, so a rank's resident file pages stay
bounded whatever the file's size.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import mmap
import sys
import traceback
from typing import Any

import numpy as np
import numpy.typing as npt

from .._libc import libc
from ..exchange import pack_uniform, pack_vector
from ..policy import FEW, copyable_lengths
from ..runs import Runs, sort, split_grid
from .fdio import pread_zeros

__all__ = [
    "FEW", "GATHER_BYTES", "LOCAL_FS", "WINDOW", "Rows", "copyable", "fs_name",
    "read_gathered", "read_mapped", "rows_of",
]  # fmt: skip

#: File systems whose page cache is the file (one node): f_type from statfs(2).
LOCAL_FS = {
    0xEF53: "ext2/3/4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0xF2F52010: "f2fs",
    0x2FC12FC1: "zfs",
    0x794C7630: "overlayfs",
    0xCA451A4E: "bcachefs",
    0x3153464A: "jfs",
    0x52654973: "reiserfs",
}
#: Bytes of the file mapped at once (the resident file pages a rank adds).
WINDOW = 16 << 20
#: Runs within this many bytes of the file are read with one pread and gathered
#: (:func:`read_gathered`): up to here the pread's copy of the bytes between the runs
#: costs less than a map's mmap, page faults, munmap and TLB shootdown.
GATHER_BYTES = 1 << 20


def fs_name(fd: int) -> str | None:
    """The local file system holding ``fd`` (a :data:`LOCAL_FS` name), or None when the
    file system is another kind or cannot be told (no ``fstatfs``)."""
    fn = _fstatfs()
    if fn is None:
        return None
    buf = _STATFS()
    if fn(ctypes.c_int(fd), buf) != 0:
        return None
    f_type = ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF  # (__fsword_t, first field)
    return LOCAL_FS.get(f_type)


#: Room for a struct statfs (120 bytes on 64-bit Linux): one ctypes type, kept (ctypes
#: caches array types weakly: ``create_string_buffer`` made the type, a reference
#: cycle, again at each call where nothing else held it)
_STATFS = ctypes.c_char * 256


@functools.cache
def _fstatfs() -> Any:
    if not sys.platform.startswith("linux"):  # (struct statfs differs elsewhere)
        return None
    return getattr(libc(), "fstatfs", None)


def copyable(runs: Runs) -> bool:
    """Whether :func:`read_mapped` copies these runs in a few numpy passes."""
    return copyable_lengths(runs.length)


def read_mapped(fd: int, runs: Runs, out: npt.NDArray[np.uint8], window: int = WINDOW) -> None:
    """Copy the bytes of ``runs`` (sorted by file offset, all below the file's end) from
    the file ``fd`` into ``out[mem : mem + length]``, mapping ``window`` bytes at a time
    (runs longer than that are cut)."""
    if len(runs) and not bool((runs.length > 0).all()):  # (a map of 0 bytes maps it all)
        runs = runs.take(np.flatnonzero(runs.length > 0))
    if len(runs) and int(runs.length.max()) > window:
        # a long run's later pieces may start past a later run that overlaps it (reads
        # may overlap): sort again, so no run of a window starts before its base
        runs = sort(split_grid(runs, runs.file, window)[0])
    f, n = runs.file, runs.length
    end = f + n
    i, total = 0, len(runs)
    while i < total:
        j = max(int(np.searchsorted(f, f[i] + window, side="left")), i + 1)
        base = int(f[i]) // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        stop = int(end[i:j].max())
        mm = mmap.mmap(fd, stop - base, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=base)
        try:
            _copy(np.frombuffer(mm, np.uint8), runs.take(slice(i, j)), base, out)
        except BaseException as exc:
            # the traceback's frames hold numpy views of the map: drop them, or close()
            # raises BufferError in place of this error and the map stays open
            traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            mm.close()  # (no view of it is left: _copy returned)
        i = j


def read_gathered(
    fd: int, runs: Runs, out: npt.NDArray[np.uint8], buf: npt.NDArray[np.uint8],
    rows: Rows | None = None,
) -> None:  # fmt: skip
    """:func:`read_mapped` through one ``pread`` of the runs' extent into ``buf`` (at
    least that long, and :attr:`Rows.span` long with ``rows``): the same numpy gather,
    from memory instead of a map; or, ``rows`` being these runs (:func:`rows_of`), one
    numpy copy of the rows."""
    lo, hi = runs.extent()
    src = buf[: hi - lo]
    pread_zeros(fd, src, lo)
    if rows is not None:
        rows.copy(buf, out)
    else:
        _copy(src, runs, lo, out)


@dataclasses.dataclass(frozen=True, slots=True)
class Rows:
    """Runs of ``length`` bytes, one every ``stride`` bytes of the file from their
    extent's start, read one after another into memory from ``mem``: the rows of a
    strided array (a column block, a time series' interleaved pieces).  Moved in the
    file they are the same rows, so a repeated call keeps them."""

    count: int
    length: int
    stride: int
    mem: int

    @property
    def span(self) -> int:
        """Bytes from the extent's start that :meth:`copy` views as ``count`` rows of
        ``stride`` (the last row's bytes past its run are viewed, never copied)."""
        return self.count * self.stride

    def copy(self, src: npt.NDArray[np.uint8], out: npt.NDArray[np.uint8]) -> None:
        """Copy the rows from ``src`` (the file's bytes from the extent's start, at least
        :attr:`span` long) into ``out``: the shuffle's own copy of a vector
        (:func:`~collio.exchange.pack_vector`, one numpy assignment of views), where a
        gather by index arrays costs a dozen numpy calls."""
        pack_vector(src, 0, self.count, self.length, self.stride, out[self.mem :])


def rows_of(runs: Runs) -> Rows | None:
    """Pure: ``runs`` as :class:`Rows` (two or more of one length, evenly spaced in the
    file without overlapping, one after another in memory), or None."""
    n = len(runs)
    if n < 2:
        return None
    f, m = runs.file, runs.mem
    k, stride = int(runs.length[0]), int(f[1] - f[0])
    if k <= 0 or stride < k:
        return None
    if not (
        bool((runs.length == k).all())
        and bool((np.diff(f) == stride).all())
        and bool((np.diff(m) == k).all())
    ):
        return None
    return Rows(n, k, stride, int(m[0]))


def _copy(src: npt.NDArray[np.uint8], runs: Runs, base: int, out: npt.NDArray[np.uint8]) -> None:
    """Copy ``runs`` from ``src``, which holds the file's bytes from offset ``base``."""
    rel = runs.file - base
    if len(runs) <= FEW:
        for s, k, m in zip(rel.tolist(), runs.length.tolist(), runs.mem.tolist(), strict=True):
            out[m : m + k] = src[s : s + k]
        return
    first = int(runs.length[0])
    if bool((runs.length == first).all()):
        _copy_uniform(src, rel, first, runs.mem, out)
        return
    lengths, which = np.unique(runs.length, return_inverse=True)
    for g, size in enumerate(lengths.tolist()):
        pick = np.flatnonzero(which == g)
        _copy_uniform(src, rel[pick], size, runs.mem[pick], out)


def _copy_uniform(
    src: npt.NDArray[np.uint8], rel: npt.NDArray[np.int64], size: int,
    mem: npt.NDArray[np.int64], out: npt.NDArray[np.uint8],
) -> None:  # fmt: skip
    """Copy runs of ``size`` bytes from ``src[rel]`` to ``out[mem]``: when memory follows
    the runs, the shuffle's own gather (:func:`~collio.exchange.pack_uniform`: one
    ``np.take`` when they are rows of ``size`` bytes) straight into ``out``; else a
    gather and a scatter."""
    if bool((np.diff(mem) == size).all()):
        pack_uniform(src, rel, size, out[int(mem[0]) :])
        return
    got = np.lib.stride_tricks.sliding_window_view(src, size)[rel]  # (k, size), a copy
    # a batch's ``out`` spans every item's address (collio.batch): items in different
    # mappings lie terabytes apart, and a view of rows over all of it has more bytes than
    # numpy can count; so one view per stretch of at most ``reach`` bytes holding runs
    # (one per far-apart allocation, not per run)
    reach = max(1, _VIEW_BYTES // size)
    lo = int(mem.min())
    if int(mem.max()) - lo < reach:
        _scatter(out, lo, mem, got, size)
        return
    part = (mem - lo) // reach
    order = np.argsort(part, kind="stable")
    cuts = np.flatnonzero(np.diff(part[order])) + 1
    for pick in np.split(order, cuts):
        _scatter(out, int(mem[pick].min()), mem[pick], got[pick], size)


#: Most bytes a strided view of rows over memory may count (numpy's limit is 2**63).
_VIEW_BYTES = 1 << 61


def _scatter(
    out: npt.NDArray[np.uint8], lo: int, mem: npt.NDArray[np.int64],
    got: npt.NDArray[np.uint8], size: int,
) -> None:  # fmt: skip
    """Write row ``i`` of ``got`` to ``out[mem[i] : mem[i] + size]`` (all ``mem >= lo``)."""
    hi = int(mem.max()) + size
    # each run's own bytes of `out`: rows of a view whose rows overlap, over only the
    # range the runs touch, written where the runs' memory lies (runs never share a
    # byte of memory, so no write aliases)
    slots = np.lib.stride_tricks.as_strided(
        out[lo:hi], shape=(hi - lo - size + 1, size), strides=(out.strides[0], out.strides[0])
    )
    slots[mem - lo] = got
