"""The kept two-phase lane: a time series' next step through the last write's layout.

A solver writes one variable per step: a :class:`~collio.layouts.Subarray` equal to the
last call's but for its offset, a two-phase call whose plan the cache keeps
(:mod:`collio.plancache`, ``Plan.shifted``).  What the general way finds before its head
(:func:`collio.check.before_head`: the layout's checks, its runs, the facts, the kept
plan's epoch and shift) follows here from the last call's (:class:`Lane`) and the
offset's change, with no check made again: the runs are the last ones moved, their
facts the same, the plan entry the one that call used.  The rank contributes to the
head exactly what the general way would (so ranks in the lane and ranks not in it meet
in one head, and every step after it is the general one: errors, mismatches, the path).

After the head, a call whose agreed plan is the lane's entry moved by a multiple of
the domain alignment takes that plan at once (:func:`transfer`: the domains of an extent
moved by whole alignment units are the same domains moved, so the window and rounds are
the entry's), instead of cutting the domains again; whether a rank took the lane before
the head changes nothing after it, so no agreement says who did.

What each call acquires is still acquired in every call, inside the step the head
agrees on: the round buffers (``rounds.prepare``), which a rank may have lost since.

A write whose plan has one round is posted inline (:mod:`collio.keptround`), from the
lane's record of its messages (``Lane.round``), which owns its hvectors: they are freed
when the lane lets the round go (another plan, another lane, or the file's close:
:func:`drop`).

A batch's write keeps a lane of its own (:func:`keep_batch`, ``Context.batch_lane``) for
:func:`transfer` alone: a time series' next batch through the same arrays has the last
one's runs moved (:mod:`collio.boxes`), so its agreed plan is the lane's entry moved and
its round the lane's, posted from the record, as long as its runs lie at the entry's
buffer offsets (other arrays: the plan is taken the general way, its pieces moved to
theirs).  What goes before a batch's head is its items' checks, made in every call.
"""

from __future__ import annotations

import dataclasses
import operator
import time
from typing import Any

import numpy as np

from . import rounds, speculate
from .backends.base import Backend
from .backends.failures import storage_error
from .backends.posix import PosixBackend
from .buffers import PAGE, round_buffers, rounds_allocation
from .check import Headed, Pending
from .checkfacts import Checked, moved_by, placed, unzigzag, zigzag
from .collective import Attempt, KeptHead, call_kept_head, raise_agreed
from .collective import kept as recorded
from .completion import KeptReduce, local_summary, local_when_read
from .context import Call, Context, Plan
from .facts import NOT_COMPARED, How
from .keptround import Round, exchange, kept_round, one_round, round_of, write_rounds
from .layouts.arrays import Subarray
from .policy import CHECKED_MAX_RUNS, DEPTH, Path, domain_alignment
from .quick import array_of
from .rounds import prepare as prepare_rounds
from .runs import Runs, is_read_only
from .stats import MAXES, SUMS, Stats

__all__ = ["Lane", "drop", "headed", "keep", "transfer", "write_rounds"]

_BIG = speculate.BIG


@dataclasses.dataclass(slots=True, eq=False)
class Lane:
    """This rank's last single two-phase write through a Subarray, as a repeat needs it."""

    box: tuple[Any, ...]  # the layout's fields but its offset
    offset: int  # the layout's offset then
    runs: Runs  # its runs (read-only: the layout's)
    extent: tuple[int, int]  # their (lo, hi)
    facts: tuple[Any, ...]  # this rank's (small, mapped, checked, signature digest)
    prekey: tuple[Any, ...]
    entry: Any  # the plan cache's entry the call used (plancache._Entry)
    shift: int  # the runs are the entry's moved by this
    hints: Any  # (by identity: set_info makes new ones)
    backend: Backend
    aggregators: Any
    window: int
    active: int
    head: KeptHead | None = None  # a repeat's head before its patch (made when first used)
    round: Round | None = None  # the entry's one round as messages (made when first used)
    out: tuple[int, ...] = ()  # the agreed maxima of the lane's last head (:func:`_head`'s)
    posted: Round | None = None  # the round the last call posted by kept_round (transfer)
    step: Step | None = None  # a repeat finished without the general way (:class:`Step`)


def keep(ctx: Context, call: Call | None, layout: Any, *, lane: bool = False) -> None:
    """Local: after a single write through ``layout``, keep it for :func:`headed` when it
    was a one-level two-phase call on a local backend whose plan the cache holds; else
    forget the last one.  ``lane``: the call came through :func:`headed` (its layout is
    the kept one at another offset)."""
    k = ctx.lane
    if lane and k is not None and call is not None and _again(ctx, k, call):
        k.offset, k.runs, k.shift = layout.offset, layout._runs, call.plan_shift
        k.extent = k.runs.extent()  # (known: moved runs carry it)
        k.step = Step.made(ctx, k, call)
        return
    new = _lane(ctx, call, layout) if call is not None else None
    if k is not None and k.round is not None:
        if new is not None and new.entry is k.entry:  # (the same plan: its round still serves)
            new.round = k.round
        else:
            k.round.free()
        k.round = None
    ctx.lane = new


def keep_batch(ctx: Context, call: Call, runs: Runs) -> None:
    """Local: after a batch's write, keep its plan's round for :func:`transfer` when it
    was a one-level two-phase call on a local backend whose plan the cache holds, made
    from (or taken for) these runs at these buffer offsets (a time series' next step
    through the same arrays has the same: :mod:`collio.boxes` moves the last union);
    else forget the last one.  Apart from the single writes' lane: a batch is never
    the repeat that :func:`headed` takes before its head."""
    k = ctx.batch_lane
    new = _batch_lane(ctx, call, runs)
    if k is not None and k.round is not None:
        if new is not None and new.entry is k.entry:  # (the same plan: its round still serves)
            new.round = k.round
        else:
            k.round.free()
        k.round = None
    ctx.batch_lane = new


def _keepable(ctx: Context, call: Call) -> bool:
    """Whether ``call`` can be kept in a lane: a one-level two-phase call on a local
    backend."""
    return (
        call.path is Path.TWO_PHASE and call.own is None and not call.two_level
        and ctx.local is None and _local(ctx.backend)
    )  # fmt: skip


def _batch_lane(ctx: Context, call: Call, runs: Runs) -> Lane | None:
    be, plans = ctx.backend, ctx.plans
    if plans is None or call.facts is None or not _keepable(ctx, call):
        return None
    if not len(runs.file) or not is_read_only(runs):
        return None
    entry, shift = _entry(plans, call, runs, batch=True)
    if entry is None:
        return None
    return Lane(
        (), 0, runs, runs.extent(), call.facts, call.prekey, entry, shift, ctx.hints, be,
        ctx.aggregators, call.window, call.active,
    )  # fmt: skip


def drop(ctx: Context) -> None:
    """Local: forget the lanes and free their rounds' hvectors (the file closes: the
    thread closing it is in the file's last call, so nothing posts with them)."""
    for k in (ctx.lane, ctx.batch_lane):
        if k is not None and k.round is not None:
            k.round.free()
            k.round = None
    ctx.lane = ctx.batch_lane = None


def _again(ctx: Context, k: Lane, call: Call) -> bool:
    """Whether a call of the lane went as the kept one did: two-phase in one level,
    with the lane's plan entry (the cache leaves it last)."""
    return (
        call.path is Path.TWO_PHASE and call.own is None and not call.two_level
        and call.reused and call.plan_epoch == k.entry.epoch and ctx.local is None
        and ctx.plans is not None and bool(ctx.plans.entries)
        and ctx.plans.entries[-1] is k.entry
    )  # fmt: skip


def _lane(ctx: Context, call: Call, layout: Any) -> Lane | None:
    be, plans = ctx.backend, ctx.plans
    if plans is None or call.facts is None or not _keepable(ctx, call):
        return None
    if type(layout) is not Subarray or layout._invalid:
        return None
    runs = getattr(layout, "_runs", None)
    if runs is None or not len(runs.file) or not is_read_only(runs):
        return None
    entry, shift = _entry(plans, call, runs)
    if entry is None:
        return None
    box = layout.box
    return Lane(
        box, layout.offset, runs, runs.extent(), call.facts, call.prekey, entry, shift,
        ctx.hints, be, ctx.aggregators, call.window, call.active,
    )  # fmt: skip


def _local(be: Backend) -> bool:
    """Whether the backend's domains are the plain byte split of the data's extent and
    a write needs nothing after it (no remote store, no flush, no layout checks)."""
    t = type(be)
    return not (be.remote or be.needs_flush) and (
        t.domain_bounds is Backend.domain_bounds and t.domain_extent is Backend.domain_extent
        and t.runs_for is Backend.runs_for and t.check_layout is Backend.check_layout
    )  # fmt: skip


def _entry(plans: Any, call: Call, runs: Runs, *, batch: bool = False) -> tuple[Any, int]:
    """The cache entry ``call`` used for ``runs`` and how far they lie from its runs
    (``batch``: a batch's runs, which :func:`transfer` takes only at the entry's buffer
    offsets)."""
    entries = plans.entries
    if not entries:
        return None, 0
    last = entries[-1]  # (take and store leave the entry a call used last)
    if call.reused and last.epoch == call.plan_epoch:
        # (a batch's plan: take moves its pieces to each call's buffer offsets; the lane's
        # round would post them where they were: only a batch lane that checks them)
        if last.remap and not (batch and _same_mem(last, runs)):
            return None, 0
        return last, call.plan_shift
    if not call.reused and last.epoch == plans.epoch and last.source is runs:
        return last, 0
    return None, 0


def headed(ctx: Context, data: Any, layout: Any, t0: float) -> Headed | bool | None:
    """Collective over ``ctx.comm`` unless it returns None (nothing done, nothing
    communicated): ``data`` through ``layout``, the last write's layout at another
    offset, up to its head, as :func:`collio.check.check` would take it there; True:
    the call is complete (a repeat the lane's :class:`Step` finished)."""
    k = ctx.lane
    if k is None or type(layout) is not Subarray:
        return None
    box = k.box
    if (  # (layout.box != box, inline: no tuple built, no property called)
        layout.shape != box[2] or layout.start != box[1] or layout.global_shape != box[0]
        or layout._dtype != box[3] or layout._order != box[4] or layout._invalid
    ):  # fmt: skip
        return None
    offset = layout._offset
    if type(offset) is not int or offset < 0:
        return None  # (the general way's checks raise it, agreed)
    if k.hints is not ctx.hints or k.backend is not ctx.backend or ctx.plans is None:
        return None
    if ctx.aggregators is not k.aggregators or ctx.local is not None:
        return None
    d = offset - k.offset
    entries = ctx.plans.entries  # (the lane's entry last: _latest at once)
    if k.extent[1] + d >= _BIG or not (entries and entries[-1] is k.entry or _latest(entries, k)):
        return None  # (past every real size: the general way's checks say so, agreed)
    s: Step | None = k.step
    if s is not None and not s.fits(k):
        s = None
    try:  # (anything failing here is the general way's to agree on, as its checks find it)
        buf = _bytes(ctx, data, box)
        if buf is None:
            return None
        if s is None:
            runs = k.runs.moved(d) if d else k.runs
    except Exception:  # noqa: BLE001
        return None
    if s is not None:  # (after the try: a step's call is collective from its head on)
        return s.go(ctx, k, layout, buf, d, t0)
    return _head(ctx, k, layout, buf, runs, d, t0)


def _head(ctx: Context, k: Lane, layout: Any, buf: Any, runs: Runs, d: int,
          t0: float) -> Headed:  # fmt: skip
    """Collective over ``ctx.comm``: the call's head, with the facts the general way's
    checks would have found (:func:`collio.check._pending`'s)."""
    lo, hi = k.extent[0] + d, k.extent[1] + d
    step = Attempt()
    with step:  # (allocations fail here, agreed, not in the rounds: check._kept_plan)
        r = k.round
        if r is None or r.plan is not k.entry.plan:
            prepare_rounds(k.entry.plan, writing=True)
        elif r.req is not None:  # (its shapes are made: an aggregator's round buffers)
            round_buffers(r.plan.window, DEPTH)
    head = _patched(ctx, k, layout, lo, hi, d, step.error, t0)
    failed, out = call_kept_head(ctx.comm, head, step.error is not None)
    return _headed(k, layout, buf, runs, lo, hi, step.error, failed, out)


def _patched(ctx: Context, k: Lane, layout: Any, lo: int, hi: int, d: int,
             error: BaseException | None, t0: float) -> KeptHead:  # fmt: skip
    """Local: the lane's head with the facts of this call written in (the plan's only
    where this rank's preparations did not fail)."""
    epoch, zshift = (-1, 0) if error is not None else (k.entry.epoch, zigzag(k.shift + d))
    ext = ctx.extents
    if ext is not None and hi > lo and ext[1] - ext[0] == hi - lo:  # (moved_by, inline)
        moved, shift = False, 2 * (lo - ext[0]) if lo >= ext[0] else 2 * (ext[0] - lo) - 1
    else:
        moved, shift = moved_by(ext, lo, hi)
    head = k.head if k.head is not None else _kept_head(ctx, k)
    _PATCH(
        head.own, lo, hi, placed(k.facts[3], layout._offset), epoch, zshift, error is None,
        0, int((time.perf_counter() - t0) * 1e9), moved, shift,
    )  # fmt: skip  # (speculate.times of no I/O, inline)
    ctx.stats.local = {}
    k.posted = None  # (transfer says if this call posts the kept round)
    return head


def _headed(k: Lane, layout: Any, buf: Any, runs: Runs, lo: int, hi: int,
            error: BaseException | None, failed: bool, out: Any) -> Headed:  # fmt: skip
    """Local: the call past its head as the general way goes on from it (the pending
    call of ``runs``, the layout keeping them as check._moved_box does)."""
    layout._runs, layout._overlap = runs, (runs, -1)
    p = Pending(
        True, "write_all", None, runs, buf, None, layout.signature(), k.facts, (lo, hi), None,
        error, None, k.prekey,
    )  # fmt: skip
    k.out = tuple(out)
    return p, (failed, k.out)


#: The facts of a call of the lane that are not its kept call's (:func:`_kept_head`)
_PATCHED = ("lo", "hi", "sig", "plan", "plan_shift", "io_only", "t_io", "t_total", "moved",
            "shift")  # fmt: skip
_PATCH = Checked.patcher(*_PATCHED)


def _slots_of(name: str) -> range:
    """The head slots of the fact ``name`` (two for a fact agreed equal or the same)."""
    i = Checked.index()[name]
    return range(i, i + (2 if Checked._how(name) in (How.SAME, How.EQUAL) else 1))


#: The agreed slots of a head that a repeat of the lane does not patch, read at once
_CONST = operator.itemgetter(*sorted(
    set(range(Checked.width())) - {i for n in _PATCHED for i in _slots_of(n)}
))  # fmt: skip
#: The agreed facts a repeat's :class:`Step` decides from
_AGREED = Checked.reader("lo", "hi", "sig", "plan", "plan_shift", "moved", "shift")
_RUNS = SUMS.index("runs")
#: Where a call's local sums hold what the backend counts (Backend.take_counts's three:
#: direct_io_bytes, early_flushes, mapped_bytes, one after another in SUMS)
_COUNTS = slice(SUMS.index("direct_io_bytes"), SUMS.index("mapped_bytes") + 1)


class Step:
    """A repeat of the lane finished after its head without the general way.

    After its head, the general way builds the agreed record, chooses the path, finds
    the kept plan moved, posts the kept round and completes the call, each a layer of
    Python that costs more than the call's own messages and write at a few KiB per rank
    (and with more ranks than cores, every rank's Python is on every other rank's
    way).  After one lane call went that way to one kept round with nothing else
    communicated (:meth:`made`), all of that follows from the agreed facts: a repeat
    whose agreed slots equal that call's but for those a repeat patches (the extent,
    the plan's shift, the signature's offset, the times, how the extent moved) would
    take the same path to the same round moved, decided the same way on every rank
    (the general way too, on a rank that is not in the lane).  It then posts the round
    from the lane's record, writes the aggregator's window in one request, and agrees
    on the call's errors and counters in one allreduce, as the general way would.
    Anything else after the head (an error, other facts) goes the general way from it.
    """

    __slots__ = ("round", "const", "asked", "disjoint", "align", "be", "window", "active",
                 "local", "counts", "reducer")  # fmt: skip

    def __init__(self, ctx: Context, k: Lane, r: Round, const: tuple[int, ...],
                 asked: bool, local: list[int]) -> None:  # fmt: skip
        self.round, self.const, self.asked = r, const, asked
        # (the call's own counters, as its completion packed them: a repeat's are these,
        # but for what the backend counted, Backend.take_counts)
        self.local, self.counts = local, tuple(local[_COUNTS])
        self.disjoint = asked and bool(ctx.extents[2])  # type: ignore[index]
        self.align = domain_alignment(ctx.backend.alignment, ctx.hints)
        be = ctx.backend
        assert isinstance(be, PosixBackend)  # (made only for one)
        self.be: PosixBackend = be
        self.window, self.active = k.window, k.active
        self.reducer = KeptReduce(len(MAXES))  # (the completion's vectors, made once)

    @staticmethod
    def made(ctx: Context, k: Lane, call: Call) -> Step | None:
        """Local, after a lane call that went the general way from its head (agreed as
        ``k.out``): the step its repeats take, when that way was one kept round of a
        posix window written whole, with no communication but the round's messages and
        the completion, chosen from the agreed facts alone; else None."""
        out, r, be, hints = k.out, k.round, ctx.backend, ctx.hints
        posted, k.posted = k.posted, None
        if len(out) < Checked.width() or r is None or r.plan is not k.entry.plan:
            return None
        if posted is not r:  # (its counters are not those of the round the step posts)
            return None
        if type(be) is not PosixBackend or not be.independent or call.counters.rounds != 1:
            return None
        if r.req is not None and not (r.whole and r.cover is not None and len(r.cover) == 1
                                      and int(r.cover.length[0]) == r.req[1]):  # fmt: skip
            return None  # (holes read first, or a window written by its runs)
        kept = ctx.sums_kept.get("write_all")
        agreed = Checked.agreed(out)
        if kept is None or agreed.guessed or agreed.mapped or agreed.vouched:
            return None
        mode = hints.romio_cb_write
        if mode != "enable" and agreed.checked <= CHECKED_MAX_RUNS:
            return None  # (choose_path asks whether the runs overlap: an allgather)
        # (it asks whether the extents interleave without mode 'enable' where some rank's
        # runs are not small: kept with the extents while every extent moves alike)
        asked = mode != "enable" and (mode == "disable" or not agreed.small)
        if asked and ctx.extents is None:
            return None
        return Step(ctx, k, r, _CONST(out), asked, kept[0])  # type: ignore[arg-type]

    def fits(self, k: Lane) -> bool:
        """Local: the lane's round is still this step's."""
        r = self.round
        return k.round is r and r.plan is k.entry.plan

    def go(self, ctx: Context, k: Lane, layout: Any, buf: Any, d: int,
           t0: float) -> Headed | bool:  # fmt: skip
        """Collective over ``ctx.comm``: the call ``d`` bytes after the lane's, with the
        head :func:`_head` would make; True when complete, else the call at its head for
        the general way (:func:`_head`'s outcome)."""
        r = self.round
        lo, hi = k.extent[0] + d, k.extent[1] + d
        error: BaseException | None = None
        whole = None
        if r.req is not None:  # (an aggregator's round buffers: allocations agreed)
            try:  # (their allocation: the window is cut from it, as window_of cuts it)
                whole = rounds_allocation(self.window, DEPTH)
            except Exception as exc:  # noqa: BLE001
                error = exc
        head = _patched(ctx, k, layout, lo, hi, d, error, t0)
        failed, out = call_kept_head(ctx.comm, head, error is not None)
        plan_shift = None if failed else self._shift(ctx, k, out)
        if plan_shift is None:  # (the general way from the head, as _head goes on)
            runs = k.runs.moved(d) if d else k.runs
            return _headed(k, layout, buf, runs, lo, hi, error, failed, out)
        alo, ahi, sig, _, _, _, ashift = _AGREED(out)
        if self.asked:  # (as choose's disjoint(): the extents' answer kept with them)
            ctx.extents = (lo, hi, ctx.extents[2])  # type: ignore[index]
        plans = ctx.plans
        assert plans is not None  # (_shift found the lane's entry in it)
        plans.hits += 1
        ctx.stats.local_when_read(_moved_summary, ctx, r.plan, plan_shift)
        t_ex, t_io, error = self._round(ctx, buf, whole, plan_shift)
        self._complete(ctx, error, t_ex, t_io, t0, alo, ahi)
        ctx.guesses[True] = None  # (speculate.remember of a two-phase write)
        ctx.kept[True].completed(speculate.call_key(-1 if ashift is None else ashift, sig, alo),
                                 None)  # fmt: skip
        return True

    def _shift(self, ctx: Context, k: Lane, out: Any) -> int | None:
        """Local: the agreed plan shift when the agreed facts are the step's call's but
        for what a repeat patches (the same path, plan and round on every rank), else
        None."""
        if _CONST(out) != self.const:
            return None
        _, _, sig, epoch, zshift, moved, shift = _AGREED(out)
        e, plans = k.entry, ctx.plans
        if sig is None or epoch != e.epoch or zshift is None or zshift < 0:
            return None
        if plans is None or not plans.entries or plans.entries[-1] is not e:
            return None
        if self.asked:
            ext = ctx.extents
            if moved or shift is None or ext is None or bool(ext[2]) != self.disjoint:
                return None
        d = unzigzag(zshift)
        return None if d % self.align else d

    def _round(self, ctx: Context, buf: Any, whole: Any,
               d: int) -> tuple[float, float, BaseException | None]:  # fmt: skip
        """Collective over ``ctx.comm``: the round moved ``d`` bytes, as
        :func:`~collio.keptround.kept_round` posts it, the aggregator's window written
        in one request; the exchange's and the write's seconds and this rank's error,
        not yet agreed.  ``whole``: the round buffers' allocation (an aggregator's)."""
        r = self.round
        t = time.perf_counter()
        wbuf = at = None
        if r.req is not None:
            at = r.req[0] + d
            skip = at % PAGE  # (window_of of the first round buffer, which starts it)
            wbuf = whole[skip : skip + r.req[1]]
        error = exchange(ctx.comm, r, buf, wbuf)
        t_ex = time.perf_counter() - t
        if at is None or error is not None:
            return t_ex, 0.0, error
        t = time.perf_counter()
        try:  # (Attempt and storage_errors, inline: two context managers a call)
            try:  # (write_at of the call's one round: no flush)
                self.be._put(at, wbuf)  # type: ignore[arg-type]
            except BaseException as exc:
                got = storage_error(self.be, exc)
                if got is exc:
                    raise
                raise got from exc
        except BaseException as exc:
            if not recorded(exc):
                raise
            error = exc
        return t_ex, time.perf_counter() - t, error

    def _complete(self, ctx: Context, error: BaseException | None, t_ex: float,
                  t_io: float, t0: float, lo: int, hi: int) -> None:  # fmt: skip
        """Collective over ``ctx.comm``: :func:`~collio.completion.complete_call` of the
        step's call (its counters the step's call's, but for what the backend counted)."""
        kept = ctx.sums_kept.get("write_all")
        counts = self.be.take_counts()
        sums = self.local
        if counts != self.counts:  # (the backend counted otherwise this time)
            sums = list(sums)
            sums[_COUNTS] = counts
        maxes = [1, 0.0, t_ex, t_io, time.perf_counter() - t0]  # (Stats.pack's order)
        got = self.reducer.reduce(ctx.comm, sums, maxes, error, kept, patient=True)
        if got is None:
            raise_agreed(ctx.comm, error, what="backend I/O")
        assert got is not None  # (raise_agreed raised)
        agreed, most = got
        again = None
        if kept is not None and agreed is kept[1]:  # (the kept sums: added as kept)
            again = kept[2] if kept[2] is not None else Stats.again(agreed)
        ctx.sums_kept["write_all"] = (sums, agreed, again)
        stats = ctx.stats
        stats.absorb_most(agreed, most, again)
        stats.collective_calls += 1
        stats.last_facts = (
            1, int(agreed[_RUNS]), False, _TWO_PHASE, 1, [lo, hi], True, self.window,
            ctx.nodes, False, self.active, False,
        )  # fmt: skip


_TWO_PHASE = Path.TWO_PHASE._value_


def _kept_head(ctx: Context, k: Lane) -> KeptHead:
    """The head of a call of the lane before its patch: the facts of the general way's
    (:func:`collio.check._pending`) that a repeat of ``k`` keeps; kept on ``k``."""
    f = k.facts
    own = Checked(
        lo=0, hi=0, small=f[0], mapped=f[1], checked=f[2], sig=f[3], plan=-1, items=-1,
        vouched=False, plan_shift=0, guessed=False, size=_BIG, io_only=True, same=False,
        t_io=0, t_total=0, moved=True, shift=NOT_COMPARED,
    ).slots()  # fmt: skip
    k.head = KeptHead("write_all", ctx.file, own, ctx.comm)
    return k.head


def _latest(entries: list[Any], k: Lane) -> bool:
    """Whether the plan cache's candidate for the lane's runs is its entry (no entry made
    since for runs of the same count and prekey: ``PlanCache.candidate`` would find it
    first)."""
    n, e = len(k.runs.file), k.entry
    for got in reversed(entries):
        if got is e:
            return True
        if got.nruns == n and got.prekey == k.prekey:
            return False
    return False


def _bytes(ctx: Context, data: Any, box: tuple[Any, ...]) -> Any:
    """Local: ``data``'s bytes when the layout's checks of it would pass without a copy
    (an ndarray of the box's dtype and shape, contiguous in its order), on a file that
    takes a write; else None."""
    arr = array_of(ctx, box, data, writing=True)
    return None if arr is None else arr.reshape(-1, order=box[4]).view(np.uint8)


def transfer(
    ctx: Context, call: Call, data: Any, runs: Runs | None = None
) -> tuple[BaseException | None] | None:  # fmt: skip
    """Collective over ``ctx.comm`` unless it returns None (nothing done: plan the general
    way): the rounds of a two-phase write whose agreed plan is the lane's entry moved by
    a whole number of alignment units (the domains, window and rounds are the entry's,
    moved: ``PlanCache.take`` without cutting the domains again).  ``runs``: a batch's
    (its lane is :func:`keep_batch`'s, its runs at the entry's buffer offsets, or the
    entry's pieces are not this call's: planned the general way).  Returns this rank's
    error, not yet agreed, in a tuple."""
    k = ctx.lane if runs is None else ctx.batch_lane
    e = _entry_now(ctx, k, call)
    if e is None or (runs is not None and not _same_mem(e, runs)):
        return None
    d, base = call.plan_shift, e.plan
    plans = ctx.plans
    assert k is not None and plans is not None
    plans.hits += 1
    call.reused, call.window, call.active = True, k.window, k.active
    call.counters.rounds = base.nrounds
    if base.nrounds != 1 or ctx.backend.remote:
        plan = base.shifted(d) if d else base
        local_when_read(ctx, plan)
        return (rounds.write_rounds(ctx, plan, data, call),)
    ctx.stats.local_when_read(_moved_summary, ctx, base, d)
    r = k.round
    if r is None or r.plan is not base:
        if r is not None:
            r.free()
        k.round = None
        try:
            r = k.round = round_of(ctx, base)
        except Exception:  # noqa: BLE001 - MPI refused an hvector: one_round stands in
            r = None
    if r is None:  # (a message of no fixed shape: built from the runs each call)
        return (one_round(ctx, base, d, data, call),)
    k.posted = r
    return (kept_round(ctx, r, d, data, call),)


def _same_mem(e: Any, runs: Runs) -> bool:
    """Whether ``runs`` lie at the buffer offsets of the cache entry ``e``'s runs (the same
    array when they were moved from them, as a time series' batches are)."""
    mem = e.runs.mem
    return runs.mem is mem or (len(runs.mem) == len(mem) and bool((runs.mem == mem).all()))


def _entry_now(ctx: Context, k: Lane | None, call: Call) -> Any:
    """Local: the lane ``k``'s plan entry (made most recently used, as ``PlanCache.take``
    leaves it) if it is this call's plan moved by whole alignment units, else None."""
    if k is None or call.plan_epoch != k.entry.epoch or ctx.plans is None:
        return None
    if k.hints is not ctx.hints or k.backend is not ctx.backend:
        return None
    if ctx.aggregators is not k.aggregators or ctx.local is not None or call.own is not None:
        return None
    if call.plan_shift % domain_alignment(ctx.backend.alignment, ctx.hints):
        return None
    e, entries = k.entry, ctx.plans.entries
    if not entries or entries[-1] is not e:
        if e not in entries:  # (every rank found it at the head: kept on every rank)
            return None
        entries.remove(e)
        entries.append(e)  # most recently used last
    return e


def _moved_summary(ctx: Context, plan: Plan, d: int) -> dict[str, Any]:
    """``stats.local`` of ``plan`` moved ``d`` bytes (made when read)."""
    return local_summary(ctx, plan.shifted(d) if d else plan)
