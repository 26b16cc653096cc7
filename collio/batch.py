"""Many arrays in one collective call: the union of their runs over one span of memory.

``write_all_many(items)`` and ``read_all_many(layouts)`` are one two-phase call each:
every item's layout is checked as ``write_all`` checks it (an error names the item),
then the runs of all items become one set of runs, planned, exchanged and written as
one call's.  The items' data stay where they are: a run's memory offset is counted
from the lowest address of any item's bytes, and the buffer the call moves bytes
from (or into) is a view of the address range from there to the end of the highest
item (:func:`span`), as MPI programs send from ``MPI.BOTTOM`` with absolute
displacements.  Nothing is copied into a staging buffer.

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

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .backends.base import Backend
from .errors import LayoutError, OverlapError, classify, make_error
from .layouts.arrays import ArrayLayout, BlockCyclic, Subarray
from .layouts.base import Layout
from .runs import Runs, first_overlap, merge

__all__ = ["Gathered", "gather", "items_count", "span"]

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
#: What a batch's check gives the engine: the union of the runs, the span buffer, the
#: items' arrays (kept alive for the call; a read's results), and ``("items", their
#: signatures)``.
Gathered = tuple[Runs, U8, list[Any], tuple[Any, ...]]


class ItemSigs(tuple):  # type: ignore[type-arg]
    """The items' signatures, one per item, as a tuple whose ``repr`` (what the ranks'
    digest of a call's signature hashes) is short: the distinct signatures but for their
    offsets, then which one each item has and its offset, as hex of int64 arrays.  The
    repr of 200 full signature tuples costs as much as the rest of a batch's local check;
    equal sequences have equal keys whichever way they were made (:func:`sig_key`)."""

    _key: str

    def __new__(cls, sigs: Any, key: str | None = None) -> ItemSigs:
        self = super().__new__(cls, sigs)
        self._key = sig_key(self) if key is None else key
        return self

    def __repr__(self) -> str:
        return self._key

    def __reduce__(self) -> Any:  # (sent whole to every rank when the ranks disagree)
        return (ItemSigs, (tuple(self), self._key))


_I64_MAX = 2**63 - 1


def _split_sig(sig: Any) -> tuple[str, int]:
    """An array layout's signature as (repr of all but its offset, offset); any other
    signature whole, offset 0."""
    if (
        type(sig) is tuple
        and len(sig) == 5
        and sig[0] == "array"
        and type(sig[4]) is int
        and 0 <= sig[4] <= _I64_MAX
    ):
        return repr(sig[:4]), sig[4]
    return repr(sig), 0


def _key_of(prefixes: Sequence[str], which: Any, offsets: Any) -> str:
    ids = np.asarray(which, np.int64).tobytes().hex()
    offs = np.asarray(offsets, np.int64).tobytes().hex()
    return f"items[{'; '.join(prefixes)}] {ids} {offs}"


def sig_key(sigs: Sequence[Any]) -> str:
    """The canonical short key of a sequence of item signatures (see :class:`ItemSigs`)."""
    seen: dict[str, int] = {}
    which, offsets = [], []
    for sig in sigs:  # (the per-item path; a box batch makes the key from its arrays)
        prefix, offset = _split_sig(sig)
        which.append(seen.setdefault(prefix, len(seen)))
        offsets.append(offset)
    return _key_of(list(seen), which, offsets)


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
    fast = _gather_boxes(backend, items, writing=writing, outs=outs)
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


#: Layouts whose runs at byte ``offset`` are their runs at offset 0 moved by ``offset``
#: (each a box or block-cyclic piece of a global array: its runs depend on nothing else
#: than the fields of :func:`_shape_key`), checked the same way at every offset.
_SHIFTABLE = (Subarray, BlockCyclic)


def _shape_key(lay: ArrayLayout) -> tuple[Any, ...]:
    """What an array layout's runs depend on besides its offset (see :data:`_SHIFTABLE`).
    (A box's dims are made from its start and shape alone: tuples of ints hash and
    compare in C, a tuple of dataclasses through Python per dimension.)"""
    if type(lay) is Subarray:
        return (Subarray, lay.global_shape, lay.start, lay.shape, lay._dtype, lay._order,
                lay._invalid)  # fmt: skip
    return (type(lay), lay.global_shape, lay.dims, lay._dtype, lay._order, lay._invalid)


def _plain(backend: Any) -> bool:
    """Whether ``backend`` checks and maps layouts as the base class does (no hook of its
    own: the runs in its byte space are the layout's, and no layout is refused)."""
    cls = type(backend)
    return (
        cls.runs_for is Backend.runs_for
        and cls.check_layout is Backend.check_layout
        and cls.check_batch is Backend.check_batch
    )


def _gather_boxes(backend: Any, items: Any, *, writing: bool, outs: Any) -> Gathered | None:
    """:func:`gather` of a batch of :data:`_SHIFTABLE` layouts over C- or F-contiguous
    arrays of their dtype and shape (a checkpoint's tensors, a time series' steps), or
    None for any other batch, or any item that would fail: then :func:`gather` checks
    each item itself and raises the first one's error.

    Items of the same shape key share the runs and checks of the first of them: one
    layout per distinct key is checked and flattened, and every item's runs are that
    template's moved by the item's offset in file and by its array's address in memory,
    all in a few numpy passes over the whole batch (no per-run Python, and per item only
    the attribute reads that say which template and which array it is).
    """
    if not len(items) or not _plain(backend):
        return None
    try:
        lays = [it[1] for it in items] if writing else list(items)
        data = [it[0] for it in items] if writing else None
    except (TypeError, IndexError, KeyError):
        return None
    if writing and any(type(it) not in (tuple, list) or len(it) != 2 for it in items):
        return None
    if any(type(lay) not in _SHIFTABLE for lay in lays):
        return None
    keys: dict[tuple[Any, ...], int] = {}
    group = np.fromiter(
        (keys.setdefault(_shape_key(lay), len(keys)) for lay in lays), np.intp, len(lays)
    )
    firsts = np.zeros(len(keys), np.intp)
    firsts[group[::-1]] = np.arange(len(lays) - 1, -1, -1)  # (each key's first item)
    templates: list[Runs] = []
    for k in firsts.tolist():  # (a loop per distinct layout shape, not per item)
        lay = lays[k]
        try:
            lay.checked()
        except LayoutError:
            return None
        templates.append(lay.runs())
    try:
        offsets = np.fromiter((lay.offset for lay in lays), np.int64, len(lays))
    except OverflowError:  # (an offset past int64: the item's own check says so)
        return None
    if bool((offsets < 0).any()):
        return None
    arrays = _arrays(lays, data, firsts, group, outs, writing=writing)
    if arrays is None:
        return None
    base = np.fromiter((lays[k].offset for k in firsts.tolist()), np.int64, len(firsts))
    sigs = _box_sigs(lays, firsts, group, offsets)
    union, whole = _union_shifted(templates, group, offsets - base[group], arrays, writing=writing)
    return union, whole, arrays, ("items", sigs)


def _box_sigs(lays: list[Any], firsts: Any, group: Any, offsets: I64) -> ItemSigs:
    """The box items' signatures and their key from the templates' (:func:`sig_key` of
    them, without a repr per item)."""
    seen: dict[str, int] = {}
    ids = np.empty(len(firsts), np.int64)
    for g, k in enumerate(firsts.tolist()):  # (groups in order of their first item)
        prefix, _ = _split_sig(lays[k].signature())
        ids[g] = seen.setdefault(prefix, len(seen))
    key = _key_of(list(seen), ids[group], offsets)
    return ItemSigs((lay.signature() for lay in lays), key)


def _arrays(
    lays: list[Any], data: list[Any] | None, firsts: Any, group: Any, outs: Any, *, writing: bool
) -> list[Any] | None:
    """The items' arrays as the batch moves them (a write's data, a read's outputs), or
    None when one is not already an array of its layout's dtype, shape and memory order
    (the per-item checks of :meth:`Layout.as_bytes` / :meth:`Layout.allocate`)."""
    specs = [(lays[k].dtype, lays[k].local_shape, lays[k].order) for k in firsts.tolist()]
    per = [specs[g] for g in group.tolist()]
    if not writing and outs is None:
        return [np.empty(shape, dt, order=order) for dt, shape, order in per]
    got = data if writing else list(outs)
    assert got is not None
    for arr, (dt, shape, order) in zip(got, per, strict=True):
        if type(arr) is not np.ndarray or arr.dtype != dt or arr.shape != shape:
            return None
        if not (arr.flags.f_contiguous if order == "F" else arr.flags.c_contiguous):
            return None
        if not writing and not arr.flags.writeable:
            return None
    return got


def _union_shifted(
    templates: list[Runs], group: Any, shift: I64, arrays: list[Any], *, writing: bool
) -> tuple[Runs, U8]:
    """:func:`_union` of items whose runs are ``templates[group[k]]`` moved by ``shift[k]``
    in the file, over the arrays ``arrays`` (contiguous in their layout's order)."""
    n = len(group)
    counts = np.array([len(t) for t in templates], np.int64)[group]
    if not int(counts.sum()):
        return Runs.empty(), np.zeros(0, np.uint8)
    address = MPI.memory.frombuffer
    addr = np.fromiter(
        (
            address(a if a.flags.c_contiguous else a.T, readonly=True).address if a.nbytes else 0
            for a in arrays
        ),
        np.int64,
        n,
    )
    sizes = np.fromiter((a.nbytes for a in arrays), np.int64, n)
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
    return _sorted_union(file, length, mem, item, addr, ends, used, writing=writing), whole


def _sorted_union(
    file: I64, length: I64, mem: I64, item: Any, addr: I64, ends: I64, used: Any, *, writing: bool
) -> Runs:
    """The runs sorted by file offset, then item (already so costs one pass), checked
    for bytes written twice (writes) or arrays sharing memory (reads), merged.  (The
    item breaks ties: an error names the same items whatever order they came in.)"""
    step = np.diff(file)
    if len(file) > 1 and not bool(((step > 0) | ((step == 0) & (np.diff(item) >= 0))).all()):
        order = np.lexsort((item, file))
        file, length, mem, item = file[order], length[order], mem[order], item[order]
    if writing:
        _refuse_overlap(file, length, item)
    else:
        _refuse_shared_memory(addr[used], ends[used], np.flatnonzero(used))
    return merge(Runs(file, length, mem))


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
    # (mpi4py's buffer address: a tenth of what numpy's ctypes attribute costs per item)
    # (read-only: a write's data may be a read-only buffer, and nothing writes through it)
    address = MPI.memory.frombuffer
    addr = np.fromiter(
        (address(b, readonly=True).address if len(b) else 0 for b in bufs), np.int64, len(bufs)
    )
    used = counts > 0
    ends = addr + np.fromiter((len(b) for b in bufs), np.int64, len(bufs))
    lo, hi = int(addr[used].min()), int(ends[used].max())
    file = np.concatenate([r.file for r in runs])
    length = np.concatenate([r.length for r in runs])
    mem = np.concatenate([r.mem for r in runs]) + np.repeat(addr - lo, counts)
    item = np.repeat(np.arange(len(runs)), counts)
    union = _sorted_union(file, length, mem, item, addr, ends, used, writing=writing)
    return union, span(lo, hi - lo, writable=not writing, holds=arrays)


def _refuse_shared_memory(addr: I64, ends: I64, item: npt.NDArray[np.intp]) -> None:
    """Raise :class:`LayoutError` naming two items of a read whose arrays share memory
    (MPI fills no byte twice in one call, and one of the two would lose)."""
    if len(addr) < 2:
        return
    order = np.argsort(addr, kind="stable")
    a, e, k = addr[order], ends[order], item[order]
    bad = np.flatnonzero(a[1:] < np.maximum.accumulate(e)[:-1])
    if not len(bad):
        return
    i = int(bad[0]) + 1
    j = int(np.argmax(e[:i] > a[i]))  # an earlier array reaching past its start
    x, y = sorted((int(k[j]), int(k[i])))
    raise LayoutError(f"items {x} and {y} read into arrays that share memory")


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
