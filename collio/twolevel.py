"""Two-level aggregation: each node's ranks hand their pieces to a local aggregator first.

With one level every aggregator takes a message from every rank with bytes in its
window, in every round: at 65,536 ranks that is tens of thousands of messages of a
few hundred bytes per aggregator and round.  With two levels (Kang et al., TPDS
2020; ADIOS2's TwoLevelShm; PnetCDF's ``nc_num_aggrs_per_node``) the ranks of a
node first hand their pieces of a round to one of a few local aggregators on the
node, which sends them on to the file-domain aggregators in one message per
aggregator: an aggregator then hears from the local aggregators only.

The intra-node stage moves the pieces with point-to-point messages (MPI's
shared-memory transport: a copy into the local aggregator's staging buffer, as a
shared window would need, without a node barrier per round; docs/design.md).  The
local aggregator keeps one round's bytes at a time (:mod:`collio.aggregators.stage`).
The stage between local and file-domain aggregators is the one-level exchange
itself (:mod:`collio.rounds`, given a :class:`~collio.rounds.Stage`), so domains,
windows, rounds, requests and errors are those of one level; reads run the stages
backwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from . import policy
from .aggregators.nodes import LocalGroups, local_groups, node_shape
from .aggregators.plan import AggregatorPlan, plan_sender
from .aggregators.stage import by_round, holders, leader_runs, round_bytes, slots, staging
from .collective import Attempt, any_flag, raise_agreed
from .completion import local_summary
from .context import Call, Context, Plan
from .exchange import Shapes, alltoallv_i64
from .hints import Hints
from .rounds import read_rounds, write_rounds
from .runs import Runs
from .shmstage import Group, ShmStage, group_of

__all__ = ["TwoLevel", "local_aggregators", "plan", "run"]

I64 = npt.NDArray[np.int64]
_NONE = np.zeros(0, np.int64)
_NOBYTES = np.zeros(0, np.uint8)


def local_aggregators(
    nodes: I64, hints: Hints, used: dict[str, Any]
) -> tuple[LocalGroups | None, int]:
    """A file's local aggregators (None: one level) and its node count, from the node
    map and :func:`~collio.policy.two_level`; ``used`` (``stats.hints``) records them."""
    nnodes, fullest = node_shape(nodes)
    per = policy.two_level(hints, nranks=len(nodes), nnodes=nnodes, fullest=fullest)
    groups = local_groups(nodes, per) if per else None
    used["nodes"] = nnodes
    used["cb_local_aggregators"] = per
    used["local_aggregator_ranks"] = groups.leaders.tolist() if groups is not None else []
    return groups, nnodes


def _pairs(file: I64, length: I64) -> I64:
    out = np.empty(2 * len(file), np.int64)
    out[0::2], out[1::2] = file, length
    return out


@dataclasses.dataclass(slots=True)
class _Staged:
    """One rank's part of the intra-node stage, kept with the plan.

    This rank's ``pieces`` of round ``k`` are ``pieces[order[starts[k]:starts[k+1]]]``,
    each at ``spos`` in the round's slot of ``size`` bytes, one of ``slots`` (both the
    same on every rank of the group).  A local aggregator also keeps, per round, how
    many ranks of its group have pieces in it (``sources``, for the statistics).
    """

    lead: bool
    pieces: Runs
    order: I64
    starts: I64
    spos: I64
    size: int
    slots: int = 0  # staging slots of the group (:func:`~collio.aggregators.stage.slots`)
    sources: list[int] = dataclasses.field(default_factory=list)

    def bound(self, ctx: Context, buf: npt.NDArray[np.uint8]) -> ShmStage:
        """This stage for a call on ``buf``, over the group's window (a kept plan holds
        neither: the user's buffer changes, and the window is the communicator's)."""
        assert ctx.local is not None
        group = group_of(ctx.comm, ctx.local)
        p = self.pieces
        return ShmStage(
            group, buf, p.mem, p.length, self.spos, self.order, self.starts, self.size, self.lead,
            self.slots,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class TwoLevel:
    """A two-level call's plan, kept between identical calls as one level's is: this
    rank's intra-node stage and the stage-two plan."""

    stage: _Staged
    plan: Plan

    # what :func:`collio.rounds.prepare` asks of a kept plan (the engine's check
    # prepares whatever plan it finds): the stage-two plan's
    @property
    def agg(self) -> AggregatorPlan | None:
        return self.plan.agg

    @property
    def window(self) -> int:
        return self.plan.window

    def sender_shapes(self) -> Shapes:
        return self.plan.sender_shapes()

    def agg_shapes(self) -> Shapes:
        return self.plan.agg_shapes()

    def nbytes(self) -> int:
        """Bytes of its arrays (what keeping it costs)."""
        st = self.stage
        parts = [st.pieces.file, st.pieces.length, st.pieces.mem, st.order, st.starts]
        parts += [st.spos]
        return self.plan.nbytes() + sum(a.nbytes for a in parts)


def plan(
    ctx: Context,
    runs: Runs,
    bounds: I64,
    window: int,
    new_plan: Callable[[Runs], tuple[Plan, bool]],
    *,
    writing: bool,
) -> tuple[TwoLevel, bool]:
    """Collective over ``ctx.comm``: plan a two-level call (see module doc), and whether
    it may be kept (agreed).

    Each rank's pieces (its runs cut at domains and windows) go to its local
    aggregator, which merges them into its group's runs and hands the runs of each
    domain to that domain's holder in the group (:func:`~collio.aggregators.stage.holders`).
    ``new_plan(runs)`` is the engine's one-level planning (collective, errors agreed),
    run with each rank's share.  Then each piece learns its round and its place in the
    group's staging slot.
    """
    assert ctx.local is not None
    what = "write_all" if writing else "read_all"
    step = Attempt()
    share, pieces, vpos = _to_holders(ctx, runs, bounds, window, step, writing)
    plan, keep = new_plan(share)  # (collective; raises the same error on every rank)
    group = group_of(ctx.comm, ctx.local)
    base, slot = _slot_bases(group, plan, step)
    staged, plan = _placed(ctx, group, plan, pieces, vpos, bounds, base, step, writing)
    staged.size, staged.slots = slot, slots(slot, plan.nrounds, ctx.hints.cb_buffer_size)
    with step:  # (collective over the group: the same size on its ranks)
        group.ensure(staged.slots * slot)
    if any_flag(ctx.comm, step.error is not None):
        raise_agreed(ctx.comm, step.error, what=what)
    return TwoLevel(staged, plan), keep


def run(
    ctx: Context, call: Call, tl: TwoLevel, buf: npt.NDArray[np.uint8], *, writing: bool
) -> BaseException | None:
    """Collective over ``ctx.comm``: the rounds of a two-level call on ``buf``.  Returns
    this rank's error of the rounds, not yet agreed (as :func:`~collio.rounds.write_rounds`)."""
    staged, plan = tl.stage.bound(ctx, buf), tl.plan
    call.two_level = True
    call.counters.rounds = plan.nrounds
    ctx.stats.local = local_summary(ctx, plan)
    ctx.stats.local["local_sources"] = tl.stage.sources
    if writing:
        return write_rounds(ctx, plan, buf, call, staged)
    return read_rounds(ctx, plan, buf, call, staged)


def _to_holders(
    ctx: Context, runs: Runs, bounds: I64, window: int, step: Attempt, writing: bool
) -> tuple[Runs, Runs, I64]:
    """Collective: this rank's pieces to its local aggregator, which merges its group's
    and returns each piece's virtual position; the merged runs of each domain go to
    their holder.  Returns this rank's share, its pieces, and their virtual positions
    (errors agreed)."""
    assert ctx.local is not None
    comm, size, rank = ctx.comm, ctx.comm.Get_size(), ctx.comm.Get_rank()
    what = "write_all" if writing else "read_all"
    leader = int(ctx.local.leader[rank])
    pieces, counts, meta = Runs.empty(), np.zeros(size, np.int64), _NONE
    with step:  # (a rank that fails here sends nothing: counts are set last)
        pieces = plan_sender(runs, bounds, window).pieces
        meta = _pairs(pieces.file, pieces.length)
        counts[leader] = len(meta)
    recv, rcounts = alltoallv_i64(comm, meta, counts, what=what)
    shares, scounts = _NONE, np.zeros(size, np.int64)
    vback, vcounts = _NONE, np.zeros(size, np.int64)
    with step:
        if step.error is None and leader == rank:
            merged, vback = leader_runs(recv[0::2], recv[1::2])
            members = _members(ctx.local, rank, writing)
            shares, scounts = _shares(merged, bounds, window, members, size)
            vcounts = rcounts // 2
    got, _ = alltoallv_i64(comm, shares, scounts, what=what)
    vpos, _ = alltoallv_i64(comm, vback, vcounts, what=what)
    if any_flag(comm, step.error is not None):
        raise_agreed(comm, step.error, what=what)
    return Runs(got[0::3].copy(), got[1::3].copy(), got[2::3].copy()), pieces, vpos


def _members(local: LocalGroups, rank: int, writing: bool) -> I64:
    """The ranks of ``rank``'s local group that hold parts of its stage-two plan, sorted:
    for reads all of them (each receives the group's messages of some domains, so MPI's
    copies into the staging spread over the group's cores instead of queueing at one
    rank), for writes its local aggregator alone (the aggregators' receives already
    spread those copies; each more sender would have to wait for the whole group)."""
    if writing:
        return local.leader[rank : rank + 1].copy()
    return np.flatnonzero(local.group == local.group[rank]).astype(np.int64)


def _shares(merged: Runs, bounds: I64, window: int, members: I64, size: int) -> tuple[I64, I64]:
    """A local aggregator's merged runs cut at domains and windows, as (file, length,
    virtual position) triples by holder, and the count of values for each rank."""
    sp = plan_sender(merged, bounds, window)
    p = sp.pieces
    hold = holders(np.repeat(sp.gdom, np.diff(sp.gstart)), members)
    order = np.argsort(hold, kind="stable")
    out = np.empty(3 * len(order), np.int64)
    out[0::3], out[1::3], out[2::3] = p.file[order], p.length[order], p.mem[order]
    return out, 3 * np.bincount(hold, minlength=size).astype(np.int64)


def _slot_bases(group: Group, plan: Plan, step: Attempt) -> tuple[I64, int]:
    """Collective over the group: where this rank's stage-two groups of each round start
    in the round's slot (after those of the group's lower ranks), and the slot's bytes."""
    mine = np.zeros(plan.nrounds, np.int64)
    with step:
        mine = round_bytes(plan.sender, plan.sround, plan.nrounds)
    base, total = np.zeros_like(mine), np.zeros_like(mine)
    group.comm.Exscan([mine, MPI.INT64_T], [base, MPI.INT64_T], op=MPI.SUM)
    group.comm.Allreduce([mine, MPI.INT64_T], [total, MPI.INT64_T], op=MPI.SUM)
    if group.comm.Get_rank() == 0:
        base[:] = 0  # (Exscan leaves the first rank's undefined)
    return base, int(total.max(initial=0))


def _placed(
    ctx: Context, group: Group, plan: Plan, pieces: Runs, vpos: I64, bounds: I64,
    base: I64, step: Attempt, writing: bool,
) -> tuple[_Staged, Plan]:  # fmt: skip
    """Collective: each piece's virtual position to the holder of its domain, which
    answers with the piece's round and staging position; this rank's stage record, and
    its plan sending from (receiving into) the staging slot."""
    assert ctx.local is not None
    comm, size, rank = ctx.comm, ctx.comm.Get_size(), ctx.comm.Get_rank()
    what = "write_all" if writing else "read_all"
    order, counts, ask = _NONE, np.zeros(size, np.int64), _NONE
    with step:
        dom = np.searchsorted(bounds[1:-1], pieces.file, side="right").astype(np.int64)
        hold = holders(dom, _members(ctx.local, rank, writing))
        order = np.argsort(hold, kind="stable").astype(np.int64)
        ask, counts = vpos[order], np.bincount(hold, minlength=size).astype(np.int64)
    asked, acounts = alltoallv_i64(comm, ask, counts, what=what)
    back, bcounts = _NONE, np.zeros(size, np.int64)
    with step:
        lay = staging(plan.sender, plan.sround, asked, base)
        back, bcounts = _pairs(lay.sround, lay.spos), 2 * acounts
        plan = dataclasses.replace(plan, sender=lay.sender, _sender_shapes=None)
        plan.sender_shapes()
    got, _ = alltoallv_i64(comm, back, bcounts, what=what)
    rounds, spos = np.zeros(len(order), np.int64), np.zeros(len(order), np.int64)
    with step:
        rounds[order], spos[order] = got[0::2], got[1::2]
    by, starts = by_round(rounds, plan.nrounds)
    lead = int(ctx.local.leader[rank]) == rank
    staged = _Staged(lead, pieces, by, starts, spos, 0)
    has = (np.diff(starts) > 0).astype(np.int64)
    sources = np.zeros_like(has)
    group.comm.Reduce([has, MPI.INT64_T], [sources, MPI.INT64_T], op=MPI.SUM, root=0)
    staged.sources = sources.tolist() if lead else []
    return staged, plan
