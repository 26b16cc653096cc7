"""Two-level aggregation: each node's ranks hand their pieces to a local aggregator first.

With one level every aggregator takes a message from every rank with bytes in its
window, in every round: at 65,536 ranks that is tens of thousands of messages of a
few hundred bytes per aggregator and round.  With two levels (Kang et al., TPDS
2020; ADIOS2's TwoLevelShm; PnetCDF's ``nc_num_aggrs_per_node``) the ranks of a
node first hand their pieces of a round to one of a few local aggregators on the
node, which sends them on to the file-domain aggregators in one message per
aggregator: an aggregator then hears from the local aggregators only.  A rank's
pieces for an aggregator of its own local group skip the stage: a write's rank sends
them itself, from its buffer, and a read's receives them into it, as one level does
(they stay on the node either way, and the stage would copy each of their bytes once
more).

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
from .aggregators.plan import AggregatorPlan
from .aggregators.stage import by_round
from .completion import local_summary
from .context import Call, Context, Plan
from .exchange import Shapes
from .hints import Hints
from .readrounds import read_rounds
from .rounds import write_rounds
from .runs import Runs
from .shmstage import Blocks, ShmStage, blocks, group_of
from .twoplan import place

__all__ = ["TwoLevel", "local_aggregators", "plan", "run"]

I64 = npt.NDArray[np.int64]
_NONE = np.zeros(0, np.int64)
_NOBYTES = np.zeros(0, np.uint8)


def local_aggregators(
    nodes: I64, hints: Hints, used: dict[str, Any], shape: tuple[int, int] | None = None
) -> tuple[LocalGroups | None, int]:
    """A file's local aggregators (None: one level) and its node count, from the node
    map and :func:`~collio.policy.two_level`; ``used`` (``stats.hints``) records them.
    ``shape``: the map's :func:`~collio.aggregators.nodes.node_shape`, if known."""
    nnodes, fullest = node_shape(nodes) if shape is None else shape
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
    # the stage-two groups that go from (a read's: into) the rank's own buffer (None: none)
    direct: npt.NDArray[np.bool_] | None = None
    blocks: Blocks | None = None  # its pieces of each round as strided blocks
    nbytes: int = 0  # its pieces' bytes (what it copies through the staging per call)

    def bound(self, ctx: Context, buf: npt.NDArray[np.uint8]) -> ShmStage:
        """This stage for a call on ``buf``, over the group's window (a kept plan holds
        neither: the user's buffer changes, and the window is the communicator's)."""
        assert ctx.local is not None
        group = group_of(ctx.comm, ctx.local)
        p = self.pieces
        return ShmStage(
            group, buf, p.mem, p.length, self.spos, self.order, self.starts, self.size, self.lead,
            self.slots, self.direct, self.blocks if buf.flags.c_contiguous else None,
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
        more = st.direct.nbytes if st.direct is not None else 0
        more += st.blocks.nbytes if st.blocks is not None else 0
        return self.plan.nbytes() + sum(a.nbytes for a in parts) + more


def plan(
    ctx: Context,
    runs: Runs,
    bounds: I64,
    window: int,
    new_plan: Callable[[Runs], tuple[Plan, int | None]],
    *,
    writing: bool,
    what: str,
) -> tuple[TwoLevel, int | None]:
    """Collective over ``ctx.comm``: plan a two-level call (:mod:`collio.twoplan`), and
    what keeping it costs, None: not kept (agreed; the stage-two plan's cost, as
    ``new_plan`` returns it).  ``new_plan(runs)`` is the engine's one-level
    planning (collective, errors agreed), run with each rank's share of its group's runs.
    ``what`` names the call in errors.
    """
    assert ctx.local is not None
    group = group_of(ctx.comm, ctx.local)
    got = place(ctx, group, runs, bounds, window, new_plan, writing=writing, what=what)
    rank, nrounds = ctx.comm.Get_rank(), got.plan.nrounds
    order, starts = by_round(got.rounds, nrounds)
    lead = int(ctx.local.leader[rank]) == rank
    staged = _Staged(lead, got.pieces, order, starts, got.spos, got.slot, sources=got.sources)
    staged.slots = got.slots  # (the group's window holds them: grown by place)
    staged.direct = got.direct
    p = got.pieces
    staged.blocks = blocks(p.mem[order], got.spos[order], p.length[order], starts)
    staged.nbytes = int(p.length.sum())
    return TwoLevel(staged, got.plan), got.keep


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
    # (this rank's bytes through its group's staging: its pieces for other groups'
    # aggregators; those for its own group's move as one level's)
    ctx.stats.local["staged_bytes"] = tl.stage.nbytes
    if writing:
        return write_rounds(ctx, plan, buf, call, staged)
    return read_rounds(ctx, plan, buf, call, staged)
