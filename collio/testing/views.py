"""References for file views: MPI's own typemaps (by ``Pack``), ROMIO's bytes, test datatypes.

* :func:`typemap_bytes` asks MPI itself where each data byte of a datatype lies
  (it packs byte planes of a numbered buffer), independently of collio's decoder.
* :func:`romio_view_write` / :func:`romio_view_read` do the same call through
  mpi4py's ``MPI.File`` (ROMIO), for byte comparisons in the same run.
* :func:`datatype_cases` builds a filetype per constructor, nested two deep or
  more, with resized extents, different on every rank and disjoint between ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..layouts.typemap import Flat

__all__ = [
    "TypeBag",
    "datatype_cases",
    "flat_bytes",
    "romio_view_read",
    "romio_view_write",
    "type_bag",
    "typemap_bytes",
]

I64 = npt.NDArray[np.int64]


def typemap_bytes(dt: MPI.Datatype, count: int = 1) -> I64:
    """Displacement of every data byte of ``count`` x ``dt``, in typemap order, per MPI."""
    tlb, text = dt.Get_true_extent()
    _, extent = dt.Get_extent()
    lo = min(tlb, tlb + (count - 1) * extent)
    hi = max(tlb + text, tlb + text + (count - 1) * extent)
    shift, n = -lo, max(hi - lo, 1)
    placed = dt.Create_hindexed([count], [shift])
    try:
        wrap = placed.Create_resized(0, n).Commit()  # Pack infers count 1 from the extent
    finally:
        placed.Free()
    try:
        addr = np.arange(n, dtype=np.int64)
        size = wrap.Get_size()
        out = np.zeros(size, np.int64)
        packed = np.empty(max(wrap.Pack_size(1, MPI.COMM_SELF), 1), np.uint8)
        for b in range(5):
            plane = ((addr >> (8 * b)) & 0xFF).astype(np.uint8)
            pos = wrap.Pack(plane, packed, 0, MPI.COMM_SELF)
            out |= packed[:pos].astype(np.int64) << (8 * b)
        return out - shift
    finally:
        wrap.Free()


def flat_bytes(flat: Flat, count: int = 1) -> I64:
    """The same list from collio's runs (tiles at multiples of the extent)."""
    if not flat.nruns or not count:
        return np.zeros(0, np.int64)
    off = (flat.off[None, :] + np.arange(count)[:, None] * flat.extent).reshape(-1)
    length = np.tile(flat.length, count)
    first = np.cumsum(length) - length
    ramp = np.arange(int(length.sum())) - np.repeat(first, length)
    out: I64 = np.repeat(off, length) + ramp
    return out


def romio_view_write(
    path: str, disp: int, etype: Any, filetype: Any, buf: Any, comm: MPI.Intracomm
) -> None:
    """Collective: ``Set_view`` + ``Write_all`` through ROMIO (the file must exist)."""
    fh = MPI.File.Open(comm, path, MPI.MODE_RDWR | MPI.MODE_CREATE)
    try:
        fh.Set_view(disp, etype, filetype)
        fh.Write_all(buf)
    finally:
        fh.Close()


def romio_view_read(
    path: str, disp: int, etype: Any, filetype: Any, buf: Any, comm: MPI.Intracomm
) -> None:
    """Collective: ``Set_view`` + ``Read_all`` through ROMIO into ``buf``."""
    fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
    try:
        fh.Set_view(disp, etype, filetype)
        fh.Read_all(buf)
    finally:
        fh.Close()


class TypeBag:
    """Keeps every datatype a test builds; :meth:`free` frees them all."""

    def __init__(self) -> None:
        self.made: list[MPI.Datatype] = []

    def __call__(self, dt: MPI.Datatype) -> MPI.Datatype:
        self.made.append(dt)
        return dt

    def free(self) -> None:
        for dt in self.made:
            if dt != MPI.DATATYPE_NULL:
                dt.Free()
        self.made.clear()


@contextlib.contextmanager
def type_bag() -> Iterator[TypeBag]:
    bag = TypeBag()
    try:
        yield bag
    finally:
        bag.free()


def _slot(t: TypeBag, unit: MPI.Datatype, rank: int, size: int) -> MPI.Datatype:
    """``unit`` in slot ``rank`` of ``size`` slots of its span: ranks interleave, disjoint."""
    tlb, text = unit.Get_true_extent()
    span = max(unit.Get_extent()[0] + unit.Get_extent()[1], tlb + text)
    placed = t(unit.Create_hindexed([1], [rank * span]))
    lb = min(unit.Get_extent()[0], 0)  # a negative lb stays visible in the filetype
    return t(placed.Create_resized(lb, size * span)).Commit()


def _units(t: TypeBag) -> list[tuple[str, MPI.Datatype, MPI.Datatype]]:
    """(name, etype, unit type) for every constructor, nested, some resized."""
    i, d, s = MPI.INT, MPI.DOUBLE, MPI.SHORT
    vec = t(i.Create_vector(2, 1, 3))
    return [
        ("contiguous", i, t(vec.Create_contiguous(3))),
        ("vector", i, t(t(i.Create_resized(0, 8)).Create_vector(3, 2, 4))),
        ("hvector", s, t(t(s.Create_vector(2, 1, 2)).Create_hvector(3, 2, 40))),
        ("indexed", i, t(t(t(i.Create_contiguous(2)).Create_resized(0, 12)).Create_indexed(
            [2, 1, 3], [0, 4, 9]))),
        ("hindexed", d, t(t(d.Create_vector(2, 1, 3)).Create_hindexed([1, 2], [0, 48]))),
        ("indexed_block", i, t(t(i.Create_resized(0, 6)).Create_indexed_block(2, [1, 5, 9]))),
        ("hindexed_block", i, t(t(i.Create_hvector(2, 1, 12)).Create_hindexed_block(
            1, [0, 24, 72]))),
        ("struct", MPI.BYTE, t(t(MPI.Datatype.Create_struct(
            [1, 2, 1], [0, 8, 40], [i, t(s.Create_vector(2, 1, 2)), d])).Create_resized(0, 64))),
        ("resized-lb", d, t(t(d.Create_vector(2, 1, 2)).Create_resized(8, 48))),
        ("resized-neg-lb", i, t(t(t(i.Create_vector(2, 1, 3)).Create_hindexed([1], [16])
                                  ).Create_resized(-8, 56))),
        ("dup", i, t(t(i.Create_indexed([1, 2], [0, 3])).Dup())),
        ("nested3", i, t(t(t(i.Create_vector(2, 1, 2)).Create_contiguous(2)).Create_hvector(
            2, 1, 100))),
    ]  # fmt: skip


def _arrays(t: TypeBag, rank: int, size: int) -> list[tuple[str, MPI.Datatype, MPI.Datatype]]:
    """Subarray and darray filetypes of derived element types (the rank's own piece)."""
    elem = t(t(MPI.INT.Create_contiguous(2)).Create_resized(0, 8))
    n0 = 3 * size
    sub = t(elem.Create_subarray([n0, 5, 4], [3, 3, 2], [3 * rank, 1, 1]))
    subf = t(MPI.DOUBLE.Create_subarray([4, n0], [3, 3], [1, 3 * rank], order=MPI.ORDER_F))
    grid = MPI.Compute_dims(size, 2)
    dist = [MPI.DISTRIBUTE_CYCLIC, MPI.DISTRIBUTE_BLOCK]
    dar = t(
        t(MPI.SHORT.Create_vector(2, 1, 2)).Create_darray(
            size, rank, [9, 7], dist, [2, MPI.DISTRIBUTE_DFLT_DARG], grid
        )
    )
    darf = t(
        MPI.DOUBLE.Create_darray(
            size, rank, [5, 6], [MPI.DISTRIBUTE_CYCLIC] * 2, [1, 2], grid, order=MPI.ORDER_F
        )
    )
    return [
        ("subarray", MPI.INT, sub),
        ("subarray-F", MPI.DOUBLE, subf),
        ("darray", MPI.SHORT, dar),
        ("darray-F", MPI.DOUBLE, darf),
    ]  # fmt: skip


def datatype_cases(
    t: TypeBag, rank: int, size: int
) -> list[tuple[str, MPI.Datatype, MPI.Datatype]]:
    """(name, etype, filetype) per constructor; committed; ranks' bytes are disjoint."""
    out = [(name, et, _slot(t, unit, rank, size)) for name, et, unit in _units(t)]
    out += [(name, et, ft.Commit()) for name, et, ft in _arrays(t, rank, size)]
    return out
