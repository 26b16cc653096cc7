"""A batch's buffer: one view over the memory of all its items, and the union of their runs.

The items' data stay where they are: a run's memory offset is counted from the lowest
address of any item's bytes, and the buffer the call moves bytes from (or into) is a
view of the address range from there to the end of the highest item (:func:`span`), as
MPI programs send from ``MPI.BOTTOM`` with absolute displacements.  Nothing is copied
into a staging buffer.

The range may hold memory no item owns (other objects, unmapped pages between two
mappings), so it is safe only because every consumer of a call's buffer touches the
bytes of its runs and nothing else: slices ``buf[m:m+n]`` (backends' own runs,
``pwritev``/``preadv``, the mapped-read copy), MPI datatypes built over the runs'
offsets (the exchange), numpy gathers and scatters at the runs' offsets; no copy,
checksum or message of the whole buffer.  The span also holds the items' arrays, so
they live as long as any view of it (an MPI request keeps its buffer), whatever the
caller drops.  Pure: no MPI calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .errors import LayoutError, OverlapError
from .runs import Runs, first_overlap, merge

__all__ = ["U8", "addresses", "shared_pair", "sorted_union", "span"]

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]


def addresses(bufs: list[U8], nbytes: I64) -> tuple[I64, I64]:
    """Each buffer's first address (0 for an empty one) and its end, ``nbytes`` long.

    mpi4py's buffer address costs a tenth of numpy's ctypes attribute per item; read-only,
    as a write's data may be a read-only buffer (nothing writes through it)."""
    address = MPI.memory.frombuffer
    addr = np.fromiter(
        (address(b, readonly=True).address if len(b) else 0 for b in bufs), np.int64, len(bufs)
    )
    return addr, addr + nbytes


def sorted_union(
    file: I64,
    length: I64,
    mem: I64,
    item: Callable[[], I64],
    addr: I64,
    ends: I64,
    used: Any,
    *,
    writing: bool,
) -> Runs:
    """The runs sorted by file offset, then item, checked for bytes written twice
    (writes) or arrays sharing memory (reads), merged.  (The item breaks ties: an error
    names the same items whatever order they came in.)  ``item()`` gives the item of
    each run; it is asked for only when the runs are not already in file order, each
    ending before the next starts (a time series' steps, a checkpoint's tensors are:
    then one pass over the runs is all the sort and the overlap check cost)."""
    if len(file) > 1 and not bool((file[1:] >= (file + length)[:-1]).all()):
        it = item()
        step = np.diff(file)
        if not bool(((step > 0) | ((step == 0) & (np.diff(it) >= 0))).all()):
            order = np.lexsort((it, file))
            file, length, mem, it = file[order], length[order], mem[order], it[order]
        if writing:
            _refuse_overlap(file, length, it)
    if not writing:
        _refuse_shared_memory(addr, ends, used)
    return merge(Runs(file, length, mem))


def _refuse_shared_memory(addr: I64, ends: I64, used: Any) -> None:
    """Raise :class:`LayoutError` naming two items of a read whose arrays share memory
    (MPI fills no byte twice in one call, and one of the two would lose); of the items
    ``used`` (those that read a byte)."""
    if not bool(used.all()):
        addr, ends = addr[used], ends[used]
    pair = shared_pair(addr, ends)
    if pair is not None:
        item = np.flatnonzero(used)
        x, y = int(item[pair[0]]), int(item[pair[1]])
        raise LayoutError(f"items {x} and {y} read into arrays that share memory")


def shared_pair(addr: I64, ends: I64) -> tuple[int, int] | None:
    """Two arrays, by index (the lower first), whose memory ``[addr, ends)`` overlaps:
    the first array in address order that starts before an earlier one ends, and that
    earlier one; None when no two overlap."""
    if len(addr) < 2 or bool((addr[1:] >= ends[:-1]).all()):
        return None  # (arrays made one after the other: in address order, each after the last)
    order = np.argsort(addr, kind="stable")
    a, e = addr[order], ends[order]
    bad = np.flatnonzero(a[1:] < np.maximum.accumulate(e)[:-1])
    if not len(bad):
        return None
    i = int(bad[0]) + 1
    j = int(np.argmax(e[:i] > a[i]))  # an earlier array reaching past its start
    x, y = sorted((int(order[j]), int(order[i])))
    return x, y


def _refuse_overlap(file: I64, length: I64, item: I64) -> None:
    """Raise :class:`OverlapError` naming the items when two runs share a byte."""
    i = first_overlap(file, length)
    if i < 0:
        return
    j = int(np.argmax((file[:i] + length[:i]) > file[i]))  # an earlier run reaching past it
    lo, hi = int(file[i]), int(min(file[i] + length[i], file[j] + length[j]))
    a, b = sorted((int(item[j]), int(item[i])))
    who = f"item {a} writes them twice" if a == b else f"items {a} and {b} both write them"
    raise OverlapError(f"bytes [{lo}, {hi}) are written twice by this rank: {who}")


class _Range:
    """An address range as numpy sees a buffer (``__array_interface__``), and what must
    stay alive while it is used: a view of it has this object as its base."""

    __slots__ = ("__array_interface__", "holds")

    def __init__(self, address: int, nbytes: int, writable: bool, holds: Any) -> None:
        self.__array_interface__ = {
            "version": 3,
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, not writable),
        }
        self.holds = holds


def span(address: int, nbytes: int, *, writable: bool, holds: Any) -> U8:
    """A uint8 view of ``nbytes`` of memory from ``address`` that keeps ``holds`` (the
    items' arrays) alive.  See the module docstring: only the runs' bytes, each inside
    one of those arrays, may ever be touched through it."""
    view: U8 = np.asarray(_Range(address, nbytes, writable, holds))
    return view
