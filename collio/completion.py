"""The end of a collective call: one sync point agrees on its errors and reduces its counters."""

from __future__ import annotations

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

    The sums (with the error flag) and the maxima are reduced by two non-blocking
    allreduces completed together: the call's last sync point.  ``patient`` waits
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
    sums = np.append(sums, 0 if error is None else 1)
    rs, rm = np.empty_like(sums), np.empty_like(maxes)
    comm = ctx.comm
    reqs = [
        comm.Iallreduce([sums, MPI.INT64_T], [rs, MPI.INT64_T], op=MPI.SUM),
        comm.Iallreduce([maxes, MPI.DOUBLE], [rm, MPI.DOUBLE], op=MPI.MAX),
    ]
    if patient:
        sleep_until_done(reqs)
    else:
        MPI.Request.Waitall(reqs)
    if rs[-1]:
        raise_agreed(comm, error, what=what)
    ctx.stats.absorb(rs[:-1], rm)
    # calls are collective: count each once, not once per rank
    if call.hi > call.lo:
        if call.direct:
            ctx.stats.direct_calls += 1
        else:
            ctx.stats.collective_calls += 1
    ctx.stats.last_call = {
        "items": 1 if items is None else items,
        "runs": int(rs[_RUNS]),
        "direct": call.direct,
        "path": call.path.value,
        "rounds": call.counters.rounds,  # (the plan's, agreed)
        "extent": [call.lo, call.hi] if call.hi > call.lo else [0, 0],
        "plan_reused": call.reused,
        "window": call.window,
        "nodes": ctx.nodes,
        "two_level": call.two_level,
    }


def local_summary(ctx: Context, plan: Plan) -> dict[str, Any]:
    """This rank's own figures of the call (not reduced): see ``Stats.local``."""
    d = ctx.my_domain
    if plan.agg is None or d < 0:
        return {"domain": -1}
    lo, hi = int(plan.bounds[d]), int(plan.bounds[d + 1])
    return aggregator_summary(plan.agg, d, lo, hi, plan.window, ctx.backend.partial_write)
