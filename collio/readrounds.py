"""The rounds of a two-phase read: the next window read ahead while this one's pieces
go out (the module doc of :mod:`collio.rounds` says how rounds agree and fail)."""

from __future__ import annotations

import time
from functools import partial

import numpy as np
import numpy.typing as npt

from .buffers import scratch_buffer
from .collective import Attempt
from .context import Call, Context, Plan
from .exchange import Messages, messages
from .policy import DEPTH
from .roundio import cover, drain, read_window, run_inline, wait_io
from .rounds import (
    NO_SCRATCH,
    PACK_SCRATCH,
    TAG,
    Lagged,
    Rounds,
    Stage,
    agg_runs,
    packs,
    sender_runs,
    start_rounds,
)

__all__ = ["read_rounds"]


def read_rounds(
    ctx: Context, plan: Plan, out: npt.NDArray[np.uint8], call: Call, stage: Stage | None = None
) -> BaseException | None:
    """Collective over ``ctx.comm``: every round of a two-phase read (next window read ahead).

    Returns this rank's first error, not yet agreed (see :func:`write_rounds`).  With a
    ``stage``, each round's pieces arrive in its ``landing`` buffer (those of the groups
    its ``direct`` marks straight in ``out``), and its ``scatter`` hands them out while
    the next round's messages are in flight.
    """
    r = start_rounds(ctx, plan, call)
    comm, be, c = ctx.comm, ctx.backend, r.c
    status = Lagged(comm, patient=True) if be.remote else None  # see module doc
    # small equal runs are packed with numpy before sending (Messages.send)
    small = plan.agg is not None and r.mine and packs(plan.agg)
    scratch = scratch_buffer(min(plan.window, PACK_SCRATCH)) if small else NO_SCRATCH
    error: BaseException | None = None
    arrived = -1  # the last round that arrived (two levels: handed out one round later)
    step = Attempt()
    with step:
        ap = r.agg(0)
        if ap is not None:  # what this aggregator reads, first to last byte
            be.read_extent(int(ap.rlo[0]), int(ap.rhi.max()))
        _prefetch(r, 0)
    error = step.error
    for k in range(plan.nrounds):
        step = Attempt()
        with step:
            if r.agg(k) is not None:
                fut, r.pending[k % DEPTH] = r.pending[k % DEPTH], None
                wait_io(fut, c)
                if error is None:
                    _prefetch(r, k + 1)
        error = error or step.error
        if status is not None and _stop(status, error):
            break
        if error is not None and r.agg(k) is not None:  # (its I/O of round k is done)
            r.buffer(k, r.request(k)).fill(0)  # zeros, not an earlier call's bytes
        t = time.perf_counter()
        into, direct = (out, None) if stage is None else (stage.landing(k), stage.direct)
        with messages(comm, TAG + (k & 0x3FF)) as msgs:
            _exchange_read(r, msgs, k, into, scratch, direct, out)
            if stage is not None and k:
                stage.scatter(k - 1)
        error = error or msgs.error
        if stage is not None:
            stage.arrived(k)
            arrived = k
        c.time_exchange += time.perf_counter() - t
    if stage is not None:
        if arrived >= 0 and error is None:
            stage.scatter(arrived)
        error = error or stage.finish()
    return drain(r.pending, c, error)


def _stop(status: Lagged, error: BaseException | None) -> bool:
    """Collective: agree this rank's status before a lockstep round's messages; whether
    any rank failed (then every rank stops at this round)."""
    status.post(error is not None)
    return status.failed()


def _prefetch(r: Rounds, k: int) -> None:
    """Start reading this aggregator's window of round ``k`` (the first one here and now:
    it is waited for at once)."""
    ap = r.agg(k)
    if ap is None:
        return
    req = r.request(k)
    args = (r.ctx.backend, req[0], r.buffer(k, req), cover(ap, k, req), r.c)
    if k == 0:
        r.pending[0] = run_inline(r.c, read_window, *args)
    else:
        r.pending[k % DEPTH] = r.pool().submit(read_window, *args)


def _exchange_read(
    r: Rounds, msgs: Messages, k: int, out: npt.NDArray[np.uint8], scratch: npt.NDArray[np.uint8],
    direct: npt.NDArray[np.bool_] | None = None, own: npt.NDArray[np.uint8] = NO_SCRATCH,
) -> None:  # fmt: skip
    """Round ``k`` of a read: receive this rank's pieces (those of the groups ``direct``
    marks into ``own``, the call's buffer when ``out`` is a stage's); an aggregator sends
    its window's."""
    sp, ssh, c = r.plan.sender, r.plan.sender_shapes(), r.c
    for g in r.groups(k):
        src = int(r.ctx.aggregators[sp.gdom[g]])
        buf = own if direct is not None and direct[g] else out
        msgs.recv_group(src, buf, ssh, g, 0, partial(sender_runs, sp, g))
        c.exchanged_bytes += int(ssh.total[g])
    ap = r.agg(k)
    if ap is None:
        return
    ash = r.plan.agg_shapes()
    req, used = r.request(k), 0
    rbuf = r.buffer(k, req)
    for g in ap.groups_of_round(k).tolist():
        dest, runs = int(ap.gsrc[g]), partial(agg_runs, ap, g, req[0])
        used += msgs.send_group(dest, rbuf, ash, g, req[0], runs, scratch[used:])
        c.messages += 1
