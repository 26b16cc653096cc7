"""MPI derived datatypes read through ``Get_envelope``/``Get_contents`` into byte runs.

:func:`flatten` decodes an mpi4py datatype level by level (one Python step per
constructor level, the rest vectorised in :mod:`collio.layouts.typemap`) and
caches the result on the datatype itself as an MPI attribute, so a type is
flattened once however often it is used, and the cache goes when the type is
freed.  Every handle ``Get_contents`` returns is freed again (try/finally).

Both the MPI-3 form of the contents (integers and addresses) and the MPI-4
large-count form (what mpi4py 4 constructors create) are understood.
:func:`from_datatype` turns a datatype into a collio layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from .errors import CollioError, LayoutError
from .layouts import typemap as tm
from .layouts.arrays import ArrayLayout, Subarray
from .layouts.base import Layout
from .layouts.typed import TypedLayout

__all__ = ["flatten", "decode", "from_datatype", "leaf_dtype"]

I64 = tm.I64
_KEYVAL: list[int] = []
_NAMED: dict[int, tuple[tm.Flat, str | None]] = {}


def _keyval() -> int:
    if not _KEYVAL:
        _KEYVAL.append(MPI.Datatype.Create_keyval())
    return _KEYVAL[0]


def flatten(datatype: MPI.Datatype) -> tm.Flat:
    """The typemap of ``datatype`` as byte runs (cached on the datatype)."""
    return decode(datatype)[0]


def leaf_dtype(datatype: MPI.Datatype) -> np.dtype[Any] | None:
    """The numpy dtype of the predefined type every element of ``datatype`` has, or None."""
    code = decode(datatype)[1]
    return None if code is None else np.dtype(code)


def decode(datatype: MPI.Datatype) -> tuple[tm.Flat, str | None]:
    """(runs, numpy type code of the leaves if they are all one predefined type)."""
    if not isinstance(datatype, MPI.Datatype):
        raise LayoutError(f"expected an MPI datatype, not {type(datatype).__name__}")
    if datatype == MPI.DATATYPE_NULL:
        raise LayoutError("datatype is MPI.DATATYPE_NULL")
    combiner = datatype.Get_envelope()[-1]
    if combiner == MPI.COMBINER_NAMED:
        return _named(datatype)
    kv = _keyval()
    cached = datatype.Get_attr(kv)
    if isinstance(cached, tuple):
        return cached
    out = _derived(datatype, combiner)
    datatype.Set_attr(kv, out)
    return out


_PAIRS = ("FLOAT_INT", "DOUBLE_INT", "LONG_INT", "SHORT_INT", "LONG_DOUBLE_INT", "TWOINT")


def _named(dt: MPI.Datatype) -> tuple[tm.Flat, str | None]:
    hit = _NAMED.get(dt.handle)
    if hit is not None:
        return hit
    size = dt.Get_size()
    lb, extent = dt.Get_extent()
    tlb, text = dt.Get_true_extent()
    if size == text:
        runs = [(tlb, size)]
    elif any(dt == getattr(MPI, name, MPI.DATATYPE_NULL) for name in _PAIRS):
        isize = MPI.INT.Get_size()  # (value, int) pairs: the int comes last
        runs = [(tlb, size - isize), (tlb + text - isize, isize)]
    else:
        raise LayoutError(f"predefined datatype {dt.Get_name()} has holes collio cannot place")
    code: str | None
    try:
        from mpi4py.util.dtlib import to_numpy_dtype

        code = np.dtype(to_numpy_dtype(dt)).str
    except (ValueError, TypeError, KeyError):
        code = None
    if code is not None and np.dtype(code).itemsize != size:
        code = None
    out = (tm.Flat.leaf(runs, lb, extent), code)
    _NAMED[dt.handle] = out
    return out


def _derived(dt: MPI.Datatype, combiner: int) -> tuple[tm.Flat, str | None]:
    ints, addrs, counts, types = dt.Get_contents()
    try:
        lb, extent = dt.Get_extent()
        if combiner in (MPI.COMBINER_F90_REAL, MPI.COMBINER_F90_COMPLEX, MPI.COMBINER_F90_INTEGER):
            size = dt.Get_size()
            tlb, text = dt.Get_true_extent()
            if size != text:
                raise LayoutError(f"fortran datatype of {size} bytes has holes")
            return tm.Flat.leaf([(tlb, size)], lb, extent), None
        distinct, which = _distinct(types)
        kids = [decode(t) for t in distinct]
        codes = {c for _, c in kids}
        code = codes.pop() if len(codes) == 1 else None
        runs = _runs(combiner, ints, addrs, counts, which, [k[0] for k in kids])
        return tm.Flat.make(runs, lb, extent), code
    finally:
        for t in types:
            if not t.is_predefined:
                t.Free()


def _distinct(types: Sequence[MPI.Datatype]) -> tuple[list[MPI.Datatype], I64]:
    """The distinct handles among ``types`` and, per entry, its index among them."""
    first: dict[int, int] = {}
    which = np.fromiter(
        (first.setdefault(t.handle, len(first)) for t in types), np.int64, len(types)
    )
    seen: dict[int, MPI.Datatype] = {}
    for t in types:
        seen.setdefault(t.handle, t)
    return list(seen.values()), which


def _runs(
    combiner: int,
    ints: list[int],
    addrs: list[int],
    counts: list[int],
    which: I64,
    kids: list[tm.Flat],
) -> tm.Pair:
    """The runs of one constructor level, from its contents and its children's runs."""
    if combiner == MPI.COMBINER_SUBARRAY:
        return _subarray(ints, counts, kids[0])
    if combiner == MPI.COMBINER_DARRAY:
        return _darray(ints, counts, kids[0])
    # every other combiner lists its numbers in the same order in both forms
    v = np.asarray(counts if counts else ints + addrs, np.int64)
    child = kids[0]
    if combiner in (MPI.COMBINER_DUP, MPI.COMBINER_RESIZED):
        return child.off, child.length
    if combiner == MPI.COMBINER_CONTIGUOUS:
        return tm.contiguous(child, int(v[0]))
    if combiner in (MPI.COMBINER_VECTOR, MPI.COMBINER_HVECTOR):
        n, bl, stride = (int(x) for x in v[:3])
        step = stride * child.extent if combiner == MPI.COMBINER_VECTOR else stride
        return tm.indexed(child, np.full(n, bl, np.int64), np.arange(n, dtype=np.int64) * step)
    n = int(v[0])
    if combiner in (MPI.COMBINER_INDEXED_BLOCK, MPI.COMBINER_HINDEXED_BLOCK):
        bls, disp = np.full(n, v[1], np.int64), v[2 : 2 + n]
    else:
        bls, disp = v[1 : 1 + n], v[1 + n : 1 + 2 * n]
    if combiner in (MPI.COMBINER_INDEXED, MPI.COMBINER_INDEXED_BLOCK):
        return tm.indexed(child, bls, disp * child.extent)
    if combiner in (MPI.COMBINER_HINDEXED, MPI.COMBINER_HINDEXED_BLOCK):
        return tm.indexed(child, bls, disp)
    if combiner == MPI.COMBINER_STRUCT:
        return tm.struct(kids, which, bls, disp)
    raise LayoutError(f"datatype combiner {combiner} is not supported")


def _order_c(order: int) -> bool:
    return bool(order == MPI.ORDER_C)


def _subarray_args(ints: list[int], counts: list[int]) -> tuple[list[int], ...]:
    nd = ints[0]
    if counts:  # large-count form: ints = [ndims, order], counts = sizes, subsizes, starts
        c = list(counts)
        return c[:nd], c[nd : 2 * nd], c[2 * nd : 3 * nd], [ints[1]]
    i = list(ints)
    return i[1 : 1 + nd], i[1 + nd : 1 + 2 * nd], i[1 + 2 * nd : 1 + 3 * nd], [i[1 + 3 * nd]]


def _subarray(ints: list[int], counts: list[int], child: tm.Flat) -> tm.Pair:
    sizes, subsizes, starts, (order,) = _subarray_args(ints, counts)
    return tm.subarray_sets(child, sizes, subsizes, starts, _order_c(order))


def _darray_args(ints: list[int], counts: list[int]) -> tuple[Any, ...]:
    size, rank, nd = ints[0], ints[1], ints[2]
    if counts:  # large-count form: gsizes are the counts
        gsizes, rest = list(counts), list(ints[3:])
    else:
        gsizes, rest = list(ints[3 : 3 + nd]), list(ints[3 + nd :])
    distribs, dargs, psizes, order = rest[:nd], rest[nd : 2 * nd], rest[2 * nd : 3 * nd], rest[-1]
    names = {MPI.DISTRIBUTE_BLOCK: tm.BLOCK, MPI.DISTRIBUTE_CYCLIC: tm.CYCLIC}
    dist = [names.get(d, tm.NONE) for d in distribs]
    darg = [None if a == MPI.DISTRIBUTE_DFLT_DARG else a for a in dargs]
    dims = tm.darray_dims(size, rank, gsizes, dist, darg, psizes)
    return gsizes, dims, _order_c(order)


def _darray(ints: list[int], counts: list[int], child: tm.Flat) -> tm.Pair:
    gsizes, dims, order_c = _darray_args(ints, counts)
    return tm.darray_sets(child, gsizes, dims, order_c)


# ------------------------------------------------------------------ layouts
def from_datatype(datatype: Any, count: int = 1, *, disp: int = 0, dtype: Any = None) -> Layout:
    """The layout of a rank holding ``count`` copies of ``datatype``'s typemap from byte ``disp``.

    The rank's buffer holds the data bytes in typemap order, as a file view of
    ``datatype`` at ``disp`` would consume them.  A subarray or darray of a
    predefined type becomes an array layout (:class:`~collio.layouts.Subarray`
    or :class:`~collio.layouts.ArrayLayout`, shaped like the local array);
    other types an explicit :class:`~collio.layouts.TypedLayout` whose buffer
    is 1-D of ``dtype`` (default: the leaves' type when they are all one, else
    bytes).  Errors are deferred to ``validate``, so that the collective call
    raises them on every rank.
    """
    try:
        flat, code = decode(datatype)
        leaf = np.dtype(dtype) if dtype is not None else (np.dtype(code) if code else None)
        if count == 1 and leaf is not None:
            array = _array_layout(datatype, leaf, disp)  # (the layout checks disp)
            if array is not None:
                return array
        return TypedLayout(flat, count, disp, leaf if leaf is not None else np.uint8)
    except (CollioError, ValueError, TypeError, MPI.Exception) as exc:
        return TypedLayout(None, 0, 0, np.uint8, invalid=f"datatype: {exc}")


def _array_layout(dt: MPI.Datatype, leaf: np.dtype[Any], disp: Any) -> Layout | None:
    """Subarray/darray of a predefined type of ``leaf``'s size, as an array layout."""
    combiner = dt.Get_envelope()[-1]
    if combiner not in (MPI.COMBINER_SUBARRAY, MPI.COMBINER_DARRAY):
        return None
    ints, _, counts, types = dt.Get_contents()
    try:
        base = types[0]
        if not base.is_predefined or base.Get_size() != leaf.itemsize:
            return None
        if base.Get_extent() != (0, leaf.itemsize):
            return None
        if combiner == MPI.COMBINER_SUBARRAY:
            sizes, subsizes, starts, (order,) = _subarray_args(ints, counts)
            o = "C" if _order_c(order) else "F"
            return Subarray(sizes, starts, subsizes, leaf, o, disp)
        gsizes, dims, order_c = _darray_args(ints, counts)
        return ArrayLayout(gsizes, dims, leaf, "C" if order_c else "F", disp)
    finally:
        for t in types:
            if not t.is_predefined:
                t.Free()
