"""Reads of a file that may copy from a map of it instead of ``preadv`` (hint
``mapped_reads``): the posix backend's, and the HDF5 backend's file (which is one)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..policy import maps_file
from ..runs import Runs, is_read_only
from .base import Backend, _one
from .fdio import pread_runs, pread_zeros
from .mapped import GATHER_BYTES, Rows, copyable, fs_name, read_gathered, read_mapped, rows_of

__all__ = [
    "FEW_PREADS", "LONG_PREAD", "LONG_PREAD_MAX", "ONE_PREAD_BYTES", "PREAD_BYTES", "MappedReads",
    "maps_for", "preads",
]  # fmt: skip

#: At most this many runs of at most this many bytes in all are read with pread even
#: where the file is mapped (see read_runs).
FEW_PREADS = 4
PREAD_BYTES = 1 << 20
#: One run of at most this many bytes is one ``preadv`` straight into the array even
#: where the file is mapped: the kernel's copy into the array costs a rank less than a
#: map's faults and numpy's copy out of it, with the array given or new; beyond it the
#: two cost about the same, and the map's windows bound what a rank holds at once.
ONE_PREAD_BYTES = 8 << 20
#: Runs of this many bytes and more on average, up to :data:`LONG_PREAD_MAX`, and more
#: than :data:`~collio.backends.mapped.GATHER_BYTES` in all (fewer may lie within one
#: pread's gather, which read_runs tries first), are a ``preadv`` each even where the
#: file is mapped: from a few pages up, the syscall per run costs less than the map's
#: page faults, page tables and unmapping of its pages, and the kernel's copy no more
#: than numpy's out of the map; past the upper bound numpy's copy of the long runs out
#: of the map gains again.
LONG_PREAD = 16 << 10
LONG_PREAD_MAX = 512 << 10


def preads(runs: int, nbytes: int) -> bool:
    """Whether a read of ``runs`` runs of ``nbytes`` in all is done with a ``preadv`` per
    run even where the file is mapped (:meth:`MappedReads.read_runs`)."""
    if runs == 1:
        return nbytes <= ONE_PREAD_BYTES
    if runs <= FEW_PREADS and nbytes <= PREAD_BYTES:
        return True
    return nbytes > GATHER_BYTES and runs * LONG_PREAD <= nbytes <= runs * LONG_PREAD_MAX


class MappedReads(Backend):
    """A backend on the file ``fd`` whose reads copy many small runs from a map of it
    where :meth:`maps_reads` allows (``maps``: the hint ``mapped_reads`` settled at
    open, :func:`maps_for`), else read with ``preadv``."""

    fd: int = -1
    maps: bool = False  # reads copy many small runs from a mapped file (mapped_reads)
    mapped_bytes: int = 0  # read that way
    _copyable: tuple[Runs, bool] | None = None  # the last runs asked about
    _gather: npt.NDArray[np.uint8] | None = None  # read_gathered's, kept
    _rows: tuple[Runs, Rows | None] | None = None  # the last runs read gathered, as rows

    def read_one(self, offset: int, out: npt.NDArray[np.uint8]) -> int | list[int]:
        """As :meth:`read_runs` of one run: up to :data:`ONE_PREAD_BYTES` one ``preadv``,
        mapped or not."""
        if len(out) > ONE_PREAD_BYTES:
            return super().read_one(offset, out)
        self.read_at(offset, out)
        return 1

    def read_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        pread_zeros(self.fd, buf, offset)  # (past the end of the file: zeros)

    def maps_reads(self, runs: Runs) -> bool:
        """On a local file system (or with ``mapped_reads=enable``): runs that end within
        the file (a mapped page past its end faults) and that numpy copies in a few passes."""
        if not self.maps:
            return False
        if not len(runs):
            return True
        if len(runs) == 1:
            return self.maps_one(int(runs.file[0]), int(runs.length[0]))
        # the size is asked every time: a kept "it fits" could outlive a call whose
        # read_runs never came (another path agreed) and meet a file truncated since, where
        # a map faults; copyable() is the runs' own property, kept for the same object
        if runs.extent()[1] > self.size():
            return False
        return self._is_copyable(runs)

    def _is_copyable(self, runs: Runs) -> bool:
        seen = self._copyable  # (asked again by read_runs for the same runs object)
        if seen is None or seen[0] is not runs:
            rows = self._rows  # (a series' next step: rows, of one length, are copyable)
            if rows is not None and rows[1] is not None and rows[0] is _base(runs):
                return True
            seen = self._copyable = (runs, copyable(runs))
        return seen[1]

    def read_if_maps(self, offset: int, out: npt.NDArray[np.uint8]) -> tuple[bool, Any]:
        """A run of up to :data:`ONE_PREAD_BYTES` is read by one ``preadv`` mapped or not
        (:meth:`read_one`), and whether it lies within the file comes from the bytes read,
        without asking the size first; a larger one asks first (a map past the end
        faults), once: then it is copied from the map (as :meth:`read_runs` copies one
        large run) without :meth:`maps_reads` asking the size again."""
        if not self.maps:
            return super().read_if_maps(offset, out)
        n = len(out)
        if n <= ONE_PREAD_BYTES:
            if pread_zeros(self.fd, out, offset) < n:
                return False, None
            return True, 1
        if not self.maps_one(offset, n):
            return False, None
        read_mapped(self.fd, _one(offset, n), out)
        self.mapped_bytes += n
        return True, 1

    def maps_one(self, offset: int, nbytes: int) -> bool:
        # (one run is copyable; the size asked every time, as for maps_reads)
        return self.maps and offset + nbytes <= self.size()

    def read_runs(self, runs: Runs, out: npt.NDArray[np.uint8]) -> int | list[int]:
        """Copied from the mapped file when :meth:`maps_reads` allows, on every direct
        path (also disjoint extents, ``romio_cb_read=disable``, and a few runs of a
        megabyte and more: numpy's copy out of the map is faster than ``preadv`` into
        the array), but for a few small runs, one up to :data:`ONE_PREAD_BYTES`, or runs
        of :data:`LONG_PREAD` to :data:`LONG_PREAD_MAX` bytes (:func:`preads`), else one
        ``preadv`` each.  Runs within :data:`~collio.backends.mapped.GATHER_BYTES` of the file are
        one ``pread`` of their extent and one gather instead of a map."""
        if self.maps and len(runs) > FEW_PREADS:
            lo, hi = runs.extent()
            if hi - lo <= GATHER_BYTES and self._is_copyable(runs):
                # no map, so nothing faults: bytes past the end read as zeros, as the
                # preads' do, and the file's size need not be asked (an fstat per call)
                self._copyable = None
                rows = self._rows_of(runs)
                if rows is None:
                    read_gathered(self.fd, runs, out, self._gather_buffer(hi - lo))
                    self.mapped_bytes += runs.nbytes
                    return len(runs)
                need = max(hi - lo, rows.span)
                read_gathered(self.fd, runs, out, self._gather_buffer(need), rows)
                self.mapped_bytes += rows.count * rows.length
                return len(runs)
        if self.maps_reads(runs):
            self._copyable = None  # (do not keep the runs beyond the call)
            if preads(len(runs), runs.nbytes):
                # a small call's few runs: a pread each costs a few microseconds, a map
                # (mmap, page faults, munmap and its TLB shootdown) ten or more; one
                # run up to ONE_PREAD_BYTES, or runs of LONG_PREAD and more: the
                # kernel's copies beat the map's
                return self._preads(runs, out)
            read_mapped(self.fd, runs, out)
            self.mapped_bytes += runs.nbytes
            return len(runs)
        return self._preads(runs, out)

    def _preads(self, runs: Runs, out: npt.NDArray[np.uint8]) -> int:
        """A ``preadv`` per run (:func:`~collio.backends.fdio.pread_runs`: zeros past
        the end, as :meth:`read_at`)."""
        pread_runs(self.fd, runs.file, runs.length, runs.mem, out)
        return len(runs)

    def _rows_of(self, runs: Runs) -> Rows | None:
        """:func:`~collio.backends.mapped.rows_of` of ``runs``, kept for the runs they
        were moved from (:meth:`~collio.runs.Runs.moved`: the same lengths and memory,
        so the same rows), which a time series' every step is."""
        base = _base(runs)
        seen = self._rows
        if seen is not None and seen[0] is base:
            return seen[1]
        rows = rows_of(runs)
        if is_read_only(base):  # (runs that can change are asked again)
            self._rows = (base, rows)
        return rows

    def _gather_buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        """This file's buffer for :func:`read_gathered`, kept (at most
        :data:`GATHER_BYTES`): a fresh one would pay a page fault per page."""
        buf = self._gather
        if buf is None or len(buf) < nbytes:
            buf = self._gather = np.empty(max(nbytes, 64 << 10), np.uint8)
        return buf

    def take_mapped_bytes(self) -> int:
        n, self.mapped_bytes = self.mapped_bytes, 0
        return n


def _base(runs: Runs) -> Runs:
    """The runs ``runs`` were moved from (:meth:`~collio.runs.Runs.moved`), or themselves."""
    origin = runs._origin
    return runs if origin is None else origin[0]


def maps_for(hints: Any, fd: int) -> bool:
    """Whether reads of the file ``fd`` copy from a map, per the hint ``mapped_reads``."""
    maps = str(getattr(hints, "mapped_reads", "automatic"))
    return maps_file(maps, local_fs=fs_name(fd) is not None)
