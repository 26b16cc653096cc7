"""A batch of box and block-cyclic pieces: one template per distinct shape, no Python per run.

A checkpoint's tensors and a time series' steps are boxes (or block-cyclic pieces) of
global arrays, each over a contiguous array of its dtype and shape.  The runs of such a
layout at byte ``offset`` are its runs at offset 0 moved by ``offset``, so items of the
same shape share the runs and checks of the first of them (its *template*): one layout
per distinct shape is checked and flattened, and every item's runs are that template's
moved by the item's offset in the file and by its array's address in memory, all in a
few numpy passes over the whole batch.

What is read of each item is read in C-level passes (``map`` of attribute getters over
the items), not in a Python loop: its layout's type, shape fields and offset, its
array's type, dtype, shape, contiguity and address.  Any item that would fail, or any
other kind of item, sends the whole batch to the per-item path
(:func:`collio.batch.gather`), which checks each item alone and names the first bad one.
Pure: no MPI calls (mpi4py's buffer object only reads an array's address).
"""

from __future__ import annotations

from functools import partial
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .backends.base import Backend
from .errors import LayoutError
from .itemsigs import ItemSigs, array_sigs
from .layouts.arrays import ArrayLayout, BlockCyclic, Subarray
from .runs import Runs
from .spans import U8, sorted_union, span

__all__ = ["SHIFTABLE", "gather_boxes", "shape_key"]

I64 = npt.NDArray[np.int64]
#: What a batch's check gives the engine (as :data:`collio.batch.Gathered`).
Gathered = tuple[Runs, U8, list[Any], tuple[Any, ...]]

#: Layouts whose runs at byte ``offset`` are their runs at offset 0 moved by ``offset``
#: (each a box or block-cyclic piece of a global array: its runs depend on nothing else
#: than the fields of :func:`shape_key`), checked the same way at every offset.
SHIFTABLE = (Subarray, BlockCyclic)

#: What a layout's runs depend on besides its offset, per exact type (a tuple of plain
#: values, made and compared in C: a box's dims are made from its start and shape, a
#: block-cyclic piece's from its block, grid and coords).
_KEYS: dict[type, attrgetter[tuple[Any, ...]]] = {
    Subarray: attrgetter("global_shape", "start", "shape", "_dtype", "_order", "_invalid"),
    BlockCyclic: attrgetter(
        "global_shape", "block", "grid", "coords", "_dtype", "_order", "_invalid"
    ),
}
_OFFSET = attrgetter("offset")
_DTYPE_SHAPE = attrgetter("dtype", "shape")
_C_CONTIGUOUS = attrgetter("flags.c_contiguous")
_F_CONTIGUOUS = attrgetter("flags.f_contiguous")
_WRITEABLE = attrgetter("flags.writeable")
_NBYTES = attrgetter("nbytes")
_ADDRESS = attrgetter("address")
# (mpi4py's buffer object: a tenth of what numpy's ctypes attribute costs per array;
# read-only, since a write's data may be a read-only array and nothing writes through it)
_BUFFER = partial(MPI.memory.frombuffer, readonly=True)


def shape_key(lay: ArrayLayout) -> tuple[Any, ...]:
    """What an array layout's runs depend on besides its offset, its type included."""
    return (type(lay), *_KEYS[type(lay)](lay))


def _plain(backend: Any) -> bool:
    """Whether ``backend`` checks and maps layouts as the base class does (no hook of its
    own: the runs in its byte space are the layout's, and no layout is refused)."""
    cls = type(backend)
    return (
        cls.runs_for is Backend.runs_for
        and cls.check_layout is Backend.check_layout
        and cls.check_batch is Backend.check_batch
    )


def gather_boxes(backend: Any, items: Any, *, writing: bool, outs: Any) -> Gathered | None:
    """:func:`collio.batch.gather` of a batch of :data:`SHIFTABLE` layouts over C- or
    F-contiguous arrays of their dtype and shape, or None for any other batch, or any
    item that would fail (see the module doc)."""
    n = len(items)
    if not n or not _plain(backend):
        return None
    split = _split(items, writing=writing)
    if split is None:
        return None
    lays, data = split
    grouped = _group(lays)
    if grouped is None:
        return None
    group, firsts = grouped
    templates = _templates(lays, firsts)
    if templates is None:
        return None
    try:
        offsets = np.fromiter(map(_OFFSET, lays), np.int64, n)
    except (OverflowError, TypeError):  # (an offset past int64: the item's own check says so)
        return None
    if bool((offsets < 0).any()):
        return None
    arrays = _arrays(lays, data, firsts, group, outs, writing=writing)
    if arrays is None:
        return None
    heads = [lays[k].signature()[:4] for k in firsts.tolist()]  # (one per distinct shape)
    sigs: ItemSigs = array_sigs(heads, group, offsets)
    base = offsets[firsts]
    union, whole = _union_shifted(templates, group, offsets - base[group], arrays, writing=writing)
    return union, whole, arrays, ("items", sigs)


def _split(items: Any, *, writing: bool) -> tuple[list[Any], list[Any] | None] | None:
    """The items' layouts and (writes) data, or None unless every item is what this path
    takes: a (data, layout) pair for writes, and a layout of a :data:`SHIFTABLE` type."""
    if writing:
        if not set(map(type, items)) <= {tuple, list} or set(map(len, items)) != {2}:
            return None
        lays, data = list(map(itemgetter(1), items)), list(map(itemgetter(0), items))
    else:
        lays, data = list(items), None
    if not set(map(type, lays)) <= set(SHIFTABLE):
        return None
    return lays, data


def _group(lays: list[Any]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]] | None:
    """Which template each item has (numbered in order of their first items) and the
    first item of each; None for a key that does not hash (an invalid layout's)."""
    n = len(lays)
    kinds = set(map(type, lays))
    keys = list(map(_KEYS[kinds.pop()], lays)) if len(kinds) == 1 else list(map(shape_key, lays))
    try:
        if keys.count(keys[0]) == n:  # (one shape: a time series' steps)
            return np.zeros(n, np.intp), np.zeros(1, np.intp)
        index = {k: i for i, k in enumerate(dict.fromkeys(keys))}  # (a step per distinct)
    except TypeError:
        return None
    group = np.fromiter(map(index.__getitem__, keys), np.intp, n)
    firsts = np.zeros(len(index), np.intp)
    firsts[group[::-1]] = np.arange(n - 1, -1, -1)  # (each key's first item)
    return group, firsts


def _templates(lays: list[Any], firsts: npt.NDArray[np.intp]) -> list[Runs] | None:
    """The runs of each template, checked (a loop per distinct shape, not per item); None
    when one is invalid (the per-item path raises its error)."""
    templates: list[Runs] = []
    for k in firsts.tolist():
        lay = lays[k]
        try:
            lay.checked()
        except LayoutError:
            return None
        templates.append(lay.runs())
    return templates


def _arrays(
    lays: list[Any], data: list[Any] | None, firsts: Any, group: Any, outs: Any, *, writing: bool
) -> list[Any] | None:
    """The items' arrays as the batch moves them (a write's data, a read's outputs), or
    None when one is not already an array of its layout's dtype, shape and memory order
    (the per-item checks of :meth:`Layout.as_bytes` / :meth:`Layout.allocate`)."""
    specs = [(lays[k].dtype, lays[k].local_shape) for k in firsts.tolist()]
    orders = [lays[k].order for k in firsts.tolist()]
    n = len(lays)
    if not writing and outs is None:
        per = group.tolist()
        return [np.empty(specs[g][1], specs[g][0], order=orders[g]) for g in per]  # type: ignore[call-overload]
    got = list(data if writing else outs)  # type: ignore[arg-type]
    if set(map(type, got)) != {np.ndarray}:
        return None
    want = specs * n if len(specs) == 1 else list(map(specs.__getitem__, group.tolist()))
    if list(map(_DTYPE_SHAPE, got)) != want:
        return None
    if "F" not in orders:
        contiguous = all(map(_C_CONTIGUOUS, got))
    else:
        f_order = np.array([o == "F" for o in orders])[group]
        c = np.fromiter(map(_C_CONTIGUOUS, got), bool, n)
        f = np.fromiter(map(_F_CONTIGUOUS, got), bool, n)
        contiguous = bool(np.where(f_order, f, c).all())
    if not contiguous or (not writing and not all(map(_WRITEABLE, got))):
        return None
    return got


def _union_shifted(
    templates: list[Runs], group: Any, shift: I64, arrays: list[Any], *, writing: bool
) -> tuple[Runs, U8]:
    """The union of items whose runs are ``templates[group[k]]`` moved by ``shift[k]``
    in the file, over the arrays ``arrays`` (contiguous in their layout's order)."""
    n = len(group)
    counts = np.array([len(t) for t in templates], np.int64)[group]
    if not int(counts.sum()):
        return Runs.empty(), np.zeros(0, np.uint8)
    addr = np.fromiter(map(_ADDRESS, map(_BUFFER, arrays)), np.int64, n)
    sizes = np.fromiter(map(_NBYTES, arrays), np.int64, n)
    used = counts > 0
    ends = addr + sizes
    lo, hi = int(addr[used].min()), int(ends[used].max())
    if len(templates) == 1:  # (one shape: a 2-D broadcast, no concatenation)
        t = templates[0]
        file = (t.file[None, :] + shift[:, None]).reshape(-1)
        length = np.tile(t.length, n)
        mem = (t.mem[None, :] + (addr - lo)[:, None]).reshape(-1)
        item = np.repeat(np.arange(n), len(t))
    else:
        by = np.argsort(group, kind="stable")  # the items of each shape in turn
        first = np.searchsorted(group[by], np.arange(len(templates) + 1))
        parts: list[tuple[I64, I64, I64]] = []
        for g, t in enumerate(templates):  # (a loop per distinct shape, not per item)
            sel = by[first[g] : first[g + 1]]
            parts.append(
                (
                    (t.file[None, :] + shift[sel][:, None]).reshape(-1),
                    np.tile(t.length, len(sel)),
                    (t.mem[None, :] + (addr[sel] - lo)[:, None]).reshape(-1),
                )
            )
        file, length, mem = (np.concatenate([p[i] for p in parts]) for i in range(3))
        item = np.repeat(by, counts[by])
    whole = span(lo, hi - lo, writable=not writing, holds=arrays)
    return sorted_union(file, length, mem, item, addr, ends, used, writing=writing), whole
