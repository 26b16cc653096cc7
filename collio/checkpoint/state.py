"""A job's state as the save sees it: named entries, sharded or replicated.  No MPI."""

from __future__ import annotations

import dataclasses
import functools
import heapq
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import LayoutError
from ..layouts.arrays import ArrayLayout, Subarray, array_layout
from ..layouts.base import Layout

__all__ = ["Entry", "as_array", "flatten_state", "whole"]


def as_array(obj: Any) -> np.ndarray[Any, Any]:
    """A numpy view of ``obj`` where it offers one (``__array_interface__``, the buffer
    protocol, ``__dlpack__``: a torch CPU tensor), else numpy's conversion of it."""
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__array_interface__") or isinstance(obj, (bytes, bytearray, memoryview)):
        return np.asarray(obj)
    if hasattr(obj, "__dlpack__"):
        try:
            return np.from_dlpack(obj)
        except (TypeError, RuntimeError, BufferError) as exc:
            raise LayoutError(f"cannot view {type(obj).__name__} through dlpack: {exc}") from None
    return np.asarray(obj)


# (kept: a layout is immutable, and a job saves and loads the same replicated entries
# step after step; one made anew costs more than the rest of the entry's checks)
@functools.lru_cache(maxsize=4096)
def whole(shape: tuple[int, ...], dtype: Any, order: str = "C") -> Subarray:
    """The whole array as one rank's piece."""
    return Subarray(shape, (0,) * len(shape), shape, dtype, order)


@functools.lru_cache(maxsize=4096)
def nothing(shape: tuple[int, ...], dtype: Any, order: str = "C") -> Subarray:
    """No element of the array (a rank that does not write a replicated entry)."""
    return Subarray(shape, (0,) * len(shape), (0,) * len(shape), dtype, order)


@dataclasses.dataclass(slots=True)
class Entry:
    """One named array: this rank's piece and its layout (offset 0), or a replicated value."""

    name: str
    data: np.ndarray[Any, Any]
    layout: ArrayLayout
    replicated: bool
    #: a 0-d value, written as one element of shape (1,) (a layout has no empty 0-d piece)
    scalar: bool = False
    #: the piece's bytes (:meth:`raw`), once worked out
    bytes_: np.ndarray[Any, Any] | None = dataclasses.field(default=None, repr=False)

    def raw(self) -> np.ndarray[Any, Any]:
        """The piece's bytes as its layout writes them (a uint8 view where it can be),
        worked out once: the save's check, its writes and its checksums all use them."""
        if self.bytes_ is None:
            self.bytes_ = self.layout.as_bytes(self.data)
        return self.bytes_

    @property
    def shape(self) -> tuple[int, ...]:
        return () if self.scalar else self.layout.global_shape

    def signature(self) -> tuple[Any, ...]:
        lay = self.layout
        return (self.name, self.replicated, self.shape, lay.dtype.str, lay.order)

    def skipped(self) -> Entry:
        """This entry on a rank that does not write it: an empty piece."""
        lay = nothing(self.layout.global_shape, self.layout.dtype, self.layout.order)
        empty = np.empty(lay.local_shape, lay.dtype)
        return Entry(self.name, empty, lay, self.replicated, self.scalar)


def _entry(name: str, value: Any) -> Entry:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Layout):
        data, lay = value
        try:  # (the layout's checks and a write's of shape and dtype, naming the entry)
            lay = array_layout(lay, "a checkpoint")
            if lay.offset:
                raise LayoutError(f"layout offset {lay.offset}; the save places it")
            arr = as_array(data)
            return Entry(name, arr, lay, False, bytes_=lay.as_bytes(arr))
        except LayoutError as exc:
            raise LayoutError(f"entry {name!r}: {exc}") from None
    if isinstance(value, tuple) and len(value) == 2 and _array_like(value[0]):
        raise LayoutError(
            f"entry {name!r}: a tuple entry is (array, layout), and its second item is a "
            f"{type(value[1]).__name__}, not a collio layout (a replicated value is the "
            "array alone)"
        )
    try:
        arr = as_array(value)
    except (ValueError, TypeError) as exc:
        raise LayoutError(f"entry {name!r}: {type(exc).__name__}: {exc}") from None
    if arr.dtype.hasobject:
        raise LayoutError(f"entry {name!r}: dtype {arr.dtype} holds Python objects")
    if arr.ndim == 0:
        arr = arr.reshape(1)
        return Entry(name, arr, whole(arr.shape, arr.dtype), True, scalar=True)
    order = "F" if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    return Entry(name, arr, whole(arr.shape, arr.dtype, order), True)


def _array_like(x: Any) -> bool:
    """An array of some library with one dimension or more: not a number (a numpy scalar
    or 0-d array among them: a tuple of those is a replicated value), nor a sequence."""
    if isinstance(x, np.generic):
        return False
    arrayish = hasattr(x, "__array_interface__") or hasattr(x, "__dlpack__")
    return arrayish and getattr(x, "ndim", 1) >= 1


def leaves(
    mapping: Mapping[Any, Any], bad_key: Callable[[Any], str | None], prefix: str = ""
) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of each value of ``mapping`` that is no mapping, a nested
    mapping's names joined to its key with ``/`` (a save's state, a load's spec), in
    the mapping's order; ``bad_key(key)`` says why a key is no name (None: it is one),
    raised as a :class:`~collio.LayoutError`."""
    for key, value in mapping.items():
        why = bad_key(key)
        if why is not None:
            raise LayoutError(why)
        if isinstance(value, Mapping):
            yield from leaves(value, bad_key, f"{prefix}{key}/")
        else:
            yield prefix + key, value


def _state_key(key: Any) -> str | None:
    if not isinstance(key, str) or "" in key.split("/"):
        return f"state key {key!r}: names are strings of non-empty '/' parts"
    return None


def flatten_state(state: Mapping[str, Any]) -> list[Entry]:
    """Entries sorted by name, nested mappings joined with ``/``."""
    if not isinstance(state, Mapping):
        raise LayoutError(
            f"state must be a mapping of names to entries, not {type(state).__name__}"
        )
    out = [_entry(name, value) for name, value in leaves(state, _state_key)]
    out.sort(key=lambda e: e.name)
    twice = [a.name for a, b in zip(out, out[1:], strict=False) if a.name == b.name]
    if twice:
        raise LayoutError(f"state names {twice[0]!r} twice (a nested and a flat key)")
    return out


def writers(sizes: list[int], size: int) -> list[int]:
    """The rank that writes each replicated entry: the largest first, each to the rank
    with the fewest such bytes so far, so that no rank writes them all."""
    heap = [(0, r) for r in range(min(max(size, 1), max(len(sizes), 1)))]  # the idle ranks tie
    out = [0] * len(sizes)
    for k in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        load, r = heapq.heappop(heap)
        out[k] = r
        heapq.heappush(heap, (load + sizes[k], r))
    return out
