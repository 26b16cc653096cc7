"""Reference I/O through mpi4py's ``MPI.File`` (ROMIO in MPICH) for the same layouts."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..layouts import ArrayLayout, BlockCyclic, Layout, Segments, Subarray

__all__ = ["filetype", "romio_write", "romio_read", "covered_mask"]


def filetype(
    layout: Layout, comm: MPI.Comm, *, darray: bool = False
) -> tuple[MPI.Datatype, MPI.Datatype, int]:
    """(etype, filetype, displacement) that describe ``layout`` as an MPI file view.

    Subarrays become ``Create_subarray`` (or, with ``darray=True`` and a layout
    made by ``layouts.block``, ``Create_darray`` with BLOCK distribution),
    block-cyclic layouts ``Create_darray`` (CYCLIC), segments ``Create_hindexed``
    over bytes.  The caller frees both types.
    """
    if isinstance(layout, Segments):
        runs = layout.runs()
        ft = MPI.BYTE.Create_hindexed(runs.length.tolist(), runs.file.tolist())
        return MPI.BYTE.Dup(), ft.Commit(), 0
    assert isinstance(layout, ArrayLayout)
    et = MPI.BYTE.Create_contiguous(layout.dtype.itemsize).Commit()
    order = MPI.ORDER_C if layout.order == "C" else MPI.ORDER_FORTRAN
    if isinstance(layout, Subarray) and darray and layout.grid is not None:
        assert layout.coords is not None
        ft = et.Create_darray(
            int(np.prod(layout.grid)),
            _grid_rank(layout.coords, layout.grid),
            layout.global_shape,
            [MPI.DISTRIBUTE_BLOCK] * len(layout.grid),
            [MPI.DISTRIBUTE_DFLT_DARG] * len(layout.grid),
            list(layout.grid),
            order=order,
        )
    elif isinstance(layout, Subarray):
        if 0 in layout.shape:
            ft = et.Create_contiguous(0)
        else:
            ft = et.Create_subarray(layout.global_shape, layout.shape, layout.start, order=order)
    elif isinstance(layout, BlockCyclic):
        ft = et.Create_darray(
            int(np.prod(layout.grid)),
            _grid_rank(layout.coords, layout.grid),
            layout.global_shape,
            [MPI.DISTRIBUTE_CYCLIC] * len(layout.grid),
            list(layout.block),
            list(layout.grid),
            order=order,
        )
    else:  # pragma: no cover
        raise TypeError(type(layout))
    return et, ft.Commit(), layout.offset


def _grid_rank(coords: tuple[int, ...], grid: tuple[int, ...]) -> int:
    rank = 0
    for c, p in zip(coords, grid, strict=True):
        rank = rank * p + c
    return rank


def _file_order(layout: Layout) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Index that puts the layout's buffer bytes in file order (what a file view consumes)."""
    runs = layout.runs()
    if not len(runs):
        return np.zeros(0, np.int64)
    starts = np.repeat(runs.mem - np.concatenate(([0], np.cumsum(runs.length)[:-1])), runs.length)
    return (starts + np.arange(int(runs.length.sum()))).astype(np.int64)


def _view(
    fh: MPI.File, layout: Layout, comm: MPI.Comm, darray: bool = False
) -> tuple[MPI.Datatype, MPI.Datatype]:
    et, ft, disp = filetype(layout, comm, darray=darray)
    fh.Set_view(disp, et, ft)
    return et, ft


def romio_write(
    path: str,
    data: Any,
    layout: Layout,
    comm: MPI.Intracomm,
    info: Any = None,
    *,
    darray: bool = False,
) -> None:
    """Collective: write like collio would, but with ``MPI.File.Write_all``."""
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR, info or MPI.INFO_NULL)
    try:
        et, ft = _view(fh, layout, comm, darray)
        buf = np.ascontiguousarray(layout.as_bytes(data))
        if isinstance(layout, Segments):
            buf = buf[_file_order(layout)]
        fh.Write_all([buf, MPI.BYTE])
        et.Free()
        ft.Free()
    finally:
        fh.Close()


def romio_read(path: str, layout: Layout, comm: MPI.Intracomm, info: Any = None) -> Any:
    """Collective: read the rank's piece with ``MPI.File.Read_all``."""
    arr, view = layout.allocate(None)
    fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY, info or MPI.INFO_NULL)
    try:
        et, ft = _view(fh, layout, comm)
        if isinstance(layout, Segments):
            tmp = np.empty_like(view)
            fh.Read_all([tmp, MPI.BYTE])
            view[_file_order(layout)] = tmp
        else:
            fh.Read_all([view, MPI.BYTE])
        et.Free()
        ft.Free()
    finally:
        fh.Close()
    return arr


def covered_mask(layouts: list[Layout], size: int) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Bytes of a file of ``size`` that some layout covers (ROMIO's holes are undefined)."""
    mask = np.zeros(size, bool)
    for lay in layouts:
        r = lay.runs()
        if len(r):
            starts = np.zeros(size + 1, np.int64)
            np.add.at(starts, r.file, 1)
            np.add.at(starts, r.file + r.length, -1)
            mask |= np.cumsum(starts)[:size] > 0
    return mask
