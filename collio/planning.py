"""A two-phase call's plan: its file domains and round window, the plan an identical
earlier call kept, or a new one (the metadata exchange, the aggregators' overlap check
and rounds, agreed before any byte moves), in one level or two (:mod:`collio.twolevel`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from . import twolevel
from .aggregators import call_domains, plan_aggregator, plan_sender
from .aggregators.plan import AggregatorPlan, SenderPlan
from .collective import Attempt, agree_facts
from .context import Call, Context, Plan
from .exchange import alltoallv_i64
from .facts import Facts, How, fact, record
from .overlaps import overlap_error, raise_plan_error
from .policy import domain_alignment, round_window
from .rounds import prepare as prepare_rounds
from .runs import Runs

__all__ = ["plan", "two_level"]

I64 = npt.NDArray[np.int64]


@record
class _Planned(Facts):
    """The facts of a new plan, agreed before the rounds."""

    failed: bool = fact(How.ANY)  # some rank failed to plan
    nrounds: int = fact(How.MAX)  # the call's rounds: the most of any aggregator
    # an aggregator is sparse when its non-empty windows are not 0..n-1: then the round
    # numbers are sent back (dense: a sender's round is its window index)
    sparse: bool = fact(How.ANY)
    # a plan kept by only some ranks (an aggregator's is larger) could never be reused
    big: bool = fact(How.ANY)  # some rank's plan is too large to keep: no rank keeps it
    cost: int = fact(How.MAX)  # what keeping it holds on the rank it costs most (plancache)


def plan(ctx: Context, runs: Runs, call: Call, *, writing: bool) -> Plan:
    """Collective over ``ctx.comm``: the call's plan, kept from an identical call or new."""
    t0 = time.perf_counter()
    bounds, window = _domains(ctx, call)
    key = (writing, window, tuple(ctx.aggregators.tolist()))
    kept = _kept(ctx, call, key, bounds, runs)
    if kept is not None:
        call.counters.time_plan += time.perf_counter() - t0
        return kept  # type: ignore[no-any-return]
    plan, cost = _new_plan(ctx, runs, bounds, window, writing=writing, what=call.name)
    if ctx.plans is not None:
        # (a batch's plan may serve its file runs from other arrays: plancache._remapped)
        remap = call.name.endswith("_many")
        ctx.plans.store(key, bounds, runs, plan, call.prekey, cost=cost, remap=remap)
    call.counters.time_plan += time.perf_counter() - t0
    return plan


def _domains(
    ctx: Context, call: Call, sources: int = 0, *, writing: bool = True
) -> tuple[I64, int]:
    """The call's file domains and round window (``sources``: see
    :func:`~collio.policy.round_window`, as ``writing``); sets ``call.window``."""
    # domain_extent first: a backend may settle its alignment from the global extent
    # (S3 plans its part size from the object size at the first write_all)
    lo, hi = ctx.backend.domain_extent(call.lo, call.hi)
    align = domain_alignment(ctx.backend.alignment, ctx.hints)
    bounds, call.active = call_domains(
        lo, hi, len(ctx.aggregators), align, ctx.hints.cb_min_domain, ctx.backend.domain_bounds
    )
    call.window = round_window(
        ctx.hints, bounds, align=align, nranks=ctx.comm.Get_size(),
        floor=ctx.backend.min_window, sources=sources, writing=writing,
    )  # fmt: skip
    return bounds, call.window


def _kept(ctx: Context, call: Call, key: tuple[Any, ...], bounds: I64, runs: Runs) -> Any:
    """Collective: the plan of an earlier identical call on every rank, or None."""
    if ctx.plans is None:
        return None
    if call.own is None:  # the check agreed on the candidate: no allreduce here
        kept = None
        if call.plan_epoch >= 0:
            kept = ctx.plans.take(call.plan_epoch, key, bounds, call.plan_shift, runs)
    else:  # the runs were split after the check (kept by their ranks): agree now
        kept = ctx.plans.lookup(ctx.comm, key, bounds, runs)
    call.reused = kept is not None
    return kept


def two_level(
    ctx: Context, call: Call, runs: Runs, buf: npt.NDArray[np.uint8], *, writing: bool
) -> BaseException | None:
    """Collective: the hook to :mod:`collio.twolevel`, its plans kept as one level's (the
    local aggregators in the key: the cache is the communicator's, shared by files)."""
    assert ctx.local is not None
    t0 = time.perf_counter()
    bounds, window = _domains(ctx, call, sources=ctx.local.ngroups, writing=writing)
    key = ("two-level", writing, window, tuple(ctx.aggregators.tolist()),
           tuple(ctx.local.leader.tolist()))  # fmt: skip
    tl = _kept(ctx, call, key, bounds, runs)
    if tl is None:

        def stage_two(mine: Runs) -> tuple[Plan, int | None]:
            return _new_plan(ctx, mine, bounds, window, writing=writing, what=call.name)

        tl, cost = twolevel.plan(
            ctx, runs, bounds, window, stage_two, writing=writing, what=call.name
        )
        if ctx.plans is not None:
            ctx.plans.store(key, bounds, runs, tl, call.prekey, cost=cost)
    call.counters.time_plan += time.perf_counter() - t0
    return twolevel.run(ctx, call, tl, buf, writing=writing)


def _new_plan(
    ctx: Context, runs: Runs, bounds: I64, window: int, *, writing: bool, what: str
) -> tuple[Plan, int | None]:
    """Collective over ``ctx.comm``: metadata exchange, overlap check, rounds; returns the
    plan and what keeping it costs on the rank it costs most, None when some rank may not
    keep it (agreed: :meth:`~collio.plancache.PlanCache.store`)."""
    # every step a rank could fail alone in is inside ``step``, agreed before the rounds
    comm, call_name = ctx.comm, what
    step = Attempt()
    sp: SenderPlan | None = None
    counts = np.zeros(comm.Get_size(), np.int64)
    meta = np.zeros(0, np.int64)
    with step:  # (a rank that fails here sends nothing: counts are set last)
        sp = plan_sender(runs, bounds, window)
        meta = np.empty(2 * len(sp.pieces), np.int64)
        meta[0::2], meta[1::2] = sp.pieces.file, sp.pieces.length
        counts[ctx.aggregators] = 2 * sp.per_dom
    recv, rcounts = alltoallv_i64(comm, meta, counts, what=call_name)
    ap, replies, rep_counts = _aggregate(ctx, step, recv, rcounts, bounds, window, writing)
    draft: Plan | None = None
    big, est = False, 0
    with step:
        if step.error is None and sp is not None:
            draft = Plan(bounds, window, sp, sp.gwin, ap, 0)
            prepare_rounds(draft, writing=writing)
            est = draft.nbytes() + 3 * runs.length.nbytes
            big = ctx.plans is not None and est > ctx.plans.max_bytes
    mine = _Planned(
        failed=step.error is not None, nrounds=ap.nrounds if ap else 0, big=big, cost=est,
        sparse=ap is not None and ap.nrounds > 0 and int(ap.rwin[-1]) != ap.nrounds - 1,
    )  # fmt: skip
    agreed = agree_facts(comm, mine)
    if agreed.failed:
        raise_plan_error(comm, step.error, what=call_name)  # (overlaps: one message)
    assert draft is not None  # (no rank failed)
    if agreed.sparse:
        sround, _ = alltoallv_i64(comm, replies, rep_counts, what=call_name)
    else:
        sround = draft.sender.gwin.copy()
    # (the draft's shapes, made by prepare, are kept; the rounds' order is made anew)
    plan = dataclasses.replace(draft, sround=sround, nrounds=agreed.nrounds, _by_round=None)
    return plan, None if agreed.big else agreed.cost


def _aggregate(
    ctx: Context, step: Attempt, recv: I64, rcounts: I64, bounds: I64, window: int, writing: bool
) -> tuple[AggregatorPlan | None, I64, I64]:
    """Local, inside ``step``: an aggregator plans its domain from the pieces it received;
    returns its plan (None elsewhere) and the round numbers to send back, per rank."""
    d, size = ctx.my_domain, ctx.comm.Get_size()
    ap: AggregatorPlan | None = None
    replies, rep_counts = np.zeros(0, np.int64), np.zeros(size, np.int64)
    with step:
        if step.error is None and d >= 0:
            src = np.repeat(np.arange(size, dtype=np.int64), rcounts // 2)
            ap, bad = plan_aggregator(recv[0::2], recv[1::2], src, int(bounds[d]), window)
            if bad >= 0 and writing:
                raise overlap_error(recv[0::2], recv[1::2], src)
            replies, rep_counts = ap.replies(size)
    return ap, replies, rep_counts
