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

A write whose plan has one round (:func:`write_rounds`; the plan is agreed, so every
rank takes the same way) posts its receives and sends at once, waits for them and
writes its window inline: what :func:`collio.rounds.write_rounds` does for one round,
without the machinery that overlaps a round's I/O with the next one's messages.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from . import rounds, speculate
from .aggregators.plan import AggregatorPlan, round_requests
from .backends.base import Backend
from .backends.failures import storage_errors
from .buffers import round_buffers, window_of
from .check import Headed, Pending
from .checkfacts import Checked, moved_by, placed, zigzag
from .collective import Attempt, KeptHead, call_kept_head
from .completion import local_summary, local_when_read
from .context import Call, Context, Plan
from .exchange import CONTIG, Messages, kept_type
from .facts import NOT_COMPARED
from .layouts.arrays import Subarray
from .policy import DEPTH, Path, domain_alignment
from .quick import array_of
from .roundio import cover, round_cover
from .rounds import TAG, agg_runs, sender_runs
from .rounds import prepare as prepare_rounds
from .runs import Runs, is_read_only
from .stats import Stats

__all__ = ["Lane", "headed", "keep", "transfer", "write_rounds"]

_BIG = speculate.BIG
_BYTE = MPI.BYTE


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
    round: _Round | None = None  # the entry's one round as messages (made when first used)


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
    ctx.lane = _lane(ctx, call, layout) if call is not None else None


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
        r = k.round = _round_of(ctx, base)
    if r is None:  # (a message of no fixed shape: built from the runs each call)
        return (_one_round(ctx, base, d, data, call),)
    return (_kept_round(ctx, r, d, data, call),)


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


def write_rounds(
    ctx: Context, plan: Plan, data: Any, call: Call
) -> BaseException | None:  # fmt: skip
    """Collective over ``ctx.comm``: :func:`collio.rounds.write_rounds` of ``plan``, its
    one round inline on a local backend (see the module doc).  Returns this rank's first
    error, not yet agreed (the call's completion agrees on it)."""
    if plan.nrounds != 1 or ctx.backend.remote:
        return rounds.write_rounds(ctx, plan, data, call)
    return _one_round(ctx, plan, 0, data, call)


def _one_round(ctx: Context, plan: Plan, d: int, data: Any, call: Call) -> BaseException | None:
    """Collective over ``ctx.comm``: the one round of ``plan`` moved ``d`` bytes in the
    file (its messages are placed relative to its window: only the request moves)."""
    c = call.counters
    msgs = Messages(ctx.comm, TAG)
    ap = plan.agg  # (None: this rank does not aggregate)
    t = time.perf_counter()
    try:
        got = _receive(ctx, plan, d, ap, msgs, c) if ap is not None and ap.nrounds else None
        _send(ctx, plan, data, msgs, c)
    except BaseException:
        msgs.free()
        raise
    msgs.wait()  # (every message completes, failed or not: nobody is left waiting)
    c.time_exchange += time.perf_counter() - t
    if got is None:
        return msgs.error
    req, wbuf, error = got
    error = error or msgs.error  # (a stand-in's bytes are not written)
    if error is not None:
        return error
    assert ap is not None
    step = Attempt()
    t = time.perf_counter()
    with step, storage_errors(ctx.backend):
        # (the bytes ranks sent: the whole request, or its runs, moved as the request)
        covered = cover(ap, 0, req) if ap.rcovered[0] >= req[1] else round_cover(ap, 0).moved(d)
        c.add_writes(ctx.backend.write_window(req[0], wbuf, covered))
    c.time_io += time.perf_counter() - t
    return step.error


@dataclasses.dataclass(slots=True, eq=False)
class _Round:
    """The one round of a kept plan as this rank posts it, found once: what
    :func:`_receive` and :func:`_send` find again from the plan in every call."""

    plan: Plan  # the plan it is of (by identity)
    req: tuple[int, int] | None  # an aggregator's request, unmoved (None: it does not aggregate)
    cover: Runs | None  # what ranks send of it, unmoved (an aggregator's)
    whole: bool  # they send every byte of it (no holes to read first)
    recvs: list[tuple[int, int, int, Any]]  # (source, first byte, bytes, hvector or None)
    sends: list[tuple[int, int, int, Any]]  # (aggregator, first byte, bytes, hvector or None)
    sent: int  # the bytes this rank sends


def _round_of(ctx: Context, plan: Plan) -> _Round | None:
    """Local: ``plan``'s one round as :class:`_Round`, or None when a message has no
    fixed shape (``OTHER``) or its hvector is not kept by the exchange (made and freed
    per message): those go the way of :func:`_one_round`."""
    ap, be, aggs = plan.agg, ctx.backend, ctx.aggregators
    req, covered, whole, recvs = None, None, True, []
    if ap is not None and ap.nrounds:
        dom = ctx.my_domain
        lo, hi = int(plan.bounds[dom]), int(plan.bounds[dom + 1])
        offs, lens = round_requests(ap, lo, hi, plan.window, be.partial_write)
        req = (int(offs[0]), int(lens[0]))
        whole = bool(ap.rcovered[0] >= req[1])
        covered = cover(ap, 0, req)
        sh = plan.agg_shapes()
        got = [(int(ap.gsrc[g]), *_fixed(sh, g, req[0])) for g in ap.groups_of_round(0).tolist()]
        if any(len(m) < 4 for m in got):
            return None
        recvs = got
    sp, sh = plan.sender, plan.sender_shapes()
    sends = [(int(aggs[sp.gdom[g]]), *_fixed(sh, g, 0)) for g in range(len(sp.gdom))]
    if any(len(m) < 4 for m in sends):
        return None
    return _Round(plan, req, covered, whole, recvs, sends, int(sh.total.sum()))  # type: ignore[arg-type]


def _fixed(sh: Any, g: int, base: int) -> tuple[int, int, Any] | tuple[()]:
    """Group ``g``'s first byte (less ``base``), bytes and kept hvector (None: a slice),
    or () when its messages are built per call (:func:`collio.exchange.shaped`)."""
    first, total = int(sh.first[g]) - base, int(sh.total[g])
    if int(sh.kind[g]) == CONTIG:
        return first, total, None
    kept = kept_type(sh, g)
    return () if kept is None else (first, total, kept)


def _kept_round(ctx: Context, r: _Round, d: int, data: Any, call: Call) -> BaseException | None:
    """Collective over ``ctx.comm``: :func:`_one_round` of ``r``'s plan moved ``d``
    bytes, its messages posted from ``r`` (each a stand-in if it cannot be posted, as
    :class:`~collio.exchange.Messages` does)."""
    c, comm, plan = call.counters, ctx.comm, r.plan
    msgs = Messages(comm, TAG)
    posted, error = msgs.requests, None
    t = time.perf_counter()
    req = wbuf = None
    if r.req is not None:
        req = (r.req[0] + d, r.req[1])
        wbuf = window_of(round_buffers(plan.window, DEPTH)[0], *req)
        if not r.whole:  # (as _receive: the old bytes of its holes)
            error = _holes(ctx, wbuf, req, r.cover, d, c)
        for src, first, n, dt in r.recvs:
            try:
                spec = [wbuf[first : first + n], _BYTE] if dt is None else [wbuf[first:], 1, dt]
                posted.append(comm.Irecv(spec, src, TAG))
            except Exception as exc:  # noqa: BLE001 - agreed in the completion
                msgs.stand_in(comm.Irecv, n, src, exc)
        c.messages += len(r.recvs)
    for dest, first, n, dt in r.sends:
        try:
            spec = [data[first : first + n], _BYTE] if dt is None else [data[first:], 1, dt]
            posted.append(comm.Isend(spec, dest, TAG))
        except Exception as exc:  # noqa: BLE001 - agreed in the completion
            msgs.stand_in(comm.Isend, n, dest, exc)
    c.exchanged_bytes += r.sent
    msgs.wait()  # (every message completes, failed or not: nobody is left waiting)
    c.time_exchange += time.perf_counter() - t
    error = error or msgs.error  # (a stand-in's bytes are not written)
    if req is None or error is not None:
        return error
    assert r.cover is not None and wbuf is not None
    step = Attempt()
    t = time.perf_counter()
    with step, storage_errors(ctx.backend):
        c.add_writes(ctx.backend.write_window(req[0], wbuf, r.cover.moved(d) if d else r.cover))
    c.time_io += time.perf_counter() - t
    return step.error


def _holes(ctx: Context, wbuf: Any, req: tuple[int, int], covered: Any, d: int,
           c: Stats) -> BaseException | None:  # fmt: skip
    """Local: the old bytes of the window's holes read into ``wbuf``; the error."""
    step = Attempt()
    t = time.perf_counter()
    with step, storage_errors(ctx.backend):
        c.add_reads(ctx.backend.fill_holes(req[0], wbuf, covered.moved(d) if d else covered))
    c.time_io += time.perf_counter() - t
    return step.error


def _receive(
    ctx: Context, plan: Plan, d: int, ap: AggregatorPlan, msgs: Messages, c: Stats
) -> tuple[tuple[int, int], Any, BaseException | None]:
    """An aggregator's round (``plan`` moved ``d`` bytes): its request, its window of the
    round buffer (the holes read first where the backend needs them) with every source's
    receive posted into it, and the error of reading the holes (the receives are posted
    all the same)."""
    dom, be = ctx.my_domain, ctx.backend
    lo, hi = int(plan.bounds[dom]), int(plan.bounds[dom + 1])
    offs, lens = round_requests(ap, lo, hi, plan.window, be.partial_write)
    base = int(offs[0])
    req = (base + d, int(lens[0]))
    wbuf = window_of(round_buffers(plan.window, DEPTH)[0], *req)
    step = Attempt()
    if ap.rcovered[0] < req[1]:  # (as roundio.reuse_buffer: the old bytes of its holes)
        t = time.perf_counter()
        with step, storage_errors(be):
            c.add_reads(be.fill_holes(req[0], wbuf, round_cover(ap, 0).moved(d)))
        c.time_io += time.perf_counter() - t
    sh = plan.agg_shapes()
    for g in ap.groups_of_round(0).tolist():
        msgs.recv_group(int(ap.gsrc[g]), wbuf, sh, g, base, partial(agg_runs, ap, g, base))
        c.messages += 1
    return req, wbuf, step.error


def _send(ctx: Context, plan: Plan, data: Any, msgs: Messages, c: Stats) -> None:
    """This rank's sends of the round (every send group: there is one round)."""
    sp, sh, aggs = plan.sender, plan.sender_shapes(), ctx.aggregators
    for g in range(len(sp.gdom)):
        msgs.send_group(int(aggs[sp.gdom[g]]), data, sh, g, 0, partial(sender_runs, sp, g))
        c.exchanged_bytes += int(sh.total[g])
