"""N-d array layouts: boxes (subarrays) and block-cyclic distributions.

Each dimension of a rank's piece is a :class:`DimSet`: the global indices
``first + j*period + i`` for ``0 <= i < block``, ``count`` of them in all (the last
block may be partial).  A box is one block; ScaLAPACK's CYCLIC(b) is many.  The
rank's buffer holds its elements in global order, in C or Fortran order, as MPI's
subarray and darray types and ScaLAPACK's local matrices do.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import LayoutError
from ..runs import Runs, read_only
from .base import TOP, Layout, refuse_objects
from .strided import Blocks

__all__ = [
    "DimSet", "ArrayLayout", "Subarray", "BlockCyclic", "array_layout", "numroc", "offsets_of",
    "shape_keys",
]  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class DimSet:
    """Global indices ``first + j*period + i`` (``i < block``), ``count`` in all."""

    first: int
    block: int
    period: int
    count: int

    @classmethod
    def interval(cls, start: int, count: int) -> DimSet:
        return cls(start, max(count, 1), max(count, 1), count)

    def pieces(self) -> list[tuple[int, int, int, int]]:
        """(global start, blocks, items per block, local start) of the regular parts."""
        if self.count <= 0:
            return []
        nfull, rest = divmod(self.count, self.block)
        out = []
        if nfull:
            out.append((self.first, nfull, self.block, 0))
        if rest:
            out.append((self.first + nfull * self.period, 1, rest, nfull * self.block))
        return out

    def last(self) -> int:
        """The largest global index (count must be > 0)."""
        j, i = divmod(self.count - 1, self.block)
        return self.first + j * self.period + i

    def indices(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The global indices, in order (length ``count``)."""
        k = np.arange(self.count, dtype=np.int64)
        return self.first + (k // self.block) * self.period + k % self.block


def integers(values: Any, what: str) -> tuple[tuple[int, ...], str | None]:
    """``values`` as Python ints, and why they are not (None: they are).  Each must be an
    integer (``operator.index``, as numpy takes a shape): int() would cut a start of 2.5
    to 2 and read "2" as 2, placing the piece elsewhere than asked without a word.  Never
    raises (see :class:`ArrayLayout`): a bad value gives () and the reason."""
    try:
        return tuple(map(operator.index, values)), None
    except TypeError as exc:  # (a float, a string, None; or not a sequence at all)
        return (), f"{what} {values!r} must be integers: {exc}"


@functools.lru_cache(maxsize=1024)
def _box_dims(start: tuple[int, ...], shape: tuple[int, ...]) -> tuple[DimSet, ...]:
    """A box's dimensions (immutable, so shared by the boxes of a time series, whose
    steps make a layout each with the same start and shape)."""
    return tuple(DimSet.interval(s, c) for s, c in zip(start, shape, strict=False))


def numroc(n: int, nb: int, iproc: int, nprocs: int) -> int:
    """ScaLAPACK NUMROC: how many of ``n`` items in blocks of ``nb`` process ``iproc`` owns."""
    nblocks = n // nb
    count = (nblocks // nprocs) * nb
    extra = nblocks % nprocs
    if iproc < extra:
        count += nb
    elif iproc == extra:
        count += n % nb
    return count


class ArrayLayout(Layout):
    """A rank's elements of a global array stored from byte ``offset`` of the target."""

    __slots__ = ("global_shape", "_dtype", "_order", "_offset", "dims", "_invalid", "_key")

    def __init__(
        self,
        global_shape: Sequence[int],
        dims: Sequence[DimSet],
        dtype: Any,
        order: str = "C",
        offset: int = 0,
    ) -> None:
        super().__init__()
        # Constructors never raise for bad values: a layout is checked inside the
        # collective call (validate), so that every rank raises together.
        self._invalid: str | None = getattr(self, "_invalid", None)
        self.global_shape, bad = integers(global_shape, "global shape")
        self._invalid = self._invalid or bad
        self.dims = tuple(dims)
        try:
            self._dtype = np.dtype(dtype)
        except TypeError as exc:
            self._dtype = np.dtype(np.uint8)
            self._invalid = self._invalid or f"invalid dtype {dtype!r}: {exc}"
        if order not in ("C", "F"):
            self._invalid = self._invalid or f"order must be 'C' or 'F', not {order!r}"
            order = "C"
        self._order = order
        try:
            self._offset = operator.index(offset)
        except TypeError:
            self._offset = 0
            self._invalid = self._invalid or f"offset {offset!r} must be an integer"
        self._key = _shape_key(self)

    def _shape_fields(self) -> tuple[Any, ...] | None:
        """The fields this layout's runs depend on besides its offset, for a kind of
        layout whose runs at byte ``offset`` are its runs at 0 moved by ``offset``
        (:func:`shape_keys`); None for any other kind."""
        return None

    @property
    def offset(self) -> int:
        """Byte offset of the global array in the target.  Read-only, as the layout is:
        its runs are kept once worked out, and collio reuses a checked layout's runs for
        the next step of a series (a new step is a new layout)."""
        return self._offset

    @property
    def dtype(self) -> np.dtype[Any]:
        dt: np.dtype[Any] = self._dtype
        return dt

    @property
    def order(self) -> str:
        return self._order

    @property
    def local_shape(self) -> tuple[int, ...]:
        return tuple([d.count for d in self.dims])  # (a list: one call, not one per dim)

    @property
    def global_nbytes(self) -> int:
        return math.prod(self.global_shape) * self.dtype.itemsize

    def signature(self) -> tuple[Any, ...]:
        return ("array", self.global_shape, self.dtype.str, self.order, self.offset)

    def validate(self) -> None:
        if self._invalid:
            raise LayoutError(self._invalid)
        if len(self.dims) != len(self.global_shape):
            raise LayoutError(
                f"layout has {len(self.dims)} dimensions, global shape {self.global_shape} "
                f"has {len(self.global_shape)}"
            )
        if any(g < 0 for g in self.global_shape):
            raise LayoutError(f"global shape {self.global_shape} has a negative extent")
        if self.offset < 0:
            raise LayoutError(f"offset {self.offset} is negative")
        if self.dtype.itemsize == 0:
            raise LayoutError(f"dtype {self.dtype} has no size")
        refuse_objects(self.dtype)  # (also for a batch's items, whose arrays skip as_bytes)
        end = self.offset + math.prod(self.global_shape) * self.dtype.itemsize
        if end > TOP:  # (its runs are int64: one ending past the top would wrap)
            raise LayoutError(f"the array ends at byte {end}, past the largest offset {TOP}")
        for k, d in enumerate(self.dims):
            if d.count < 0 or d.first < 0 or d.block < 1 or d.period < d.block:
                raise LayoutError(f"dimension {k}: invalid index set {d}")
            if d.count and d.last() >= self.global_shape[k]:
                self._out_of_bounds()

    def _out_of_bounds(self) -> None:
        raise LayoutError(f"region exceeds global shape {self.global_shape}")

    def blocks(self) -> Blocks:
        itemsize = self.dtype.itemsize
        g = list(self.global_shape)
        dims = list(self.dims)
        if self.order == "F":
            g.reverse()
            dims.reverse()
        n = len(g)
        fstride = [itemsize] * n
        mstride = [itemsize] * n
        for k in range(n - 2, -1, -1):
            fstride[k] = fstride[k + 1] * g[k + 1]
            mstride[k] = mstride[k + 1] * dims[k + 1].count
        rows: list[tuple[int, int, list[int], list[int], list[int]]] = []
        for combo in itertools.product(*(d.pieces() for d in dims)):
            base = self.offset + sum(p[0] * fstride[k] for k, p in enumerate(combo))
            mem = sum(p[3] * mstride[k] for k, p in enumerate(combo))
            counts: list[int] = []
            strides: list[int] = []
            mstrides: list[int] = []
            for k, (_, nblk, per, _) in enumerate(combo):
                counts += [nblk, per]
                strides += [dims[k].period * fstride[k], fstride[k]]
                mstrides += [dims[k].block * mstride[k], mstride[k]]
            rows.append((base, mem, counts, strides, mstrides))
        if not rows:
            z = np.zeros((0, max(2 * n, 1)), np.int64)
            return Blocks.build(z[:, 0], z[:, 0], z, z, z, z[:, 0])
        return Blocks.build(
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            [r[3] for r in rows],
            [r[4] for r in rows],
            [itemsize] * len(rows),
        )


class Subarray(ArrayLayout):
    """One N-d box of a global array whose elements are stored from byte ``offset``.

    Parameters
    ----------
    global_shape, start, shape
        The global array's shape; the box's first index and extent per dimension.
    dtype
        Element type (any numpy dtype, structured ones included).
    order
        'C' (row-major) or 'F' (column-major), for both the file and the local array.
    offset
        Byte offset of element (0, ..., 0) in the target.
    """

    __slots__ = ("start", "shape", "grid", "coords")

    def __init__(
        self,
        global_shape: Sequence[int],
        start: Sequence[int],
        shape: Sequence[int],
        dtype: Any,
        order: str = "C",
        offset: int = 0,
        *,
        invalid: str | None = None,
    ) -> None:
        self.start, bad = integers(start, "start")
        self.shape, bad_shape = integers(shape, "shape")
        #: process grid and this rank's place in it, when made by ``layouts.block``
        self.grid: tuple[int, ...] | None = None
        self.coords: tuple[int, ...] | None = None
        self._invalid = invalid or bad or bad_shape  # (invalid: a factory's finding)
        if not self._invalid and len(self.start) != len(self.shape):
            self._invalid = f"start {self.start} and shape {self.shape} differ in length"
        super().__init__(global_shape, _box_dims(self.start, self.shape), dtype, order, offset)

    def __repr__(self) -> str:
        return (
            f"Subarray(global_shape={self.global_shape}, start={self.start}, "
            f"shape={self.shape}, dtype={self.dtype.str!r}, order={self.order!r}, "
            f"offset={self.offset})"
        )

    def _shape_fields(self) -> tuple[Any, ...]:
        return (self.global_shape, self.start, self.shape, self._dtype, self._order,
                self._invalid)  # fmt: skip

    @property
    def box(self) -> tuple[Any, ...]:
        """Every field but the offset: the steps of a time series through one layout
        have the same box (the lanes of repeated calls keep it and compare it)."""
        return (self.global_shape, self.start, self.shape, self._dtype, self._order)

    def validate(self) -> None:
        if self._invalid:
            raise LayoutError(self._invalid)
        for k, (s, c) in enumerate(zip(self.start, self.shape, strict=True)):
            if s < 0 or c < 0:
                raise LayoutError(
                    f"region {self.start}+{self.shape}: negative start or extent in dimension {k}"
                )
        super().validate()

    def _out_of_bounds(self) -> None:
        raise LayoutError(
            f"region {self.start}+{self.shape} exceeds global shape {self.global_shape}"
        )

    def runs(self) -> Runs:
        """The box's runs straight from its shape (cached): the same runs :func:`flatten`
        lists from :meth:`blocks`, without building the boxes, which costs more than
        the rest of a small call's checks."""
        if self._runs is None:
            self._runs = read_only(self._box_runs())
        return self._runs

    def _box_runs(self) -> Runs:
        g, start, count = list(self.global_shape), list(self.start), list(self.shape)
        if self.order == "F":
            g, start, count = g[::-1], start[::-1], count[::-1]
        if 0 in count:
            return Runs.empty()
        n = len(g)
        stride = [self.dtype.itemsize] * (n + 1)
        for k in range(n - 1, -1, -1):
            stride[k] = stride[k + 1] * g[k]
        k = n - 1  # dimensions k.. of the box are one run: those after k are whole
        while k > 0 and count[k] == g[k]:
            k -= 1
        run = count[k] * stride[k + 1] if n else stride[0]
        first = self.offset + sum(a * b for a, b in zip(start, stride[1:], strict=False))
        if k <= 0:  # one run (the common case of a piece of a time series)
            one = np.array([first, run, 0], np.int64)
            return Runs(one[0:1], one[1:2], one[2:3])
        off = np.array([first], np.int64)
        for j in range(k):  # (a loop per dimension: the runs come out in file order)
            off = (off[:, None] + np.arange(count[j], dtype=np.int64) * stride[j + 1]).ravel()
        return Runs.sequential(off, np.full(len(off), run, np.int64))

    @property
    def slices(self) -> tuple[slice, ...]:
        """The box as slices of the global array: ``global[layout.slices]`` is the piece."""
        return tuple(slice(s, s + c) for s, c in zip(self.start, self.shape, strict=True))


def _cyclic_fault(
    shape: tuple[int, ...], block: tuple[int, ...], grid: tuple[int, ...], coords: tuple[int, ...]
) -> str | None:
    """Why a block-cyclic distribution of these integers is impossible (None: it is not)."""
    if not len(shape) == len(block) == len(grid) == len(coords):
        return (
            f"global shape {shape}, block {block}, grid {grid} and coords "
            f"{coords} must have the same length"
        )
    if any(b < 1 for b in block) or any(p < 1 for p in grid):
        return f"block {block} and grid {grid} must be positive"
    if any(not 0 <= c < p for c, p in zip(coords, grid, strict=True)):
        return f"coords {coords} outside grid {grid}"
    return None


class BlockCyclic(ArrayLayout):
    """A rank's blocks of a CYCLIC(block) distribution on a process grid (ScaLAPACK).

    Build it with :func:`collio.layouts.block_cyclic`.  ``indices`` gives the global
    indices per dimension: ``global[np.ix_(*layout.indices)]`` is the local array.
    """

    __slots__ = ("block", "grid", "coords")

    def __init__(
        self,
        global_shape: Sequence[int],
        dtype: Any,
        *,
        block: Sequence[int],
        grid: Sequence[int],
        coords: Sequence[int],
        order: str = "C",
        offset: int = 0,
        invalid: str | None = None,
    ) -> None:
        self.block, bad = integers(block, "block")
        self.grid, bad_grid = integers(grid, "grid")
        self.coords, bad_coords = integers(coords, "coords")
        shape, bad_shape = integers(global_shape, "global shape")
        self._invalid = invalid or bad or bad_grid or bad_coords or bad_shape
        if self._invalid is None:
            self._invalid = _cyclic_fault(shape, self.block, self.grid, self.coords)
        dims = []
        if self._invalid is None:
            dims = [
                DimSet(c * b, b, p * b, numroc(g, b, c, p))
                for g, b, p, c in zip(shape, self.block, self.grid, self.coords, strict=True)
            ]
        super().__init__(shape, dims, dtype, order, offset)

    def __repr__(self) -> str:
        return (
            f"BlockCyclic(global_shape={self.global_shape}, block={self.block}, "
            f"grid={self.grid}, coords={self.coords}, dtype={self.dtype.str!r}, "
            f"order={self.order!r})"
        )

    def _shape_fields(self) -> tuple[Any, ...]:
        return (self.global_shape, self.block, self.grid, self.coords, self._dtype,
                self._order, self._invalid)  # fmt: skip

    @property
    def indices(self) -> tuple[np.ndarray[Any, np.dtype[np.int64]], ...]:
        """Global indices held, per dimension, in local order."""
        return tuple(d.indices() for d in self.dims)


#: The shape keys made so far, each kept once (:func:`_shape_key`), forgotten all at once
#: past :data:`SHAPE_KEYS_MAX` of them.
_SHAPE_KEYS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
SHAPE_KEYS_MAX = 4096
_KEY_OF = attrgetter("_key")
_OFFSET_OF = attrgetter("_offset")


def _shape_key(lay: ArrayLayout) -> tuple[Any, ...] | None:
    """``(type, fields)`` of a layout whose runs move with its offset, made once when it
    is made (a layout is immutable): equal layouts but for their offsets get the same
    key object, so that a batch of them is grouped by identity, without comparing their
    fields item by item; None for a layout of another kind, or fields that do not hash."""
    fields = lay._shape_fields()
    if fields is None:
        return None
    key = (type(lay), fields)
    try:
        found = _SHAPE_KEYS.get(key)
        if found is None:
            if len(_SHAPE_KEYS) >= SHAPE_KEYS_MAX:
                _SHAPE_KEYS.clear()  # (a key made before is still right: equal, not the same)
            found = _SHAPE_KEYS.setdefault(key, key)
    except TypeError:  # (a dtype whose metadata does not hash: no key, no batch by shape)
        return None
    return found


def shape_keys(layouts: Sequence[ArrayLayout]) -> list[tuple[Any, ...] | None]:
    """Each layout's shape key: what its runs depend on besides its offset, as
    ``(type, fields)``, equal for layouts whose runs are the same runs moved by the
    difference of their offsets (and mostly the same object); None for a layout whose
    runs are not so.  A C-level pass over the layouts, for a batch of hundreds."""
    return list(map(_KEY_OF, layouts))


def offsets_of(layouts: Sequence[ArrayLayout]) -> npt.NDArray[np.int64]:
    """Each layout's byte offset, as int64 (OverflowError for one past int64), in a
    C-level pass over the layouts."""
    return np.fromiter(map(_OFFSET_OF, layouts), np.int64, len(layouts))


def array_layout(layout: Any, who: str) -> ArrayLayout:
    """``layout``, validated, when it is an array layout; else a LayoutError that names
    ``who`` (a .npy file, a checkpoint entry: targets that store a global shape, which
    byte segments do not have)."""
    if not isinstance(layout, ArrayLayout):
        raise LayoutError(
            f"{who} needs an array layout (Subarray, block, block_cyclic, a subarray or "
            f"darray datatype), not {type(layout).__name__}"
        )
    layout.checked()  # (once per layout: it is immutable, and a job passes the same ones)
    return layout
