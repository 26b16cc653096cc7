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
Pure: no communication (``MPI.Get_address`` only reads an array's address).
"""

from __future__ import annotations

import dataclasses
import math
from operator import attrgetter, is_, itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .backends.base import Backend
from .errors import LayoutError
from .itemsigs import ItemSigs, array_sigs, sig_parts
from .layouts.arrays import ArrayLayout, BlockCyclic, Subarray, offsets_of, shape_keys
from .runs import Runs, read_only
from .spans import U8, sorted_union, span

__all__ = ["SHIFTABLE", "by_shape", "forget", "gather_boxes", "shape_key"]

I64 = npt.NDArray[np.int64]
#: What a batch's check gives the engine (as :data:`collio.batch.Gathered`).
Gathered = tuple[Runs, U8, list[Any], tuple[Any, ...]]

#: Layouts whose runs at byte ``offset`` are their runs at offset 0 moved by ``offset``
#: (each a box or block-cyclic piece of a global array: its runs depend on nothing else
#: than the fields of :func:`shape_key`), checked the same way at every offset.
SHIFTABLE = (Subarray, BlockCyclic)

_DTYPE_SHAPE = attrgetter("dtype", "shape")
_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")
_C_CONTIGUOUS = attrgetter("flags.c_contiguous")
_F_CONTIGUOUS = attrgetter("flags.f_contiguous")
_WRITEABLE = attrgetter("flags.writeable")
# (MPI_Get_address through the buffer protocol: a tenth of what numpy's ctypes attribute
# costs per array, and half of an mpi4py buffer object's; it takes read-only arrays too)
_ADDRESS = MPI.Get_address


def shape_key(lay: ArrayLayout) -> tuple[Any, ...] | None:
    """What an array layout's runs depend on besides its offset: its type, and the
    fields its runs are made from (made with the layout: :func:`.arrays.shape_keys`)."""
    return shape_keys([lay])[0]


def plain_backend(backend: Any) -> bool:
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
    if not len(items) or not plain_backend(backend):
        return None
    split = _split(items, writing=writing)
    if split is None:
        return None
    lays, data = split
    shapes = _shapes(lays)
    if shapes is None:
        return None
    arrays = _arrays(shapes, data, outs, writing=writing)
    if arrays is None:
        return None
    union, whole = _union_shifted(shapes, arrays, writing=writing)
    return union, whole, arrays, ("items", shapes.sigs)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class _Shapes:
    """What a batch's layouts alone decide: which template each item has, the templates'
    runs, how far each item lies from its template, the items' signatures, each
    template's dtype, local shape and memory order, and each item's count of runs and
    of bytes (its array's, once :func:`_arrays` found it of its template's spec).  Kept
    for the next batch of the same layout objects (layouts are immutable, and the kept
    tuple holds them, so the same objects are the same layouts): a checkpoint or a time
    series passes them again; or of new ones, each of its item's shape, all moved by one
    offset (a time series' next step: :func:`_moved_shapes`)."""

    lays: tuple[Any, ...]
    group: npt.NDArray[np.intp]
    firsts: npt.NDArray[np.intp]
    templates: list[Runs]
    shift: I64
    sigs: ItemSigs
    specs: list[tuple[np.dtype[Any], tuple[int, ...]]]
    orders: list[str]
    counts: I64
    sizes: I64
    keys: list[Any]  # each item's shape key (by identity: see by_shape)
    heads: list[tuple[Any, ...]]  # each template's signature but for the offset
    parts: tuple[list[str], I64]  # the signatures' key but for the offsets (sig_parts)
    offsets: I64  # each item's layout's offset
    # (the token of the shapes these are moved from, and by how much: _moved_shapes; a
    # token, not those shapes, so that a time series' steps do not hold each other)
    origin: tuple[object, int] | None = None
    token: object = dataclasses.field(default_factory=object)


#: The last batch's :class:`_Shapes` (one entry, replaced whole: another thread's call
#: may read it) ...
_KEPT: list[_Shapes | None] = [None]
#: ... and the last union made over it: (shapes, writing, addresses, union).
_UNION: list[tuple[_Shapes, bool, I64, Runs] | None] = [None]


def _shapes(lays: list[Any]) -> _Shapes | None:
    """The batch's :class:`_Shapes`, kept or made; None when an item's layout would fail
    (its offset, or its template's check)."""
    kept = _KEPT[0]
    if kept is not None and len(kept.lays) == len(lays):
        if all(map(is_, lays, kept.lays)):
            return kept
        moved = _moved_shapes(kept, lays)
        if moved is not None:
            _KEPT[0] = moved
            return moved
    grouped = by_shape(lays)
    if grouped is None:
        return None
    group, firsts, keys = grouped
    templates = _templates(lays, firsts, keys)
    if templates is None:
        return None
    try:
        offsets = offsets_of(lays)
    except (OverflowError, TypeError):  # (an offset past int64: the item's own check says so)
        return None
    if bool((offsets < 0).any()):
        return None
    base = np.array([t.base for t in templates], np.int64)
    counts = np.array([len(t.runs) for t in templates], np.int64)[group]
    sizes = np.array([math.prod(t.spec[1]) * t.spec[0].itemsize for t in templates], np.int64)
    heads = [t.head for t in templates]
    parts = sig_parts(heads, group)
    made = _Shapes(
        tuple(lays), group, firsts, [t.runs for t in templates], offsets - base[group],
        array_sigs(heads, group, offsets, parts), [t.spec for t in templates],
        [t.order for t in templates], counts, sizes[group], keys_of(lays, group, keys), heads,
        parts, offsets,
    )  # fmt: skip
    _KEPT[0] = made
    return made


def keys_of(lays: list[Any], group: Any, keys: list[Any]) -> list[Any]:
    """Each item's shape key (``keys[group[k]]``, the same objects as the items' own)."""
    if len(keys) == 1:
        return [keys[0]] * len(lays)
    return shape_keys(lays)


def _moved_shapes(kept: _Shapes, lays: list[Any]) -> _Shapes | None:
    """The last batch's shapes moved, for layouts (new objects) whose shape keys are its
    items' in order and whose offsets are its items' moved by one common ``d``: a time
    series writing the same arrays at a new offset each step.  Each item's runs are then
    its template's moved by ``d`` more (a layout valid at one offset is valid at every
    offset >= 0: :data:`_TEMPLATES`), in a few passes, no grouping or template found
    again; None for any other batch."""
    try:
        keys = shape_keys(lays)
        offsets = offsets_of(lays)
    except (AttributeError, OverflowError, TypeError):  # (the general way says what)
        return None
    if not all(map(is_, keys, kept.keys)):
        return None
    d = int(offsets[0]) - int(kept.offsets[0])
    if not bool(np.logical_and.reduce(kept.offsets + d == offsets)):
        return None
    if int(offsets.min()) < 0:
        return None
    k = kept
    return _Shapes(
        tuple(lays), k.group, k.firsts, k.templates, k.shift + d,
        array_sigs(k.heads, k.group, offsets, k.parts), k.specs, k.orders, k.counts, k.sizes,
        k.keys, k.heads, k.parts, offsets, (k.token, d),
    )  # fmt: skip


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


def by_shape(
    lays: list[Any],
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], list[Any]] | None:
    """Which template each item has (numbered in order of their first items), the first
    item of each and its :func:`shape_key`; None for a layout without one.

    Layouts of equal fields share their key object (made when the layout was), so the
    items are grouped by the keys' identities: a pointer compare per item, not a compare
    of their fields.  Two equal keys that are not the same object (one made after the
    keys were forgotten, or unpickled) make two groups of the same template, which is
    only a second lookup of it."""
    n = len(lays)
    try:
        keys = shape_keys(lays)
    except AttributeError:  # (a layout made without its constructor)
        return None
    first = keys[0]
    if first is not None and keys.count(first) == n:  # (one shape: a time series' steps)
        return np.zeros(n, np.intp), np.zeros(1, np.intp), [first]
    if None in keys:
        return None
    ids = list(map(id, keys))
    index = {k: i for i, k in enumerate(dict.fromkeys(ids))}  # (a step per distinct key)
    group = np.fromiter(map(index.__getitem__, ids), np.intp, n)
    firsts = np.zeros(len(index), np.intp)
    firsts[group[::-1]] = np.arange(n - 1, -1, -1)  # (each key's first item)
    return group, firsts, [keys[k] for k in firsts.tolist()]


@dataclasses.dataclass(frozen=True, slots=True)
class _Template:
    """What every layout of one :func:`shape_key` shares: its runs at byte ``base`` (the
    offset of the layout they were made from), its signature but for the offset, its
    dtype and local shape, and its memory order."""

    base: int
    runs: Runs
    head: tuple[Any, ...]
    spec: tuple[np.dtype[Any], tuple[int, ...]]
    order: str


#: Templates by shape key, for batches that pass layouts of known shapes anew (a time
#: series at a new offset each step): a layout valid at one offset is valid at every
#: offset >= 0, and its runs are the template's moved.  Forgotten all at once past
#: :data:`TEMPLATES_MAX` entries or :data:`TEMPLATE_RUNS_MAX` runs in all.
_TEMPLATES: dict[Any, _Template] = {}
_TEMPLATE_RUNS = [0]
TEMPLATES_MAX = 4096
TEMPLATE_RUNS_MAX = 1 << 18


def _templates(lays: list[Any], firsts: Any, keys: list[Any]) -> list[_Template] | None:
    """The template of each distinct shape, found or made from its first item (checked:
    a loop per distinct shape, not per item); None when one is invalid (the per-item
    path raises its error)."""
    out: list[_Template] = []
    for k, key in zip(firsts.tolist(), keys, strict=True):
        t = _TEMPLATES.get(key)
        if t is None:
            lay = lays[k]
            try:
                lay.checked()
            except LayoutError:
                return None
            runs = lay.runs()
            t = _Template(lay.offset, runs, lay.signature()[:4], (lay.dtype, lay.local_shape),
                          lay.order)  # fmt: skip
            if len(_TEMPLATES) >= TEMPLATES_MAX or _TEMPLATE_RUNS[0] > TEMPLATE_RUNS_MAX:
                _TEMPLATES.clear()
                _TEMPLATE_RUNS[0] = 0
            _TEMPLATES[key] = t
            _TEMPLATE_RUNS[0] += len(runs)
        out.append(t)
    return out


def _arrays(
    shapes: _Shapes, data: list[Any] | None, outs: Any, *, writing: bool
) -> list[Any] | None:
    """The items' arrays as the batch moves them (a write's data, a read's outputs), or
    None when one is not already an array of its layout's dtype, shape and memory order
    (the per-item checks of :meth:`Layout.as_bytes` / :meth:`Layout.allocate`)."""
    specs, orders, group = shapes.specs, shapes.orders, shapes.group
    n = len(group)
    if not writing and outs is None:
        per = group.tolist()
        return [np.empty(specs[g][1], specs[g][0], order=orders[g]) for g in per]  # type: ignore[call-overload]
    got = list(data if writing else outs)  # type: ignore[arg-type]
    if set(map(type, got)) != {np.ndarray}:
        return None
    if len(specs) == 1:  # (counted: a compare per item, mostly of the same dtype object)
        dtype, shape = specs[0]
        if list(map(_SHAPE, got)).count(shape) != n or list(map(_DTYPE, got)).count(dtype) != n:
            return None
    elif list(map(_DTYPE_SHAPE, got)) != list(map(specs.__getitem__, group.tolist())):
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


def _union_shifted(shapes: _Shapes, arrays: list[Any], *, writing: bool) -> tuple[Runs, U8]:
    """The union of items whose runs are their templates' moved by ``shapes.shift`` in
    the file, over the arrays ``arrays`` (contiguous in their layout's order); read-only,
    and the same object as the last call's when the layouts and the arrays' addresses
    are (so the engine's checks and kept plan know it by identity)."""
    counts, sizes = shapes.counts, shapes.sizes
    if not int(counts.sum()):
        return Runs.empty(), np.zeros(0, np.uint8)
    addr = np.fromiter(map(_ADDRESS, arrays), np.int64, len(arrays))
    used = counts > 0
    ends = addr + sizes
    if bool(used.all()):
        lo, hi = int(addr.min()), int(ends.max())
    else:
        lo, hi = int(addr[used].min()), int(ends[used].max())
    whole = span(lo, hi - lo, writable=not writing, holds=arrays)
    last = _UNION[0]
    # (the same shapes object: the same layouts, so the same sizes of arrays; or shapes
    # moved from the last ones: the last union moved, in file order and checked alike,
    # and read-only with its origin, so the kept plan finds the shift without comparing)
    if last is not None and last[1] == writing and np.array_equal(last[2], addr):
        if last[0] is shapes:
            return last[3], whole
        origin = shapes.origin
        if origin is not None and origin[0] is last[0].token:
            union = last[3].moved(origin[1])
            _UNION[0] = (shapes, writing, addr, union)
            return union, whole
    file, length, mem, item = _moved(shapes, counts, addr - lo)
    union = read_only(sorted_union(file, length, mem, item, addr, ends, used, writing=writing))
    _UNION[0] = (shapes, writing, addr, union)
    return union, whole


def _moved(shapes: _Shapes, counts: I64, rel: I64) -> tuple[I64, I64, I64, Any]:
    """Every item's runs: its template's moved by its shift in the file and by ``rel``
    (its array's address from the span's start) in memory, and a function giving the
    item of each run (asked for only if the runs need sorting)."""
    templates, group, shift = shapes.templates, shapes.group, shapes.shift
    n = len(group)
    if len(templates) == 1:  # (one shape: a 2-D broadcast, no concatenation)
        t = templates[0]
        file = (t.file[None, :] + shift[:, None]).reshape(-1)
        mem = (t.mem[None, :] + rel[:, None]).reshape(-1)
        length = np.repeat(t.length[None, :], n, axis=0).reshape(-1)  # (np.tile, in C)
        return file, length, mem, lambda: np.repeat(np.arange(n), len(t))
    by = np.argsort(group, kind="stable")  # the items of each shape in turn
    first = np.searchsorted(group[by], np.arange(len(templates) + 1))
    parts: list[tuple[I64, I64, I64]] = []
    for g, t in enumerate(templates):  # (a loop per distinct shape, not per item)
        sel = by[first[g] : first[g + 1]]
        parts.append(
            (
                (t.file[None, :] + shift[sel][:, None]).reshape(-1),
                np.repeat(t.length[None, :], len(sel), axis=0).reshape(-1),
                (t.mem[None, :] + rel[sel][:, None]).reshape(-1),
            )
        )
    file, length, mem = (np.concatenate([p[i] for p in parts]) for i in range(3))
    return file, length, mem, lambda: np.repeat(by, counts[by])


def forget() -> None:
    """Local: drop what batches keep for the next ones (the last batch's layouts and
    union, the templates by shape; :func:`collio.release_buffers`)."""
    _KEPT[0] = None
    _UNION[0] = None
    _TEMPLATES.clear()
    _TEMPLATE_RUNS[0] = 0
