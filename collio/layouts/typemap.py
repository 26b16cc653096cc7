"""MPI typemaps as numpy byte runs: the pure half of reading MPI derived datatypes.

A :class:`Flat` is a datatype's typemap reduced to byte runs in *typemap order*
(the order in which a buffer's bytes fill them), neighbours merged, with MPI's
``lb`` and ``extent``.  The functions here build a derived type's runs from its
children's the way ROMIO's ``ADIOI_Flatten`` does, but vectorised: a child is
flattened once and tiled with numpy, never with a Python loop per run or per
element.  No MPI here: :mod:`collio.datatypes` reads the constructor arguments
through ``Get_envelope``/``Get_contents`` and supplies ``lb``/``extent``.

:func:`stream_runs` tiles a type over a byte stream (a file view, or a memory
type with a count); :func:`zip_runs` pairs a file stream with a memory stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..runs import Runs, merge
from .arrays import DimSet, numroc

__all__ = [
    "Flat",
    "cartesian",
    "contiguous",
    "darray_sets",
    "indexed",
    "merge_runs",
    "regular",
    "stream_runs",
    "struct",
    "subarray_sets",
    "zip_runs",
]

I64 = npt.NDArray[np.int64]
Pair = tuple[I64, I64]


@dataclasses.dataclass(frozen=True, slots=True)
class Flat:
    """A typemap as byte runs: ``off[i] .. off[i]+length[i]`` relative to the origin.

    Runs are in typemap order (not necessarily sorted), non-empty, and neighbours
    that continue each other are merged.  ``size`` is the number of data bytes.
    """

    off: I64
    length: I64
    lb: int
    extent: int
    size: int

    @classmethod
    def make(cls, runs: Pair, lb: int, extent: int) -> Flat:
        off, length = merge_runs(*runs)
        return cls(off, length, int(lb), int(extent), int(length.sum()))

    @classmethod
    def leaf(cls, runs: Sequence[tuple[int, int]], lb: int, extent: int) -> Flat:
        """A predefined type from its (offset, length) pieces."""
        arr = np.asarray(runs, np.int64).reshape(-1, 2)
        return cls.make((arr[:, 0].copy(), arr[:, 1].copy()), lb, extent)

    @property
    def nruns(self) -> int:
        return len(self.off)

    @property
    def dense(self) -> bool:
        """One run filling the extent: consecutive copies form one run."""
        return self.nruns == 1 and int(self.length[0]) == self.extent

    @property
    def ub(self) -> int:
        return self.lb + self.extent


def merge_runs(off: I64, length: I64) -> Pair:
    """Drop empty runs; merge each run with the next when it continues it (:func:`merge`)."""
    r = merge(Runs.sequential(np.asarray(off, np.int64), np.asarray(length, np.int64)))
    return r.file, r.length


def _ramp(counts: I64) -> I64:
    """``0..counts[b]-1`` for every b, concatenated."""
    first = np.cumsum(counts) - counts
    out: I64 = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(first, counts)
    return out


def copies(child: Flat, starts: I64, counts: I64, stride: int) -> tuple[I64, I64, I64]:
    """Block ``b`` holds ``counts[b]`` copies of ``child`` at ``starts[b] + j*stride``.

    Returns the runs (unmerged, block by block, typemap order) and the number of
    runs each block produced.
    """
    starts = np.asarray(starts, np.int64)
    counts = np.asarray(counts, np.int64)
    if child.dense and stride == child.extent:
        return starts + child.off[0], counts * child.length[0], np.ones(len(starts), np.int64)
    pos = np.repeat(starts, counts) + _ramp(counts) * stride
    off = (pos[:, None] + child.off[None, :]).reshape(-1)
    length = np.tile(child.length, len(pos))
    return off, length, counts * child.nruns


def contiguous(child: Flat, count: int) -> Pair:
    off, length, _ = copies(child, np.zeros(1, np.int64), np.array([count]), child.extent)
    return off, length


def indexed(child: Flat, blocklengths: I64, displs: I64) -> Pair:
    """Blocks of ``blocklengths[b]`` children from byte ``displs[b]`` (all indexed kinds)."""
    off, length, _ = copies(child, displs, blocklengths, child.extent)
    return off, length


def struct(children: Sequence[Flat], which: I64, blocklengths: I64, displs: I64) -> Pair:
    """Field ``i`` holds ``blocklengths[i]`` copies of ``children[which[i]]`` at ``displs[i]``.

    Fields sharing a child are tiled together; the pieces are then put back in
    field order.  The Python loop is per distinct child type.
    """
    nf = len(which)
    nper = np.zeros(nf, np.int64)
    parts: list[tuple[npt.NDArray[np.intp], I64, I64, I64]] = []
    for c, child in enumerate(children):
        idx = np.flatnonzero(which == c)
        off, length, n = copies(child, displs[idx], blocklengths[idx], child.extent)
        nper[idx] = n
        parts.append((idx, off, length, n))
    first = np.cumsum(nper) - nper
    total = int(nper.sum())
    out_off = np.empty(total, np.int64)
    out_len = np.empty(total, np.int64)
    for idx, off, length, n in parts:
        where = np.repeat(first[idx], n) + _ramp(n)
        out_off[where] = off
        out_len[where] = length
    return out_off, out_len


def cartesian(child: Flat, sets: Sequence[I64], strides: Sequence[int]) -> Pair:
    """Elements at ``sum_k sets[k][i_k] * strides[k]``, the last dimension fastest.

    Consecutive indices of the last dimension become blocks of children, so a
    box of 10^6 rows costs 10^6 numbers, not one per element.
    """
    if any(len(s) == 0 for s in sets):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    outer = np.zeros(1, np.int64)
    for idx, st in zip(sets[:-1], strides[:-1], strict=True):
        outer = (outer[:, None] + idx * np.int64(st)).reshape(-1)
    inner = np.asarray(sets[-1], np.int64)
    brk = np.flatnonzero(np.diff(inner) != 1) + 1
    bstart = inner[np.concatenate(([0], brk))]
    bcount = np.diff(np.concatenate(([0], brk, [len(inner)]))).astype(np.int64)
    starts = (outer[:, None] + bstart * np.int64(strides[-1])).reshape(-1)
    off, length, _ = copies(child, starts, np.tile(bcount, len(outer)), int(strides[-1]))
    return off, length


def _c_order(
    sizes: Sequence[int], sets: list[I64], order_c: bool, ext: int
) -> tuple[list[I64], list[int]]:
    """Index sets and byte strides listed slowest first (Fortran order is reversed)."""
    g = list(sizes)
    if not order_c:
        g.reverse()
        sets = sets[::-1]
    strides = [ext] * len(g)
    for k in range(len(g) - 2, -1, -1):
        strides[k] = strides[k + 1] * int(g[k + 1])
    return sets, strides


def subarray_sets(
    child: Flat, sizes: Sequence[int], subsizes: Sequence[int], starts: Sequence[int], order_c: bool
) -> Pair:
    """The runs of ``MPI_Type_create_subarray``."""
    sets = [np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, subsizes, strict=True)]
    sets, strides = _c_order(sizes, sets, order_c, child.extent)
    return cartesian(child, sets, strides)


BLOCK, CYCLIC, NONE = "block", "cyclic", "none"


def darray_dims(
    size: int,
    rank: int,
    gsizes: Sequence[int],
    distribs: Sequence[str],
    dargs: Sequence[int | None],
    psizes: Sequence[int],
) -> list[DimSet]:
    """Per dimension, the global indices a darray gives ``rank`` (ranks row-major on the grid).

    ``dargs[k]`` is None for ``MPI_DISTRIBUTE_DFLT_DARG``.
    """
    coords = []
    procs, rest = size, rank
    for p in psizes:
        procs //= p
        coords.append(rest // procs)
        rest %= procs
    dims = []
    for g, dist, darg, p, c in zip(gsizes, distribs, dargs, psizes, coords, strict=True):
        if dist == NONE:
            dims.append(DimSet.interval(0, g))
        elif dist == BLOCK:
            b = -(-g // p) if darg is None else darg
            start = min(c * b, g)
            dims.append(DimSet.interval(start, max(0, min(b, g - start))))
        else:
            b = 1 if darg is None else darg
            dims.append(DimSet(c * b, b, p * b, numroc(g, b, c, p)))
    return dims


def darray_sets(child: Flat, gsizes: Sequence[int], dims: Sequence[DimSet], order_c: bool) -> Pair:
    """The runs of ``MPI_Type_create_darray`` given :func:`darray_dims`."""
    sets, strides = _c_order(gsizes, [d.indices() for d in dims], order_c, child.extent)
    return cartesian(child, sets, strides)


def stream_runs(flat: Flat, base: int, start: int, nbytes: int) -> Pair:
    """Bytes ``[start, start+nbytes)`` of the stream that ``flat`` tiled from ``base`` holds.

    Tile ``k`` lies at ``base + k*extent`` and holds stream bytes
    ``[k*size, (k+1)*size)``; the runs come back in stream order.  Only the runs
    touched are listed.
    """
    if nbytes <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if flat.dense:  # the tiles chain into one run
        return np.array([base + int(flat.off[0]) + start], np.int64), np.array([nbytes], np.int64)
    n, size = flat.nruns, flat.size
    end_in = np.cumsum(flat.length)
    end = start + nbytes
    g0 = (start // size) * n + int(np.searchsorted(end_in, start % size, side="right"))
    g1 = ((end - 1) // size) * n + int(np.searchsorted(end_in, (end - 1) % size, side="right"))
    k, j = np.divmod(np.arange(g0, g1 + 1, dtype=np.int64), n)
    s0 = k * size + end_in[j] - flat.length[j]
    lo = np.maximum(s0, start)
    hi = np.minimum(s0 + flat.length[j], end)
    off: I64 = base + flat.off[j] + k * flat.extent + (lo - s0)
    return off, hi - lo


def zip_runs(file: Pair, mem: Pair) -> Runs:
    """Pair two cuttings of the same byte stream into runs (file offset, length, mem offset)."""
    f_off, f_len = file
    m_off, m_len = mem
    f_end = np.cumsum(f_len)
    m_end = np.cumsum(m_len)
    if len(m_len) == 1:  # a contiguous buffer: no cutting needed
        return Runs(f_off, f_len, m_off[0] + f_end - f_len)
    cuts = np.union1d(f_end[:-1], m_end[:-1])
    starts = np.concatenate(([0], cuts)).astype(np.int64)
    ends = np.append(cuts, f_end[-1] if len(f_end) else 0).astype(np.int64)
    fi = np.searchsorted(f_end, starts, side="right")
    mi = np.searchsorted(m_end, starts, side="right")
    fo = f_off[fi] + starts - (f_end[fi] - f_len[fi])
    mo = m_off[mi] + starts - (m_end[mi] - m_len[mi])
    return Runs(fo.astype(np.int64), ends - starts, mo.astype(np.int64))


def regular(off: I64, length: I64) -> tuple[int, int, int] | None:
    """(count, stride, runlen) when runs are equally long and equally spaced, else None."""
    if len(off) == 0:
        return None
    if len(off) == 1:
        return 1, max(int(length[0]), 1), int(length[0])
    d = np.diff(off)
    if bool((d == d[0]).all()) and bool((length == length[0]).all()) and d[0] >= length[0]:
        return len(off), int(d[0]), int(length[0])
    return None
