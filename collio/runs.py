"""Byte runs: numpy arrays of (file offset, length, memory offset), never lists of tuples.

Every function here is vectorised: no Python loop per run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "Runs", "merge", "split_at", "split_grid", "group_bounds", "as_i64", "displacements",
    "read_only",
]  # fmt: skip

I64 = npt.NDArray[np.int64]


def as_i64(values: object) -> I64:
    """A 1-D int64 array (copy only when needed)."""
    arr = np.asarray(values)
    if arr.dtype != np.int64:
        arr = arr.astype(np.int64)
    return np.ascontiguousarray(arr.reshape(-1))


def read_only(runs: Runs) -> Runs:
    """``runs`` with its arrays made read-only, as a layout keeps them for every call
    (so a check or a kept plan may trust the same object to hold the same runs)."""
    for a in (runs.file, runs.length, runs.mem):
        a.flags.writeable = False
    return runs


def is_read_only(runs: Runs) -> bool:
    return not (
        runs.file.flags.writeable or runs.length.flags.writeable or runs.mem.flags.writeable
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Runs:
    """Byte runs of one rank, sorted by file offset.

    ``file[i] .. file[i]+length[i]`` in the target holds bytes
    ``mem[i] .. mem[i]+length[i]`` of the rank's buffer.
    """

    file: I64
    length: I64
    mem: I64
    # the extent, once asked of runs whose arrays are read-only (a layout's own, kept for
    # every call, and a time series' runs moved: :meth:`moved`)
    _extent: tuple[int, int] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )
    # the runs these were moved from and by how much (:meth:`moved`): a kept plan's runs
    # and a time series' next step are then known to be a shift without comparing them
    _origin: tuple[Runs, int] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    @classmethod
    def empty(cls) -> Runs:
        z = np.zeros(0, np.int64)
        return cls(z, z, z)

    @classmethod
    def sequential(cls, file: I64, length: I64) -> Runs:
        """Runs whose memory is consumed in file order (the common case)."""
        mem = np.zeros(len(length), np.int64)
        if len(length) > 1:
            np.cumsum(length[:-1], out=mem[1:])
        return cls(file, length, mem)

    def __len__(self) -> int:
        return len(self.length)

    @property
    def nbytes(self) -> int:
        return int(self.length[0]) if len(self.length) == 1 else int(np.add.reduce(self.length))

    def extent(self) -> tuple[int, int]:
        """(first byte, end) in the file; (0, 0) when empty."""
        got = self._extent
        if got is not None:
            return got
        n = len(self)
        if not n:
            return (0, 0)
        if n == 1:  # (a small call's one run: no numpy passes)
            first = int(self.file[0])
            return first, first + int(self.length[0])
        got = int(self.file[0]), int((self.file + self.length).max())
        if not (self.file.flags.writeable or self.length.flags.writeable):
            object.__setattr__(self, "_extent", got)  # (a small call asks several times)
        return got

    def moved(self, d: int) -> Runs:
        """These runs ``d`` bytes further in the file, read-only (the lengths and memory
        offsets shared), their extent known when these runs' is."""
        file = self.file + d
        file.flags.writeable = False
        out = Runs(file, self.length, self.mem)
        if self._extent is not None:
            object.__setattr__(out, "_extent", (self._extent[0] + d, self._extent[1] + d))
        origin = self._origin  # (moved runs remember the first runs, not a chain)
        base, e = (self, d) if origin is None else (origin[0], origin[1] + d)
        if is_read_only(base):
            object.__setattr__(out, "_origin", (base, e))
        return out

    def shift_from(self, other: Runs) -> int | None:
        """How far these runs lie after ``other`` when they are ``other`` moved
        (:meth:`moved`, read-only both), else None (not known without comparing)."""
        origin = self._origin
        if origin is None:
            return 0 if self is other else None
        if origin[0] is other:
            return origin[1]
        o = other._origin
        return origin[1] - o[1] if o is not None and o[0] is origin[0] else None

    def mem_sequential(self) -> bool:
        """True when memory is consumed in file order without gaps (send by slices)."""
        if not len(self):
            return True
        return bool(
            self.mem[0] == 0 and np.array_equal(self.mem[1:], (self.mem + self.length)[:-1])
        )

    def take(self, index: npt.NDArray[np.intp] | slice) -> Runs:
        return Runs(self.file[index], self.length[index], self.mem[index])


def displacements(counts: Any) -> I64:
    """Where each of consecutive blocks of ``counts`` values starts (MPI's ``displs``)."""
    out = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def merge(runs: Runs) -> Runs:
    """Drop empty runs and merge neighbours contiguous in both file and memory."""
    keep = runs.length > 0
    if not keep.all():
        runs = runs.take(np.flatnonzero(keep))
    n = len(runs)
    if n < 2:
        return runs
    end_f = runs.file + runs.length
    end_m = runs.mem + runs.length
    joined = (runs.file[1:] == end_f[:-1]) & (runs.mem[1:] == end_m[:-1])
    if not joined.any():
        return runs
    starts = np.flatnonzero(np.concatenate(([True], ~joined)))
    lengths = np.add.reduceat(runs.length, starts)
    return Runs(runs.file[starts], lengths.astype(np.int64), runs.mem[starts])


def sort(runs: Runs) -> Runs:
    """Sort by file offset (stable)."""
    if len(runs) < 2 or bool((np.diff(runs.file) >= 0).all()):
        return runs
    order = np.argsort(runs.file, kind="stable")
    return runs.take(order)


def _explode(runs: Runs, first: I64, npieces: I64) -> tuple[Runs, npt.NDArray[np.intp], I64]:
    """Repeat run i npieces[i] times; return the repeated runs, run index, piece index."""
    idx = np.repeat(np.arange(len(runs)), npieces)
    starts = np.zeros(len(runs), np.int64)
    if len(runs) > 1:
        np.cumsum(npieces[:-1], out=starts[1:])
    k = np.arange(len(idx), dtype=np.int64) - starts[idx]
    return runs.take(idx), idx, first[idx] + k


def split_at(runs: Runs, bounds: I64) -> tuple[Runs, I64]:
    """Cut runs at sorted boundaries; also return each piece's bin.

    Bin ``b`` is ``[bounds[b-1], bounds[b])``: bin 0 lies before ``bounds[0]``,
    bin ``len(bounds)`` after the last boundary.
    """
    if not len(runs):
        return runs, np.zeros(0, np.int64)
    end = runs.file + runs.length
    first = np.searchsorted(bounds, runs.file, side="right").astype(np.int64)
    last = np.searchsorted(bounds, end - 1, side="right").astype(np.int64)
    npieces = last - first + 1
    if bool((npieces == 1).all()):
        return runs, first
    rep, idx, bins = _explode(runs, first, npieces)
    edge = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64)
    lo_b = np.concatenate((edge[:1], bounds))[bins]
    hi_b = np.concatenate((bounds, edge[1:]))[bins]
    lo: I64 = np.maximum(rep.file, lo_b)
    hi: I64 = np.minimum(rep.file + rep.length, hi_b)
    mem: I64 = rep.mem + (lo - rep.file)
    return Runs(lo, hi - lo, mem), bins


def split_grid(runs: Runs, origin: I64, period: int) -> tuple[Runs, I64]:
    """Cut each run at ``origin[i] + k*period`` (per-run origins); return pieces and k.

    Used to cut a domain's runs into rounds of ``cb_buffer_size`` without listing
    every window boundary of a huge domain.
    """
    if not len(runs):
        return runs, np.zeros(0, np.int64)
    rel = runs.file - origin
    first = rel // period
    last = (rel + runs.length - 1) // period
    npieces = last - first + 1
    if bool((npieces == 1).all()):
        return runs, first
    rep, idx, k = _explode(runs, first, npieces)
    org = origin[idx]
    lo = np.maximum(rep.file, org + k * period)
    hi = np.minimum(rep.file + rep.length, org + (k + 1) * period)
    return Runs(lo, hi - lo, (rep.mem + (lo - rep.file)).astype(np.int64)), k


def group_bounds(keys: I64) -> tuple[I64, I64]:
    """For sorted keys, the start index of each group of equal keys and the key."""
    if not len(keys):
        return np.zeros(1, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return np.append(starts, len(keys)).astype(np.int64), keys[starts]


def first_overlap(file: I64, length: I64) -> int:
    """Index i of a run (sorted by offset) that overlaps an earlier one, or -1."""
    if len(file) < 2:
        return -1
    ends = np.maximum.accumulate(file + length)
    bad = np.flatnonzero((file[1:] < ends[:-1]) & (length[1:] > 0))
    return int(bad[0]) + 1 if len(bad) else -1
