"""The rounds of a two-phase call: exchange straight into round buffers, I/O overlapped.

Round ``k`` moves the ``k``-th non-empty window of every aggregator.  Senders
hand MPI slices of their own buffer (or a datatype over it); an aggregator
receives into its round buffer with a datatype that puts each byte at its file
position.  The backend request of round ``k`` runs in the I/O thread while round
``k+1`` is exchanged.  Reads run the same way backwards, the next window read
ahead.

Calls on a local backend agree on nothing per round: the call's completion agrees
on the error once.  Writes (see :func:`_write_streamed`) post their sends rounds
ahead, and each aggregator receives at its own pace, keeping up the messages even
after its I/O failed, so every send completes.  Reads run every round too: an
aggregator whose read failed still sends the round's messages (zeros: the call
fails, and a failed read's array holds undefined bytes), so every receive
completes.  Nobody waits for the slowest rank at every round.  A message a rank
cannot build is posted as a stand-in of the same size
(:class:`~collio.exchange.Messages`), so a failure in the exchange itself is agreed
the same way instead of stranding its peers.

With a remote backend (``Backend.remote``: object stores) rounds run in lockstep,
each round's status agreed before its messages, sleeping: a failed upload or GET
stops every rank at the same round instead of running the others' requests for
nothing, and an aggregator first waits for the request that frees its buffer (an
upload or a GET of seconds), where ranks that entered the messages meanwhile would
poll MPI for all that time, on cores that the uploads, and a server on the node,
need.  The data messages themselves must poll (a sleeping test loop starves MPICH's
large-message protocol).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.plan import AggregatorPlan, SenderPlan, round_requests
from .buffers import round_buffers, scratch_buffer, window_of
from .collective import Attempt
from .context import Call, Context, Plan
from .exchange import PACK_MAX_RUN, Messages, messages
from .policy import DEPTH
from .roundio import (
    Future,
    cover,
    drain,
    reuse_buffer,
    run_inline,
    settle,
    write_window,
)
from .stats import Stats
from .threads import io_executor
from .waits import sleep_until_done

__all__ = [
    # (the names readrounds.py shares with the write's rounds)
    "NO_SCRATCH", "PACK_SCRATCH", "TAG", "Lagged", "Rounds", "Stage", "agg_runs", "packs",
    "prepare", "sender_runs", "start_rounds", "write_rounds",
]  # fmt: skip

I64 = npt.NDArray[np.int64]
TAG = 0x0C01
#: Rounds of sends a rank keeps posted ahead of the round it receives (bounds the
#: requests outstanding and MPI's queue of unexpected messages at each aggregator).
AHEAD = 8
#: Most bytes an aggregator packs per round for its sends (a third buffer, kept).
PACK_SCRATCH = 16 << 20
NO_SCRATCH = np.zeros(0, np.uint8)


class Lagged:
    """Status agreement one round behind: Iallreduce now, wait at the next round."""

    __slots__ = ("comm", "req", "out", "patient")

    def __init__(self, comm: MPI.Comm, patient: bool = False) -> None:
        self.comm = comm
        self.req: MPI.Request | None = None
        self.out = np.zeros(1, np.int64)
        self.patient = patient  # sleep instead of polling (remote backends)

    def failed(self) -> bool:
        """Collective: did any rank report a failure in the previous round?"""
        if self.req is None:
            return False
        if self.patient:
            sleep_until_done(self.req)
        else:
            self.req.Wait()
        self.req = None
        return bool(self.out[0])

    def post(self, bad: bool) -> None:
        """Collective: report this rank's status for the round about to run."""
        self.out = np.zeros(1, np.int64)
        self.req = self.comm.Iallreduce(
            [np.array([int(bad)], np.int64), MPI.INT64_T], [self.out, MPI.INT64_T], op=MPI.MAX
        )


class Stage(Protocol):
    """A stage before a write's rounds and after a read's (two-level aggregation's
    intra-node stage, :mod:`collio.shmstage`): the plan's senders send from, and
    receive into, one of its ``slots`` buffers; ``slots - 1`` rounds of sends may be in
    flight while the next round's slot fills."""

    slots: int
    #: The plan's groups that go from (a read's: into) the call's own buffer instead
    #: (None: none).
    direct: npt.NDArray[np.bool_] | None

    def gather(self, k: int) -> npt.NDArray[np.uint8]:
        """Collective: fill the buffer for write round ``k``; returns it."""

    def landing(self, k: int) -> npt.NDArray[np.uint8]:
        """Collective: the buffer read round ``k`` arrives in."""

    def arrived(self, k: int) -> None:
        """Collective: read round ``k`` arrived (this rank's messages of it completed)."""

    def scatter(self, k: int) -> None:
        """Collective: hand out the buffer of read round ``k`` (after :meth:`arrived`)."""

    def finish(self) -> BaseException | None:
        """Collective: complete the stage; this rank's first error in it."""


def prepare(plan: Plan, *, writing: bool) -> None:
    """Local: make the large things this rank's rounds of ``plan`` need, so the rounds
    allocate only small ones (the order of the rounds, request lists): the plan's message
    shapes and the kept round (and, for reads, packing) buffers.  Mostly a no-op (a kept
    plan has its shapes, the buffers are kept).

    Call it inside the step that the last agreement before the rounds covers (the
    check of a call with a kept plan, the planning of a new one).  A rank that runs
    out of memory there makes every rank raise the same error; in the rounds it would
    leave its peers waiting for messages it never posts.
    """
    plan.sender_shapes()
    ap = plan.agg
    if ap is None or not ap.nrounds:
        return
    plan.agg_shapes()
    round_buffers(plan.window, DEPTH)
    if not writing and packs(ap):
        scratch_buffer(min(plan.window, PACK_SCRATCH))


def packs(ap: AggregatorPlan) -> bool:
    """Does a read's aggregator pack its sends (small equal runs, see Messages.send)?"""
    return int(ap.length.min()) <= PACK_MAX_RUN


def _my_groups(order: I64, starts: I64, k: int) -> list[int]:
    return order[starts[k] : starts[k + 1]].tolist() if k + 1 < len(starts) else []


def _requests(ctx: Context, plan: Plan) -> tuple[I64, I64]:
    """(offsets, lengths) of the backend requests of this aggregator's rounds."""
    ap, d = plan.agg, ctx.my_domain
    if ap is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = int(plan.bounds[d]), int(plan.bounds[d + 1])
    return round_requests(ap, lo, hi, plan.window, ctx.backend.partial_write)


def agg_runs(ap: AggregatorPlan, g: int, base: int) -> tuple[I64, I64]:
    """Group g's (file offsets less ``base``, lengths); a message takes them as a
    ``partial``, made only when asked for (no Python call per message of a round)."""
    s, e = int(ap.gstart[g]), int(ap.gstart[g + 1])
    return ap.file[s:e] - base, ap.length[s:e]


def _post_recvs(
    msgs: Messages, plan: Plan, k: int, wbuf: npt.NDArray[np.uint8], base: int, c: Stats
) -> None:
    """An aggregator's receives of round k, each source's bytes at their file positions."""
    ap, sh = plan.agg, plan.agg_shapes()
    assert ap is not None
    for g in ap.groups_of_round(k).tolist():
        msgs.recv_group(int(ap.gsrc[g]), wbuf, sh, g, base, partial(agg_runs, ap, g, base))
        c.messages += 1


def _post_sends(
    msgs: Messages, ctx: Context, plan: Plan, groups: list[int], data: npt.NDArray[np.uint8],
    c: Stats, direct: npt.NDArray[np.bool_] | None = None, own: npt.NDArray[np.uint8] = NO_SCRATCH,
) -> None:  # fmt: skip
    """This rank's sends of one round (``groups``: its send groups of that round; those
    ``direct`` marks go from ``own``, the call's buffer when ``data`` is a stage's)."""
    sp, sh = plan.sender, plan.sender_shapes()
    for g in groups:
        dest = int(ctx.aggregators[sp.gdom[g]])
        buf = own if direct is not None and direct[g] else data
        msgs.send_group(dest, buf, sh, g, 0, partial(sender_runs, sp, g))
        c.exchanged_bytes += int(sh.total[g])


def sender_runs(sp: SenderPlan, g: int) -> tuple[I64, I64]:
    """Group g's (memory offsets, lengths), taken as :func:`agg_runs`."""
    piece = sp.group(g)
    return piece.mem, piece.length


@dataclasses.dataclass(slots=True)
class Rounds:
    """What each round loop starts from: this rank's part of the plan and its buffers."""

    ctx: Context
    plan: Plan
    c: Stats
    order: I64  # this rank's send groups by round (Plan.by_round)
    starts: I64  # where each round's groups start in ``order``
    mine: int  # rounds this rank aggregates (0: none)
    bufs: list[npt.NDArray[np.uint8]]  # the DEPTH round buffers (aggregators only)
    offs: I64  # offset and length of the backend request of each of its rounds
    lens: I64
    pool: Callable[[], concurrent.futures.ThreadPoolExecutor]  # (made when first used)
    pending: list[Future | None] = dataclasses.field(default_factory=lambda: [None] * DEPTH)

    def agg(self, k: int) -> AggregatorPlan | None:
        """The aggregator plan if this rank aggregates in round ``k``, else None."""
        return self.plan.agg if k < self.mine else None

    def request(self, k: int) -> tuple[int, int]:
        """(offset, length) of this aggregator's backend request in round ``k``."""
        return int(self.offs[k]), int(self.lens[k])

    def buffer(self, k: int, req: tuple[int, int]) -> npt.NDArray[np.uint8]:
        """The part of round ``k``'s buffer that holds the bytes of ``req``."""
        return window_of(self.bufs[k % DEPTH], *req)

    def groups(self, k: int) -> list[int]:
        """This rank's send groups of round ``k``."""
        return _my_groups(self.order, self.starts, k)


def start_rounds(ctx: Context, plan: Plan, call: Call) -> Rounds:
    """The round loops' common start (the buffers were made by :func:`prepare`)."""
    order, starts = plan.by_round()
    mine = plan.agg.nrounds if plan.agg is not None else 0
    bufs = round_buffers(plan.window, DEPTH) if mine else []
    offs, lens = _requests(ctx, plan)
    return Rounds(ctx, plan, call.counters, order, starts, mine, bufs, offs, lens, io_executor)


def write_rounds(
    ctx: Context, plan: Plan, data: npt.NDArray[np.uint8], call: Call, stage: Stage | None = None
) -> BaseException | None:
    """Collective over ``ctx.comm``: every round of a two-phase write.

    Returns this rank's first error, not yet agreed: the call's completion agrees
    on it together with the statistics (one sync point instead of two).  With a
    ``stage``, each round's sends go from what its ``gather`` returns.
    """
    if ctx.backend.remote:
        return _write_lockstep(start_rounds(ctx, plan, call), data, stage)
    return _write_streamed(start_rounds(ctx, plan, call), data, stage)


def _write_streamed(
    r: Rounds, data: npt.NDArray[np.uint8], stage: Stage | None = None
) -> BaseException | None:
    """Sends posted :data:`AHEAD` rounds early (with a ``stage``, as many as its slots
    allow); each aggregator receives at its own pace.

    A rank posts the sends of rounds ``k .. k + AHEAD - 1`` before it receives round
    ``k``, so an aggregator never waits for a sender to reach the round: MPI moves
    the bytes when the aggregator posts its receives.  Nothing agrees per round: an
    aggregator whose I/O failed still receives every round (dropping the data), so
    every send completes, and the call's completion agrees on the error.
    """
    comm, nrounds, c = r.ctx.comm, r.plan.nrounds, r.c
    error: BaseException | None = None
    sends: dict[int, Messages] = {}
    ahead = AHEAD if stage is None else stage.slots - 1

    def post(k: int) -> None:
        if k < nrounds:
            send, direct = (data, None) if stage is None else (stage.gather(k), stage.direct)
            sends[k] = Messages(comm, TAG + (k & 0x3FF))
            _post_sends(sends[k], r.ctx, r.plan, r.groups(k), send, c, direct, data)

    try:
        for k in range(min(ahead, nrounds)):
            post(k)
        for k in range(nrounds):
            error = _receive_and_write(r, k, sends, error)
            if k + ahead < nrounds:  # at most ``ahead`` rounds of sends outstanding
                t = time.perf_counter()
                error = _waited(sends.pop(k), error)
                c.time_exchange += time.perf_counter() - t
                post(k + ahead)
        t = time.perf_counter()
        for k in sorted(sends):
            error = _waited(sends.pop(k), error)
        if stage is not None:
            error = error or stage.finish()
        c.time_exchange += time.perf_counter() - t
    finally:
        for msgs in sends.values():
            msgs.free()
    return drain(r.pending, c, error)


def _waited(msgs: Messages, error: BaseException | None) -> BaseException | None:
    """Complete a round's sends; the first error, a stand-in's if one was sent."""
    msgs.wait()
    return error or msgs.error


def _receive_and_write(
    r: Rounds, k: int, sends: dict[int, Messages], error: BaseException | None
) -> BaseException | None:
    """An aggregator's round ``k`` of a streamed write: receive it, then hand it to I/O."""
    ap, c, be = r.agg(k), r.c, r.ctx.backend
    if ap is None:
        return error
    b, req = k % DEPTH, r.request(k)
    step = Attempt()
    with step:
        reuse_buffer(be, ap, k, req, r.bufs, r.pending, c, error)
    error = error or step.error
    t = time.perf_counter()
    wbuf = r.buffer(k, req)
    msgs = Messages(r.ctx.comm, TAG + (k & 0x3FF))  # (as exchange.messages, inline: per call)
    try:
        _post_recvs(msgs, r.plan, k, wbuf, req[0], c)
    except BaseException:
        msgs.free()
        raise
    msgs.wait()
    error = error or msgs.error  # (a stand-in's zeros are not written)
    c.time_exchange += time.perf_counter() - t
    # the last round is drained right after the loop: write it here, once the I/O
    # thread is done (one request at a time), if this rank's sends are complete (a
    # rank in pwrite drives no MPI progress for peers' receives)
    last = k == r.mine - 1 and k + AHEAD >= r.plan.nrounds
    if last:  # (a loop, not all() of a generator: every round of a small call passes)
        for m in sends.values():
            if not m.done():
                last = False
                break
    if last:
        error = settle(r.pending, c, error)
    step = Attempt()
    with step:  # (an error here must not leave sends and receives behind)
        if error is None:
            args = (be, req[0], wbuf, cover(ap, k, req), c, k < r.mine - 1)
            if last:
                r.pending[b] = run_inline(c, write_window, *args)
            else:
                r.pending[b] = r.pool().submit(write_window, *args)
    return error or step.error


def _write_lockstep(
    r: Rounds, data: npt.NDArray[np.uint8], stage: Stage | None = None
) -> BaseException | None:
    """Rounds one after another, their status agreed before their messages (see module doc)."""
    comm, be, c = r.ctx.comm, r.ctx.backend, r.c
    # writes wait for each other sleeping: an aggregator's request runs in its I/O
    # thread, and a rank that spins in MPI takes the core that thread needs
    status = Lagged(comm, patient=True)
    meet = be.remote  # see module doc
    error: BaseException | None = None
    for k in range(r.plan.nrounds):
        step = Attempt()
        ap = r.agg(k)
        req = r.request(k) if ap is not None else (0, 0)
        with step:
            if ap is not None:
                reuse_buffer(be, ap, k, req, r.bufs, r.pending, c, error)
        error = error or step.error
        if status.failed():
            break
        status.post(error is not None)
        if meet and status.failed():
            break
        t = time.perf_counter()
        send, direct = (data, None) if stage is None else (stage.gather(k), stage.direct)
        with messages(comm, TAG + (k & 0x3FF)) as msgs:
            if ap is not None:
                _post_recvs(msgs, r.plan, k, r.buffer(k, req), req[0], c)
            _post_sends(msgs, r.ctx, r.plan, r.groups(k), send, c, direct, data)
        error = error or msgs.error
        c.time_exchange += time.perf_counter() - t
        if error is None and ap is not None:
            args = (be, req[0], r.buffer(k, req), cover(ap, k, req), c, k < r.mine - 1)
            r.pending[k % DEPTH] = r.pool().submit(write_window, *args)
    status.failed()
    if stage is not None:
        error = error or stage.finish()
    return drain(r.pending, c, error)
