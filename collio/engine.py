"""Two-phase collective write and read, as ROMIO's ad_write_coll.c / ad_read_coll.c, vectorised.

Flow of one call (every rank runs every step, so nothing hangs):

1. *check*: validate the layout and data locally, then one allreduce agrees on
   the call itself (the first operation of every collective call on a file,
   :func:`~collio.collective.call_head`), errors, the shared signature (global
   shape, dtype), the global extent and the other facts (:class:`_Checked`) from
   which :mod:`collio.policy` chooses the path: direct, mapped, own pieces or
   two-phase;
2. *plan*: cut runs at file domains and round windows; send (offset, length)
   lists to the aggregators, which check overlaps and number their rounds;
3. *rounds* (:mod:`collio.rounds`): messages straight into the round buffers; the
   backend request of round k runs in the I/O thread while round k+1 is exchanged;
4. *complete* (:mod:`collio.completion`): wait for the I/O, then one sync point
   agrees on errors and reduces the statistics (backends that flush after a write,
   and zarr's own runs done before the shuffle, agree once more before that).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from . import batch, twolevel
from .aggregators import plan_aggregator, plan_sender
from .aggregators.plan import AggregatorPlan, SenderPlan
from .backends.base import storage_errors
from .buffers import free_buffers
from .collective import Attempt, agree, agree_facts, any_flag, call_head, digest, raise_agreed
from .completion import complete_call, local_summary
from .context import Call, Context, Plan
from .errors import LayoutError, ModeError, OverlapError
from .exchange import alltoallv_i64
from .facts import NOT_COMPARED, Facts, How, fact, record
from .layouts.base import Layout
from .mismatch import raise_count_mismatch, raise_mismatch
from .overlaps import overlap_error, raise_plan_error
from .plancache import clear_all
from .policy import (
    CHECKED_MAX_RUNS,
    Path,
    PathFacts,
    checked_runs,
    choose_path,
    domain_alignment,
    extents_disjoint,
    has_many_small_runs,
    may_map,
    round_window,
)
from .rounds import prepare as prepare_rounds
from .rounds import read_rounds, write_rounds
from .runs import Runs, first_overlap, is_read_only, read_only
from .stats import Stats

__all__ = ["Context", "read", "read_many", "release_buffers", "write", "write_many"]

I64 = npt.NDArray[np.int64]
_BIG = 2**62  # an empty rank's first byte: above every real one


@record
class _Checked(PathFacts):
    """The facts of a call's check, carried by its :func:`call_head` (beside the path's)."""

    sig: int | None = fact(How.EQUAL)  # digest of the global array (None: ranks differ)
    plan: int | None = fact(How.SAME)  # the kept plan's epoch found (-1: none; None: differ)
    # some rank's extent changed since the ranks compared them, other than all of them
    # moving by the same ``shift`` (a time series: that keeps the answer; see _moved)
    moved: bool = fact(How.ANY)
    shift: int | None = fact(How.EQUAL)
    items: int | None = fact(How.EQUAL)  # a batch's items (None: ranks pass different counts)
    # how far every rank's runs lie from the kept plan's (zigzag coded; None: ranks differ)
    plan_shift: int | None = fact(How.EQUAL)
    # every rank's caller vouched that no two ranks' runs overlap (a checkpoint's plan,
    # which proved it from every rank's pieces): each rank may do its own I/O, however
    # the ranks' extents interleave
    vouched: bool = fact(How.ALL)


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


@record
class _Extent(Facts):
    """The extent of every rank's runs."""

    lo: int = fact(How.MIN)
    hi: int = fact(How.MAX)


def _check(
    ctx: Context, source: Any, *, writing: bool, count: int | None = None, disjoint: bool = False
) -> tuple[Runs, npt.NDArray[np.uint8], Any, Call]:
    """Collective over ``ctx.comm``: local checks, then one agreement (see module doc).

    ``source()`` (local) checks the call's layout (or a batch's items) and returns
    its runs, buffer, what goes beside it and the signature; ``count`` is a batch's
    number of items (-1: not a sequence; None: a single call); ``disjoint`` the caller's
    word that no two ranks' runs overlap (agreed: direct only if every rank gives it).
    Nothing before that
    agreement communicates (the checks, the runs, the kept plan's lookup): ranks in
    different calls must meet there first.
    """
    ctx.stats.local = {}
    step = Attempt()
    prekey = _prekey(ctx, writing)
    # what a rank that fails contributes (its flag makes every rank raise first)
    local = _FAILED
    with step:
        local = _check_locally(ctx, source, prekey, writing=writing)
    runs, buf, extra, sig, (plan, shift), mapped = local
    lo, hi = runs.extent() if len(runs) else (_BIG, 0)
    call_name = ("write_all" if writing else "read_all") + ("" if count is None else "_many")
    mine = _Checked(
        lo=lo, hi=hi, mapped=mapped,
        small=has_many_small_runs(runs, ctx.hints.direct_threshold),
        sig=_digest(sig), plan=plan, items=-1 if count is None else count, vouched=disjoint,
        checked=_checked(runs),
        plan_shift=_zigzag(shift) if len(runs) else NOT_COMPARED,
        **_moved(ctx.extents, lo, hi),
    )  # fmt: skip
    # the call's first operation, as of every collective call on a file: a call mismatch
    # (a read beside a write, a sync, ...) is raised first, before any rank's own error
    failed, out = call_head(ctx.comm, call_name, ctx.file, step.error is not None, mine.slots())
    agreed = _Checked.agreed(out)
    if agreed.items is None:  # (item k means nothing when the counts differ)
        raise_count_mismatch(ctx.comm, -1 if count is None else count, call_name)
    if failed:
        raise_agreed(ctx.comm, step.error, what=call_name)
    if agreed.sig is None:
        raise_mismatch(ctx.comm, sig)
    call = _choose(ctx, agreed, runs, (lo, hi), writing=writing, what=call_name)
    call.prekey, call.nruns, call.name = prekey, len(runs), call_name
    if agreed.plan is not None and agreed.plan_shift is not None:
        # every rank found the plan of the same earlier call (or none), its runs shifted alike
        call.plan_epoch = agreed.plan
        call.plan_shift = _unzigzag(agreed.plan_shift) if agreed.plan_shift >= 0 else 0
    return runs, buf, extra, call


#: the last signature digested and its digest (one entry, replaced whole)
_SIG: list[tuple[Any, int]] = [(None, digest(None))]


def _digest(sig: Any) -> int:
    """:func:`digest` of a layout's signature, kept for the next call with an equal one
    (a time series' layouts have the same global array call after call: a tuple compare
    instead of a repr and a hash)."""
    seen = _SIG[0]
    try:  # (equal values digest alike here: the ranks compare with == when digests differ)
        if type(sig) is type(seen[0]) and bool(sig == seen[0]):
            return seen[1]
    except (TypeError, ValueError):  # (a user's signature holding arrays)
        pass
    got = digest(sig)
    # (only a signature of immutable values is kept: == takes an element for equal to
    # itself by identity, so a list or array changed in place would get the old digest)
    _SIG[0] = (sig, got) if _frozen(sig) else (None, digest(None))
    return got


_SCALARS = (int, float, str, bytes, bool, type(None))


def _frozen(value: Any) -> bool:
    """Local: whether ``value`` is a scalar or a tuple of such, nested (a signature's few
    fields, checked when it is kept, not on every call)."""
    if type(value) is tuple:
        return all(_frozen(v) for v in value)
    return type(value) in _SCALARS


def _zigzag(d: int) -> int:
    """A shift as a non-negative fact (:data:`How.EQUAL` compares those)."""
    return 2 * d if d >= 0 else -2 * d - 1


def _unzigzag(z: int) -> int:
    return z // 2 if z % 2 == 0 else -(z + 1) // 2


#: What a rank's local checks found: its runs, its buffer and what ``prepare`` returned
#: beside it, the layout's global array (None: not compared), the epoch of the kept
#: plan for these runs (-1: none) with how far these runs lie from its runs, and whether it
#: would copy a read from the mapped file.
_Found = tuple[Runs, npt.NDArray[np.uint8], Any, Any, tuple[int, int], bool]


#: What a rank whose local checks fail contributes (read-only: nothing uses it but the
#: head, after which every rank raises)
_FAILED: _Found = (read_only(Runs.empty()), np.zeros(0, np.uint8), None, None, (-1, 0), False)
_FAILED[1].flags.writeable = False


def _moved(before: tuple[int, int, bool] | None, lo: int, hi: int) -> dict[str, Any]:
    """This rank's ``moved`` and ``shift`` facts: its extent moved by ``shift`` (zigzag
    coded, so never negative) keeping its width, or it is empty now as then
    (``NOT_COMPARED``), or ``moved``."""
    if before is None:
        return {"moved": True, "shift": NOT_COMPARED}
    plo, phi = before[0], before[1]
    if hi <= lo and phi <= plo:
        return {"moved": False, "shift": NOT_COMPARED}
    if hi <= lo or phi <= plo or hi - lo != phi - plo:
        return {"moved": True, "shift": NOT_COMPARED}
    return {"moved": False, "shift": _zigzag(lo - plo)}


def _check_locally(ctx: Context, source: Any, prekey: Any, *, writing: bool) -> _Found:
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
    # a kept plan for exactly these runs (every rank must find the same one: plancache)
    plan = (-1, 0)
    if ctx.plans is not None:
        plan = ctx.plans.candidate(prekey, runs)
        kept = ctx.plans.peek(plan[0]) if plan[0] >= 0 else None
        if kept is not None:  # (allocations fail here, agreed, not in the rounds)
            prepare_rounds(kept, writing=writing)
    # (the mapping question may fail on one rank, e.g. its fstat: agreed too)
    mapped = may_map(ctx.hints, writing=writing) and ctx.backend.maps_reads(runs)
    return runs, buf, extra, sig, plan, mapped


def _one_layout(
    ctx: Context, layout: Any, prepare: Any, *, writing: bool
) -> tuple[Runs, npt.NDArray[np.uint8], Any, Any]:
    """Local: a single call's checks of its layout; its runs, buffer, extra and signature."""
    if not isinstance(layout, Layout):
        raise LayoutError(f"layout must be a collio layout, not {type(layout).__name__}")
    layout.checked()
    ctx.backend.check_layout(layout)
    buf, extra = prepare(layout)
    runs = ctx.backend.runs_for(layout)
    bad = _first_overlap(layout, runs)
    if bad >= 0 and writing:
        raise OverlapError(
            f"bytes [{int(runs.file[bad])}, {int(runs.file[bad] + runs.length[bad])}) "
            f"are written twice by this rank"
        )
    return runs, buf, extra, layout.signature()


def _choose(
    ctx: Context,
    agreed: _Checked,
    runs: Runs,
    extent: tuple[int, int],
    *,
    writing: bool,
    what: str,
) -> Call:
    """Collective over ``ctx.comm``: the call's path (:func:`~collio.policy.choose_path`)."""
    own: npt.NDArray[np.bool_] | None = None

    def disjoint() -> bool:
        if agreed.moved or agreed.shift is None or ctx.extents is None:
            # (ctx.extents is the same on every rank but for its (lo, hi), so is None
            # on all of them or none)
            ctx.extents = (*extent, _disjoint(ctx.comm, *extent))
        else:  # every extent as then, or moved alike: the same answer as then
            ctx.extents = (*extent, ctx.extents[2])
        return ctx.extents[2]

    def split() -> bool | None:
        nonlocal own
        kept = ctx.backend.own_runs(ctx.comm, runs, writing=writing)
        if kept is None:
            return None
        own = kept[0]
        return kept[1]

    def runs_disjoint() -> bool:
        return _runs_disjoint(ctx.comm, runs, agreed.checked, what=what)

    mode = ctx.hints.romio_cb_write if writing else ctx.hints.romio_cb_read
    be = ctx.backend
    path = choose_path(
        agreed, mode=mode, independent=be.independent, disjoint=disjoint, split=split,
        runs_disjoint=runs_disjoint, vouched=agreed.vouched,
    )  # fmt: skip
    return Call(agreed.lo, agreed.hi, path, Stats(), own if path is Path.OWN else None)


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
    """What a call's plan depends on besides its runs and their global extent."""
    be, h = ctx.backend, ctx.hints
    return (
        writing, tuple(ctx.aggregators.tolist()), type(be).__name__, be.alignment, be.min_window,
        h.cb_buffer_size, h.min_rounds, h.striping_unit,
    )  # fmt: skip


def _disjoint(comm: MPI.Comm, lo: int, hi: int) -> bool:
    """Collective: True when no two ranks' extents interleave (each may write alone)."""
    mine = np.array([lo, hi], np.int64)
    every = np.empty(2 * comm.Get_size(), np.int64)
    comm.Allgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
    return extents_disjoint(every[0::2], every[1::2])


def _checked(runs: Runs) -> int:
    """Local: this rank's ``checked`` fact (:func:`~collio.policy.checked_runs`), kept
    for the read-only lengths it was found from (a time series' next runs share them)."""
    seen = _CHECKED[0]
    if seen is not None and seen[0] is runs.length:
        return seen[1]
    got = _checked_anew(runs)
    if not runs.length.flags.writeable:
        _CHECKED[0] = (runs.length, got)
    return got


#: the last lengths :func:`_checked` was asked about and its answer (one entry, replaced
#: whole: another thread's call may read it)
_CHECKED: list[tuple[npt.NDArray[np.int64], int] | None] = [None]


def _checked_anew(runs: Runs) -> int:
    n = len(runs)
    if n == 0 or n > CHECKED_MAX_RUNS:  # (no shortest run to find)
        return 0 if n == 0 else CHECKED_MAX_RUNS + 1
    shortest = int(runs.length[0]) if n == 1 else int(runs.length.min())  # (a small call's)
    return int(checked_runs(n, shortest))


def _runs_disjoint(comm: MPI.Comm, runs: Runs, most: int, *, what: str) -> bool:
    """Collective: True when no two ranks' runs overlap (each may do its own I/O).

    ``most`` is the agreed ``checked`` fact, the most runs of any rank: every rank
    sends a block of that many (offset, length) pairs after a pair holding its count,
    so one allgather of fixed blocks moves them, with no allgather of the counts first.
    A rank that cannot allocate the blocks makes every rank raise the same error before
    they move (as :func:`~collio.exchange.alltoallv_i64`), and so does one failing to
    sort them (every rank computes the answer from the same pairs).
    """
    step = Attempt()
    mine = every = np.zeros(0, np.int64)
    with step:
        mine, every = _pair_buffers(runs, most, comm.Get_size())
    agree(comm, step.error, what=what)
    comm.Allgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
    disjoint = False
    with step:
        disjoint = _pairs_disjoint(every, most)
    agree(comm, step.error, what=what)
    return disjoint


def _pair_buffers(runs: Runs, most: int, size: int) -> tuple[I64, I64]:
    """Local: this rank's block (its count, 0, then its (offset, length) pairs, padded
    to ``most``) and room for every rank's."""
    n = len(runs)
    mine = np.zeros(2 * (most + 1), np.int64)
    mine[0] = n
    mine[2 : 2 * n + 2 : 2], mine[3 : 2 * n + 3 : 2] = runs.file, runs.length
    return mine, np.empty(size * len(mine), np.int64)


def _pairs_disjoint(blocks: I64, most: int) -> bool:
    """Local, pure: whether no two of the runs in ``blocks`` (every rank's block of
    :func:`_pair_buffers`) overlap.  A rank's runs overlapping each other (a read may)
    answer False too: the shuffle then reads them, as it did before the runs were
    compared."""
    pairs = blocks.reshape(-1, most + 1, 2)
    real = np.arange(most) < pairs[:, 0, 0, None]  # (the padding past each rank's count)
    file, length = pairs[:, 1:, 0][real], pairs[:, 1:, 1][real]
    order = np.argsort(file, kind="stable")
    return first_overlap(file[order], length[order]) < 0


def release_buffers() -> None:
    """Local: free what calls keep for the next ones, the round buffers and the plans
    (and what batches keep of their layouts)."""
    free_buffers()
    clear_all()
    batch.forget()


# ---------------------------------------------------------------- planning
def _plan(ctx: Context, runs: Runs, call: Call, *, writing: bool) -> Plan:
    """Collective over ``ctx.comm``: the call's plan, kept from an identical call or new."""
    t0 = time.perf_counter()
    bounds, window = _domains(ctx, call)
    key = (writing, window, tuple(ctx.aggregators.tolist()))
    kept = _kept(ctx, call, key, bounds, runs)
    if kept is not None:
        call.counters.time_plan += time.perf_counter() - t0
        return kept  # type: ignore[no-any-return]
    plan, keep = _new_plan(ctx, runs, bounds, window, writing=writing, what=call.name)
    if ctx.plans is not None:
        ctx.plans.store(key, bounds, runs, plan, call.prekey, keep=keep)
    call.counters.time_plan += time.perf_counter() - t0
    return plan


def _domains(ctx: Context, call: Call, sources: int = 0) -> tuple[I64, int]:
    """The call's file domains and round window (``sources``: see
    :func:`~collio.policy.round_window`); sets ``call.window``."""
    # domain_extent first: a backend may settle its alignment from the global extent
    # (S3 plans its part size from the object size at the first write_all)
    lo, hi = ctx.backend.domain_extent(call.lo, call.hi)
    align = domain_alignment(ctx.backend.alignment, ctx.hints)
    bounds = ctx.backend.domain_bounds(lo, hi, len(ctx.aggregators), align)
    call.window = round_window(
        ctx.hints, bounds, align=align, nranks=ctx.comm.Get_size(),
        floor=ctx.backend.min_window, sources=sources,
    )  # fmt: skip
    return bounds, call.window


def _kept(ctx: Context, call: Call, key: tuple[Any, ...], bounds: I64, runs: Runs) -> Any:
    """Collective: the plan of an earlier identical call on every rank, or None."""
    if ctx.plans is None:
        return None
    if call.own is None:  # the check agreed on the candidate: no allreduce here
        kept = None
        if call.plan_epoch >= 0:
            kept = ctx.plans.take(call.plan_epoch, key, bounds, call.plan_shift)
    else:  # the runs were split after the check (kept by their ranks): agree now
        kept = ctx.plans.lookup(ctx.comm, key, bounds, runs)
    call.reused = kept is not None
    return kept


def _two_level(
    ctx: Context, call: Call, runs: Runs, buf: npt.NDArray[np.uint8], *, writing: bool
) -> BaseException | None:
    """Collective: the hook to :mod:`collio.twolevel`, its plans kept as one level's (the
    local aggregators in the key: the cache is the communicator's, shared by files)."""
    assert ctx.local is not None
    t0 = time.perf_counter()
    bounds, window = _domains(ctx, call, sources=ctx.local.ngroups)
    key = ("two-level", writing, window, tuple(ctx.aggregators.tolist()),
           tuple(ctx.local.leader.tolist()))  # fmt: skip
    tl = _kept(ctx, call, key, bounds, runs)
    if tl is None:

        def stage_two(mine: Runs) -> tuple[Plan, bool]:
            return _new_plan(ctx, mine, bounds, window, writing=writing, what=call.name)

        tl, keep = twolevel.plan(ctx, runs, bounds, window, stage_two, writing=writing)
        if ctx.plans is not None:
            ctx.plans.store(key, bounds, runs, tl, call.prekey, keep=keep)
    call.counters.time_plan += time.perf_counter() - t0
    return twolevel.run(ctx, call, tl, buf, writing=writing)


def _new_plan(
    ctx: Context, runs: Runs, bounds: I64, window: int, *, writing: bool, what: str
) -> tuple[Plan, bool]:
    """Collective over ``ctx.comm``: metadata exchange, overlap check, rounds; returns the
    plan and whether it may be kept (agreed)."""
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
    big = False
    with step:
        if step.error is None and sp is not None:
            draft = Plan(bounds, window, sp, sp.gwin, ap, 0)
            prepare_rounds(draft, writing=writing)
            est = draft.nbytes() + 3 * runs.length.nbytes
            big = ctx.plans is not None and est > ctx.plans.max_bytes
    mine = _Planned(
        failed=step.error is not None, nrounds=ap.nrounds if ap else 0, big=big,
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
    return plan, not agreed.big


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


# ------------------------------------------------------------- entry points
def write(ctx: Context, data: Any, layout: Any) -> None:
    """Collective over ``ctx.comm``: two-phase write of every rank's piece."""

    def prepare(lay: Layout) -> tuple[npt.NDArray[np.uint8], None]:
        return lay.as_bytes(data), None

    _write(ctx, lambda: _one_layout(ctx, layout, prepare, writing=True))


def write_many(ctx: Context, items: Any, *, disjoint: bool = False) -> None:
    """Collective over ``ctx.comm``: one two-phase write of every item of every rank
    (``(data, layout)`` pairs, the same number on every rank: :mod:`collio.batch`);
    with ``disjoint`` on every rank, each rank writes its own (see :func:`_check`)."""
    _write(
        ctx,
        lambda: batch.gather(ctx.backend, items, writing=True),
        count=batch.items_count(items),
        disjoint=disjoint,
    )


def _write(ctx: Context, source: Any, count: int | None = None, disjoint: bool = False) -> None:
    t0 = time.perf_counter()
    runs, buf, kept, call = _check(ctx, source, writing=True, count=count, disjoint=disjoint)
    active = call.hi > call.lo  # (own_runs may shrink the extent to the shuffled rest)
    error = _transfer(ctx, call, runs, buf, writing=True)
    what = "backend I/O"
    if active and ctx.backend.needs_flush:  # flush may be collective: agree on the I/O first
        if any_flag(ctx.comm, error is not None, patient=True):
            raise_agreed(ctx.comm, error, what=what)
        step = Attempt()
        with step:
            ctx.backend.flush(ctx.comm)
        error, what = step.error, "backend flush"
    complete_call(ctx, call, t0, error, what, patient=True, items=count)
    del kept  # (a batch's item buffers, alive until the call is complete)


def read(ctx: Context, layout: Any, out: Any) -> Any:
    """Collective over ``ctx.comm``: two-phase read; returns the rank's piece."""

    def prepare(lay: Layout) -> tuple[npt.NDArray[np.uint8], Any]:
        arr, view = lay.allocate(out)
        return view, arr

    return _read(ctx, lambda c: _one_layout(c, layout, prepare, writing=False))


def read_many(ctx: Context, layouts: Any, out: Any, *, disjoint: bool = False) -> list[Any]:
    """Collective over ``ctx.comm``: one two-phase read of every layout of every rank;
    returns the arrays, one per layout (``out[k]`` filled when given); ``disjoint``: as
    :func:`write_many`'s."""
    got: list[Any] = _read(
        ctx,
        lambda c: batch.gather(c.backend, layouts, writing=False, outs=out),
        count=batch.items_count(layouts),
        disjoint=disjoint,
    )
    return got


def _read(ctx: Context, source: Any, count: int | None = None, disjoint: bool = False) -> Any:
    t0 = time.perf_counter()
    if ctx.read_aggregators is not None:  # the backend reads with other aggregators
        ctx = dataclasses.replace(ctx, aggregators=ctx.read_aggregators)
    c = ctx
    runs, buf, arr, call = _check(
        c, lambda: source(c), writing=False, count=count, disjoint=disjoint
    )
    if ctx.hints.read_past_eof == "disable":
        _refuse_past_eof(ctx, runs)
    error = _transfer(ctx, call, runs, buf, writing=False)
    # after rounds reads wait polling (sleeping gains nothing there); after each rank's own
    # I/O (direct path: it takes each rank its own time, e.g. decoding zarr chunks) and on
    # remote backends a rank done early sleeps instead of taking a core the others need
    patient = ctx.backend.remote or call.direct
    complete_call(ctx, call, t0, error, "backend I/O", patient=patient, items=count)
    return arr


def _refuse_past_eof(ctx: Context, runs: Runs) -> None:
    """Collective over ``ctx.comm`` (hint ``read_past_eof=disable``): the same
    :class:`LayoutError` on every rank when some rank's runs reach past the end."""
    step = Attempt()
    with step:
        end = runs.extent()[1] if len(runs) else 0
        size = ctx.backend.size()
        if end > size:
            raise LayoutError(
                f"read_all reaches byte {end}, past the end of {ctx.file[1]} ({size} bytes; "
                "hint read_past_eof=disable)"
            )
    if any_flag(ctx.comm, step.error is not None):
        raise_agreed(ctx.comm, step.error, what="read_all")


def _transfer(
    ctx: Context, call: Call, runs: Runs, buf: npt.NDArray[np.uint8], *, writing: bool
) -> BaseException | None:
    """Collective: the direct path, or (kept runs first, then) plan and rounds.

    Returns this rank's I/O error, not yet agreed (``complete_call`` agrees on it).
    """
    if call.hi <= call.lo:
        return None
    be = ctx.backend
    if call.direct:
        action = be.write_runs if writing else be.read_runs
        return _direct(ctx, call, lambda: action(runs, buf), runs, writing=writing)
    runs = _own_first(ctx, call, runs, buf, writing=writing)
    if call.hi > call.lo and ctx.local is not None:
        return _two_level(ctx, call, runs, buf, writing=writing)
    if call.hi > call.lo:
        plan = _plan(ctx, runs, call, writing=writing)
        call.counters.rounds = plan.nrounds
        ctx.stats.local = local_summary(ctx, plan)
        return (write_rounds if writing else read_rounds)(ctx, plan, buf, call)
    return None


def _own_first(
    ctx: Context, call: Call, runs: Runs, buf: npt.NDArray[np.uint8], *, writing: bool
) -> Runs:
    """Collective: do the runs the backend let this rank keep; return the rest to shuffle.

    Used when ``Backend.own_runs`` splits a call (zarr: chunks only one rank touches
    are stored by it, shared ones go through their aggregator).  The extent is
    agreed again for the rest.
    """
    if call.own is None:
        return runs
    own, rest = runs.take(np.flatnonzero(call.own)), runs.take(np.flatnonzero(~call.own))
    be = ctx.backend
    do = be.write_runs if writing else be.read_runs
    error = _direct(ctx, call, lambda: do(own, buf), own, writing=writing)
    # ranks finish their own I/O at different times: wait sleeping (see complete_call)
    if any_flag(ctx.comm, error is not None, patient=True):
        raise_agreed(ctx.comm, error, what="backend I/O")
    lo, hi = rest.extent() if len(rest) else (_BIG, 0)
    agreed = agree_facts(ctx.comm, _Extent(lo=lo, hi=hi))
    call.lo, call.hi = agreed.lo, agreed.hi
    return rest


def _direct(
    ctx: Context, call: Call, action: Any, runs: Runs, *, writing: bool
) -> BaseException | None:
    """Local: this rank does its own (large, disjoint) I/O; returns its error, not agreed."""
    lengths = runs.length  # as it is, not a list of (up to millions of) Python ints ...
    if lengths.flags.writeable:  # ... read-only: a caller cannot change the runs
        lengths = lengths.view()
        lengths.flags.writeable = False
    ctx.stats.local = {"domain": -1, "direct": True, "requests": lengths}
    step = Attempt()
    t = time.perf_counter()
    with step:
        if len(runs):
            with storage_errors(ctx.backend):
                done = action()  # a request count (one per run) or the requests' sizes
            sizes = runs.length if isinstance(done, int) else done
            if writing:
                call.counters.add_writes(sizes)
            else:
                call.counters.add_reads(sizes)
    call.counters.time_io += time.perf_counter() - t
    return step.error
