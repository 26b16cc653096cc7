"""This rank's side of a load before any byte is read: each requested name checked
against the index, its layout and span, and the array it is read into (the caller's,
a new one, or one over a map of the file: :mod:`.filemap`)."""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from itertools import chain
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from ..boxes import by_shape
from ..errors import BackendError, ChecksumError, LayoutError
from ..layouts.arrays import ArrayLayout, Subarray, array_layout
from ..spans import addresses, shared_pair
from . import format
from .chunks import Chunks
from .extents import box_spans
from .filemap import Reader, map_range, map_runs, pieces
from .save import spans
from .state import as_array, leaves, whole

__all__ = ["Wanted"]

I64 = npt.NDArray[np.int64]


#: Each requested name, its layout, and the caller's array to read it into (None: a new one)
Found = list[tuple[str, ArrayLayout, np.ndarray[Any, Any] | None]]


def flat_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A spec whose nested mappings are joined with ``/``, as a save flattens its state
    (:func:`.state.leaves`)."""
    out: dict[str, Any] = {}
    for name, value in leaves(spec, _spec_key):
        if name in out:
            raise LayoutError(f"spec names {name!r} twice (a nested and a flat key)")
        out[name] = value
    return out


def _spec_key(key: Any) -> str | None:
    return None if isinstance(key, str) else f"spec key {key!r}: names are strings"


def _wanted(index: format.Index, spec: Mapping[str, Any]) -> Found:
    """Each requested name, sorted, with this rank's piece (offset 0) checked against the
    index, and the caller's array to read it into (None: a new one)."""
    if not isinstance(spec, Mapping):
        raise LayoutError(f"spec must map names to layouts or None, not {type(spec).__name__}")
    out = []
    arrays, dtype_of = index.arrays, index.dtype
    for name in sorted(spec):
        entry = arrays.get(name)
        if entry is None:
            raise LayoutError(f"array {name!r} is not in the checkpoint")
        shape, dtype, order = tuple(entry["shape"]), dtype_of(name), entry["order"]
        lay, into = spec[name], None
        if isinstance(lay, tuple) and len(lay) == 2:  # (out, layout or None): in place
            # (a numpy array as given: checked with the others' in one pass, by find)
            into = lay[0] if isinstance(lay[0], np.ndarray) else _into(name, lay[0])
            lay = lay[1]
        if shape == ():  # a 0-d value is stored as one element
            if lay is not None:
                raise LayoutError(f"array {name!r} is 0-d: load it with None, not a layout")
            shape = (1,)
        if lay is None:
            lay = whole(shape, dtype, order)
        if isinstance(lay, ArrayLayout):
            lay.checked()  # (as array_layout, without its message made for every entry)
        else:
            lay = array_layout(lay, f"array {name!r}: a spec")
        # (the fields, not their read-only properties: a call each, per array)
        if lay._offset:  # (as a save refuses one: the checkpoint places every array)
            raise LayoutError(
                f"array {name!r}: layout offset {lay.offset}; the checkpoint places it"
            )
        if (lay.global_shape, lay._dtype, lay._order) != (shape, dtype, order):
            raise LayoutError(
                f"array {name!r}: stored shape {shape} dtype {dtype.str} order {order}; layout "
                f"has shape {lay.global_shape} dtype {lay.dtype.str} order {lay.order}"
            )
        if into is not None and entry["shape"] == [] and into.shape == ():
            into = into.reshape(1)  # (a view: the stored form of a 0-d value)
        out.append((name, lay, into))
    return out


def _check_given(found: Found, shapes: list[tuple[int, ...]]) -> None:
    """Raise :class:`LayoutError` for the first of the caller's arrays (``found``'s third
    items, numpy arrays) that cannot take its piece (of local shape ``shapes[k]``):
    read-only, or not of the piece's shape and dtype and contiguous in the layout's
    order; then for two that share memory.  One pass over the arrays' flags, shapes and
    dtypes (a model's hundreds of arrays, each checked by its layout, cost a load into
    them as much as its planning); the first that does not fit checked again as each
    layout checks, for its message."""
    at = [k for k, (_, _, into) in enumerate(found) if into is not None]
    if not at:
        return
    arrs = cast("list[np.ndarray[Any, Any]]", [found[k][2] for k in at])
    flags = [arr.flags for arr in arrs]
    fits = [
        fl.writeable
        and (fl.f_contiguous if found[k][1]._order == "F" else fl.c_contiguous)
        and arr.shape == shapes[k]
        and arr.dtype == found[k][1]._dtype
        for fl, arr, k in zip(flags, arrs, at, strict=True)
    ]
    if not all(fits):
        bad = fits.index(False)
        name, lay, into = found[at[bad]]
        if not flags[bad].writeable:
            raise LayoutError(f"array {name!r}: the array to load into is read-only")
        try:
            lay.check_out(into)
        except LayoutError as exc:
            raise LayoutError(f"array {name!r}: {exc}") from None
        # (the layout's own check found nothing: never read into an array that did not fit)
        arr = arrs[bad]
        raise LayoutError(
            f"array {name!r}: the array to load into has shape {arr.shape}, dtype "
            f"{arr.dtype.str}, C-contiguous {flags[bad].c_contiguous}, F-contiguous "
            f"{flags[bad].f_contiguous}; its piece needs shape {shapes[at[bad]]}, dtype "
            f"{lay.dtype.str}, contiguous in order {lay.order}"
        )
    # (arrays each owning their memory, each given once, share none: no address needed)
    if len(at) > 1 and not (
        all(fl.owndata for fl in flags) and len(set(map(id, arrs))) == len(arrs)
    ):
        _refuse_shared(found)


def _refuse_shared(found: Found) -> None:
    """Raise :class:`LayoutError` naming two arrays loaded into memory they share: each is
    read and checksummed in place, so one would silently hold the other's bytes.  (The
    arrays given are contiguous, checked by :func:`_check_given`: each is one address
    range.)"""
    given = [(name, into) for name, _, into in found if into is not None and into.nbytes]
    if len(given) < 2:
        return
    nbytes = np.fromiter((into.nbytes for _, into in given), np.int64, len(given))
    # (each array itself: its buffer is one range, C- or F-contiguous, so the address
    # needs no flat byte view made of it first)
    addr, ends = addresses([into for _, into in given], nbytes)
    pair = shared_pair(addr, ends)
    if pair is not None:
        x, y = given[pair[0]][0], given[pair[1]][0]
        raise LayoutError(f"arrays {x!r} and {y!r} are loaded into arrays that share memory")


def _into(name: str, obj: Any) -> np.ndarray[Any, Any]:
    """A numpy view of the caller's array ``obj`` to read array ``name`` into."""
    try:
        arr = as_array(obj)
    except LayoutError as exc:
        raise LayoutError(f"array {name!r}: {exc}") from None
    if arr is not obj and arr.base is None:
        # (numpy made a new array of its values, as of a list or a numpy scalar: loading
        # into that would leave the caller's object as it was)
        raise LayoutError(
            f"array {name!r}: cannot load into a {type(obj).__name__}, which numpy copies; "
            f"pass a numpy array"
        )
    if not arr.flags.writeable:
        raise LayoutError(f"array {name!r}: the array to load into is read-only")
    return arr


_NOT_GROUPED: Any = object()


def _spans(lays: list[ArrayLayout], found: Any = _NOT_GROUPED) -> I64:
    """(lo, hi, contiguous, bytes) of each piece, relative to its array (a row per array),
    worked out once per distinct shape (the shape key layouts of equal fields share: a
    model's layers repeat a few shapes) and taken for the others.  ``found``: the
    layouts' :func:`~collio.boxes.by_shape`, where the caller has it."""
    if found is _NOT_GROUPED:
        found = by_shape(lays) if lays else None
    if found is None or len(found[1]) == len(lays):
        return _spans_each(lays)
    group, firsts, _ = found
    out: I64 = _spans_each([lays[k] for k in firsts.tolist()])[group]
    return out


def _spans_each(lays: list[ArrayLayout]) -> I64:
    """:func:`_spans` of each layout: the boxes (Subarray: a row shard, a whole array) in
    one numpy pass, the others from their runs (:func:`~.save.spans`)."""
    n = len(lays)
    out = np.zeros((n, 4), np.int64)
    at = np.flatnonzero(np.fromiter((type(lay) is Subarray for lay in lays), bool, n))
    if len(at):
        out[at] = _box_spans(cast("list[Subarray]", [lays[k] for k in at.tolist()]))
    if len(at) < n:
        other = np.setdiff1d(np.arange(n), at).tolist()
        out[other] = spans([lays[k] for k in other])
    return out


def _box_spans(boxes: list[Subarray]) -> I64:
    """:func:`~.extents.box_spans` of the boxes: their global shapes, starts and counts
    taken flat (one pass over the boxes each) and laid out as rows in memory order
    ('F' boxes reversed), padded in front to the most dimensions of any."""
    n = len(boxes)
    nd = np.fromiter((len(b.global_shape) for b in boxes), np.int64, n)
    total, d = int(nd.sum()), max(int(nd.max()), 1)

    def flat(attr: str) -> I64:
        return np.fromiter(chain.from_iterable(getattr(b, attr) for b in boxes), np.int64, total)

    fort = np.fromiter((b.order == "F" for b in boxes), bool, n)
    row = np.repeat(np.arange(n), nd)
    j = np.arange(total) - np.repeat(np.cumsum(nd) - nd, nd)  # (each value's dimension)
    col = np.where(fort[row], d - 1 - j, d - nd[row] + j)
    g, st, sh = np.ones((n, d), np.int64), np.zeros((n, d), np.int64), np.ones((n, d), np.int64)
    g[row, col], st[row, col], sh[row, col] = flat("global_shape"), flat("start"), flat("shape")
    size = np.fromiter((b.dtype.itemsize for b in boxes), np.int64, n)
    return box_spans(g, st, sh, size)


def _local_shapes(lays: list[ArrayLayout], found: Any) -> list[tuple[int, ...]]:
    """Each layout's local shape, worked out once per shape key (layouts of one key have
    the same fields besides their offset: a model's layers repeat a few shapes);
    ``found``: the layouts' :func:`~collio.boxes.by_shape`."""
    if found is None:
        return [lay.local_shape for lay in lays]
    group, firsts, _ = found
    per = [lays[k].local_shape for k in firsts.tolist()]
    return [per[g] for g in group.tolist()]


def _allocate(
    lays: list[ArrayLayout], shapes: list[tuple[int, ...]], into: list[Any], skip: Any = None
) -> list[Any]:
    """This rank's arrays: the caller's where given, None where ``skip`` (to be mapped),
    else each its own allocation.
    (One allocation for them all, in huge pages, faulted in faster on a quiet machine,
    but after a save's writes had filled the page cache its huge pages came slower and
    less steadily, and any array kept would have kept them all.  Reading into arrays the
    job already has costs no page faults at all.)"""
    return [
        None if skip is not None and skip[k] else
        np.empty(shape, lay._dtype, order="F" if lay._order == "F" else "C")
        if arr is None else arr
        for k, (lay, shape, arr) in enumerate(zip(lays, shapes, into, strict=True))
    ]  # fmt: skip


class Wanted:
    """This rank's side of a load, before any byte is read: each requested name, sorted,
    its layout, the array it is read into (the caller's or a new one), the caller's
    object for the result, and the pieces' spans."""

    def __init__(self) -> None:
        self.wanted: list[tuple[str, ArrayLayout]] = []
        self.arrays: list[Any] = []
        self.given: list[Any] = []
        self.spans: Any = None
        self.shapes: list[tuple[int, ...]] = []

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.wanted]

    def find(self, index: format.Index, spec: Mapping[str, Any], *, maps: bool = False) -> None:
        """With ``maps``, the pieces that are one range and new are left to :meth:`map`."""
        if isinstance(spec, Mapping) and any(isinstance(v, Mapping) for v in spec.values()):
            spec = flat_spec(spec)  # (nested names joined with '/', as a save's state)
        found = _wanted(index, spec)
        self.wanted = [(name, lay) for name, lay, _ in found]
        into = [arr for _, _, arr in found]
        self.given = [spec[name][0] if arr is not None else None for name, _, arr in found]
        lays = [lay for _, lay in self.wanted]
        groups = by_shape(lays) if lays else None  # (once for both)
        self.spans = _spans(lays, groups)
        self.shapes = _local_shapes(lays, groups)
        _check_given(found, self.shapes)
        self.mapped = np.zeros(len(found), bool)
        if maps:
            new = np.array([arr is None for arr in into], bool)
            lo, hi, one = self.spans[:, 0], self.spans[:, 1], self.spans[:, 2].astype(bool)
            self.mapped = new & one & (hi > lo)
        # (allocated before the agreement: a rank out of memory is agreed there, not left
        # raising alone before the reads' collectives)
        self.arrays = _allocate(lays, self.shapes, into, self.mapped)

    def map(self, reader: Reader, offs: I64, chunks: Chunks, required: bool) -> None:
        """Local: the pieces :meth:`find` left, as arrays over private maps of the file:
        those that are one range of the file over one map of the range they span; those
        across several chunks of their array (a row shard at another decomposition than
        the save's) over one space where each chunk's part is mapped in place, where the
        chunks' edges fall on page boundaries of the piece (else read).  Pieces past the
        file's end are read (a shorter file's bytes read as zeros, which then differ
        from their checksums).  Where a map fails, allocated, or with ``required`` (hint
        ``checkpoint_map=enable``) the error raised.  ``offs`` are the arrays' virtual
        offsets, ``chunks`` their map to the file."""
        vlo = offs + self.spans[:, 0]
        n = self.spans[:, 1] - self.spans[:, 0]
        one, lo = chunks.within(vlo, vlo + np.maximum(n, 1))
        size = reader.size()
        single = np.flatnonzero(self.mapped & one & (lo + n <= size))
        across = np.flatnonzero(self.mapped & ~one)
        multi = across[_stitchable(vlo[across], chunks.runs(vlo[across], n[across]), size)]
        left = np.setdiff1d(np.flatnonzero(self.mapped), np.union1d(single, multi))
        self.mapped[left] = False
        for ids in (single, multi):
            if not len(ids):
                continue
            try:
                got = self._views(reader.fd, ids, vlo, n, lo if ids is single else None, chunks)
            except BackendError:
                if required:
                    raise
                self.mapped[ids] = False
                left, got = np.union1d(left, ids), []
            for k, arr in zip(ids.tolist(), got, strict=False):
                self.arrays[k] = arr
        if len(left):  # (read instead: into arrays of their own)
            ids = left.tolist()
            new = _allocate([self.wanted[k][1] for k in ids], [self.shapes[k] for k in ids],
                            [None] * len(ids))  # fmt: skip
            for k, arr in zip(left.tolist(), new, strict=True):
                self.arrays[k] = arr

    def _views(
        self, fd: int, ids: I64, vlo: I64, n: I64, lo: I64 | None, chunks: Chunks
    ) -> list[Any]:
        """The pieces ``ids`` over one map: of the file's range they span (``lo``: each
        one range of the file, from there), else of their chunks' parts in one space."""
        lays = [self.wanted[k][1] for k in ids.tolist()]
        shapes = [self.shapes[k] for k in ids.tolist()]
        if lo is not None:
            first = int(lo[ids].min())
            buf = map_range(fd, first, int((lo + n)[ids].max()))
            return pieces(buf, lo[ids] - first, lays, shapes)
        buf, start = map_runs(fd, n[ids], chunks.runs(vlo[ids], n[ids]))
        return pieces(buf, start, lays, shapes)

    def result(self, index: format.Index, flags: npt.NDArray[np.bool_]) -> dict[str, Any]:
        """The arrays by name; the agreed checksum error naming those that differ."""
        bad = [self.wanted[k][0] for k in np.flatnonzero(flags).tolist()]
        if bad:
            err = ChecksumError(
                f"{len(bad)} arrays differ from their checksums: {', '.join(map(repr, bad))}"
            )
            err.names = tuple(bad)
            raise err
        return {
            name: obj
            if obj is not None
            else arr.reshape(())
            if index.arrays[name]["shape"] == []
            else arr
            for (name, _), arr, obj in zip(self.wanted, self.arrays, self.given, strict=True)
        }


def _stitchable(vlo: I64, runs: tuple[I64, I64, I64, I64], size: int) -> npt.NDArray[np.bool_]:
    """Per piece (at virtual offsets ``vlo``, its file ``runs`` as :meth:`Chunks.runs`
    gives them): whether each of its runs can be mapped in place (at the same offset
    within a page in the file as in the piece: the saving ranks' pieces page-sized
    multiples, as row shards of most arrays are) and lies within the file.  A run that
    starts within a page, after another run of its piece that ends in that page
    elsewhere in the file (a saving rank's piece of rows that are no whole pages, placed
    for huge pages: :data:`.format.PLACE_MIN`), cannot: the page would hold both."""
    file, length, src, within = runs
    at = vlo[src] + within  # (each run's place in memory)
    bad = ((file - at) % mmap.PAGESIZE != 0) | (file + length > size)
    bad[1:] |= (
        (src[1:] == src[:-1]) & (at[1:] % mmap.PAGESIZE != 0)
        & (file[1:] != file[:-1] + length[:-1])
    )  # fmt: skip
    out: npt.NDArray[np.bool_] = np.bincount(src, weights=bad, minlength=len(vlo)) == 0
    return out
