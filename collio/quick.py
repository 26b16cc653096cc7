"""The one-run lane: a repeated small call through a dense file view, in Python ints.

A time series writes (reads) one buffer per step through a view whose filetype fills
its extent (``MPI.BYTE``, a contiguous type: :attr:`~collio.layouts.typemap.Flat.dense`),
so the call's one run is ``disp + position * etype_size``, as many bytes as the buffer.
When the call repeats this rank's last one through the same view
(:func:`collio.check.again`'s conditions), and its extent moved as
:func:`collio.speculate.attempt` requires, its I/O, its head and, when every rank guessed
and found the same requests, its completion need none of the objects the general way
builds (runs, the guess, the pending call, the records of the head): the head's slots
are the last call's (:attr:`~collio.speculate.Kept.head`) with the few facts that change
patched in, and a few of the agreed maxima decide that the call is complete.

A time series through array layouts takes the lane too (:func:`layout_again`): a
:class:`~collio.layouts.Subarray` equal to the last call's but for its offset has the
last call's runs moved by the offset's change, and its data the checks it passed then.

The lane decides before any I/O whether it is taken; not taken (nothing done), the call
goes the way it went before (:func:`collio.check.again`, else the general way).  A call
that did its I/O here but is not complete at its head (a rank failed or did not guess,
another call, other requests) builds what the general way would have built and goes on
from its head (:func:`collio.check.after_head`): the same take-backs, errors and paths.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Literal, NoReturn

import numpy as np

from . import check, speculate
from .backends import filereads
from .backends.directio import DIRECT_MIN
from .backends.failures import storage_error
from .backends.fdio import pwrite_all
from .backends.filereads import FEW_PREADS, ONE_PREAD_BYTES
from .backends.keeping import HOLE_MIN, Before, keep_one
from .backends.mapped import GATHER_BYTES, Rows, rows_of
from .backends.posix import PosixBackend
from .checkfacts import PLACED, Checked, moved_by, placed
from .collective import KeptHead, call_kept_head, kept, raise_kept_mismatch
from .context import Context
from .errors import MismatchError
from .facts import NOT_COMPARED
from .layouts.arrays import Subarray
from .policy import Path, may_map
from .runs import Runs, read_only

__all__ = ["Headed", "Step", "again", "array_of", "layout_again"]

#: A call that went as far as its head (:func:`collio.check.resume` goes on from it)
Headed = check.Headed

_U8 = np.dtype(np.uint8)
#: (an enum member looked up once: each lookup through its class costs a call)
_MAPPED = Path.MAPPED
_DIRECT = Path.DIRECT
#: The kinds of arrays that are buffers as they are (os.pwrite takes them)
_NUMBERS = "biufc"
#: The facts that change from one call of the lane to the next (the others are the
#: kept call's, packed once into :attr:`Kept.head`)
_PATCH = Checked.patcher(
    "lo", "hi", "moved", "shift", "guessed", "size", "same", "t_io", "t_total", "sig"
)  # fmt: skip
#: :data:`_PATCH` of a step (:meth:`Step._go`: a write, or a read it does itself) that did
#: its I/O as it guessed, with its last call's requests, its values ints: no ``int()`` per
#: fact, no tuple per pair
_PATCH_WRITE = Checked.int_patcher(
    "lo", "hi", "moved", "shift", "size", "t_io", "t_total", "sig", guessed=True, same=True
)  # fmt: skip
#: :data:`_PATCH` of a step's read that every rank copied from the mapped file, its
#: values ints: it did its I/O as it guessed, with its last call's requests, and asked no
#: size (``speculate.BIG``)
_PATCH_READ = Checked.int_patcher(
    "lo", "hi", "moved", "shift", "t_io", "t_total", "sig", guessed=True, size=speculate.BIG,
    same=True,
)  # fmt: skip
#: The agreed facts that tell a call complete at its head, and what settles it
_READ = Checked.reader("guessed", "same", "sig", "items", "lo", "hi", "t_io", "t_total")


def again(ctx: Context, fview: Any, position: Any, data: Any, *, writing: bool,
          t0: float) -> Literal[True] | Headed | None:  # fmt: skip
    """Collective over ``ctx.comm`` unless it returns None: ``data`` written (read)
    through ``fview`` from etype ``position`` as a repeat of this rank's last call of
    its kind through the view.  True: the call is complete; a :data:`Headed`: the call
    went as far as its head; None (nothing done, nothing communicated): not a repeat."""
    calls = ctx.kept[writing]
    step: Step | None = calls.last_step()  # (the last call's, if this call may repeat it)
    if step is not None:
        stepped = step.view(ctx, fview, position, data, t0)
        if stepped is not None:
            return stepped
    k = calls.candidate()  # (speculate.candidate, inline: every call asks)
    if k is not None and k.view is fview and k.at is not None and k.at_call is ctx.call_at:
        mine: Step | None = k.step
        if mine is not None and mine is not step:  # (a series alternating variables)
            stepped = mine.view(ctx, fview, position, data, t0)
            if stepped is not None:
                return stepped
        taken = _taken(ctx, k, position, data, writing=writing)
        if taken is not None:
            got = _run(ctx, k, position, *taken, writing=writing, t0=t0)
            if got is True and k.step is None and Step.fits(ctx, k, writing):
                k.step = calls.step = Step(ctx, k, writing)  # (the series' next calls)
            if got is not None:
                return got
    p = check.again(ctx, fview, position, data, writing=writing, t0=t0)
    return None if p is None else (p, check.head(ctx, p))


def layout_again(ctx: Context, layout: Any, data: Any, *, writing: bool,
                 t0: float) -> tuple[Literal[True] | Headed, Any] | None:  # fmt: skip
    """Collective over ``ctx.comm`` unless it returns None: ``data`` written (read into;
    None: a new array) through ``layout``, a :class:`~collio.layouts.Subarray` equal to
    this rank's last call's but for its offset (a time series' next step,
    :func:`collio.speculate.note_layout`), as :func:`again` does through a view.  Returns
    its outcome (as :func:`again`'s) and the array read (``data`` when writing); None
    (nothing done, nothing communicated): not such a repeat."""
    calls = ctx.kept[writing]
    step: Step | None = calls.last_step()  # (the last call's, if this call may repeat it)
    if step is not None:
        stepped = step(ctx, layout, data, t0)
        if stepped is not None:
            return stepped
    k = calls.candidate()  # (speculate.candidate, inline: every call asks)
    if k is None or k.box is None or type(layout) is not Subarray or k.at_call:
        return None
    mine: Step | None = k.step
    if mine is not None and mine is not step:  # (a series alternating variables)
        stepped = mine(ctx, layout, data, t0)
        if stepped is not None:
            return stepped
    box = k.box
    if layout.box != box or layout._invalid:
        return None
    offset = layout._offset
    if offset < 0:
        return None  # (the general way's checks raise it, agreed)
    arr = array_of(ctx, k.box, data, writing=writing)
    if arr is None:
        return None
    lo, runs = k.base + offset, k.runs
    if runs is not None:  # (several runs: the kept ones, moved by the offset's change)
        runs = runs.moved(lo - int(runs.file[0]))
    taken = _tail(ctx, k, lo, writing=writing, runs=runs)
    if taken is None:
        return None
    buf = arr.reshape(-1, order="A").view(np.uint8)
    where = (layout, offset, arr, runs)
    got = _run(ctx, k, where, lo, buf, *taken, writing=writing, t0=t0)
    if got is None:
        return None
    if got is True and k.step is None and Step.fits(ctx, k, writing):
        k.step = calls.step = Step(ctx, k, writing)  # (the series' next calls take it)
    return got, arr


def array_of(ctx: Context, box: Any, data: Any, *, writing: bool) -> Any:
    """Local: the call's array when the layout's checks of it would pass (``data``: of
    the kept box's dtype and shape, contiguous in its order, writeable for a read; a read
    without one: a new array), on a file that takes the call; else None."""
    mode = ctx.mode
    if mode == "closed" or (writing and (mode == "r" or ctx.aborted)):
        return None
    if data is None:
        if writing:
            return None
        try:
            return np.empty(box[2], box[3], order=box[4])
        except MemoryError:  # (the general way allocates again, inside an agreed step)
            return None
    if type(data) is not np.ndarray or data.shape != box[2] or data.dtype != box[3]:
        return None
    flags = data.flags
    if not (flags.f_contiguous if box[4] == "F" else flags.c_contiguous):
        return None
    if not (writing or flags.writeable):
        return None
    return data


class Step:
    """A repeat of one kept one-run call on a posix file (through a
    :class:`~collio.layouts.Subarray`: :func:`layout_again`; through a dense view:
    :func:`again`), or of a Subarray's read of several runs that are rows of a strided
    array (:meth:`_read_rows`), in the fewest operations: oversubscribed ranks pay
    every operation of one rank in the others' waits, and on a small call the Python
    between its I/O and its one agreement is most of its time.

    Made at the call's first repeat through the lane and kept on its
    :class:`~collio.speculate.Kept`; it does what the lane does (the same conditions,
    I/O, head and completion) with the facts that do not change from call to call
    looked up once.  Anything but the plain case (a condition not met, an I/O error, a
    call not complete at its head, another call) goes the lane's general way from where
    it is (:func:`_agree`, :func:`_settle`), so errors, take-backs and statistics stay
    the lane's."""

    __slots__ = (
        "k", "calls", "writing", "be", "fd", "c_order", "pre", "post", "maps", "local", "rows",
        "first", "need", "gather", "src", "shelf", "typed", "f_order", "end", "alo", "ahi",
        "mark",
    )  # fmt: skip

    def __init__(self, ctx: Context, k: speculate.Kept, writing: bool) -> None:
        self.k, self.calls, self.writing = k, ctx.kept[writing], writing
        be = ctx.backend
        assert isinstance(be, PosixBackend)
        self.be: PosixBackend = be
        self.fd = be.fd
        box = k.box
        # (an array contiguous in C order of numbers is a buffer os.pwrite / preadv take
        # as it is)
        self.c_order = box is not None and (box[4] != "F" or len(box[2]) <= 1)
        self.c_order = self.c_order and box is not None and np.dtype(box[3]).kind in _NUMBERS
        # the kept call's last facts around the extent (slot 5) and ``guessed`` (last)
        self.pre, self.post = tuple(k.last[:5]), (*k.last[6:-1], True)
        # what Stats.local makes when read, the same every call (Stats.local_when_read's)
        self.local = (dict, (("domain", -1), ("direct", True), ("requests", k.lengths)))
        # a read copied from the map by one preadv (MappedReads.read_if_maps)
        self.maps = (not writing and k.path is _MAPPED and be.maps
                     and may_map(k.hints, writing=False))  # fmt: skip
        # a read of several runs, rows of a strided array (:meth:`_read_rows`): the rows
        # (the same for every step's runs, moved), where the kept runs start, and the
        # bytes of the backend's gather buffer that a step reads and views
        self.rows: Rows | None = None if k.runs is None else rows_of(k.runs)
        self.first = 0 if k.runs is None else int(k.runs.file[0])
        self.need = k.span if self.rows is None else max(k.span, self.rows.span)
        # the gather buffer the views below are of, the view a step's pread fills and the
        # rows viewed in it (made again when the backend's buffer is another)
        self.gather: Any = None
        self.src: Any = None
        self.shelf: Any = None
        # the rows viewed as the array's elements in its memory order (None: no such
        # view), so that a step's copy is one ``copyto`` of the array (its transpose for
        # one in Fortran order: C-contiguous, its shape reversed)
        self.typed: Any = None
        self.f_order = box is not None and box[4] == "F"
        # a write's: the file's size after the step's last call, complete at its head,
        # that call's agreed extent (-1: not known; see _go), and the file's write calls
        # (Context.writes) then: another write since, the end is not known
        self.end = self.alo = self.ahi = self.mark = -1

    @staticmethod
    def fits(ctx: Context, k: speculate.Kept, writing: bool) -> bool:
        """Local: whether a step can repeat ``k`` (on the posix backend, whose requests
        it makes itself, the lane's head made): one run; or a read of several, rows of a
        strided array that every rank copied from the mapped file, read as
        :meth:`~collio.backends.filereads.MappedReads.read_runs` reads them (one
        ``pread`` of their extent into the gather buffer, one copy of the rows)."""
        be = ctx.backend
        if type(be) is not PosixBackend or k.head is None:
            return False
        if k.runs is not None:
            return (
                not writing and k.path is _MAPPED and k.box is not None and k.facts[1] is True
                and be.maps and may_map(k.hints, writing=False) and len(k.runs) > FEW_PREADS
                and k.span <= GATHER_BYTES and rows_of(k.runs) is not None
            )  # fmt: skip
        return (k.box is not None or k.at is not None) and (
            writing or k.path is _MAPPED or k.path is _DIRECT
        )

    def __call__(self, ctx: Context, layout: Any, data: Any,
                 t0: float) -> tuple[Literal[True] | Headed, Any] | None:  # fmt: skip
        """:func:`layout_again` of a repeat of :attr:`k` (None: not one, nothing done)."""
        k, writing = self.k, self.writing
        if type(layout) is not Subarray or layout._invalid or k.hints is not ctx.hints:
            return None
        if k.at_call:  # (a write_at_all's: its head names that call)
            return None
        offset, box = layout._offset, k.box
        if offset < 0 or box is None or k.backend is not ctx.backend:
            return None
        if (  # (layout.box != box, inline: no tuple built, no property called)
            layout.shape != box[2] or layout.start != box[1] or layout.global_shape != box[0]
            or layout._dtype != box[3] or layout._order != box[4]
        ):  # fmt: skip
            return None
        if type(data) is np.ndarray and data.shape == box[2] and data.dtype == box[3]:
            # (array_of's checks of a given array, inline)
            mode, flags = ctx.mode, data.flags
            if mode == "closed" or (writing and (mode == "r" or ctx.aborted)):
                return None
            if not (flags.f_contiguous if box[4] == "F" else flags.c_contiguous):
                return None
            if not (writing or flags.writeable):
                return None
            arr = data
        else:
            arr = array_of(ctx, box, data, writing=writing)
            if arr is None:
                return None
        if self.rows is not None:
            got = self._read_rows(ctx, k.base + offset, arr, layout, offset, t0)
            return None if got is None else (got, arr)
        buf = arr if self.c_order else arr.reshape(-1, order="A").view(np.uint8)
        if self.maps:
            got = self._read_mapped(ctx, k.base + offset, arr, buf, layout, offset, t0)
        else:
            got = self._go(ctx, k.base + offset, arr, buf, layout, offset, t0)
        return None if got is None else (got, arr)

    def view(self, ctx: Context, fview: Any, position: Any, data: Any,
             t0: float) -> Literal[True] | Headed | None:  # fmt: skip
        """:func:`again` through the view ``fview`` from etype ``position`` (None: not a
        repeat of :attr:`k`, nothing done)."""
        k = self.k
        at = k.at
        if at is None or k.view is not fview or k.hints is not ctx.hints:
            return None
        if k.at_call is not ctx.call_at:  # (another call's head: see Kept.at_call)
            return None
        if k.backend is not ctx.backend:
            return None
        # (check.plain, inline, its flags read once: every step of a series asks)
        if type(data) is not np.ndarray or type(position) is not int or position < 0:
            return None
        nbytes = k.nbytes
        if data.nbytes != nbytes or not nbytes:
            return None
        flags, writing = data.flags, self.writing
        c_order = flags.c_contiguous
        if not (c_order or flags.f_contiguous) or not (writing or flags.writeable):
            return None
        mode = ctx.mode
        if mode == "closed" or (writing and (mode == "r" or ctx.aborted)):
            return None
        if c_order and data.dtype.kind in _NUMBERS:
            buf = data
        else:
            try:  # (an object array: the general way's checks raise it, agreed)
                buf = _bytes(data)
            except Exception:  # noqa: BLE001
                return None
        lo = at + position * k.view.etype_size
        if self.maps:
            return self._read_mapped(ctx, lo, data, buf, None, position, t0)
        return self._go(ctx, lo, data, buf, None, position, t0)

    @staticmethod
    def _where(layout: Any, offset: int, arr: Any) -> Any:
        """What :func:`_agree` and :func:`_settle` take as ``where``: the layout, its
        offset and the array, or (``layout`` None) the etype position in the view."""
        return offset if layout is None else (layout, offset, arr, None)

    def _go(self, ctx: Context, lo: int, arr: Any, buf: Any, layout: Any, offset: int,
            t0: float) -> Literal[True] | Headed | None:  # fmt: skip
        """The call of ``arr`` (its bytes ``buf``, a buffer os.pwrite takes) from ``lo``
        through ``layout`` at its ``offset``, or (``layout`` None) through the view from
        etype ``offset``, once the layout or view took it; None: not taken, nothing
        done."""
        k, writing = self.k, self.writing
        n = k.span
        hi = lo + n
        if hi >= speculate.BIG:
            return None
        d = 0
        if writing or k.path is not _MAPPED:  # (as _tail: moved alike from disjoint extents)
            if not writing and ctx.read_aggregators is not None:
                return None
            ext = ctx.extents
            if ext is None or not ext[2] or ext[1] - ext[0] != n:
                return None
            d = lo - ext[0]
            shift = 2 * d if d >= 0 else -2 * d - 1
            if shift != k.shift:
                return None
            moved = False
        elif ctx.read_aggregators is not None or not self.maps or n > ONE_PREAD_BYTES:
            return None
        else:
            ext = ctx.extents
            if ext is not None and n > 0 and ext[1] - ext[0] == n:  # (moved_by, inline)
                d = lo - ext[0]
                moved, shift = False, 2 * d if d >= 0 else -2 * d - 1
            else:
                moved, shift = moved_by(ext, lo, hi)
        be, fd = self.be, self.fd
        before: Before | None = None
        fresh = False  # (past the end: nothing kept, a Before made only when needed)
        old: bytes | None = None  # (a small run's kept bytes, as read)
        size, done, error = speculate.BIG, 1, None
        key: tuple[Any, ...] = ()
        t = time.perf_counter()
        try:
            if writing:
                size = os.lseek(fd, 0, os.SEEK_END)
                known, self.end = self.end, -1  # (known again once this call completes)
                if self.mark != ctx.writes:  # (another write since: its end is not known)
                    known = -1
                if lo >= size:  # (a time series' next step: nothing to keep)
                    fresh = True
                elif 0 <= known == self.alo + d <= lo and size <= self.ahi + d:
                    # the next step of a series appending to the file, whose other ranks
                    # wrote theirs first: the file ended at ``known`` after the step's
                    # last call, where this call's extent (the last one's moved by ``d``)
                    # starts, and it ends within that extent, so what lies past ``known``
                    # is this call's: nothing is kept, and a take-back cuts the file back
                    # to ``known``.  Asking whether the range is a hole (keep_one's lseek)
                    # would wait for the inode lock the other ranks' writes hold.  (A
                    # write or a size set by other means, another handle or process,
                    # into this call's own extent since the last step, a conflicting
                    # access, is not kept.)
                    fresh, size = True, known
                elif n < HOLE_MIN:  # (keep_one of a small run: its bytes as one pread
                    # gives them, a Before made only for a call that may be taken back)
                    old = os.pread(fd, min(n, size - lo), lo)
                else:
                    before = keep_one(fd, size, lo, n, speculate.KEEP_LIMIT)
                    if before is None:
                        return None
            try:
                if writing:
                    if n < DIRECT_MIN:  # (PosixBackend.write_one's small write, inline)
                        be.dirty = True
                        if os.pwrite(fd, buf, lo) != n:
                            pwrite_all(fd, _bytes(arr), lo, be.path)
                    else:
                        be.write_one(lo, _bytes(arr))
                elif self.maps:  # (MappedReads.read_if_maps of a small run, inline:
                    # the same function, found where that method finds it)
                    if filereads.pread_zeros(fd, buf, lo) < n:  # type: ignore[attr-defined]
                        return None  # (past the end: the general way reads it again)
                else:
                    done = be.read_one(lo, _bytes(arr))  # type: ignore[assignment]
            except BaseException as exc:
                raised = storage_error(be, exc)
                if raised is exc:
                    raise
                raise raised from exc
            fl = be.flusher  # (PosixBackend.take_counts and the flusher's take_count, inline)
            flushes = 0
            if fl is not None:
                flushes, fl.count = fl.count, 0
            key = (done, be.direct_bytes, flushes, be.mapped_bytes)
            be.direct_bytes = be.mapped_bytes = 0
        except BaseException as exc:
            if not kept(exc):
                raise
            error = exc
        end = time.perf_counter()
        if error is not None or key != k.key:
            io = (_kept(size, lo, n, fresh, before, old), size, key, done, end - t, error)
            return _agree(ctx, k, self._where(layout, offset, arr), lo, _bytes(arr), moved,
                          shift, io, end, writing=writing, t0=t0)  # fmt: skip
        head = k.head
        sig = k.facts[3]
        if sig >= 0:  # (checkfacts.placed, inline; a view's array starts at 0)
            sig = (sig + offset if layout is not None else sig) & PLACED
        _PATCH_WRITE(
            head.own, lo, hi, moved, shift, size, int((end - t) * 1e9), int((end - t0) * 1e9), sig
        )  # fmt: skip
        head.slots[0] = 0
        head.agree(ctx.comm)
        got = head.got
        if got[1] != -got[2]:
            io = (_kept(size, lo, n, fresh, before, old), size, key, done, end - t, error)
            _mismatch(ctx, k, head, io, writing)
        out = head.got_own
        guessed, same, sig, items, alo, ahi, t_io, t_total = _READ(out)
        if got[0] or not (guessed and same) or sig is None or items is None:
            io = (_kept(size, lo, n, fresh, before, old), size, key, done, end - t, error)
            return _settle(ctx, k, self._where(layout, offset, arr), lo, _bytes(arr), io,
                           bool(got[0]), out, writing=writing)  # fmt: skip
        if k.path is _DIRECT:  # (speculate.complete's extents; a mapped read keeps them)
            ctx.extents = (lo, hi, True)
        if writing:  # (the file's size now: no rank's write ends past the agreed end)
            self.end, self.alo, self.ahi = max(size, ahi), alo, ahi
            ctx.writes += 1
            self.mark = ctx.writes
        return self._complete(ctx, alo, ahi, t_io, t_total)

    def _complete(self, ctx: Context, alo: int, ahi: int, t_io: int,
                  t_total: int) -> Literal[True]:  # fmt: skip
        """Local: the completion (:func:`collio.speculate.complete`, inline) of a call of
        the step complete at its head, of the agreed extent ``alo``-``ahi`` and times."""
        k, writing = self.k, self.writing
        calls = self.calls
        s = calls.serial
        calls.serial, k.serial = s + 1, s
        keys = calls.keys
        ident = k.ident
        keys.append(ident)
        if len(keys) > speculate.KEPT_CALLS + 2:
            del keys[0]
        if len(keys) > 2 and ident == keys[-2] == keys[-3]:
            calls.period = 1
        else:
            calls.period = speculate._period(keys)  # (KeptCalls.completed's rule)
        calls.step = self
        ctx.guesses[writing] = k
        stats = ctx.stats
        stats._add(k.sums)  # (Stats.add_again's sums; the times below)
        stats.time_io += t_io / 1e9
        stats.time_total += t_total / 1e9
        stats.direct_calls += 1
        stats.last_facts = (*self.pre, [alo, ahi], *self.post)
        stats._local_of = self.local  # (Stats.local_when_read, inline: no dict per call)
        return True

    def _read_mapped(self, ctx: Context, lo: int, arr: Any, buf: Any, layout: Any, offset: int,
              t0: float) -> Literal[True] | Headed | None:  # fmt: skip
        """:meth:`_go` of a read that every rank copied from the mapped file
        (:attr:`maps`), the step of a time series' small reads: ``_go``'s read with its
        write's branches left out (nothing kept to take back, the size not asked, one
        request done), and the completion it shares with ``_go``."""
        k = self.k
        n = k.span
        hi = lo + n
        if hi >= speculate.BIG or ctx.read_aggregators is not None or n > ONE_PREAD_BYTES:
            return None
        ext = ctx.extents
        if ext is not None and n > 0 and ext[1] - ext[0] == n:  # (moved_by, inline)
            d = lo - ext[0]
            moved, shift = False, 2 * d if d >= 0 else -2 * d - 1
        else:
            moved, shift = moved_by(ext, lo, hi)
        be = self.be
        error = None
        key: tuple[Any, ...] = ()
        t = time.perf_counter()
        try:
            try:  # (MappedReads.read_if_maps of a small run, inline, as in _go)
                if filereads.pread_zeros(self.fd, buf, lo) < n:  # type: ignore[attr-defined]
                    return None  # (past the end: the general way reads it again)
            except BaseException as exc:
                raised = storage_error(be, exc)
                if raised is exc:
                    raise
                raise raised from exc
            fl = be.flusher  # (as _go: PosixBackend.take_counts, inline)
            flushes = 0
            if fl is not None:
                flushes, fl.count = fl.count, 0
            key = (1, be.direct_bytes, flushes, be.mapped_bytes)
            be.direct_bytes = be.mapped_bytes = 0
        except BaseException as exc:
            if not kept(exc):
                raise
            error = exc
        return self._headed_read(ctx, lo, hi, arr, layout, offset, moved, shift,
                                 (None, speculate.BIG, key, 1, time.perf_counter() - t, error),
                                 t, t0, False)  # fmt: skip

    def _headed_read(self, ctx: Context, lo: int, hi: int, arr: Any, layout: Any, offset: int,
                     moved: bool, shift: int, io: tuple[Any, ...], t: float, t0: float,
                     several: bool) -> Literal[True] | Headed:  # fmt: skip
        """The rest of a read step's call after its I/O (``io``: the lane's tuple of it,
        begun at ``t``): its one agreement and completion, or the lane's own way on
        (:func:`_agree` for an error or other requests than the kept call's, then
        :func:`_settle` for a call not complete at its head).  ``several``: the step's
        rows (:meth:`_read_rows`), whose runs the lane's way goes on from, moved."""
        k = self.k
        end = t + io[4]
        if io[5] is not None or io[2] != k.key:
            where = self._moved(layout, offset, arr, lo) if several else self._where(
                layout, offset, arr)  # fmt: skip
            return _agree(ctx, k, where, lo, _bytes(arr), moved, shift, io, end, writing=False,
                          t0=t0)  # fmt: skip
        head = k.head
        sig = k.facts[3]
        if sig >= 0:  # (checkfacts.placed, inline; a view's array starts at 0)
            sig = (sig + offset if layout is not None else sig) & PLACED
        _PATCH_READ(head.own, lo, hi, moved, shift, int(io[4] * 1e9), int((end - t0) * 1e9),
                    sig)  # fmt: skip
        head.slots[0] = 0
        head.agree(ctx.comm)
        got = head.got
        if got[1] != -got[2]:
            _mismatch(ctx, k, head, io, False)
        out = head.got_own
        guessed, same, sig, items, alo, ahi, t_io, t_total = _READ(out)
        if got[0] or not (guessed and same) or sig is None or items is None:
            where = self._moved(layout, offset, arr, lo) if several else self._where(
                layout, offset, arr)  # fmt: skip
            return _settle(ctx, k, where, lo, _bytes(arr), io, bool(got[0]), out, writing=False)
        return self._complete(ctx, alo, ahi, t_io, t_total)

    def _read_rows(self, ctx: Context, lo: int, arr: Any, layout: Any, offset: int,
                   t0: float) -> Literal[True] | Headed | None:  # fmt: skip
        """:meth:`_read_mapped` of several runs (:attr:`rows`) whose first starts at
        ``lo``: the lane's read of them (``MappedReads.read_runs`` of rows within
        ``GATHER_BYTES``: one ``pread`` of their extent into the backend's gather buffer,
        one numpy copy of the rows into ``arr``), with the views of that buffer made
        once, and whether the runs lie within the file (the lane asks the size first:
        ``maps_reads``) told by the bytes read, as a step's one run tells it.  The
        moved runs are made only for a call that goes the lane's way after all."""
        k = self.k
        n = k.span
        hi = lo + n
        if hi >= speculate.BIG or ctx.read_aggregators is not None:
            return None
        ext = ctx.extents
        if ext is not None and n > 0 and ext[1] - ext[0] == n:  # (moved_by, inline)
            d = lo - ext[0]
            moved, shift = False, 2 * d if d >= 0 else -2 * d - 1
        else:
            moved, shift = moved_by(ext, lo, hi)
        be = self.be
        rows = self.rows
        assert rows is not None
        error = None
        key: tuple[Any, ...] = ()
        t = time.perf_counter()
        try:
            if be._gather is not self.gather or be._gather is None:
                # (MappedReads._gather_buffer, and the views of it: made again inside the
                # I/O's step, so that a rank out of memory is agreed, not raised alone
                # while the others wait in the agreement)
                g = be._gather_buffer(self.need)
                self.src = g[:n]
                self.shelf = g[: rows.span].reshape(rows.count, rows.stride)[:, : rows.length]
                self.typed = _typed(self.shelf, k.box, rows)
                self.gather = g
            try:  # (read_gathered with its rows, inline)
                if filereads.pread_zeros(self.fd, self.src, lo) < n:  # type: ignore[attr-defined]
                    return None  # (past the end: the general way reads it again)
                typed = self.typed
                if typed is not None:
                    np.copyto(arr.T if self.f_order else arr, typed)
                else:  # (Rows.copy, from the view made once)
                    m = rows.mem
                    dest = arr.reshape(-1, order="A").view(np.uint8)
                    np.copyto(dest[m : m + rows.count * rows.length].reshape(rows.count, -1),
                              self.shelf)  # fmt: skip
            except BaseException as exc:
                raised = storage_error(be, exc)
                if raised is exc:
                    raise
                raise raised from exc
            fl = be.flusher  # (as _go: PosixBackend.take_counts, inline)
            flushes = 0
            if fl is not None:
                flushes, fl.count = fl.count, 0
            key = (rows.count, be.direct_bytes, flushes, be.mapped_bytes + rows.count * rows.length)
            be.direct_bytes = be.mapped_bytes = 0
        except BaseException as exc:
            if not kept(exc):
                raise
            error = exc
        return self._headed_read(
            ctx, lo, hi, arr, layout, offset, moved, shift,
            (None, speculate.BIG, key, rows.count, time.perf_counter() - t, error), t, t0, True,
        )  # fmt: skip

    def _moved(self, layout: Any, offset: int, arr: Any, lo: int) -> Any:
        """:meth:`_where` of a read of several runs: with the kept runs moved to ``lo``,
        as :func:`layout_again` moves them (what the general way goes on from)."""
        runs = self.k.runs
        return layout, offset, arr, runs.moved(lo - self.first)


def _typed(shelf: Any, box: Any, rows: Rows) -> Any:
    """Local: the rows ``shelf`` (a uint8 view, one row per run) as a view of the kept
    box's elements in its array's memory order (its shape; reversed for Fortran order),
    for a copy into the array that is a copy of bytes: the rows fill the array from its
    start, each a whole number of elements; None where no such view exists."""
    shape, dtype = box[2], np.dtype(box[3])
    size = dtype.itemsize
    whole = rows.count * rows.length == size * int(np.prod(shape))
    if rows.mem != 0 or rows.length % size or not whole:
        return None
    try:  # (a reshape that would copy raises: a copy is no view of the rows)
        return np.reshape(shelf.view(dtype), shape[::-1] if box[4] == "F" else shape, copy=False)
    except (ValueError, TypeError):
        return None


def _kept(size: int, lo: int, n: int, fresh: bool, before: Before | None,
          old: bytes | None) -> Before | None:  # fmt: skip
    """Local: what a step's write of ``n`` bytes from ``lo`` kept to take it back, as
    :func:`keep_one` keeps it: nothing past the end (``fresh``), a small run's bytes as
    read (zeros for any the file no longer had, as ``pread_zeros`` gives), or
    ``keep_one``'s own (a range in a hole: its zeros, asked, not read; None for a read)."""
    if fresh:
        return Before(size, [])
    if old is None:
        return before
    m = min(n, size - lo)
    if len(old) < m:
        old += bytes(m - len(old))
    return Before(size, [(lo, np.frombuffer(old, np.uint8))])


def _bytes(arr: Any) -> Any:
    """An array's bytes, as one flat uint8 array (the lane's buffers)."""
    return arr.reshape(-1, order="A").view(np.uint8)


def _mismatch(ctx: Context, k: speculate.Kept, head: KeptHead, io: tuple[Any, ...],
              writing: bool) -> NoReturn:  # fmt: skip
    """Collective over ``ctx.comm``: the ranks met other calls at a step's head
    (:func:`collio.collective.call_kept_head`'s mismatch, its write taken back)."""
    before, size = io[0], io[1]
    undo = None if before is None else functools.partial(_undo, ctx, k, writing, io)
    try:
        raise_kept_mismatch(ctx.comm, head, None if before is None else size, undo)
    except MismatchError:
        ctx.stats.local = {}  # (as the general way leaves it)
        raise


def _taken(ctx: Context, k: speculate.Kept, position: Any, data: Any, *,
           writing: bool) -> tuple[int, Any, bool, int] | None:  # fmt: skip
    """Local: whether the lane takes the call (its first byte, its buffer as bytes and
    its extent's ``moved`` and ``shift``), or None: the conditions of
    :func:`collio.check.again` and :func:`collio.speculate.attempt`, with ints."""
    if not check.plain(ctx, k, position, data, writing=writing):
        return None
    assert k.at is not None
    lo = k.at + position * k.view.etype_size
    taken = _tail(ctx, k, lo, writing=writing)
    if taken is None:
        return None
    if data.dtype is _U8 and data.ndim == 1:
        return lo, data, *taken
    try:  # (an object array: the general way's checks raise it, agreed)
        return lo, data.reshape(-1, order="A").view(np.uint8), *taken
    except Exception:  # noqa: BLE001
        return None


def _tail(ctx: Context, k: speculate.Kept, lo: int, *, writing: bool,
          runs: Runs | None = None) -> tuple[bool, int] | None:  # fmt: skip
    """Local: whether a call of the lane whose extent starts at ``lo`` is taken (its
    ``moved`` and ``shift``), or None: the conditions of :func:`collio.speculate.attempt`
    on the file, the extent and the mapping (``runs``: the call's, when not one)."""
    if k.hints is not ctx.hints or k.backend is not ctx.backend:
        return None
    n = k.span
    if not writing and ctx.read_aggregators is not None:
        return None  # (the general way reads with a copy of the context)
    if lo + n >= speculate.BIG:
        return None  # (past every real size: the general way's checks say so, agreed)
    ext = ctx.extents
    moved, shift = moved_by(ext, lo, lo + n)
    if writing or k.path is not _MAPPED:  # (as speculate.attempt)
        if moved or shift != k.shift or ext is None or not ext[2]:
            return None
    elif runs is None:  # (the read asks the backend whether it maps: _io)
        if not may_map(ctx.hints, writing=False):
            return None
    elif _mapped(ctx, k, lo, n, runs) != k.facts[1]:
        return None
    return moved, shift


def _mapped(ctx: Context, k: speculate.Kept, lo: int, n: int, runs: Runs | None) -> bool | None:
    """Local: whether this rank would copy the read from the mapped file (None: asking
    failed, which the general way's checks agree on, as in :func:`collio.check.again`)."""
    try:
        if not may_map(ctx.hints, writing=False):
            return False
        be = k.backend
        return bool(be.maps_one(lo, n) if runs is None else be.maps_reads(runs))
    except Exception:  # noqa: BLE001
        return None


def _run(ctx: Context, k: speculate.Kept, where: Any, lo: int, buf: Any, moved: bool,
         shift: int, *, writing: bool, t0: float) -> Literal[True] | Headed | None:  # fmt: skip
    """Collective over ``ctx.comm`` unless it returns None (a write that cannot be taken
    back: nothing done): the call's I/O, its head, and its completion or what the
    general way goes on from (the module doc).  ``where``: the etype position in the
    view, or the layout, its offset and the array."""
    runs = None if type(where) is int else where[3]
    maps = not writing and runs is None and k.path is _MAPPED
    got = _io(ctx.backend, lo, buf, k.nbytes, writing=writing, runs=runs, maps=maps)
    if got is None:
        return None
    return _agree(ctx, k, where, lo, buf, moved, shift, *got, writing=writing, t0=t0)


def _agree(ctx: Context, k: speculate.Kept, where: Any, lo: int, buf: Any, moved: bool,
           shift: int, io: tuple[Any, ...], end: float, *, writing: bool,
           t0: float) -> Literal[True] | Headed:  # fmt: skip
    """Collective over ``ctx.comm``: :func:`_run` after the I/O (``io``, as :func:`_io`
    returns it, ended at ``end``)."""
    before, size, key, done, seconds, error = io
    head = k.head if k.head is not None else _head(ctx, k, writing)
    hi = lo + k.span
    _PATCH(
        head.own, lo, hi, moved, shift, error is None, size, key == k.key,
        int(seconds * 1e9), int((end - t0) * 1e9),
        placed(k.facts[3], 0 if type(where) is int else where[1]),
    )  # fmt: skip
    try:
        failed, out = call_kept_head(
            ctx.comm, head, error is not None, extra=None if before is None else size,
            undo=None if before is None else functools.partial(_undo, ctx, k, writing, io),
        )  # fmt: skip
    except MismatchError:
        ctx.stats.local = {}  # (as the general way leaves it)
        raise
    return _settle(ctx, k, where, lo, buf, io, failed, out, writing=writing)


def _settle(ctx: Context, k: speculate.Kept, where: Any, lo: int, buf: Any,
            io: tuple[Any, ...], failed: bool, out: Any, *,
            writing: bool) -> Literal[True] | Headed:  # fmt: skip
    """Local: the call complete at its head (the agreed maxima ``out``), or what the
    general way goes on from."""
    guessed, same, sig, items, alo, ahi, t_io, t_total = _READ(out)
    if failed or not (guessed and same) or sig is None or items is None:
        g = speculate.Guess(k, writing, *io)
        return _pending(ctx, g, where, lo, buf), (failed, tuple(out))
    speculate.complete(ctx, k, alo, ahi, (lo, lo + k.span), (t_io, t_total), writing=writing)
    return True


def _undo(ctx: Context, k: speculate.Kept, writing: bool, io: tuple[Any, ...],
          exc: MismatchError) -> None:  # fmt: skip
    """Local: a guessed write met another call (``call_head``'s ``undo``)."""
    speculate.after_mismatch(ctx, speculate.Guess(k, writing, *io), exc)


def _io(be: Any, lo: int, buf: Any, n: int, *, writing: bool, runs: Runs | None = None,
        maps: bool = False) -> tuple[tuple[Any, ...], float] | None:  # fmt: skip
    """Local: :func:`collio.speculate.attempt`'s I/O of the one run (of ``runs`` when
    given): what the write kept
    to take back (None: nothing to keep, it was read), the target's size before it, the
    requests' key, their result, the seconds and the error (kept, not raised), and when
    it ended; None: the write could not be taken back, or the read (``maps``: of a call
    whose every rank copied from the mapped file) found that this rank would not, and
    it is not the lane's (what it read is read again the general way)."""
    before, size, key, done, error = None, speculate.BIG, (), None, None
    t = time.perf_counter()
    try:  # (as Attempt and storage_errors: every small call passes here)
        if writing:
            if runs is None:
                before = be.keep_before_one(lo, n, speculate.KEEP_LIMIT)
            else:
                before = be.keep_before(runs, speculate.KEEP_LIMIT)
            if before is None:
                return None
            size = before.size
        try:
            if runs is not None:
                done = be.write_runs(runs, buf) if writing else be.read_runs(runs, buf)
            elif maps:
                mapped, done = be.read_if_maps(lo, buf)
                if not mapped:
                    return None
            else:
                done = be.write_one(lo, buf) if writing else be.read_one(lo, buf)
        except BaseException as exc:
            got = storage_error(be, exc)
            if got is exc:
                raise
            raise got from exc
        key = (done, *be.take_counts())
    except BaseException as exc:
        if not kept(exc):
            raise
        error = exc
    end = time.perf_counter()
    return (before, size, key, done, end - t, error), end


def _head(ctx: Context, k: speculate.Kept, writing: bool) -> KeptHead:
    """The head of a call of the lane that repeats ``k``, before its patch (its facts are
    ``k``'s, as :func:`collio.check.again` finds them); kept on ``k``."""
    small, mapped, checked, sig = k.facts
    own = Checked(
        lo=0, hi=0, small=small, mapped=mapped, checked=checked, sig=sig, plan=-1, items=-1,
        vouched=False, plan_shift=0, guessed=False, size=0, io_only=True, same=False,
        t_io=0, t_total=0, moved=True, shift=NOT_COMPARED,
    ).slots()  # fmt: skip
    name = ("write" if writing else "read") + ("_at_all" if k.at_call else "_all")
    head = k.head = KeptHead(name, ctx.file, own, ctx.comm)
    return head


def _pending(ctx: Context, g: speculate.Guess, where: Any, lo: int, buf: Any) -> Any:
    """Local: the pending call that :func:`collio.check.again` (:func:`collio.check.check`
    for a layout) would have made for this call, with its guess ``g`` (for a call not
    complete at its head)."""
    k = g.kept
    ctx.stats.local = {}
    name = ("write" if g.writing else "read") + ("_at_all" if k.at_call else "_all")
    extent = (lo, lo + k.span)
    if type(where) is int:
        runs, _ = k.view.stream(where * k.view.etype_size, k.nbytes, 0)
        extra, sig = None if g.writing else buf, None
    else:  # (a layout, its offset and the array)
        runs = ctx.backend.runs_for(where[0]) if where[3] is None else read_only(where[3])
        sig = where[0].signature()
        extra = None if g.writing else where[2]
    return check.Pending(
        g.writing, name, None, runs, buf, extra, sig, k.facts, extent, None, g.error, g, (),
    )  # fmt: skip
