"""The one round of a kept two-phase write, posted inline (:mod:`collio.keptcall`).

A write whose plan has one round (the plan is agreed, so every rank takes the same way)
posts its receives and sends at once, waits for them and writes its window inline:
what :func:`collio.rounds.write_rounds` does for one round, without the machinery that
overlaps a round's I/O with the next one's messages.  A kept plan's round is found once
as the messages this rank posts (:class:`Round`: sources, slices or hvectors, the
request and what ranks send of it) and posted from that record call after call.  The
round owns its hvectors: the lane that keeps it frees them when it lets the round go
(:meth:`Round.free`), inside a call on the file or at its close, so no other thread
posts with them then (calls on one communicator run one at a time), and a process that
meets any number of shapes keeps only those of the rounds its files still hold.
An aggregator's own part of its window is copied by numpy (:class:`Own`), not sent to
itself: MPI's copy of a message to itself through a derived type costs several times
numpy's strided copy of the same runs where they are about a kilobyte, and no less
where they are shorter or longer.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

from . import rounds
from .aggregators.plan import AggregatorPlan, round_requests
from .backends.failures import storage_errors
from .buffers import round_buffers, window_of
from .collective import Attempt
from .context import Call, Context, Plan
from .exchange import CONTIG, VECTOR, Messages, make_type
from .policy import DEPTH
from .roundio import cover, round_cover, window_write
from .rounds import TAG, agg_runs, sender_runs
from .runs import Runs
from .stats import Stats

__all__ = ["Own", "Round", "exchange", "kept_round", "one_round", "round_of", "write_rounds"]


def write_rounds(
    ctx: Context, plan: Plan, data: Any, call: Call
) -> BaseException | None:  # fmt: skip
    """Collective over ``ctx.comm``: :func:`collio.rounds.write_rounds` of ``plan``, its
    one round inline on a local backend (see the module doc).  Returns this rank's first
    error, not yet agreed (the call's completion agrees on it)."""
    if plan.nrounds != 1 or ctx.backend.remote:
        return rounds.write_rounds(ctx, plan, data, call)
    return one_round(ctx, plan, 0, data, call)


def one_round(ctx: Context, plan: Plan, d: int, data: Any, call: Call) -> BaseException | None:
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
        c.add_writes(window_write(ctx.backend, req[0], wbuf, covered, False))  # (one round)
    c.time_io += time.perf_counter() - t
    return step.error


@dataclasses.dataclass(slots=True, eq=False)
class Round:
    """The one round of a kept plan as this rank posts it, found once: what
    :func:`_receive` and :func:`_send` find again from the plan in every call."""

    plan: Plan | None  # the plan it is of (by identity; None: freed)
    req: tuple[int, int] | None  # an aggregator's request, unmoved (None: it does not aggregate)
    cover: Runs | None  # what ranks send of it, unmoved (an aggregator's)
    whole: bool  # they send every byte of it (no holes to read first)
    recvs: list[tuple[int, int, int, Any]]  # (source, first byte, bytes, hvector or None)
    sends: list[tuple[int, int, int, Any]]  # (aggregator, first byte, bytes, hvector or None)
    sent: int  # the bytes this rank sends
    own: Own | None = None  # its part of its own window (not in recvs and sends)
    types: list[Any] = dataclasses.field(default_factory=list)  # the hvectors it owns

    def free(self) -> None:
        """Local: free the round's hvectors; it is of no plan after (never posted again).
        Called by the thread in a call on the round's file, or closing it: calls on one
        communicator run one at a time, so nothing posts with them meanwhile (and MPI
        lets a type be freed while a message made with it is pending)."""
        self.plan = None
        types, self.types = self.types, []
        self.recvs, self.sends = [], []
        for t in types:
            t.Free()


@dataclasses.dataclass(frozen=True, slots=True)
class Own:
    """An aggregator's bytes for its own window as one strided copy: ``rows`` runs of
    ``cols`` bytes, every ``sstride`` in the data from ``sfirst`` and every ``rstride``
    in the window from ``rfirst``."""

    sfirst: int
    rfirst: int
    rows: int
    cols: int
    sstride: int
    rstride: int

    def copy(self, data: Any, wbuf: Any) -> None:
        """Local: the copy (ndarray's own bounds checks: a part past either buffer raises;
        a read-only window raises BufferError, as a receive posted into it does)."""
        if not wbuf.flags.writeable:
            raise BufferError("the round's window is read-only")
        shape = (self.rows, self.cols)
        dest = np.ndarray(shape, np.uint8, wbuf, self.rfirst, (self.rstride, 1))
        np.copyto(dest, np.ndarray(shape, np.uint8, data, self.sfirst, (self.sstride, 1)))


def round_of(ctx: Context, plan: Plan) -> Round | None:
    """Local: ``plan``'s one round as :class:`Round` (its datatypes made now, owned by
    it: the caller frees them, :meth:`Round.free`): an hvector for a message of runs
    evenly spaced, an indexed type for one of any other runs (``OTHER``: a batch's runs
    cut at a domain's edge), made once for every call of the kept plan instead of once
    per call; None when a message has no runs to make one of (:func:`one_round`'s)."""
    ap, be, aggs = plan.agg, ctx.backend, ctx.aggregators
    req, covered, whole, recvs = None, None, True, []
    if ap is not None and ap.nrounds:
        dom = ctx.my_domain
        lo, hi = int(plan.bounds[dom]), int(plan.bounds[dom + 1])
        offs, lens = round_requests(ap, lo, hi, plan.window, be.partial_write)
        req = (int(offs[0]), int(lens[0]))
        whole = bool(ap.rcovered[0] >= req[1])
        covered = cover(ap, 0, req)
        ash = plan.agg_shapes()
        rgroups = ap.groups_of_round(0).tolist()
        got = [(int(ap.gsrc[g]), *_fixed(ash, g, req[0], partial(agg_runs, ap, g, req[0])))
               for g in rgroups]  # fmt: skip
        if any(len(m) < 4 for m in got):
            return None
        recvs = got
    sp, sh = plan.sender, plan.sender_shapes()
    sends = [(int(aggs[sp.gdom[g]]), *_fixed(sh, g, 0, partial(sender_runs, sp, g)))
             for g in range(len(sp.gdom))]  # fmt: skip
    if any(len(m) < 4 for m in sends):
        return None
    r = Round(plan, req, covered, whole, recvs, sends, int(sh.total.sum()))  # type: ignore[arg-type]
    if req is not None:
        _take_own(r, ctx.comm.rank, ash, rgroups, sh, req[0])
    _make_types(r)
    return r


def _make_types(r: Round) -> None:
    """Local: each of ``r``'s messages' shapes made a committed datatype owned by ``r``:
    an hvector shape (count, block, stride) one hvector per shape, runs (displacements
    from the message's first byte, lengths: :func:`_fixed`) one type each; none is left
    made if one fails."""
    made: dict[Any, Any] = {}
    try:
        for side in (r.recvs, r.sends):
            for i, (peer, first, n, shape) in enumerate(side):
                if shape is None:
                    continue
                dt: Any
                if type(shape) is _Runs:
                    dt = make_type(shape.disp, shape.length)
                    r.types.append(dt)
                else:
                    dt = made.get(shape)
                    if dt is None:
                        dt = made[shape] = MPI.BYTE.Create_hvector(*shape)
                        r.types.append(dt)
                        dt.Commit()
                side[i] = (peer, first, n, dt)
    except BaseException:
        r.free()
        raise


def _take_own(r: Round, me: int, ash: Any, rgroups: list[int], sh: Any, base: int) -> None:
    """Local: ``r``'s message from this rank to itself, if it has exactly one each way
    and both fit one strided copy, made ``r.own`` instead of two messages."""
    ri = [i for i, m in enumerate(r.recvs) if m[0] == me]
    si = [i for i, m in enumerate(r.sends) if m[0] == me]
    if len(ri) != 1 or len(si) != 1:
        return
    own = _own(_grid(ash, rgroups[ri[0]], base), _grid(sh, si[0], 0))
    if own is not None:
        r.own = own
        del r.recvs[ri[0]], r.sends[si[0]]


def _grid(sh: Any, g: int, base: int) -> tuple[int, int, int, int] | None:
    """Group ``g`` as (first byte less ``base``, runs, bytes a run, stride), or None."""
    first, kind = int(sh.first[g]) - base, int(sh.kind[g])
    if kind == CONTIG:
        return first, 1, int(sh.total[g]), int(sh.total[g])
    if kind == VECTOR:
        return first, int(sh.count[g]), int(sh.block[g]), int(sh.stride[g])
    return None


def _own(recv: Any, send: Any) -> Own | None:
    """The copy from the ``send`` side to the ``recv`` side (:func:`_grid`'s), when
    their runs match or one side is a slice (cut as the other's runs); else None."""
    if recv is None or send is None:
        return None
    (rf, rn, rb, rs), (sf, sn, sb, ss) = recv, send
    if rn * rb != sn * sb or rn * rb == 0:
        return None
    if (rn, rb) == (sn, sb):
        return Own(sf, rf, rn, rb, ss, rs)
    if sn == 1:  # (a slice: its bytes in the receiver's runs)
        return Own(sf, rf, rn, rb, rb, rs)
    if rn == 1:
        return Own(sf, rf, sn, sb, ss, sb)
    return None


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class _Runs:
    """A message's runs of no fixed shape: displacements from its first byte, lengths."""

    disp: Any
    length: Any


def _fixed(sh: Any, g: int, base: int, runs: Any) -> tuple[int, int, Any] | tuple[()]:
    """Group ``g``'s first byte (less ``base``), bytes and shape: an hvector's, None (a
    slice), or its runs (:class:`_Runs`, from ``runs()``: offsets less ``base`` and
    lengths, as a message of ``OTHER`` shape is built from them); () for no runs."""
    grid = _grid(sh, g, base)
    if grid is None:
        offsets, lengths = runs()
        if not len(offsets):
            return ()
        first = int(offsets[0])
        return first, int(lengths.sum()), _Runs(offsets - first, lengths)
    first, count, block, stride = grid
    if int(sh.kind[g]) == CONTIG:
        return first, block, None
    return first, count * block, (count, block, stride)  # (a VECTOR's runs are all ``block``)


def kept_round(ctx: Context, r: Round, d: int, data: Any, call: Call) -> BaseException | None:
    """Collective over ``ctx.comm``: :func:`one_round` of ``r``'s plan moved ``d``
    bytes, its messages posted from ``r`` (each a stand-in if it cannot be posted, as
    :class:`~collio.exchange.Messages` does)."""
    c, plan = call.counters, r.plan
    assert plan is not None  # (a freed round is never posted: the lane makes another)
    error = None
    t = time.perf_counter()
    req = wbuf = None
    if r.req is not None:
        req = (r.req[0] + d, r.req[1])
        wbuf = window_of(round_buffers(plan.window, DEPTH)[0], *req)
        if not r.whole:  # (as _receive: the old bytes of its holes)
            error = _holes(ctx, wbuf, req, r.cover, d, c)
        c.messages += len(r.recvs)
    c.exchanged_bytes += r.sent
    if r.own is not None:
        c.messages += 1
    posted = exchange(ctx.comm, r, data, wbuf)
    error = error or posted
    c.time_exchange += time.perf_counter() - t
    if req is None or error is not None:
        return error
    assert r.cover is not None and wbuf is not None
    step = Attempt()
    t = time.perf_counter()
    with step, storage_errors(ctx.backend):
        covered = r.cover.moved(d) if d else r.cover
        c.add_writes(window_write(ctx.backend, req[0], wbuf, covered, False))  # (one round)
    c.time_io += time.perf_counter() - t
    return step.error


def exchange(comm: MPI.Comm, r: Round, data: Any, wbuf: Any) -> BaseException | None:
    """Collective over ``comm``: ``r``'s messages posted from its record (the receives
    into an aggregator's window ``wbuf``, which also gets its own part by numpy) and
    completed; this rank's first error, not yet agreed (a message that could not be
    posted was a stand-in: its peer is not left waiting)."""
    msgs = Messages(comm, TAG)
    error = None
    if wbuf is not None:
        post, irecv = msgs.post_fixed, comm.Irecv
        for src, first, n, dt in r.recvs:
            post(irecv, wbuf, src, first, n, dt)
    post, isend = msgs.post_fixed, comm.Isend
    for dest, first, n, dt in r.sends:
        post(isend, data, dest, first, n, dt)
    if r.own is not None:  # (while the messages travel)
        try:
            r.own.copy(data, wbuf)
        except Exception as exc:  # noqa: BLE001 - agreed in the completion
            error = exc
    msgs.wait()  # (every message completes, failed or not: nobody is left waiting)
    return error or msgs.error  # (a stand-in's bytes are not written)


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
