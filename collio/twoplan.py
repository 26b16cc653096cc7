"""Planning a two-level call: the collective steps behind :func:`collio.twolevel.plan`.

1. Each rank sends the (offset, length) of its pieces (its runs cut at domains and
   windows) to its local aggregator, which merges its group's in file order, each piece
   at a virtual position (:func:`~collio.aggregators.stage.leader_runs`).  A rank's
   pieces for its own group's aggregators stay with the rank (:func:`near_domains`):
   it plans them in step 3 as one level does (a write sends them from its buffer, a
   read receives them into it).
2. The local aggregator cuts the merged runs at domains and windows and hands each
   domain's to its holder in the group (:func:`~collio.aggregators.stage.holders`: the
   local aggregator itself for writes), with the pieces of its ranks that lie there.
3. Each rank plans its share as one level does (``new_plan``, collective).
4. The holders of a group lay their rounds out one after another in each staging slot
   and tell every piece's owner the piece's round and staging position.

A rank that fails in a step goes on with empty results (sending nothing), so that every
collective after it still matches; the steps' errors are agreed once, at the end, with
the window's growth (each collective step costs a wait for every rank: on a node whose
ranks outnumber its cores, a scheduling slice each).  Steps 1, 2 and 4 are collective
over the group's communicator (a node's ranks only: a job of many nodes would otherwise
send every rank's counts to every rank to reach one on its node); step 3 and the
agreement are the whole communicator's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.plan import plan_sender
from .aggregators.stage import holders, leader_runs, round_bytes, slots, staging
from .collective import Attempt, agree
from .context import Context, Plan
from .exchange import alltoallv_into
from .runs import Runs, displacements, sort
from .shmstage import Group
from .waits import sleep_until_done

__all__ = ["Placed", "near_domains", "place"]

I64 = npt.NDArray[np.int64]
_NONE = np.zeros(0, np.int64)


class Placed:
    """This rank's result of :func:`place`: its stage-two plan (sending from, receiving
    into, the staging slot), its pieces with their rounds and staging positions, the
    slot's bytes and the group's slots, and (at a local aggregator) how many ranks have
    pieces in each round."""

    __slots__ = ("plan", "keep", "pieces", "rounds", "spos", "slot", "slots", "sources", "direct")

    def __init__(self, plan: Plan, keep: int | None, pieces: Runs, rounds: I64, spos: I64) -> None:
        self.plan, self.keep, self.pieces = plan, keep, pieces
        self.rounds, self.spos = rounds, spos
        self.slot, self.slots, self.sources = 0, 0, list[int]()
        # the stage-two groups that go from (a read's: into) the rank's own buffer (None: none)
        self.direct: npt.NDArray[np.bool_] | None = None


def place(
    ctx: Context, group: Group, runs: Runs, bounds: I64, window: int,
    new_plan: Callable[[Runs], tuple[Plan, int | None]], *, writing: bool, what: str,
) -> Placed:  # fmt: skip
    """Collective over ``ctx.comm``: steps 1-4 of the module doc, and the group's window
    grown to its slots (errors agreed)."""
    assert ctx.local is not None
    step = Attempt()
    near = near_domains(ctx)
    pieces, direct, recv, rcounts, answers = _to_leader(group, runs, bounds, window, step, near)
    share, queries = _to_holders(group, recv, rcounts, bounds, window, step, writing)
    joined = Runs.empty()
    with step:  # (a rank that fails here plans nothing: agreed below)
        joined = _joined(direct, share)
    plan, keep = new_plan(joined)  # (collective; raises the same error on every rank)
    via = None if near is None else ~near[plan.sender.gdom]  # (through the staging)
    base, slot = _slot_bases(group, plan, step, writing, via)
    got = _answers(group, plan, queries, (base, slot), answers, step, writing, via)
    rounds, spos, staged, slot, sources = got
    placed = Placed(staged, keep, pieces, rounds, spos)
    if not writing:  # (a read's holders each know the rounds of some pieces only)
        sources = _sources(group, rounds, plan.nrounds)
    placed.slot, placed.sources = slot, sources
    if via is not None and not bool(via.all()):
        placed.direct = ~via
    placed.slots = slots(slot, plan.nrounds, ctx.hints.cb_buffer_size)
    with step:  # (collective over the group: the same size on its ranks, failed or not)
        group.ensure(placed.slots * slot)
    # (every step above may have failed on one rank: agreed before its result is used, or
    # that rank would go on with pieces at round 0, position 0)
    agree(ctx.comm, step.error, what=what)
    return placed


def near_domains(ctx: Context) -> npt.NDArray[np.bool_]:
    """Local: whether each file domain's aggregator is in this rank's local group (a
    write's pieces for those go to it straight from the rank's buffer, a read's come
    from it straight into the buffer, as one level: a copy through the staging less for
    each of their bytes)."""
    assert ctx.local is not None
    group = ctx.local.group
    mine: npt.NDArray[np.bool_] = group[ctx.aggregators] == group[ctx.comm.Get_rank()]
    return mine


def _joined(direct: Runs, share: Runs) -> Runs:
    """A rank's stage-two runs: its own pieces for its group's aggregators (at their
    places in its buffer) and its share of its group's merged pieces for the others (at
    virtual positions; a write's local aggregator holds them all), in file order (they
    lie in different domains)."""
    if not len(direct):
        return share
    if not len(share):
        return direct
    cat = np.concatenate
    both = Runs(cat((direct.file, share.file)), cat((direct.length, share.length)),
                cat((direct.mem, share.mem)))  # fmt: skip
    return sort(both)  # (stable: as before, the rank's own first where offsets tie)


def _sources(group: Group, rounds: I64, nrounds: int) -> list[int]:
    """Collective over the group: at its local aggregator, how many of its ranks have
    pieces in each round (for the statistics)."""
    has = (np.bincount(rounds, minlength=nrounds)[:nrounds] > 0).astype(np.int64)
    sources = np.zeros_like(has)
    group.comm.Reduce([has, MPI.INT64_T], [sources, MPI.INT64_T], op=MPI.SUM, root=0)
    return sources.tolist() if group.comm.Get_rank() == 0 else []


def _to_leader(
    group: Group, runs: Runs, bounds: I64, window: int, step: Attempt,
    near: npt.NDArray[np.bool_] | None,
) -> tuple[Runs, Runs, I64, I64, I64]:  # fmt: skip
    """Step 1's message (collective over the group): this rank's pieces that go through
    the staging, and those it sends itself (for the domains ``near`` marks; None: none);
    the local aggregator's received (offset, length) pairs and the count of values from
    each rank of the group; and room for step 4's answers about the pieces sent (at most
    three values each, made here, where a rank that cannot make it still sends nothing)."""
    pieces, direct, meta, answers = Runs.empty(), Runs.empty(), _NONE, _NONE
    with step:  # (a rank that fails here sends nothing)
        sp = plan_sender(runs, bounds, window)
        sent = sp.pieces
        if near is not None and len(sent):
            own = near[np.repeat(sp.gdom, np.diff(sp.gstart))]
            direct, sent = sent.take(np.flatnonzero(own)), sent.take(np.flatnonzero(~own))
        meta = _interleave(sent.file, sent.length)
        answers = np.empty(3 * len(sent.file), np.int64)
        pieces = sent
    recv, rcounts = _gather(group.comm, meta, step)
    return pieces, direct, recv, rcounts, answers


def _gather(comm: MPI.Intracomm, send: I64, step: Attempt) -> tuple[I64, I64]:
    """Collective over a group's ``comm``: every rank's ``send`` to its rank 0, which gets
    them one rank after another and the count from each (the others: nothing).  A rank 0
    that cannot hold them keeps the error in ``step`` and says so: then nobody sends."""
    root = comm.Get_rank() == 0
    mine = np.array([len(send)], np.int64)
    counts = np.zeros(comm.Get_size() if root else 1, np.int64)
    comm.Gather([mine, MPI.INT64_T], [counts, MPI.INT64_T], root=0)
    recv, ok, held = _NONE, np.ones(1, np.int64), Attempt()
    if root:
        with held:
            recv = _room(int(counts.sum()))
        if held.error is not None:
            step.fail(held.error)
            ok[0], counts[:] = 0, 0
    comm.Bcast([ok, MPI.INT64_T], root=0)
    send = send if ok[0] else _NONE
    displ = displacements(counts)
    comm.Gatherv([send, MPI.INT64_T], [recv, (counts, displ), MPI.INT64_T], root=0)
    return recv, counts if root else _NONE


def _room(n: int) -> I64:
    """Room for ``n`` values received in a group's step."""
    return np.empty(n, np.int64)


def _scatter(comm: MPI.Intracomm, out: I64, counts: I64, step: Attempt) -> I64:
    """Collective over a group's ``comm``: ``counts[g]`` values of its rank 0's ``out``
    (one rank's after another) to its rank g; returns this rank's.  A rank that cannot
    hold them keeps the error in ``step`` and says so: then it gets nothing."""
    root, size = comm.Get_rank() == 0, comm.Get_size()
    mine = np.zeros(1, np.int64)
    counts = counts if root else np.zeros(size, np.int64)
    # (the ranks wait for rank 0's merge: sleeping, so that it has the node's cores)
    sleep_until_done(comm.Iscatter([counts, MPI.INT64_T], [mine, MPI.INT64_T], root=0))
    recv, held = _NONE, Attempt()
    with held:
        recv = _room(int(mine[0]))
    if held.error is not None:
        step.fail(held.error)
    ok = np.array([held.error is None], np.int64)
    oks = np.ones(size, np.int64)
    comm.Gather([ok, MPI.INT64_T], [oks, MPI.INT64_T], root=0)
    displ = displacements(counts)
    comm.Scatterv([out, (counts * oks, displ), MPI.INT64_T], [recv, MPI.INT64_T], root=0)
    return recv


def _to_holders(
    group: Group, recv: I64, rcounts: I64, bounds: I64, window: int,
    step: Attempt, writing: bool,
) -> tuple[Runs, I64]:  # fmt: skip
    """Step 2: this rank's share of its group's merged runs, and the queries it answers
    (owner's rank in the group, index among the owner's pieces, virtual position) for the
    received pieces in its domains (errors kept in ``step``; a read's bundles go out
    collective over the group)."""
    share, queries = Runs.empty(), _NONE
    gsize = group.comm.Get_size()
    out, counts = _NONE, np.zeros(gsize, np.int64)
    with step:
        if step.error is None and group.comm.Get_rank() == 0:
            merged, asked = _merged(recv, rcounts)
            if writing:  # (the local aggregator holds every domain: nothing to send)
                share, queries = merged, _triples(*asked)
            else:
                out, counts = _bundles(merged, asked, bounds, window, recv[0::2], gsize)
    if not writing:  # (a local aggregator that failed sends nothing: empty shares)
        got = _scatter(group.comm, out, counts, step)
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
    gsize: int,
) -> tuple[I64, I64]:  # fmt: skip
    """A local aggregator's step 2 for reads: for each rank of its group one bundle,
    [share values, its share as (file, length, virtual position) triples, its queries as
    triples], and the count of values for each (``file``: the received pieces' offsets).

    Every rank of a read's group holds the domains :func:`~collio.aggregators.stage.holders`
    gives it: each receives the group's messages of those, so MPI's copies into the
    staging spread over the group's cores instead of queueing at one rank.  (A write's
    local aggregator holds them all: the aggregators' receives already spread those
    copies; each more sender would have to wait for the whole group.)"""
    sp = plan_sender(merged, bounds, window)
    p = sp.pieces
    ranks = np.arange(gsize, dtype=np.int64)
    share_of = holders(np.repeat(sp.gdom, np.diff(sp.gstart)), ranks)
    domain = np.searchsorted(bounds[1:-1], file, side="right").astype(np.int64)
    sorder, sstart = _grouped(share_of, gsize)
    qorder, qstart = _grouped(holders(domain, ranks), gsize)
    parts, counts = [], np.zeros(gsize, np.int64)
    for i in range(gsize):  # (one bundle per rank of the group)
        s, q = sorder[sstart[i] : sstart[i + 1]], qorder[qstart[i] : qstart[i + 1]]
        shares = _triples(p.file[s], p.length[s], p.mem[s])
        parts += [np.array([len(s)], np.int64), shares, _triples(*(a[q] for a in asked))]
        counts[i] = 1 + 3 * (len(s) + len(q))
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


def _slot_bases(
    group: Group, plan: Plan, step: Attempt, writing: bool, staged: npt.NDArray[np.bool_] | None
) -> tuple[I64, int]:
    """Where this rank's stage-two groups of each round start in the round's slot (after
    those of the group's lower ranks), and the slot's bytes (``staged``: the send groups
    that go through it, None: all).  A write's local aggregator holds its group's whole
    staged plan: its slot is its own (the others learn it with their answers,
    :func:`_answers`); a read's holders tell each other theirs (collective over the
    group)."""
    mine = np.zeros(plan.nrounds, np.int64)
    with step:
        mine = round_bytes(plan.sender, plan.sround, plan.nrounds, staged)
    if writing:
        return np.zeros_like(mine), int(mine.max(initial=0))
    every = np.zeros((group.comm.Get_size(), plan.nrounds), np.int64)
    group.comm.Allgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
    base = every[: group.comm.Get_rank()].sum(axis=0)
    return base, int(every.sum(axis=0).max(initial=0))


def _answers(
    group: Group, plan: Plan, queries: I64, slot: tuple[I64, int], room: I64,
    step: Attempt, writing: bool, staged: npt.NDArray[np.bool_] | None = None,
) -> tuple[I64, I64, Plan, int, list[int]]:  # fmt: skip
    """Step 4 (collective over the group): each holder lays out its rounds and answers
    its queries with (index, round, staging position) to the pieces' owners, in
    ``room`` (:func:`_to_leader`).  Returns this rank's pieces' rounds and positions, its
    plan with its ``staged`` groups' pieces' memory at their staging positions, the slot's bytes (a
    write's from the local aggregator), and at a write's local aggregator how many
    ranks have pieces in each round."""
    base, size = slot
    gsize = group.comm.Get_size()
    out, counts, sources = _NONE, np.zeros(gsize, np.int64), list[int]()
    with step:
        owner, index, vpos = queries[0::3], queries[1::3], queries[2::3]
        lay = staging(plan.sender, plan.sround, vpos, base, staged)
        plan = dataclasses.replace(plan, sender=lay.sender, _sender_shapes=None)
        plan.sender_shapes()
        at = owner  # (the owners' ranks in the group)
        if writing and group.comm.Get_rank() == 0:
            sources = _distinct(at, lay.sround, gsize, plan.nrounds)
        order = np.argsort(at, kind="stable")
        out = _triples(index[order], lay.sround[order], lay.spos[order])
        counts = 3 * np.bincount(at, minlength=gsize).astype(np.int64)
    head = np.empty((gsize, 2), np.int64)
    head[:, 0], head[:, 1] = counts, size
    heard = np.empty_like(head)
    # (the group waits for its holders' layouts, a write's for its local aggregator's
    # alone: sleeping, so that they have the node's cores)
    sleep_until_done(group.comm.Ialltoall([head, MPI.INT64_T], [heard, MPI.INT64_T]))
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
