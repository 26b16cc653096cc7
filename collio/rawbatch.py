"""A batch of raw byte pieces, checked and flattened in a few numpy passes over all of them.

A write of ``(uint8 buffer, Segments)`` pairs (a checkpoint's row shards, each at its
range of the file) needs no layout flattened: a piece's runs are its segments.  The
per-item path still builds a layout's runs, checks and signs each item one by one,
which for a few hundred pieces costs more than writing small ones.  Here the items'
offsets and lengths are joined once and checked as one array; any batch that is not
all such pairs, or has an item that would fail its check, is None here, and the
per-item path checks it and names the item.  Pure: no MPI calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .boxes import plain_backend
from .itemsigs import ItemSigs, key_of
from .layouts.base import Segments
from .runs import Runs
from .spans import U8, addresses, sorted_union, span

__all__ = ["gather_raw"]

I64 = npt.NDArray[np.int64]
_U1 = np.dtype(np.uint8)


def gather_raw(backend: Any, items: Any, *, writing: bool) -> Any:
    """:func:`collio.batch.gather` of a write whose items are all ``(1-D contiguous
    uint8 array, Segments)`` pairs that pass their checks, else None."""
    if not writing or not len(items) or not plain_backend(backend):
        return None
    if not all(type(it) is tuple and len(it) == 2 and type(it[1]) is Segments for it in items):
        return None
    data = [it[0] for it in items]
    if not all(type(d) is np.ndarray and d.dtype == _U1 and d.ndim == 1 for d in data):
        return None
    if not all(d.flags.c_contiguous for d in data):
        return None
    offs = [it[1].offsets for it in items]
    lens = [it[1].lengths for it in items]
    count = np.fromiter(map(len, offs), np.int64, len(offs))
    if not np.array_equal(count, np.fromiter(map(len, lens), np.int64, len(lens))):
        return None
    file, length = np.concatenate(offs), np.concatenate(lens)
    if len(file) and (int(file.min()) < 0 or int(length.min()) < 0):
        return None
    csum = np.zeros(len(length) + 1, np.int64)
    np.cumsum(length, out=csum[1:])
    bound = np.zeros(len(items) + 1, np.int64)
    np.cumsum(count, out=bound[1:])
    held = csum[bound[1:]] - csum[bound[:-1]]  # each item's bytes
    if not np.array_equal(held, np.fromiter(map(len, data), np.int64, len(data))):
        return None
    return _union(data, file, length, csum[:-1] - np.repeat(csum[bound[:-1]], count), count, held)


def _union(
    data: list[U8], file: I64, length: I64, mem: I64, count: I64, held: I64
) -> tuple[Any, U8, list[Any], tuple[Any, ...]]:
    """The items' runs as one set over the span of their buffers, as the per-item path
    makes it (sorted, checked for bytes written twice, merged), and their signatures."""
    n = len(data)
    sigs = ItemSigs([None] * n, key_of([repr(None)], np.zeros(n, np.int64), np.zeros(n, np.int64)))
    used = held > 0
    if not used.any():
        return Runs.empty(), np.zeros(0, np.uint8), data, ("items", sigs)
    addr, ends = addresses(data, held)
    lo, hi = int(addr[used].min()), int(ends[used].max())
    item = np.repeat(np.arange(n, dtype=np.int64), count)
    keep = length > 0
    mem = mem + (addr - lo)[item]
    file, length, mem, item = file[keep], length[keep], mem[keep], item[keep]
    union = sorted_union(file, length, mem, lambda: item, addr, ends, used, writing=True)
    return union, span(lo, hi - lo, writable=False, holds=data), data, ("items", sigs)
