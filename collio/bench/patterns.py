"""The benchmark's access patterns: what every rank holds, for real ranks and virtual ones.

A :class:`Workload` names a pattern over a global array and a number of ranks.
For a real rank it gives a collio layout (:meth:`Workload.layout`) and the data
the rank writes; for the simulator it gives every rank's index sets at once, as
arrays (:meth:`Workload.dimsets`), so no Python object is made per virtual rank.

Patterns (all C order, all tile the array, so together they cover every byte):

``ior``
    IOR's segmented file: ``-s`` segments, each holding one ``-b`` block per rank
    in rank order; a uint8 array of shape (segments, ranks, block).
``colblock``, ``rowblock``, ``block2d``
    A float64 matrix split in column blocks, row blocks, or a 2-D process grid
    (``MPI_Dims_create``), exactly like MPI darray BLOCK.
``cyclic``
    2-D block-cyclic (ScaLAPACK / darray CYCLIC) with square blocks of
    ``cyclic_block`` elements on the ``MPI_Dims_create`` grid.
``cube``
    A float64 3-D array split in 3-D blocks.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import layouts
from ..hints import parse_size
from ..layouts import ArrayLayout

__all__ = ["PATTERNS", "Workload", "make_workload", "parse_shape"]

PATTERNS = ("ior", "colblock", "rowblock", "block2d", "cyclic", "cube")
I64 = npt.NDArray[np.int64]
_F8 = "<f8"


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """A pattern over a global array, for ``nranks`` ranks.

    ``grid`` places ranks row-major; ``block`` is the cyclic block (elements per
    dimension) or None for BLOCK distributions; ``transfer`` caps independent
    requests (``-t``; 0 = one request per run).
    """

    pattern: str
    shape: tuple[int, ...]
    dtype: str
    grid: tuple[int, ...]
    nranks: int
    block: tuple[int, ...] | None = None
    transfer: int = 0

    @property
    def itemsize(self) -> int:
        return int(np.dtype(self.dtype).itemsize)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def describe(self) -> str:
        shape = " x ".join(str(n) for n in self.shape)
        kind = "bytes" if self.pattern == "ior" else np.dtype(self.dtype).name
        extra = f", blocks {self.block}" if self.block else ""
        return f"{self.pattern}: {shape} {kind} on a {self.grid} grid{extra}"

    def layout(self, rank: int) -> ArrayLayout:
        """The collio layout of a real rank."""
        if self.block is not None:
            return layouts.block_cyclic(
                self.shape, self.dtype, block=self.block, grid=self.grid, rank=rank,
                size=self.nranks,
            )  # fmt: skip
        return layouts.block(self.shape, self.dtype, grid=self.grid, rank=rank, size=self.nranks)

    def coords(self) -> I64:
        """Grid coordinates of every rank, shape (nranks, ndim), row-major placement."""
        r = np.arange(self.nranks, dtype=np.int64)
        out = np.empty((self.nranks, len(self.grid)), np.int64)
        for k in range(len(self.grid) - 1, -1, -1):
            r, out[:, k] = np.divmod(r, self.grid[k])
        return out

    def dimsets(self) -> tuple[I64, I64, I64, I64]:
        """Every rank's :class:`~collio.layouts.DimSet` fields as (nranks, ndim) arrays.

        Returns ``first, block, period, count``: rank r holds global indices
        ``first + j*period + i`` (``i < block``), ``count`` of them, in dimension k.
        A cyclic dimension on one process (``period == block``) is one interval, so
        the boxes' runs are the merged runs collio lists (one box, not a full and a
        partial one that touch).
        """
        c = self.coords()
        n = np.array(self.shape, np.int64)[None, :]
        p = np.array(self.grid, np.int64)[None, :]
        if self.block is None:
            b = -(-n // p)
            first = np.minimum(c * b, n)
            count = np.minimum(b, n - first)
            width = np.maximum(count, 1)
            return first, width, width.copy(), count
        nb = np.array(self.block, np.int64)[None, :]
        count = numroc(n, nb, c, p)
        alone = np.broadcast_to(p == 1, c.shape)
        block = np.where(alone, np.maximum(count, 1), nb)
        period = np.where(alone, block, nb * p)
        return c * nb, block, period, count

    def data(self, rank: int, seed: int = 0) -> npt.NDArray[Any]:
        """The piece rank ``rank`` writes: a function of each element's global position."""
        return self._values(_positions(self.layout(rank)), seed)

    def whole(self, seed: int = 0) -> npt.NDArray[Any]:
        """The global array all ranks' :meth:`data` make together (built slice by slice)."""
        n = math.prod(self.shape)
        out = np.empty(n, self.dtype)
        step = 1 << 22
        for a in range(0, n, step):
            out[a : a + step] = self._values(np.arange(a, min(n, a + step), dtype=np.int64), seed)
        return out.reshape(self.shape)

    def _values(self, pos: I64, seed: int) -> npt.NDArray[Any]:
        if self.pattern == "ior":
            return ((pos * 7 + seed) % 251).astype(np.uint8)
        return (pos + seed).astype(self.dtype)

    def where(self, rank: int) -> tuple[Any, ...]:
        """An index of the global array selecting rank ``rank``'s piece (slices or ``np.ix_``)."""
        lay = self.layout(rank)
        if isinstance(lay, layouts.Subarray):
            return lay.slices
        return np.ix_(*(d.indices() for d in lay.dims))

    def piece(self, whole: npt.NDArray[Any], rank: int) -> npt.NDArray[Any]:
        """Rank ``rank``'s piece of the global array ``whole`` (e.g. a memmap of the file)."""
        return np.asarray(whole[self.where(rank)])


def numroc(n: I64, nb: I64, iproc: I64, nprocs: I64) -> I64:
    """ScaLAPACK NUMROC, vectorised (see :func:`collio.layouts.numroc`)."""
    nblocks = n // nb
    count = (nblocks // nprocs) * nb
    extra = nblocks % nprocs
    count = count + np.where(iproc < extra, nb, np.where(iproc == extra, n % nb, 0))
    out: I64 = count.astype(np.int64)
    return out


def _positions(lay: ArrayLayout) -> I64:
    """Flat global (file-order) index of every local element, shaped like the piece."""
    idx = [d.indices() for d in lay.dims]
    if any(len(i) == 0 for i in idx):
        return np.zeros(lay.local_shape, np.int64)
    pos: I64 = np.ravel_multi_index(np.ix_(*idx), lay.global_shape).astype(np.int64)
    return pos


def parse_shape(text: str, ndim: int, itemsize: int) -> tuple[int, ...]:
    """``4096`` (edge), ``4096x2048`` (shape) or ``128MiB`` / ``1TiB`` (bytes, near-square)."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+(x\d+)+", t):
        shape = tuple(int(v) for v in t.split("x"))
        if len(shape) != ndim:
            raise ValueError(f"--size {text!r} has {len(shape)} dimensions, the pattern {ndim}")
        return shape
    if t.isdigit():
        return (int(t),) * ndim
    elems = parse_size(text, "size") // itemsize
    edge = max(1, _iroot(elems, ndim))
    return (edge,) * ndim


def _iroot(x: int, k: int) -> int:
    r = int(round(x ** (1.0 / k)))
    while r**k > x:
        r -= 1
    while (r + 1) ** k <= x:
        r += 1
    return r


def make_workload(
    pattern: str,
    nranks: int,
    *,
    size: str | None = None,
    block_size: int = 1 << 20,
    transfer: int = 256 << 10,
    segments: int = 1,
    cyclic_block: int = 64,
) -> Workload:
    """Build a workload from the command line's values (IOR's defaults for ``ior``).

    Parameters
    ----------
    pattern
        One of :data:`PATTERNS`.
    nranks
        Real or virtual ranks.
    size
        Arrays: an edge (``4096``), a shape (``4096x2048``) or bytes (``1TiB``, near
        square or cube of float64); ``ior``: total bytes, which sets ``segments``.
    block_size, transfer, segments
        IOR's ``-b``, ``-t``, ``-s`` (``transfer`` also caps independent requests of
        array patterns; 0 keeps runs whole).
    cyclic_block
        Edge of the square blocks of ``cyclic``.

    Returns
    -------
    Workload

    Raises
    ------
    ValueError
        Unknown pattern, bad size, or ``-t`` that does not divide ``-b``.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    if pattern == "ior":
        if transfer <= 0 or block_size % transfer:
            raise ValueError(f"-t {transfer} must divide -b {block_size} (as in IOR)")
        if size is not None:
            segments = max(1, parse_size(size, "size") // (nranks * block_size))
        dims = (segments, nranks, block_size)
        return Workload("ior", dims, "u1", (1, nranks, 1), nranks, None, transfer)
    ndim = 3 if pattern == "cube" else 2
    shape = parse_shape(size or "4096", ndim, 8)
    if pattern == "colblock":
        grid: tuple[int, ...] = (1, nranks)
    elif pattern == "rowblock":
        grid = (nranks, 1)
    else:
        grid = layouts.dims_create(nranks, ndim)
    block = (cyclic_block, cyclic_block) if pattern == "cyclic" else None
    return Workload(pattern, shape, _F8, grid, nranks, block, max(transfer, 0))


def human(n: float) -> str:
    """Bytes with a binary unit."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError
