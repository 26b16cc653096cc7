"""The end of a collective call: one sync point agrees on its errors and reduces its counters."""

from __future__ import annotations

import struct
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.summary import aggregator_summary
from .collective import raise_agreed
from .context import Call, Context, Plan
from .stats import SUMS, Stats
from .waits import sleep_until_done

__all__ = ["KeptReduce", "complete_call", "local_summary", "local_when_read", "reduce_again"]

_RUNS = SUMS.index("runs")


def complete_call(
    ctx: Context,
    call: Call,
    t0: float,
    error: BaseException | None = None,
    what: str = "",
    *,
    patient: bool = False,
    items: int | None = None,
) -> None:
    """Collective: agree on the call's errors and reduce its counters into the stats.

    The sums (with the error flag) and the maxima are reduced by one non-blocking
    allreduce (:func:`sum_then_max`): the call's last sync point, and its only
    agreement after the head when nothing failed.  ``patient`` waits
    sleeping: after writes, after each rank's own I/O (direct path) and on remote
    backends, a rank done early must not spin on a core that another rank's I/O (or
    its I/O thread, or a server on the node) still needs.  ``items``: a batch's number
    of items (``last_call["items"]``; None: a single call, counted as one item).
    """
    c = call.counters
    c.time_total = time.perf_counter() - t0
    direct, flushes, mapped = ctx.backend.take_counts()  # (its I/O is done by now)
    c.direct_io_bytes += direct
    c.early_flushes += flushes
    c.mapped_bytes += mapped
    c.runs += call.nruns
    sums, maxes = c.pack()
    kept = ctx.sums_kept.get(call.name)
    if call.reused:  # (agreed: every rank takes the same branch)
        got = reduce_again(ctx, sums, maxes, error, kept, patient=patient)
    else:
        got = _reduce(ctx, sums, maxes, error, patient=patient)
    if got is None:
        raise_agreed(ctx.comm, error, what=what)
    assert got is not None  # (raise_agreed raised)
    call.sums, most = got
    again = None
    if kept is not None and call.sums is kept[1]:  # (the kept sums: added as kept)
        again = kept[2] if kept[2] is not None else Stats.again(call.sums)
    ctx.sums_kept[call.name] = (sums, call.sums, again)
    ctx.stats.absorb_most(call.sums, most, again)
    # calls are collective: count each once, not once per rank
    direct = call.direct  # (a property: asked once)
    if call.hi > call.lo:
        if direct:
            ctx.stats.direct_calls += 1
        else:
            ctx.stats.collective_calls += 1
    # (the order of stats._LAST_KEYS; made into the dict only when read)
    call.last = ctx.stats.last_facts = (
        1 if items is None else items, int(call.sums[_RUNS]), direct,
        call.path._value_,  # (the member's field: Enum.value is a Python property)
        call.counters.rounds,  # (the plan's, agreed)
        [call.lo, call.hi] if call.hi > call.lo else [0, 0], call.reused, call.window,
        ctx.nodes, call.two_level, 0 if direct else call.active, False,
    )  # fmt: skip


#: (the summed counters, the maxima)
Reduced = tuple[npt.NDArray[np.int64], list[float]]


def _wait(req: MPI.Request, patient: bool) -> None:
    if patient:
        sleep_until_done(req)
    else:
        req.Wait()


def _reduce(ctx: Context, sums: list[int], maxes: list[float], error: BaseException | None,
            *, patient: bool) -> Reduced | None:  # fmt: skip
    """Collective: the call's counters summed and maximised over ranks in one allreduce
    (:func:`sum_then_max`); None when some rank failed."""
    nsum = len(sums) + 1  # (the error flag is summed too)
    # one C call packs the vector; times and rounds are never negative (clamped), so
    # their float64 bits order as int64 do
    vec = np.frombuffer(
        _packer(nsum, len(maxes)).pack(
            *sums, 0 if error is None else 1, *[m if m > 0.0 else 0.0 for m in maxes]
        ),
        np.int64,
    )
    out = np.empty_like(vec)
    _wait(ctx.comm.Iallreduce([vec, MPI.INT64_T], [out, MPI.INT64_T], op=sum_then_max(nsum)),
          patient)  # fmt: skip
    if out[nsum - 1]:
        return None
    return out[: nsum - 1], out[nsum:].view(np.float64).tolist()


def reduce_again(ctx: Context, sums: list[int], maxes: list[float], error: BaseException | None,
           kept: Any, *, patient: bool) -> Reduced | None:  # fmt: skip
    """Collective: :func:`_reduce` of a call that repeats a kept plan, whose counters are
    most often the last call's of its name on every rank: then their sums are the kept
    ones, and one allreduce with MPI's own MAX (no reduction in Python on every step of
    it) agrees on the error, on whether every rank's counters repeat, and the maxima.
    Otherwise a second allreduce (SUM) sums them.  :class:`KeptReduce`'s, its vectors
    made for this call."""
    return KeptReduce(len(maxes)).reduce(ctx.comm, sums, maxes, error, kept, patient=patient)


def _summed(comm: MPI.Comm, sums: list[int], patient: bool) -> Any:
    """Collective: the sums of every rank's counters, where some rank's are not its
    kept ones (:func:`reduce_again`'s second allreduce, and :class:`KeptReduce`'s)."""
    mine = np.array(sums, np.int64)
    total = np.empty_like(mine)
    _wait(comm.Iallreduce([mine, MPI.INT64_T], [total, MPI.INT64_T], op=MPI.SUM), patient)
    return total


_PACKERS: dict[tuple[int, int], struct.Struct] = {}


class KeptReduce:
    """:func:`reduce_again`'s vectors, made once for a caller that repeats it every call
    (:class:`collio.keptcall.Step`): packed in place and sent from the same buffers, the
    same allreduce (length, type, op) as :func:`reduce_again`'s, so ranks taking either
    meet in it.  A repeated small call spends on an array per vector, its views and its
    buffer specs as much as on the allreduce.  One per caller: the buffers are reused."""

    __slots__ = ("struct", "vec", "got", "send", "recv")

    def __init__(self, nmax: int) -> None:
        self.struct = _packer(2, nmax)
        self.vec, self.got = bytearray(self.struct.size), bytearray(self.struct.size)
        self.send, self.recv = [self.vec, MPI.INT64_T], [self.got, MPI.INT64_T]

    def reduce(self, comm: MPI.Comm, sums: list[int], maxes: list[float],
               error: BaseException | None, kept: Any,
               *, patient: bool) -> Reduced | None:  # fmt: skip
        """Collective: :func:`reduce_again`, the maxima as a list of floats (what
        :meth:`~collio.stats.Stats.absorb_most` takes)."""
        same = kept is not None and kept[0] == sums
        self.struct.pack_into(
            self.vec, 0, 0 if error is None else 1, 0 if same else 1,
            *[m if m > 0.0 else 0.0 for m in maxes],
        )  # fmt: skip
        _wait(comm.Iallreduce(self.send, self.recv, op=MPI.MAX), patient)
        out = self.struct.unpack(self.got)
        if out[0]:
            return None
        most = list(out[2:])
        if not out[1]:  # (every rank's counters are its kept ones: so are their sums)
            return kept[1], most
        return _summed(comm, sums, patient), most


def _packer(nsum: int, nmax: int) -> struct.Struct:
    """The layout of a completion's vector: ``nsum`` int64, then ``nmax`` float64."""
    got = _PACKERS.get((nsum, nmax))
    if got is None:
        got = _PACKERS[nsum, nmax] = struct.Struct(f"={nsum}q{nmax}d")
    return got


_OPS: dict[int, MPI.Op] = {}


def sum_then_max(nsum: int) -> MPI.Op:
    """The reduction of a completion's vector: the first ``nsum`` int64 summed, the rest
    (non-negative float64 seen as int64) the maximum.  One allreduce instead of a sum's
    and a maximum's: every agreement of a small call costs each rank a scheduling round
    trip, as much as the call's own work.  Made once per length (MPI ops live until the
    process ends; there are one or two lengths)."""
    op = _OPS.get(nsum)
    if op is None:

        def reduce(inbuf: Any, inout: Any, datatype: Any) -> None:
            a, b = np.frombuffer(inbuf, np.int64), np.frombuffer(inout, np.int64)
            b[:nsum] += a[:nsum]
            np.maximum(b[nsum:], a[nsum:], out=b[nsum:])

        op = _OPS[nsum] = MPI.Op.Create(reduce, commute=True)
    return op


def local_summary(ctx: Context, plan: Plan) -> dict[str, Any]:
    """This rank's own figures of the call (not reduced): see ``Stats.local``."""
    d = ctx.my_domain
    if plan.agg is None or d < 0:
        return {"domain": -1}
    return _summary(plan.agg, d, plan.bounds, plan.window, ctx.backend.partial_write)


def local_when_read(ctx: Context, plan: Plan) -> None:
    """Local: ``ctx.stats.local`` is :func:`local_summary` of ``plan``, made when read
    (the plan's parts are never changed: a kept plan moved is a new one)."""
    d = ctx.my_domain
    if plan.agg is None or d < 0:
        ctx.stats.local = {"domain": -1}
        return
    bounds, partial = plan.bounds, ctx.backend.partial_write
    ctx.stats.local_when_read(_summary, plan.agg, d, bounds, plan.window, partial)


def _summary(agg: Any, d: int, bounds: Any, window: int, partial: bool) -> dict[str, Any]:
    return aggregator_summary(agg, d, int(bounds[d]), int(bounds[d + 1]), window, partial)
