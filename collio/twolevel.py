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

from . import policy
from .aggregators.nodes import LocalGroups, local_groups, node_shape
from .aggregators.plan import AggregatorPlan, SenderPlan, plan_sender
from .aggregators.stage import by_round, leader_runs, staging
from .collective import Attempt, any_flag, raise_agreed
from .completion import local_summary
from .context import Call, Context, Plan
from .exchange import Shapes, alltoallv_i64
from .hints import Hints
from .rounds import read_rounds, write_rounds
from .runs import Runs
from .shmstage import SLOTS, ShmStage, group_of

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
    each at ``spos`` in the round's slot of ``size`` bytes (the same on every rank of the
    group).  A local aggregator also keeps, per round, how many ranks of its group have
    pieces in it (``sources``, for the statistics).
    """

    lead: bool
    pieces: Runs
    order: I64
    starts: I64
    spos: I64
    size: int
    sources: list[int] = dataclasses.field(default_factory=list)

    def bound(self, ctx: Context, buf: npt.NDArray[np.uint8]) -> ShmStage:
        """This stage for a call on ``buf``, over the group's window (a kept plan holds
        neither: the user's buffer changes, and the window is the communicator's)."""
        assert ctx.local is not None
        group = group_of(ctx.comm, ctx.local)
        p = self.pieces
        return ShmStage(
            group, buf, p.mem, p.length, self.spos, self.order, self.starts, self.size, self.lead
        )


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

    ``new_plan(runs)`` is the engine's one-level planning (collective, errors agreed),
    run with each local aggregator's merged runs and no runs elsewhere.
    """
    return _plan(ctx, lambda: plan_sender(runs, bounds, window), new_plan, writing)


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


def _plan(
    ctx: Context,
    cut: Callable[[], SenderPlan],
    new_plan: Callable[[Runs], tuple[Plan, bool]],
    writing: bool,
) -> tuple[TwoLevel, bool]:
    """Collective: members' pieces (``cut()``: this rank's runs cut at domains and
    windows) to their local aggregator, the stage-two plan, and each piece's round and
    staging position (every step agreed before the rounds)."""
    assert ctx.local is not None
    comm, what = ctx.comm, "write_all" if writing else "read_all"
    size, rank = comm.Get_size(), comm.Get_rank()
    leader = int(ctx.local.leader[rank])
    step = Attempt()
    pieces, counts, meta = Runs.empty(), np.zeros(size, np.int64), _NONE
    with step:  # (a rank that fails here sends nothing: counts are set last)
        sp = cut()
        pieces, meta = sp.pieces, _pairs(sp.pieces.file, sp.pieces.length)
        counts[leader] = len(meta)
    recv, rcounts = alltoallv_i64(comm, meta, counts, what=what)
    mine, vpos = Runs.empty(), _NONE
    with step:
        if step.error is None and leader == rank:
            mine, vpos = leader_runs(recv[0::2], recv[1::2])
    if any_flag(comm, step.error is not None):
        raise_agreed(comm, step.error, what=what)
    plan, keep = new_plan(mine)  # (collective; raises the same error on every rank)
    src = np.repeat(np.arange(size, dtype=np.int64), rcounts // 2)
    back, lay = _NONE, None
    with step:
        if leader == rank:
            lay = staging(plan.sender, plan.sround, vpos)
            back = _pairs(lay.sround, lay.spos)
    # a leader whose staging failed sends nothing (its buffer is empty); the error is
    # agreed right after, so its members' counts of zero are never used
    counts = 2 * np.bincount(src, minlength=size) if lay is not None else np.zeros(size, np.int64)
    got, _ = alltoallv_i64(comm, back, counts, what=what)
    group = group_of(comm, ctx.local)
    slot = int(group.comm.bcast(lay.size if lay is not None else 0, root=0))
    with step:
        group.ensure(SLOTS * slot)  # (collective over the group: the same size on its ranks)
        order, starts = by_round(got[0::2], plan.nrounds)
        staged = _Staged(leader == rank, pieces, order, starts, got[1::2].copy(), slot)
        if lay is not None:
            plan = dataclasses.replace(plan, sender=lay.sender, _sender_shapes=None)
            plan.sender_shapes()
            staged.sources = _sources(lay.sround, src, plan.nrounds)
    if any_flag(comm, step.error is not None):
        raise_agreed(comm, step.error, what=what)
    return TwoLevel(staged, plan), keep


def _sources(sround: I64, src: I64, nrounds: int) -> list[int]:
    """Ranks with pieces in each round, from every received piece's round and source."""
    width = int(src.max(initial=0)) + 1
    pairs = np.unique(sround * width + src)
    counts: list[int] = np.bincount(pairs // width, minlength=nrounds)[:nrounds].tolist()
    return counts
