"""What one rank holds: the abstract layout and raw byte segments.  No MPI here."""

from __future__ import annotations

import abc
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import LayoutError
from ..runs import Runs, as_i64, merge, read_only, sort
from .strided import Blocks

__all__ = ["TOP", "Layout", "Segments"]

#: The largest byte offset: a file offset is a signed 64-bit number (``off_t``, and the
#: int64 of every run), so no piece may end past it
TOP = 2**63 - 1


class Layout(abc.ABC):
    """One rank's piece of the target: which bytes, and how they sit in its buffer.

    Subclasses describe the piece; this base class caches the flattened runs.
    Layouts are immutable value objects and know nothing of MPI.
    """

    __slots__ = ("_runs", "_overlap", "_valid")

    def __init__(self) -> None:
        self._runs: Runs | None = None
        # (runs, index of a run overlapping an earlier one or -1): see engine._check
        self._overlap: tuple[Runs, int] | None = None
        self._valid = False  # validate() passed (see checked)

    # -- description -----------------------------------------------------
    @property
    @abc.abstractmethod
    def dtype(self) -> np.dtype[Any]:
        """Element type of the rank's buffer."""

    @property
    @abc.abstractmethod
    def local_shape(self) -> tuple[int, ...]:
        """Shape of the ndarray that holds this rank's piece."""

    @property
    def order(self) -> str:
        """Memory order of the rank's buffer ('C' or 'F')."""
        return "C"

    @property
    def nbytes(self) -> int:
        # (math.prod: np.prod of a few ints costs more than the rest of a small call's checks)
        return int(math.prod(self.local_shape)) * self.dtype.itemsize

    def signature(self) -> tuple[Any, ...] | None:
        """What every rank using this kind of layout must agree on, or None."""
        return None

    @abc.abstractmethod
    def validate(self) -> None:
        """Raise :class:`LayoutError` if the layout itself is impossible."""

    def checked(self) -> None:
        """:meth:`validate`, once: the layout is immutable, so once valid it stays valid
        (a checkpoint or a time series passes the same layouts call after call)."""
        if getattr(self, "_valid", False):
            return
        self.validate()
        try:
            self._valid = True
        except AttributeError:  # (a subclass that did not call Layout.__init__)
            pass

    @abc.abstractmethod
    def blocks(self) -> Blocks:
        """The piece as nested strided boxes (the planner's arithmetic form)."""

    # -- derived ---------------------------------------------------------
    def runs(self) -> Runs:
        """Byte runs sorted by file offset, neighbours merged (cached)."""
        if self._runs is None:
            from .strided import flatten

            self._runs = read_only(flatten(self.blocks()))
        return self._runs

    def as_bytes(self, data: Any) -> npt.NDArray[np.uint8]:
        """Check ``data`` against the layout; return its bytes in memory order."""
        arr = np.asarray(data)
        if arr.dtype != self.dtype:
            raise LayoutError(f"data dtype {arr.dtype} does not match layout dtype {self.dtype}")
        if arr.shape != self.local_shape:
            raise LayoutError(
                f"data shape {arr.shape} does not match layout shape {self.local_shape}"
            )
        return _memory_bytes(arr, self.order)

    def allocate(self, out: Any = None) -> tuple[np.ndarray[Any, Any], npt.NDArray[np.uint8]]:
        """An output array for a read (or check the user's), and its byte view."""
        if out is None:
            arr: np.ndarray[Any, Any] = np.empty(self.local_shape, self.dtype, order=self.order)  # type: ignore[call-overload]
        else:
            arr = self.check_out(out)
        return arr, _memory_bytes(arr, self.order)

    def check_out(self, out: Any) -> np.ndarray[Any, Any]:
        """The user's output array ``out``, checked to fit this layout (else LayoutError)."""
        if not isinstance(out, np.ndarray):
            raise LayoutError(f"out must be a numpy array, not {type(out).__name__}")
        if out.dtype != self.dtype or out.shape != self.local_shape:
            raise LayoutError(
                f"out has shape {out.shape} and dtype {out.dtype}, layout needs "
                f"{self.local_shape} and {self.dtype}"
            )
        contiguous = out.flags.f_contiguous if self.order == "F" else out.flags.c_contiguous
        if not contiguous or not out.flags.writeable:
            raise LayoutError(f"out must be writeable and {self.order}-contiguous")
        return out


def refuse_objects(dtype: np.dtype[Any]) -> None:
    """Raise :class:`LayoutError` for a dtype holding Python objects: its bytes are
    pointers, meaningless in a file, and bytes read into one would be taken for objects
    (numpy's own message, "Cannot change data-type for array of references", said
    neither what nor why)."""
    if dtype.hasobject:
        raise LayoutError(f"dtype {dtype} holds Python objects, whose bytes are pointers")


def _memory_bytes(arr: np.ndarray[Any, Any], order: str) -> npt.NDArray[np.uint8]:
    """The bytes of ``arr`` laid out in ``order`` (a view when already so, else a copy)."""
    refuse_objects(arr.dtype)
    if order == "F":
        arr = np.asfortranarray(arr).T
    else:
        arr = np.ascontiguousarray(arr)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return arr.reshape(-1).view(np.uint8)


def _int64s(values: Any, what: str) -> tuple[npt.NDArray[np.int64], str | None]:
    """A copy of ``values`` as a flat int64 array, and why they are not integers that fit
    (None: they are).  Never raises: a float offset would be cut (8.5 to 8) and one past
    2**63 wrap, on the rank that gave it alone; an empty list is integers."""
    try:
        arr = np.asarray(values)
        if arr.size and arr.dtype.kind not in "iu" and arr.dtype != object:
            return np.zeros(0, np.int64), f"segment {what} must be integers, not {arr.dtype}"
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) > TOP:
            raise OverflowError(f"{int(arr.max())} is past the largest offset {TOP}")
        out = np.array(as_i64(arr), np.int64)
    except (TypeError, ValueError, OverflowError) as exc:
        return np.zeros(0, np.int64), f"segment {what} must be integers that fit int64: {exc}"
    out.flags.writeable = False  # (so the layout's arrays cannot change under its runs)
    return out, None


class Segments(Layout):
    """Raw byte runs: ``data`` is a 1-D uint8 buffer of ``sum(lengths)`` bytes.

    Segment ``i`` takes the next ``lengths[i]`` bytes of the buffer, in the order
    given (offsets need not be sorted).  Empty segments are allowed.
    """

    __slots__ = ("offsets", "lengths", "_invalid")

    def __init__(self, offsets: Any, lengths: Any) -> None:
        super().__init__()
        # copies: a layout is a snapshot, so changing the caller's arrays later cannot
        # make its cached runs (or a plan kept for them) stale; values that are not
        # integers are refused in validate, inside the call, where every rank raises
        self.offsets, bad = _int64s(offsets, "offsets")
        self.lengths, bad_lengths = _int64s(lengths, "lengths")
        self._invalid = bad or bad_lengths

    @classmethod
    def trusted(cls, offsets: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]) -> Segments:
        """Segments over int64 arrays that nothing will change (read-only views made
        by collio for its own calls), kept as they are: no copies."""
        seg = cls.__new__(cls)
        Layout.__init__(seg)
        seg.offsets, seg.lengths, seg._invalid = offsets, lengths, None
        return seg

    def __repr__(self) -> str:
        return f"Segments(<{len(self.offsets)} runs, {int(self.lengths.sum())} bytes>)"

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(np.uint8)

    @property
    def local_shape(self) -> tuple[int, ...]:
        return (int(self.lengths.sum()),)

    def validate(self) -> None:
        if self._invalid:
            raise LayoutError(self._invalid)
        if self.offsets.shape != self.lengths.shape:
            raise LayoutError(
                f"segments have {len(self.offsets)} offsets but {len(self.lengths)} lengths"
            )
        if len(self.offsets) and int(self.offsets.min()) < 0:
            i = int(np.argmin(self.offsets))
            raise LayoutError(f"segment {i} has negative offset {int(self.offsets[i])}")
        if len(self.lengths) and int(self.lengths.min()) < 0:
            i = int(np.argmin(self.lengths))
            raise LayoutError(f"segment {i} has negative length {int(self.lengths[i])}")
        # (offsets and lengths are int64, their ends too: one past the top would wrap;
        # a small call's one segment asked in Python ints, no numpy pass)
        n = len(self.offsets)
        if n == 1 and int(self.offsets[0]) + int(self.lengths[0]) <= TOP:
            return
        if n and int(self.offsets.max()) + int(self.lengths.max()) > TOP:
            past = np.flatnonzero(self.lengths > TOP - self.offsets)
            if len(past):
                i = int(past[0])
                end = int(self.offsets[i]) + int(self.lengths[i])
                raise LayoutError(f"segment {i} ends at byte {end}, past the largest offset {TOP}")

    def blocks(self) -> Blocks:
        mem = np.zeros(len(self.lengths), np.int64)
        if len(mem) > 1:
            np.cumsum(self.lengths[:-1], out=mem[1:])
        n = len(self.offsets)
        return Blocks.build(
            self.offsets, mem, np.ones((n, 1)), np.ones((n, 1)), np.ones((n, 1)), self.lengths
        )

    def runs(self) -> Runs:
        if self._runs is None:
            mem = np.zeros(len(self.lengths), np.int64)
            if len(mem) > 1:
                np.cumsum(self.lengths[:-1], out=mem[1:])
            self._runs = read_only(merge(sort(Runs(self.offsets, self.lengths, mem))))
        return self._runs

    def as_bytes(self, data: Any) -> npt.NDArray[np.uint8]:
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = np.frombuffer(data, np.uint8)
        arr = np.asarray(data)
        if arr.dtype != np.uint8:
            refuse_objects(arr.dtype)
            try:
                arr = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            except ValueError as exc:
                raise LayoutError(f"segments data must be a uint8 buffer: {exc}") from None
        arr = np.ascontiguousarray(arr).reshape(-1)
        if arr.size != self.local_shape[0]:
            raise LayoutError(
                f"data has {arr.size} bytes but the segments hold {self.local_shape[0]}"
            )
        return arr
