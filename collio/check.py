"""A call up to its path: local checks, then its head, the one agreement before bytes move.

Every rank runs every step, so nothing hangs:

1. *before the head* (local): validate the layout and data, find the runs, the facts the
   path is chosen from (:class:`~collio.checkfacts.Checked`), a kept plan for these runs;
   a single call (or a batch's read) that repeats this rank's last one does its I/O now
   (:mod:`collio.speculate`).  Nothing here communicates: ranks in different calls must
   meet in the head first.  :func:`again` is the same for a buffer written (read) through
   a file view at a new position, when what its checks would find is known from the last
   call: the same view, a buffer of the same size, the view's runs moved by whole tiles;
2. *the head* (:func:`~collio.collective.call_head`): one allreduce agrees on the call
   itself, every rank's errors and the facts;
3. *after the head*: raise the agreed error on every rank (taking back a guessed write
   first), or settle a call every rank guessed, or choose the path
   (:func:`~collio.choose.choose`).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from . import speculate
from .backends.base import Backend
from .checkfacts import Checked, digest_kept, moved, placed, unzigzag, zigzag
from .choose import checked, choose
from .collective import Attempt, call_head, detached, raise_agreed
from .context import Call, Context
from .errors import LayoutError, MismatchError, ModeError, OverlapError
from .facts import NOT_COMPARED
from .layouts.arrays import Subarray
from .layouts.base import Layout
from .mismatch import raise_count_mismatch, raise_mismatch
from .policy import Path, has_many_small_runs, may_map
from .rounds import prepare as prepare_rounds
from .runs import Runs, first_overlap, is_read_only, read_only

__all__ = ["Pending", "again", "check", "one_layout"]

#: An empty rank's first byte: above every real one.
BIG = 2**62


@dataclasses.dataclass(slots=True, eq=False)
class Pending:
    """A call up to its head on this rank: what its checks found, what it contributes."""

    writing: bool
    name: str  # the call, for messages (write_all, read_all_many, ...)
    count: int | None  # a batch's items (-1: not a sequence; None: a single call)
    runs: Runs
    buf: npt.NDArray[np.uint8]
    extra: Any  # what the layout's prepare returned beside the buffer
    sig: Any  # the layout's global array (None: not compared)
    facts: tuple[Any, ...]  # this rank's (small, mapped, checked, signature digest)
    extent: tuple[int, int]  # this rank's (lo, hi); (BIG, 0) when empty
    mine: Checked | None  # (None: the head was made elsewhere, collio.quick)
    error: BaseException | None  # this rank's, not yet agreed (its checks' or its I/O's)
    guess: speculate.Guess | None
    prekey: tuple[Any, ...]


def check(
    ctx: Context, source: Any, *, writing: bool, count: int | None = None,
    disjoint: bool = False, t0: float = 0.0,
) -> tuple[Runs, npt.NDArray[np.uint8], Any, Call]:  # fmt: skip
    """Collective over ``ctx.comm``: the steps of the module doc, for a call whose
    ``source()`` (local) checks its layout (or a batch's items) and returns its runs,
    buffer, what goes beside it and the signature.  ``disjoint`` is the caller's word
    that no two ranks' runs overlap (agreed: direct only if every rank gives it); ``t0``
    the call's start.  Returns the runs, buffer, extra and the call (``settled``: done)."""
    p = before_head(ctx, source, writing=writing, count=count, disjoint=disjoint, t0=t0)
    return resume(ctx, (p, head(ctx, p)))


#: A call that went as far as its head: the pending call and the head's outcome (whether
#: any rank failed, the maxima of its slots), made here or by :mod:`collio.quick`.
Headed = tuple["Pending", tuple[bool, tuple[int, ...]]]


def resume(ctx: Context, headed: Headed) -> tuple[Runs, npt.NDArray[np.uint8], Any, Call]:
    """Collective over ``ctx.comm``: step 3 of the module doc for a call past its head;
    the runs, buffer, extra and the call, as :func:`check` returns them."""
    p, (failed, out) = headed
    return p.runs, p.buf, p.extra, after_head(ctx, p, failed, out)


def before_head(
    ctx: Context, source: Any, *, writing: bool, count: int | None, disjoint: bool, t0: float
) -> Pending:
    """Local: step 1 of the module doc."""
    ctx.stats.local = {}
    step = Attempt()
    # what a rank that fails contributes (its flag makes every rank raise first)
    runs, buf, extra, sig, mapped = _FAILED
    d, offset = NOT_COMPARED, 0
    with step:
        runs, buf, extra, sig, mapped = _check_locally(ctx, source, writing=writing)
        # (the offset is not a fact: a time series moves it; a user's signature that
        # cannot be digested fails this rank's checks, agreed like them)
        d, offset = digest_kept(sig)
    # (a batch's write counts the ranges of the file its runs cover where the backend
    # writes each range with one request: see has_many_small_runs)
    joined = writing and count is not None and ctx.backend.joins_runs
    small = has_many_small_runs(runs, ctx.hints.direct_threshold, joined=joined)
    facts = (small, mapped, checked(runs), d)
    extent = runs.extent() if len(runs.length) else (BIG, 0)
    where = moved(ctx.extents, *extent)
    g = None
    # (a batch's read too: its runs fill the span of its items' buffers.  Not a batch's
    # write: a guessed write needs the ranks' extents apart, and a time series' batch
    # interleaves them, while a batch whose extents lie apart, a checkpoint's, is made
    # once)
    if (count is None or not writing) and step.error is None:
        g = speculate.attempt(ctx, runs, buf, facts, where, writing=writing,
                              many=count is not None)  # fmt: skip
    plan, prekey = (-1, 0), ()
    if g is None and step.error is None:
        prekey = _prekey(ctx, writing)
        with step:
            plan = _kept_plan(ctx, prekey, runs, writing=writing)
    name = ctx.call_name(writing)
    name = name if count is None else name + "_many"
    return _pending(
        ctx, writing, name, count, (runs, buf, extra, sig), facts, extent, where, g,
        step.error, disjoint=disjoint, plan=plan, prekey=prekey, t0=t0, offset=offset,
    )  # fmt: skip


def again(ctx: Context, fview: Any, position: Any, data: Any, *, writing: bool,
          t0: float) -> Pending | None:  # fmt: skip
    """Local: step 1 of the module doc for ``data`` through the view ``fview`` from etype
    ``position``, when this rank's last call of its kind was one through the same view with
    a buffer of the same size (so its checks would pass again and find the same facts),
    and its I/O was done now (:func:`collio.speculate.attempt`); None (nothing done): not
    so, the call takes the general way."""
    k = speculate.candidate(ctx, writing)
    if k is None or k.view is not fview or not plain(ctx, k, position, data, writing=writing):
        return None
    try:  # (anything failing here is the general way's to agree on, as its checks find it)
        buf = data if data.dtype == np.uint8 and data.ndim == 1 else data.reshape(-1, order="A")
        buf = buf.view(np.uint8)
        runs, bad = fview.stream(position * fview.etype_size, k.nbytes, 0)
        if bad >= 0 or runs.length is not k.lengths:
            return None
        facts = k.facts
        if not writing:
            mapped = may_map(ctx.hints, writing=False) and ctx.backend.maps_reads(runs)
            if mapped != facts[1]:
                return None
    except Exception:  # noqa: BLE001
        return None
    ctx.stats.local = {}
    extent = runs.extent()
    where = moved(ctx.extents, *extent)
    g = speculate.attempt(ctx, runs, buf, facts, where, writing=writing)
    if g is None:
        return None
    name = ctx.call_name(writing)
    found = (runs, buf, None if writing else buf, None)
    return _pending(ctx, writing, name, None, found, facts, extent, where, g, None, t0=t0)


def plain(ctx: Context, k: speculate.Kept, position: Any, data: Any, *, writing: bool) -> bool:
    """Local: whether ``data`` at etype ``position`` may repeat ``k``'s call through its
    view without the buffer's checks: an ndarray of ``k``'s bytes, contiguous (writeable
    for a read), at an int position, on a file that takes the call (else the general
    way raises what it must).  :func:`again` and :mod:`collio.quick` ask the same."""
    if type(data) is not np.ndarray or type(position) is not int or position < 0:
        return False
    if data.nbytes != k.nbytes or not k.nbytes:
        return False
    flags = data.flags
    if not (flags.c_contiguous or flags.f_contiguous) or not (writing or flags.writeable):
        return False
    mode = ctx.mode
    return not (mode == "closed" or (writing and (mode == "r" or ctx.aborted)))


def _pending(
    ctx: Context, writing: bool, name: str, count: int | None,
    found: tuple[Runs, npt.NDArray[np.uint8], Any, Any], facts: tuple[Any, ...],
    extent: tuple[int, int], where: dict[str, Any], g: speculate.Guess | None,
    error: BaseException | None, *, disjoint: bool = False, plan: tuple[int, int] = (-1, 0),
    prekey: tuple[Any, ...] = (), t0: float, offset: int = 0,
) -> Pending:  # fmt: skip
    """Local: the call up to its head, with this rank's facts for it (``offset``: where
    the layout's global array starts, :func:`collio.checkfacts.digest_kept`)."""
    runs = found[0]
    io_error = g.error if g is not None else None
    seconds = speculate.times(g.seconds if g is not None else 0.0, t0)
    mine = Checked(
        lo=extent[0], hi=extent[1], small=facts[0], mapped=facts[1], checked=facts[2],
        sig=placed(facts[3], offset), plan=plan[0], items=-1 if count is None else count,
        vouched=disjoint,
        plan_shift=zigzag(plan[1]) if len(runs.length) else NOT_COMPARED,
        guessed=g is not None and io_error is None, size=g.size if g is not None else BIG,
        io_only=error is None, same=g is not None and g.key == g.kept.key,
        t_io=seconds[0], t_total=seconds[1], **where,
    )  # fmt: skip
    return Pending(writing, name, count, *found, facts, extent, mine, error or io_error, g, prekey)


def head(ctx: Context, p: Pending) -> tuple[bool, tuple[int, ...]]:
    """Collective over ``ctx.comm``: the call's first operation, as of every collective
    call on a file; a call mismatch (a read beside a write, a sync, ...) is raised first,
    before any rank's own error, a guessed write taken back before.  Returns whether any
    rank failed, and the maxima of the call's slots."""
    g, mine = p.guess, p.mine
    assert mine is not None
    size = g.size if g is not None and g.wrote else None

    def undo(exc: MismatchError) -> None:
        speculate.after_mismatch(ctx, g, exc)

    return call_head(
        ctx.comm, p.name, ctx.file, p.error is not None, mine.slots(),
        extra=size, undo=None if size is None else undo,
    )  # fmt: skip


def after_head(ctx: Context, p: Pending, failed: bool, out: tuple[int, ...]) -> Call:
    """Collective over ``ctx.comm``: step 3 of the module doc."""
    agreed, g = Checked.agreed(out), p.guess
    if failed or agreed.items is None or agreed.sig is None:
        speculate.take_back(ctx, g, agreed.size)  # (a write guessed: nothing stays)
    if (agreed.items is None or agreed.sig is None) and p.error is not None:
        detached(p.error)  # (a rank's own error, not raised: no cycle through its frames)
    if agreed.items is None:  # (item k means nothing when the counts differ)
        raise_count_mismatch(ctx.comm, -1 if p.count is None else p.count, p.name)
    if failed:  # (a take-back's failure rides on the call's error)
        error = p.error or (g.error if g is not None else None)
        raise_agreed(ctx.comm, error, what="backend I/O" if agreed.io_only else p.name)
    if agreed.sig is None:
        raise_mismatch(ctx.comm, p.sig, p.name)
    if agreed.guessed:  # every rank did its I/O: the path can only be the last call's
        assert g is not None
        slowest = (agreed.t_io, agreed.t_total)
        call = speculate.settle(ctx, g, agreed.lo, agreed.hi, p.extent, agreed.same, slowest)
        if call.settled:
            return call
    else:
        call = choose(ctx, agreed, p.runs, p.extent, writing=p.writing, what=p.name)
        if g is not None and call.direct and not (p.writing and call.path is not Path.DIRECT):
            call.early = g  # (its I/O is this path's)
        elif g is not None and g.wrote:
            # (every rank takes its guess back before the path's first collective, so no
            # aggregator writes before: a kept plan, which needs none, is never found by a
            # call some rank guessed, whose plan fact is -1; a failure is agreed at the end)
            speculate.take_back(ctx, g, agreed.size)
            call.failed = g.error
    call.prekey, call.nruns, call.name = p.prekey or _prekey(ctx, p.writing), len(p.runs), p.name
    call.facts, call.shift = p.facts, agreed.shift if agreed.shift is not None else -1
    call.sig = agreed.sig
    if agreed.plan is not None and agreed.plan_shift is not None:
        # every rank found the plan of the same earlier call (or none), its runs shifted alike
        call.plan_epoch = agreed.plan
        call.plan_shift = unzigzag(agreed.plan_shift) if agreed.plan_shift >= 0 else 0
    return call


#: What a rank's local checks found: its runs, its buffer and what ``prepare`` returned
#: beside it, the layout's global array (None: not compared), and whether it would copy
#: a read from the mapped file.
_Found = tuple[Runs, npt.NDArray[np.uint8], Any, Any, bool]


#: What a rank whose local checks fail contributes (read-only: nothing uses it but the
#: head, after which every rank raises)
_FAILED: _Found = (read_only(Runs.empty()), np.zeros(0, np.uint8), None, None, False)
_FAILED[1].flags.writeable = False


def _check_locally(ctx: Context, source: Any, *, writing: bool) -> _Found:
    """Local: validate the call; raises what the agreement will report."""
    if ctx.mode == "closed":
        raise ModeError("the file is closed")
    if writing and ctx.mode == "r":
        raise ModeError("write_all on a file opened in mode 'r'")
    if writing and ctx.aborted:
        raise ModeError("an earlier error aborted the atomic commit: nothing more is written")
    if not writing and not ctx.backend.readable:
        raise ModeError(
            f"read_all is not possible on this {ctx.backend.name} target in mode {ctx.mode!r}"
        )
    runs, buf, extra, sig = source()
    # (the mapping question may fail on one rank, e.g. its fstat: agreed too)
    mapped = may_map(ctx.hints, writing=writing) and ctx.backend.maps_reads(runs)
    return runs, buf, extra, sig, mapped


def _kept_plan(ctx: Context, prekey: Any, runs: Runs, *, writing: bool) -> tuple[int, int]:
    """Local: the kept plan for exactly these runs, as (epoch, shift); (-1, 0): none
    (every rank must find the same one: plancache)."""
    if ctx.plans is None:
        return (-1, 0)
    plan = ctx.plans.candidate(prekey, runs)
    kept = ctx.plans.peek(plan[0]) if plan[0] >= 0 else None
    if kept is not None:  # (allocations fail here, agreed, not in the rounds)
        prepare_rounds(kept, writing=writing)
    return plan


def one_layout(
    ctx: Context, layout: Any, prepare: Any, *, writing: bool
) -> tuple[Runs, npt.NDArray[np.uint8], Any, Any]:
    """Local: a single call's checks of its layout; its runs, buffer, extra and signature."""
    if not isinstance(layout, Layout):
        raise LayoutError(f"layout must be a collio layout, not {type(layout).__name__}")
    seen = _moved_box(ctx, layout)
    if seen is None:
        layout.checked()
        ctx.backend.check_layout(layout)
    buf, extra = prepare(layout)
    if seen is None:
        runs = ctx.backend.runs_for(layout)
        bad = _first_overlap(layout, runs)
        _keep_box(ctx, layout, runs, bad)
    else:
        runs, bad = seen
    if bad >= 0 and writing:
        raise OverlapError(
            f"bytes [{int(runs.file[bad])}, {int(runs.file[bad] + runs.length[bad])}) "
            f"are written twice by this rank"
        )
    return runs, buf, extra, layout.signature()


#: The last :class:`~collio.layouts.Subarray` layouts checked, by their fields but the
#: offset: their offset, runs and first overlap; the least recently used go past
#: :data:`BOXES` entries or :data:`BOX_RUNS` runs together, the last one always kept (a
#: solver alternates its variables' layouts, each a time series); changed under
#: :data:`_BOX_LOCK` (threads on communicators of their own check layouts at once, and
#: one's count of the runs held would iterate the dict while the other adds to it)
_BOX: dict[tuple[Any, ...], tuple[int, Runs, int]] = {}
_BOX_LOCK = threading.Lock()
BOXES = 16
BOX_RUNS = 1 << 20


def _plain_runs(ctx: Context, layout: Any) -> bool:
    """Local: whether ``layout`` is a Subarray on a backend that takes its runs as they
    are and checks nothing more of it (then its runs follow from its fields)."""
    be = type(ctx.backend)
    return (type(layout) is Subarray and be.runs_for is Backend.runs_for
            and be.check_layout is Backend.check_layout)  # fmt: skip


def _moved_box(ctx: Context, layout: Any) -> tuple[Runs, int] | None:
    """Local: for a Subarray equal to the last one checked but for its offset (a time
    series' next step), its runs (the last one's moved by the offset's change) and
    first overlap, kept on it as its own checks would; None: check it."""
    if not _BOX or not _plain_runs(ctx, layout) or layout._invalid or layout.offset < 0:
        return None
    key = (layout.shape, layout.start, layout.global_shape, layout._dtype, layout._order)
    with _BOX_LOCK:
        seen = _BOX.pop(key, None)
        if seen is None:
            return None
        _BOX[key] = seen  # (most recently used last)
    offset, runs, bad = seen
    d = layout.offset - offset
    runs = runs.moved(d) if d else runs
    layout._runs, layout._overlap = runs, (runs, bad)
    return runs, bad


def forget() -> None:
    """Local: drop the kept Subarray checks (:data:`_BOX`)."""
    with _BOX_LOCK:
        _BOX.clear()


def _keep_box(ctx: Context, layout: Any, runs: Runs, bad: int) -> None:
    """Local: keep a Subarray whose checks passed for :func:`_moved_box`."""
    if _plain_runs(ctx, layout) and is_read_only(runs):
        key = (layout.shape, layout.start, layout.global_shape, layout._dtype, layout._order)
        with _BOX_LOCK:
            _BOX.pop(key, None)
            _BOX[key] = (layout.offset, runs, bad)
            held = sum(len(b[1].file) for b in _BOX.values())
            while len(_BOX) > 1 and (len(_BOX) > BOXES or held > BOX_RUNS):
                held -= len(_BOX.pop(next(iter(_BOX)))[1].file)


def _first_overlap(layout: Layout, runs: Runs) -> int:
    """:func:`first_overlap` of the runs, kept on the layout for the next call with them.

    A layout keeps its runs read-only, so the same object holds the same runs; the check
    costs a sort of every run, and repeated calls are the rule for checkpoints.
    """
    seen: tuple[Runs, int] | None = getattr(layout, "_overlap", None)
    if seen is not None and seen[0] is runs:
        return seen[1]
    bad = first_overlap(runs.file, runs.length)
    if is_read_only(runs):
        try:
            layout._overlap = (runs, bad)
        except AttributeError:  # a layout class without the slot (user-defined)
            pass
    return bad


def _prekey(ctx: Context, writing: bool) -> tuple[Any, ...]:
    """What a call's plan depends on besides its runs and their global extent (a
    two-level call's: its local aggregators, and the messages its window keeps large;
    without them a job alternating one level and two would find the other's plan, and
    replace it)."""
    be, h = ctx.backend, ctx.hints
    two = (tuple(ctx.local.leaders.tolist()), h.cb_min_message) if ctx.local is not None else ()
    return (
        writing, tuple(ctx.aggregators.tolist()), type(be).__name__, be.alignment, be.min_window,
        h.cb_buffer_size, h.min_rounds, h.striping_unit, two,
    )  # fmt: skip
