"""A layout made of a flattened MPI typemap: ``count`` copies placed from byte ``disp``.  No MPI.

Built by :func:`collio.layouts.from_datatype` for types that are not a plain
subarray or darray.  The rank's buffer holds the typemap's data bytes in
typemap order, as MPI consumes a contiguous buffer through a file view.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..errors import LayoutError
from ..runs import Runs, merge, read_only, sort
from .base import TOP, Layout, refuse_objects
from .strided import Blocks
from .typemap import Flat, regular, stream_runs

__all__ = ["TypedLayout"]


class TypedLayout(Layout):
    """``count`` tiles of a typemap (``flat``) from byte ``disp``; a 1-D buffer of ``dtype``.

    Tile ``k`` lies at ``disp + k*extent`` (MPI's tiling).  Regular typemaps
    (equal runs at equal spacing, e.g. a vector) keep their structure as
    strided boxes; the others list their runs.  ``invalid`` carries an error
    found while building, raised by :meth:`validate` inside the collective call.
    """

    __slots__ = ("flat", "count", "disp", "_dtype", "_invalid")

    def __init__(
        self, flat: Flat | None, count: int, disp: int, dtype: Any, *, invalid: str | None = None
    ) -> None:
        super().__init__()
        self.flat = flat
        try:  # (integers: int() would cut a disp of 8.5 to 8, placing the data elsewhere)
            self.count, self.disp = operator.index(count), operator.index(disp)
        except TypeError:
            self.count, self.disp = 0, 0
            invalid = invalid or f"count {count!r} and disp {disp!r} must be integers"
        self._dtype: np.dtype[Any] = np.dtype(dtype)
        self._invalid = invalid

    def __repr__(self) -> str:
        if self.flat is None:
            return f"TypedLayout(<invalid: {self._invalid}>)"
        return (
            f"TypedLayout(<{self.flat.nruns} runs, {self.flat.size} bytes, extent "
            f"{self.flat.extent}> x {self.count}, disp={self.disp}, dtype={self.dtype.str!r})"
        )

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    @property
    def nbytes(self) -> int:
        return 0 if self.flat is None else self.count * self.flat.size

    @property
    def local_shape(self) -> tuple[int, ...]:
        return (self.nbytes // max(self.dtype.itemsize, 1),)

    def validate(self) -> None:
        if self._invalid or self.flat is None:
            raise LayoutError(self._invalid or "no datatype")
        flat = self.flat
        if self.count < 0:
            raise LayoutError(f"count {self.count} is negative")
        refuse_objects(self.dtype)
        if self.dtype.itemsize == 0 or self.nbytes % self.dtype.itemsize:
            raise LayoutError(
                f"{self.nbytes} bytes of data are not a whole number of {self.dtype} items"
            )
        if self.count and flat.nruns:
            low = self.disp + int(flat.off.min()) + min(0, (self.count - 1) * flat.extent)
            if low < 0:
                raise LayoutError(f"datatype reaches byte {low}, before the start of the file")
            # (its runs are int64: one ending past the top would wrap, and be refused as
            # bytes written twice at negative offsets)
            high = self.disp + int((flat.off + flat.length).max())
            high += max(0, (self.count - 1) * flat.extent)
            if high > TOP:
                raise LayoutError(f"datatype reaches byte {high}, past the largest offset {TOP}")

    def _file_runs(self) -> tuple[Any, Any]:
        assert self.flat is not None
        return stream_runs(self.flat, self.disp, 0, self.nbytes)

    def runs(self) -> Runs:
        if self._runs is None:
            off, length = self._file_runs()
            self._runs = read_only(merge(sort(Runs.sequential(off, length))))
        return self._runs

    def blocks(self) -> Blocks:
        flat = self.flat
        if flat is None or not self.nbytes:
            z = np.zeros((0, 1), np.int64)
            return Blocks.build(z[:, 0], z[:, 0], z, z, z, z[:, 0])
        reg = regular(flat.off, flat.length)
        if reg is not None and (reg[0] - 1) * reg[1] + reg[2] <= flat.extent:
            n, stride, runlen = reg  # nested: a tile's runs lie within its extent
            return Blocks.build(
                [self.disp + int(flat.off[0])],
                [0],
                [[self.count, n]],
                [[flat.extent, stride]],
                [[flat.size, runlen]],
                [runlen],
            )
        off, length = self._file_runs()
        mem = np.cumsum(length) - length
        ones = np.ones((len(off), 1), np.int64)
        return Blocks.build(off, mem, ones, ones, ones, length)
