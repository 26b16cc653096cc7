"""Planning a two-level call: the collective steps behind :func:`collio.twolevel.plan`.

1. Each rank sends the (offset, length) of its pieces (its runs cut at domains and
   windows) to its local aggregator, which merges its group's in file order, each piece
   at a virtual position (:func:`~collio.aggregators.stage.leader_runs`).
2. The local aggregator cuts the merged runs at domains and windows and hands each
   domain's to its holder in the group (:func:`~collio.aggregators.stage.holders`: the
   local aggregator itself for writes), with the pieces of its ranks that lie there.
3. Each rank plans its share as one level does (``new_plan``, collective).
4. The holders of a group lay their rounds out one after another in each staging slot
   and tell every piece's owner the piece's round and staging position.

A rank that fails in a step goes on with empty results (sending nothing), so that every
collective after it still matches; the steps' errors are agreed once, at the end, with
the window's growth (each collective step costs a wait for every rank: on a node whose
ranks outnumber its cores, a scheduling slice each).  Steps 2-4 within a group are
collective over the group's communicator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.nodes import LocalGroups
from .aggregators.plan import plan_sender
from .aggregators.stage import holders, leader_runs, round_bytes, slots, staging
from .collective import Attempt, agree
from .context import Context, Plan
from .exchange import alltoallv_i64, alltoallv_into
from .runs import Runs
from .shmstage import Group

__all__ = ["Placed", "place"]

I64 = npt.NDArray[np.int64]
_NONE = np.zeros(0, np.int64)


class Placed:
    """This rank's result of :func:`place`: its stage-two plan (sending from, receiving
    into, the staging slot), its pieces with their rounds and staging positions, the
    slot's bytes and the group's slots, and (at a local aggregator) how many ranks have
    pieces in each round."""

    __slots__ = ("plan", "keep", "pieces", "rounds", "spos", "slot", "slots", "sources")

    def __init__(self, plan: Plan, keep: int | None, pieces: Runs, rounds: I64, spos: I64) -> None:
        self.plan, self.keep, self.pieces = plan, keep, pieces
        self.rounds, self.spos = rounds, spos
        self.slot, self.slots, self.sources = 0, 0, list[int]()


def place(
    ctx: Context, group: Group, runs: Runs, bounds: I64, window: int,
    new_plan: Callable[[Runs], tuple[Plan, int | None]], *, writing: bool,
) -> Placed:  # fmt: skip
    """Collective over ``ctx.comm``: steps 1-4 of the module doc, and the group's window
    grown to its slots (errors agreed)."""
    assert ctx.local is not None
    what = "write_all" if writing else "read_all"
    step = Attempt()
    pieces, recv, rcounts, answers = _to_leader(ctx, runs, bounds, window, step, what)
    share, queries = _to_holders(ctx, recv, rcounts, bounds, window, step, writing, what)
    plan, keep = new_plan(share)  # (collective; raises the same error on every rank)
    base, slot = _slot_bases(group, plan, step, writing)
    got = _answers(ctx, group, plan, queries, (base, slot), answers, step, writing)
    rounds, spos, staged, slot, sources = got
    placed = Placed(staged, keep, pieces, rounds, spos)
    if not writing:  # (a read's holders each know the rounds of some pieces only)
        sources = _sources(group, rounds, plan.nrounds)
    placed.slot, placed.sources = slot, sources
    placed.slots = slots(slot, plan.nrounds, ctx.hints.cb_buffer_size)
    with step:  # (collective over the group: the same size on its ranks, failed or not)
        group.ensure(placed.slots * slot)
    # (every step above may have failed on one rank: agreed before its result is used, or
    # that rank would go on with pieces at round 0, position 0)
    agree(ctx.comm, step.error, what=what)
    return placed


def _sources(group: Group, rounds: I64, nrounds: int) -> list[int]:
    """Collective over the group: at its local aggregator, how many of its ranks have
    pieces in each round (for the statistics)."""
    has = (np.bincount(rounds, minlength=nrounds)[:nrounds] > 0).astype(np.int64)
    sources = np.zeros_like(has)
    group.comm.Reduce([has, MPI.INT64_T], [sources, MPI.INT64_T], op=MPI.SUM, root=0)
    return sources.tolist() if group.comm.Get_rank() == 0 else []


def _to_leader(
    ctx: Context, runs: Runs, bounds: I64, window: int, step: Attempt, what: str
) -> tuple[Runs, I64, I64, I64]:
    """Step 1's message: this rank's pieces; the local aggregator's received (offset,
    length) pairs and the count of values from each rank; and room for step 4's answers
    about the pieces sent (at most three values each, made here, where a rank that
    cannot make it still sends nothing)."""
    assert ctx.local is not None
    comm, size, rank = ctx.comm, ctx.comm.Get_size(), ctx.comm.Get_rank()
    pieces, counts, meta, answers = Runs.empty(), np.zeros(size, np.int64), _NONE, _NONE
    with step:  # (a rank that fails here sends nothing: counts are set last)
        sent = plan_sender(runs, bounds, window).pieces
        meta = _interleave(sent.file, sent.length)
        answers = np.empty(3 * len(sent.file), np.int64)
        pieces = sent
        counts[int(ctx.local.leader[rank])] = len(meta)
    recv, rcounts = alltoallv_i64(comm, meta, counts, what=what)
    return pieces, recv, rcounts, answers


def _members(local: LocalGroups, rank: int, writing: bool) -> I64:
    """The ranks of ``rank``'s local group that hold parts of its stage-two plan, sorted:
    for reads all of them (each receives the group's messages of some domains, so MPI's
    copies into the staging spread over the group's cores instead of queueing at one
    rank), for writes its local aggregator alone (the aggregators' receives already
    spread those copies; each more sender would have to wait for the whole group)."""
    if writing:
        return local.leader[rank : rank + 1].copy()
    return np.flatnonzero(local.group == local.group[rank]).astype(np.int64)


def _to_holders(
    ctx: Context, recv: I64, rcounts: I64, bounds: I64, window: int, step: Attempt,
    writing: bool, what: str,
) -> tuple[Runs, I64]:  # fmt: skip
    """Step 2: this rank's share of its group's merged runs, and the queries it answers
    (owner, index among the owner's pieces, virtual position) for the received pieces
    in its domains (errors kept in ``step``)."""
    assert ctx.local is not None
    comm, size, rank = ctx.comm, ctx.comm.Get_size(), ctx.comm.Get_rank()
    share, queries = Runs.empty(), _NONE
    out, counts = _NONE, np.zeros(size, np.int64)
    with step:
        if step.error is None and int(ctx.local.leader[rank]) == rank:
            merged, asked = _merged(recv, rcounts)
            if writing:  # (the local aggregator holds every domain: nothing to send)
                share, queries = merged, _triples(*asked)
            else:
                members = _members(ctx.local, rank, writing)
                out, counts = _bundles(merged, asked, bounds, window, recv[0::2], members, size)
    if not writing:  # (a local aggregator that failed sends nothing: empty shares)
        got, _ = alltoallv_i64(comm, out, counts, what=what)
        if len(got):
            n = 3 * int(got[0])
            trip = got[1 : 1 + n]
            share = Runs(trip[0::3].copy(), trip[1::3].copy(), trip[2::3].copy())
            queries = got[1 + n :]
    return share, queries


def _merged(recv: I64, rcounts: I64) -> tuple[Runs, tuple[I64, I64, I64]]:
    """A local aggregator's merged runs, and each received piece's (owner, index among
    the owner's pieces, virtual position)."""
    merged, vpos = leader_runs(recv[0::2], recv[1::2])
    each = rcounts // 2
    owner = np.repeat(np.arange(len(rcounts), dtype=np.int64), each)
    index = np.arange(len(owner), dtype=np.int64) - np.repeat(np.cumsum(each) - each, each)
    return merged, (owner, index, vpos)


def _triples(a: I64, b: I64, c: I64) -> I64:
    out = np.empty(3 * len(a), np.int64)
    out[0::3], out[1::3], out[2::3] = a, b, c
    return out


def _bundles(
    merged: Runs, asked: tuple[I64, I64, I64], bounds: I64, window: int, file: I64,
    members: I64, size: int,
) -> tuple[I64, I64]:  # fmt: skip
    """A local aggregator's step 2 for reads: for each holder (``members``) one bundle,
    [share values, its share as (file, length, virtual position) triples, its queries as
    triples], and the count of values for each of the ``size`` ranks (``file``: the
    received pieces' offsets)."""
    sp = plan_sender(merged, bounds, window)
    p = sp.pieces
    where = np.zeros(size, np.int64)
    where[members] = np.arange(len(members))
    share_of = where[holders(np.repeat(sp.gdom, np.diff(sp.gstart)), members)]
    domain = np.searchsorted(bounds[1:-1], file, side="right").astype(np.int64)
    sorder, sstart = _grouped(share_of, len(members))
    qorder, qstart = _grouped(where[holders(domain, members)], len(members))
    parts, counts = [], np.zeros(size, np.int64)
    for i, h in enumerate(members.tolist()):  # (one bundle per rank of the group)
        s, q = sorder[sstart[i] : sstart[i + 1]], qorder[qstart[i] : qstart[i + 1]]
        shares = _triples(p.file[s], p.length[s], p.mem[s])
        parts += [np.array([len(s)], np.int64), shares, _triples(*(a[q] for a in asked))]
        counts[h] = 1 + 3 * (len(s) + len(q))
    return np.concatenate(parts), counts


def _grouped(key: I64, n: int) -> tuple[I64, I64]:
    """Indices of ``key`` (values 0..n-1) grouped by value, in order within each, and
    where each value's start (``n + 1`` entries).  The keys sort as 16-bit integers where
    they fit: numpy sorts those stably by radix, one pass, where int64 keys of a few
    values take a merge sort's many."""
    small = key.astype(np.int16 if n <= np.iinfo(np.int16).max else np.int32)
    order = np.argsort(small, kind="stable").astype(np.int64)
    counts = np.bincount(key, minlength=n)[:n]
    return order, np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _slot_bases(group: Group, plan: Plan, step: Attempt, writing: bool) -> tuple[I64, int]:
    """Where this rank's stage-two groups of each round start in the round's slot (after
    those of the group's lower ranks), and the slot's bytes.  A write's local aggregator
    holds its group's whole plan: its slot is its own (the others learn it with their
    answers, :func:`_answers`); a read's holders tell each other theirs (collective over
    the group)."""
    mine = np.zeros(plan.nrounds, np.int64)
    with step:
        mine = round_bytes(plan.sender, plan.sround, plan.nrounds)
    if writing:
        return np.zeros_like(mine), int(mine.max(initial=0))
    every = np.zeros((group.comm.Get_size(), plan.nrounds), np.int64)
    group.comm.Allgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
    base = every[: group.comm.Get_rank()].sum(axis=0)
    return base, int(every.sum(axis=0).max(initial=0))


def _answers(
    ctx: Context, group: Group, plan: Plan, queries: I64, slot: tuple[I64, int], room: I64,
    step: Attempt, writing: bool,
) -> tuple[I64, I64, Plan, int, list[int]]:  # fmt: skip
    """Step 4 (collective over the group): each holder lays out its rounds and answers
    its queries with (index, round, staging position) to the pieces' owners, in
    ``room`` (:func:`_to_leader`).  Returns this rank's pieces' rounds and positions, its
    plan with its pieces' memory at their staging positions, the slot's bytes (a
    write's from the local aggregator), and at a write's local aggregator how many
    ranks have pieces in each round."""
    assert ctx.local is not None
    base, size = slot
    members = np.flatnonzero(ctx.local.group == ctx.local.group[ctx.comm.Get_rank()])
    gsize = len(members)
    out, counts, sources = _NONE, np.zeros(gsize, np.int64), list[int]()
    with step:
        owner, index, vpos = queries[0::3], queries[1::3], queries[2::3]
        lay = staging(plan.sender, plan.sround, vpos, base)
        plan = dataclasses.replace(plan, sender=lay.sender, _sender_shapes=None)
        plan.sender_shapes()
        where = np.zeros(ctx.comm.Get_size(), np.int64)
        where[members] = np.arange(gsize)
        at = where[owner]  # (the owners' ranks in the group)
        if writing and group.comm.Get_rank() == 0:
            sources = _distinct(at, lay.sround, gsize, plan.nrounds)
        order = np.argsort(at, kind="stable")
        out = _triples(index[order], lay.sround[order], lay.spos[order])
        counts = 3 * np.bincount(at, minlength=gsize).astype(np.int64)
    head = np.empty((gsize, 2), np.int64)
    head[:, 0], head[:, 1] = counts, size
    heard = np.empty_like(head)
    group.comm.Alltoall([head, MPI.INT64_T], [heard, MPI.INT64_T])
    got = _group_alltoallv(group, out, counts, heard[:, 0], room)
    n = len(room) // 3
    rounds, spos = np.zeros(n, np.int64), np.zeros(n, np.int64)
    with step:
        rounds[got[0::3]], spos[got[0::3]] = got[1::3], got[2::3]
    return rounds, spos, plan, int(heard[0, 1]) if writing else size, sources


def _distinct(at: I64, rounds: I64, gsize: int, nrounds: int) -> list[int]:
    """How many of the group's ranks (``at``) have pieces in each round (marks in a
    rounds x ranks table: one pass, where ``np.unique`` sorts or hashes every piece)."""
    seen = np.zeros((nrounds, gsize), bool)
    seen[rounds, at] = True
    return seen.sum(axis=1).tolist()  # type: ignore[no-any-return]


def _group_alltoallv(group: Group, out: I64, counts: I64, rcounts: I64, room: I64) -> I64:
    """Collective over the group: ``counts[g]`` values of ``out`` to its rank g, received
    into ``room`` (which holds them: a rank's answers are about pieces it sent)."""
    total = int(rcounts.sum())
    recv = room[:total] if total <= len(room) else np.empty(total, np.int64)
    alltoallv_into(group.comm, out, counts, recv, rcounts)
    return recv


def _interleave(a: I64, b: I64) -> I64:
    out = np.empty(2 * len(a), np.int64)
    out[0::2], out[1::2] = a, b
    return out
