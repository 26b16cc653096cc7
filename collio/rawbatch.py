"""A batch of raw byte pieces, checked and flattened in a few numpy passes over all of them.

A write of ``(uint8 buffer, Segments)`` pairs (a checkpoint's row shards, each at its
range of the file) needs no layout flattened: a piece's runs are its segments; so does
a read of ``Segments`` layouts into uint8 arrays (given, or made here).  The per-item
path still builds a layout's runs, checks and signs each item one by one, which for a
few hundred pieces costs more than moving small ones.  Here the items' offsets and
lengths are joined once and checked as one array; any batch that is not all such
items, or has an item that would fail its check, is None here, and the per-item path
checks it and names the item.  Pure: no MPI calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .boxes import plain_backend
from .itemsigs import ItemSigs, key_of
from .layouts.base import TOP, Segments
from .runs import Runs
from .spans import U8, addresses, sorted_union, span

__all__ = ["gather_raw"]

I64 = npt.NDArray[np.int64]
_U1 = np.dtype(np.uint8)


def gather_raw(backend: Any, items: Any, *, writing: bool, outs: Any = None) -> Any:
    """:func:`collio.batch.gather` of a write whose items are all ``(1-D contiguous
    uint8 array, Segments)`` pairs, or a read whose items are all ``Segments`` (into
    ``outs``, 1-D contiguous writeable uint8 arrays, or new ones), that pass their
    checks; else None."""
    if not len(items) or not plain_backend(backend):
        return None
    if not writing:
        return _gather_reads(items, outs)
    if not all(type(it) is tuple and len(it) == 2 and type(it[1]) is Segments for it in items):
        return None
    data = [it[0] for it in items]
    if not all(type(d) is np.ndarray and d.dtype == _U1 and d.ndim == 1 for d in data):
        return None
    if not all(d.flags.c_contiguous for d in data):
        return None
    found = _joined([it[1] for it in items])
    if found is None:
        return None
    file, length, mem, count, held = found
    if not np.array_equal(held, np.fromiter(map(len, data), np.int64, len(data))):
        return None
    return _union(data, file, length, mem, count, held, writing=True)


def _gather_reads(lays: Any, outs: Any) -> Any:
    """:func:`gather_raw` of a read: each item's array is ``outs[k]`` (checked as a
    layout checks it: every one a 1-D C-contiguous writeable uint8 array of the item's
    bytes, else None) or a new one, the result the caller gets back either way."""
    if not all(type(lay) is Segments for lay in lays):
        return None
    found = _joined(lays)
    if found is None:
        return None
    file, length, mem, count, held = found
    if outs is None:  # (the results: one array per item, as the per-item path makes)
        arrays = [np.empty(n, np.uint8) for n in held.tolist()]
    else:
        arrays = list(outs)
        if not all(type(o) is np.ndarray and o.dtype == _U1 and o.ndim == 1 for o in arrays):
            return None
        if not all(o.flags.c_contiguous and o.flags.writeable for o in arrays):
            return None
        if not np.array_equal(held, np.fromiter(map(len, arrays), np.int64, len(arrays))):
            return None
    return _union(arrays, file, length, mem, count, held, writing=False)


def _joined(lays: list[Segments]) -> tuple[I64, I64, I64, I64, I64] | None:
    """The segments of every layout joined: their file offsets, lengths and offsets in
    their item's bytes, each layout's count of segments and of bytes; None where a
    layout would fail its check (the per-item path names it)."""
    if any(lay._invalid for lay in lays):  # (values that were not integers: no runs)
        return None
    offs = [lay.offsets for lay in lays]
    lens = [lay.lengths for lay in lays]
    count = np.fromiter(map(len, offs), np.int64, len(offs))
    if not np.array_equal(count, np.fromiter(map(len, lens), np.int64, len(lens))):
        return None
    file, length = np.concatenate(offs), np.concatenate(lens)
    if len(file) and (int(file.min()) < 0 or int(length.min()) < 0):
        return None
    if bool((length > TOP - file).any()):  # (an end past the largest offset would wrap)
        return None
    csum = np.zeros(len(length) + 1, np.int64)
    np.cumsum(length, out=csum[1:])
    bound = np.zeros(len(lays) + 1, np.int64)
    np.cumsum(count, out=bound[1:])
    held = csum[bound[1:]] - csum[bound[:-1]]  # each item's bytes
    return file, length, csum[:-1] - np.repeat(csum[bound[:-1]], count), count, held


def _union(
    data: list[U8], file: I64, length: I64, mem: I64, count: I64, held: I64, *, writing: bool
) -> tuple[Any, U8, list[Any], tuple[Any, ...]]:
    """The items' runs as one set over the span of their buffers, as the per-item path
    makes it (sorted, checked for bytes written twice or arrays sharing memory, merged),
    and their signatures."""
    n = len(data)
    none = np.zeros(n, np.int64)  # (no signatures to compare: every item's is None)
    sigs = ItemSigs(key=key_of([repr(None)], none, none), make=lambda: [None] * n)
    used = held > 0
    if not used.any():
        return Runs.empty(), np.zeros(0, np.uint8), data, ("items", sigs)
    addr, ends = addresses(data, held)
    lo, hi = int(addr[used].min()), int(ends[used].max())
    item = np.repeat(np.arange(n, dtype=np.int64), count)
    keep = length > 0
    mem = mem + (addr - lo)[item]
    file, length, mem, item = file[keep], length[keep], mem[keep], item[keep]
    union = sorted_union(file, length, mem, lambda: item, addr, ends, used, writing=writing)
    return union, span(lo, hi - lo, writable=not writing, holds=data), data, ("items", sigs)
