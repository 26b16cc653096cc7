"""Layouts: what each rank holds, as byte runs and as arithmetic structure.  Pure, no I/O.

``Subarray`` (one box), ``block`` (balanced boxes, MPI darray BLOCK),
``block_cyclic`` (ScaLAPACK / MPI darray CYCLIC), ``Segments`` (raw byte runs) and
``from_datatype`` (an MPI derived datatype, decoded by :mod:`collio.datatypes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import LayoutError
from .arrays import ArrayLayout, BlockCyclic, DimSet, Subarray, numroc
from .base import Layout, Segments
from .strided import Blocks, count_below, flatten
from .typed import TypedLayout

__all__ = [
    "ArrayLayout",
    "BlockCyclic",
    "Blocks",
    "DimSet",
    "Layout",
    "Segments",
    "Subarray",
    "TypedLayout",
    "block",
    "block_cyclic",
    "block_range",
    "count_below",
    "dims_create",
    "flatten",
    "from_datatype",
    "numroc",
]


def dims_create(nprocs: int, ndims: int, dims: Sequence[int] | None = None) -> tuple[int, ...]:
    """A balanced process grid, exactly as ``MPI_Dims_create`` makes it."""
    from mpi4py import MPI

    return tuple(MPI.Compute_dims(nprocs, list(dims) if dims is not None else ndims))


def from_datatype(datatype: Any, count: int = 1, *, disp: int = 0, dtype: Any = None) -> Layout:
    """A layout from an MPI datatype: ``count`` copies of its typemap from byte ``disp``.

    See :func:`collio.datatypes.from_datatype` (imported here only when called, so
    that layouts stay free of MPI).
    """
    from ..datatypes import from_datatype as _from_datatype

    return _from_datatype(datatype, count, disp=disp, dtype=dtype)


def _rank_size(comm: Any, rank: int | None, size: int | None) -> tuple[int, int]:
    if rank is not None and size is not None:
        return rank, size
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    return int(comm.Get_rank()), int(comm.Get_size())


def _coords(rank: int, grid: Sequence[int]) -> tuple[int, ...]:
    """Row-major placement of ranks on the grid, as MPI darray and cartesian comms do."""
    coords = []
    for p in reversed(grid):
        rank, c = divmod(rank, p)
        coords.append(c)
    return tuple(reversed(coords))


def _ndim(global_shape: Any) -> int:
    """The dimensions of ``global_shape`` where it has a length (else 0).

    A factory's own faults (a grid that does not fit the ranks) make a layout that
    fails its check inside the call, with the fault's message, as a layout's own faults
    do: raised here, on the rank that passed it alone, the others would wait in the call.
    """
    try:
        return len(global_shape)
    except TypeError:
        return 0


def _grid(global_shape: Sequence[int], grid: Sequence[int] | None, size: int) -> tuple[int, ...]:
    if len(global_shape) == 0 and size != 1:
        # A 0-d array is one element and has no dimension to cut: MPI_Dims_create gives
        # the empty grid for any size, which would hand the element to every rank.
        raise LayoutError(
            f"a 0-d global shape () holds one element and cannot be split over {size} ranks; "
            f"use global shape (1,), which gives it to one rank and (0,) to the others"
        )
    if grid is None:
        return dims_create(size, len(global_shape))
    grid = tuple(int(p) for p in grid)
    if len(grid) != len(global_shape):
        raise LayoutError(f"grid {grid} and global shape {tuple(global_shape)} differ in length")
    prod = 1
    for p in grid:
        prod *= p
    if prod != size:
        raise LayoutError(f"grid {grid} has {prod} places for {size} ranks")
    return grid


def block_range(n: int, p: int, c: int) -> tuple[int, int]:
    """MPI darray BLOCK: place ``c`` of ``p`` gets ``[start, start+count)`` of ``n``."""
    b = -(-n // p) if p else 0
    start = min(c * b, n)
    return start, min(b, n - start)


def block(
    global_shape: Sequence[int],
    dtype: Any,
    *,
    comm: Any = None,
    grid: Sequence[int] | None = None,
    order: str = "C",
    offset: int = 0,
    rank: int | None = None,
    size: int | None = None,
) -> Subarray:
    """This rank's box of a balanced block decomposition (MPI darray BLOCK).

    The grid comes from ``MPI_Dims_create`` when None; ranks are placed row-major.
    Each dimension is cut in blocks of ``ceil(n/p)`` as MPI does, so trailing places
    may get less or nothing.  ``rank``/``size`` let you plan without a communicator.
    """
    rank, size = _rank_size(comm, rank, size)
    try:
        grid = _grid(global_shape, grid, size)
        coords = _coords(rank, grid)
        ranges = [
            block_range(int(n), p, c) for n, p, c in zip(global_shape, grid, coords, strict=True)
        ]
    except (LayoutError, TypeError, ValueError) as exc:
        n = _ndim(global_shape)
        return Subarray(global_shape, (0,) * n, (0,) * n, dtype, order, offset, invalid=str(exc))
    box = Subarray(
        global_shape, [r[0] for r in ranges], [r[1] for r in ranges], dtype, order, offset
    )
    box.grid, box.coords = grid, coords
    return box


def block_cyclic(
    global_shape: Sequence[int],
    dtype: Any,
    *,
    block: int | Sequence[int],
    grid: Sequence[int],
    comm: Any = None,
    order: str = "C",
    offset: int = 0,
    rank: int | None = None,
    size: int | None = None,
) -> BlockCyclic:
    """This rank's blocks of a CYCLIC(block) distribution (ScaLAPACK, MPI darray).

    The local array holds the rank's elements in global order; its shape is what
    ScaLAPACK's ``numroc`` gives per dimension.
    """
    rank, size = _rank_size(comm, rank, size)
    try:
        grid = _grid(global_shape, grid, size)
        blk = (block,) * len(global_shape) if isinstance(block, int) else tuple(block)
    except (LayoutError, TypeError, ValueError) as exc:
        ones = (1,) * _ndim(global_shape)
        return BlockCyclic(
            global_shape, dtype, block=ones, grid=ones, coords=(0,) * len(ones), order=order,
            offset=offset, invalid=str(exc),
        )  # fmt: skip
    return BlockCyclic(
        global_shape,
        dtype,
        block=blk,
        grid=grid,
        coords=_coords(rank, grid),
        order=order,
        offset=offset,
    )
