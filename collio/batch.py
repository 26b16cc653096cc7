"""Many arrays in one collective call: the union of their runs over one span of memory.

``write_all_many(items)`` and ``read_all_many(layouts)`` are one two-phase call each:
every item's layout is checked as ``write_all`` checks it (an error names the item),
then the runs of all items become one set of runs, planned, exchanged and written as
one call's.  The items' data stay where they are: the call's buffer is a view of the
address range from the lowest item's first byte to the highest one's last
(:func:`~collio.spans.span`), which holds the items alive and is touched only at the
runs' bytes.  A batch of boxes and block-cyclic pieces over plain arrays (a
checkpoint's tensors, a time series' steps) is checked and flattened once per distinct
shape (:mod:`collio.boxes`); any other batch, or one with a bad item, item by item
here.  Pure: no MPI calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .boxes import forget, gather_boxes
from .errors import LayoutError, classify, make_error
from .itemsigs import ItemSigs, sig_key
from .layouts.base import Layout
from .rawbatch import gather_raw
from .runs import Runs
from .spans import U8, addresses, sorted_union, span

__all__ = ["Gathered", "ItemSigs", "forget", "gather", "items_count", "sig_key", "span"]

#: What a batch's check gives the engine: the union of the runs, the span buffer, the
#: items' arrays (kept alive for the call; a read's results), and ``("items", their
#: signatures)``.
Gathered = tuple[Runs, U8, list[Any], tuple[Any, ...]]


def items_count(items: Any) -> int:
    """How many items a rank passes (-1 when ``items`` is not a sequence: that rank's
    check raises, and its count is not compared)."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        return -1
    return len(items)


def at_item(exc: BaseException, k: int) -> BaseException:
    """``exc`` as the collio error it is agreed as, its message naming item ``k``."""
    name, text, errno = classify(exc)
    return make_error(name, f"item {k}: {text}", errno=errno)


def gather(backend: Any, items: Any, *, writing: bool, outs: Any = None) -> Gathered:
    """Local: check every item as a single call checks its layout; the union of their runs.

    ``items`` are ``(data, layout)`` pairs (writes) or layouts (reads, filling
    ``outs[k]`` when given).  Raises the first item's error, naming it.
    """
    if items_count(items) < 0:
        raise LayoutError(f"items must be a sequence, not {type(items).__name__}")
    if outs is not None and (items_count(outs) != len(items)):
        raise LayoutError(f"out must be a sequence of {len(items)} arrays (one per layout) or None")
    fast = gather_boxes(backend, items, writing=writing, outs=outs)
    if fast is None:
        fast = gather_raw(backend, items, writing=writing, outs=outs)
    if fast is not None:
        return fast
    runs: list[Runs] = []
    bufs: list[U8] = []
    arrays: list[Any] = []
    sigs: list[Any] = []
    lays: list[Layout] = []
    for k, item in enumerate(items):
        try:
            if writing:
                data, layout = _pair(item)
            else:
                data, layout = None, item
            _check_layout(backend, layout)
            lays.append(layout)
            if writing:
                buf = layout.as_bytes(data)
                arrays.append(buf)
            else:
                arr, buf = layout.allocate(None if outs is None else outs[k])
                arrays.append(arr)
            runs.append(backend.runs_for(layout))
            bufs.append(buf)
            sigs.append(layout.signature())
        except Exception as exc:  # noqa: BLE001 - re-raised naming the item
            raise at_item(exc, k) from exc
    backend.check_batch(lays)
    union, whole = _union(runs, bufs, arrays, writing=writing)
    return union, whole, arrays, ("items", ItemSigs(sigs))


def _pair(item: Any) -> tuple[Any, Layout]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise LayoutError(f"an item must be a (data, layout) pair, not {type(item).__name__}")
    return item[0], item[1]


def _check_layout(backend: Any, layout: Any) -> None:
    if not isinstance(layout, Layout):
        raise LayoutError(f"layout must be a collio layout, not {type(layout).__name__}")
    layout.checked()
    backend.check_layout(layout)


def _union(
    runs: list[Runs], bufs: list[U8], arrays: list[Any], *, writing: bool
) -> tuple[Runs, U8]:
    """The items' runs as one set over :func:`span` of their buffers (sorted, checked
    for overlaps between items, merged)."""
    counts = np.fromiter((len(r) for r in runs), np.int64, len(runs))
    if not int(counts.sum()):
        return Runs.empty(), np.zeros(0, np.uint8)
    addr, ends = addresses(bufs, np.fromiter((len(b) for b in bufs), np.int64, len(bufs)))
    used = counts > 0
    lo, hi = int(addr[used].min()), int(ends[used].max())
    file = np.concatenate([r.file for r in runs])
    length = np.concatenate([r.length for r in runs])
    mem = np.concatenate([r.mem for r in runs]) + np.repeat(addr - lo, counts)

    def item() -> Any:
        return np.repeat(np.arange(len(runs)), counts)

    union = sorted_union(file, length, mem, item, addr, ends, used, writing=writing)
    return union, span(lo, hi - lo, writable=not writing, holds=arrays)
