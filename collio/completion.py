"""The end of a collective call: one sync point agrees on its errors and reduces its counters."""

from __future__ import annotations

import struct
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .aggregators.summary import aggregator_summary
from .collective import raise_agreed
from .context import Call, Context, Plan
from .stats import SUMS
from .waits import sleep_until_done

__all__ = ["complete_call", "local_summary"]

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
    c.direct_io_bytes += ctx.backend.take_direct_bytes()  # (its I/O is done by now)
    c.early_flushes += ctx.backend.take_flushes()
    c.mapped_bytes += ctx.backend.take_mapped_bytes()
    c.runs += call.nruns
    sums, maxes = c.pack()
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
    comm = ctx.comm
    req = comm.Iallreduce([vec, MPI.INT64_T], [out, MPI.INT64_T], op=sum_then_max(nsum))
    if patient:
        sleep_until_done(req)
    else:
        req.Wait()
    if out[nsum - 1]:
        raise_agreed(comm, error, what=what)
    call.sums = out[: nsum - 1]
    ctx.stats.absorb(call.sums, out[nsum:].view(np.float64))
    # calls are collective: count each once, not once per rank
    if call.hi > call.lo:
        if call.direct:
            ctx.stats.direct_calls += 1
        else:
            ctx.stats.collective_calls += 1
    # (the order of stats._LAST_KEYS; made into the dict only when read)
    call.last = ctx.stats.last_facts = (
        1 if items is None else items, int(out[_RUNS]), call.direct, call.path.value,
        call.counters.rounds,  # (the plan's, agreed)
        [call.lo, call.hi] if call.hi > call.lo else [0, 0], call.reused, call.window,
        ctx.nodes, call.two_level, 0 if call.direct else call.active, False,
    )  # fmt: skip


_PACKERS: dict[tuple[int, int], struct.Struct] = {}


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
    lo, hi = int(plan.bounds[d]), int(plan.bounds[d + 1])
    return aggregator_summary(plan.agg, d, lo, hi, plan.window, ctx.backend.partial_write)
