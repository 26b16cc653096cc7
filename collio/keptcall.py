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
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from . import rounds, speculate
from .backends.base import Backend
from .buffers import round_buffers
from .check import Headed, Pending
from .checkfacts import Checked, moved_by, placed, zigzag
from .collective import Attempt, KeptHead, call_kept_head
from .completion import local_summary, local_when_read
from .context import Call, Context, Plan
from .facts import NOT_COMPARED
from .keptround import Round, kept_round, one_round, round_of, write_rounds
from .layouts.arrays import Subarray
from .policy import DEPTH, Path, domain_alignment
from .quick import array_of
from .rounds import prepare as prepare_rounds
from .runs import Runs, is_read_only

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


def keep(ctx: Context, call: Call | None, layout: Any, *, lane: bool = False) -> None:
    """Local: after a single write through ``layout``, keep it for :func:`headed` when it
    was a one-level two-phase call on a local backend whose plan the cache holds; else
    forget the last one.  ``lane``: the call came through :func:`headed` (its layout is
    the kept one at another offset)."""
    k = ctx.lane
    if lane and k is not None and call is not None and _again(ctx, k, call):
        k.offset, k.runs, k.shift = layout.offset, layout._runs, call.plan_shift
        k.extent = k.runs.extent()  # (known: moved runs carry it)
        return
    new = _lane(ctx, call, layout) if call is not None else None
    if k is not None and k.round is not None:
        if new is not None and new.entry is k.entry:  # (the same plan: its round still serves)
            new.round = k.round
        else:
            k.round.free()
        k.round = None
    ctx.lane = new


def drop(ctx: Context) -> None:
    """Local: forget the lane and free its round's hvectors (the file closes: the
    thread closing it is in the file's last call, so nothing posts with them)."""
    k, ctx.lane = ctx.lane, None
    if k is not None and k.round is not None:
        k.round.free()
        k.round = None


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
    if call.path is not Path.TWO_PHASE or call.own is not None or call.two_level:
        return None
    if plans is None or ctx.local is not None or call.facts is None or not _local(be):
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


def _entry(plans: Any, call: Call, runs: Runs) -> tuple[Any, int]:
    """The cache entry ``call`` used for ``runs`` and how far they lie from its runs."""
    entries = plans.entries
    if not entries:
        return None, 0
    last = entries[-1]  # (take and store leave the entry a call used last)
    if call.reused and last.epoch == call.plan_epoch:
        return last, call.plan_shift
    if not call.reused and last.epoch == plans.epoch and last.source is runs:
        return last, 0
    return None, 0


def headed(ctx: Context, data: Any, layout: Any, t0: float) -> Headed | None:
    """Collective over ``ctx.comm`` unless it returns None (nothing done, nothing
    communicated): ``data`` through ``layout``, the last write's layout at another
    offset, up to its head, as :func:`collio.check.check` would take it there."""
    k = ctx.lane
    if k is None or type(layout) is not Subarray:
        return None
    box = k.box
    if layout.box != box or layout._invalid:
        return None
    offset = layout.offset
    if type(offset) is not int or offset < 0:
        return None  # (the general way's checks raise it, agreed)
    if k.hints is not ctx.hints or k.backend is not ctx.backend or ctx.plans is None:
        return None
    if ctx.aggregators is not k.aggregators or ctx.local is not None:
        return None
    d = offset - k.offset
    if k.extent[1] + d >= _BIG or not _latest(ctx.plans.entries, k):
        return None  # (past every real size: the general way's checks say so, agreed)
    try:  # (anything failing here is the general way's to agree on, as its checks find it)
        buf = _bytes(ctx, data, box)
        runs = k.runs.moved(d) if d else k.runs
    except Exception:  # noqa: BLE001
        return None
    return None if buf is None else _head(ctx, k, layout, buf, runs, d, t0)


def _head(ctx: Context, k: Lane, layout: Any, buf: Any, runs: Runs, d: int,
          t0: float) -> Headed:  # fmt: skip
    """Collective over ``ctx.comm``: the call's head, with the facts the general way's
    checks would have found (:func:`collio.check._pending`'s)."""
    layout._runs, layout._overlap = runs, (runs, -1)  # (as check._moved_box keeps them)
    lo, hi = k.extent[0] + d, k.extent[1] + d
    step = Attempt()
    plan = (-1, 0)
    with step:  # (allocations fail here, agreed, not in the rounds: check._kept_plan)
        r = k.round
        if r is None or r.plan is not k.entry.plan:
            prepare_rounds(k.entry.plan, writing=True)
        elif r.req is not None:  # (its shapes are made: an aggregator's round buffers)
            round_buffers(r.plan.window, DEPTH)
        plan = (k.entry.epoch, k.shift + d)
    moved, shift = moved_by(ctx.extents, lo, hi)
    seconds = speculate.times(0.0, t0)
    head = k.head if k.head is not None else _kept_head(ctx, k)
    _PATCH(
        head.own, lo, hi, placed(k.facts[3], layout.offset), plan[0], zigzag(plan[1]),
        step.error is None, seconds[0], seconds[1], moved, shift,
    )  # fmt: skip
    ctx.stats.local = {}
    p = Pending(
        True, "write_all", None, runs, buf, None, layout.signature(), k.facts, (lo, hi), None,
        step.error, None, k.prekey,
    )  # fmt: skip
    failed, out = call_kept_head(ctx.comm, head, step.error is not None)
    return p, (failed, tuple(out))


#: The facts of a call of the lane that are not its kept call's (:func:`_kept_head`)
_PATCH = Checked.patcher(
    "lo", "hi", "sig", "plan", "plan_shift", "io_only", "t_io", "t_total", "moved", "shift"
)  # fmt: skip


def _kept_head(ctx: Context, k: Lane) -> KeptHead:
    """The head of a call of the lane before its patch: the facts of the general way's
    (:func:`collio.check._pending`) that a repeat of ``k`` keeps; kept on ``k``."""
    f = k.facts
    own = Checked(
        lo=0, hi=0, small=f[0], mapped=f[1], checked=f[2], sig=f[3], plan=-1, items=-1,
        vouched=False, plan_shift=0, guessed=False, size=_BIG, io_only=True, same=False,
        t_io=0, t_total=0, moved=True, shift=NOT_COMPARED,
    ).slots()  # fmt: skip
    k.head = KeptHead("write_all", ctx.file, own)
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


def transfer(ctx: Context, call: Call, data: Any) -> tuple[BaseException | None] | None:
    """Collective over ``ctx.comm`` unless it returns None (nothing done: plan the general
    way): the rounds of a two-phase write whose agreed plan is the lane's entry moved by
    a whole number of alignment units (the domains, window and rounds are the entry's,
    moved: ``PlanCache.take`` without cutting the domains again).  Returns this rank's
    error, not yet agreed, in a tuple."""
    e = _entry_now(ctx, call)
    if e is None:
        return None
    k, d, base = ctx.lane, call.plan_shift, e.plan
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
    return (kept_round(ctx, r, d, data, call),)


def _entry_now(ctx: Context, call: Call) -> Any:
    """Local: the lane's plan entry (made most recently used, as ``PlanCache.take``
    leaves it) if it is this call's plan moved by whole alignment units, else None."""
    k = ctx.lane
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
