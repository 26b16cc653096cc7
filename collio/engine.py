"""Two-phase collective write and read, as ROMIO's ad_write_coll.c / ad_read_coll.c, vectorised.

Flow of one call (every rank runs every step, so nothing hangs):

1. *check* (:mod:`collio.check`): validate the layout and data locally, then one
   allreduce agrees on the call itself (the first operation of every collective call
   on a file, :func:`~collio.collective.call_head`), errors, the shared signature
   (global shape, dtype), the global extent and the other facts
   (:class:`~collio.checkfacts.Checked`) from which :mod:`collio.policy` chooses the
   path: direct, mapped, own pieces or two-phase (a repeated call may have done its
   I/O before that allreduce, and end with it: :mod:`collio.speculate`);
2. *plan* (:mod:`collio.planning`): cut runs at file domains and round windows; send
   (offset, length) lists to the aggregators, which check overlaps and number their rounds;
3. *rounds* (:mod:`collio.rounds`): messages straight into the round buffers; the
   backend request of round k runs in the I/O thread while round k+1 is exchanged;
4. *complete* (:mod:`collio.completion`): wait for the I/O, then one sync point
   agrees on errors and reduces the statistics (backends that flush after a write,
   and zarr's own runs done before the shuffle, agree once more before that).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from . import batch, check, keptcall, planning, quick
from .backends.failures import storage_errors
from .buffers import free_buffers
from .collective import Attempt, agree_facts, any_flag, raise_agreed
from .completion import complete_call, local_when_read
from .context import Call, Context
from .errors import LayoutError
from .facts import Facts, How, fact, record
from .layouts.base import Layout
from .plancache import clear_all
from .readrounds import read_rounds
from .runs import Runs
from .speculate import note_layout, remember

__all__ = [
    "Context", "again", "read", "read_many", "release_buffers", "resume", "resume_lane",
    "write", "write_many",
]  # fmt: skip

I64 = npt.NDArray[np.int64]
_BIG = check.BIG


@record
class _Extent(Facts):
    """The extent of every rank's runs."""

    lo: int = fact(How.MIN)
    hi: int = fact(How.MAX)


def release_buffers() -> None:
    """Local: free what calls keep for the next ones, the round buffers and the plans
    (and what batches and the checks of single calls keep of their layouts, and the copies
    async checkpoint saves keep for the next ones); the plans of a communicator in a call
    on another thread go when that call returns."""
    free_buffers()
    clear_all()
    batch.forget()
    check.forget()
    saves = sys.modules.get("collio.checkpoint.asyncsave")  # (loaded only if ever used)
    if saves is not None:
        saves.forget()  # the copies async saves keep for the next ones


# ------------------------------------------------------------- entry points
def lane_headed(ctx: Context, data: Any, layout: Any, t0: float) -> Any:
    """:func:`collio.keptcall.headed`, a write it took (or failed in, its rounds maybe
    written) counted in :attr:`~collio.context.Context.writes`."""
    try:
        got = keptcall.headed(ctx, data, layout, t0)
    except BaseException:
        ctx.writes += 1
        raise
    if got is not None and got is not False:
        ctx.writes += 1
    return got


def write(ctx: Context, data: Any, layout: Any) -> None:
    """Collective over ``ctx.comm``: two-phase write of every rank's piece."""

    t0 = time.perf_counter()
    lane = lane_headed(ctx, data, layout, t0)
    if lane is True:  # (complete: a repeat the lane's step finished)
        return
    if lane is not None and lane is not False:
        resume_lane(ctx, lane, layout, t0)
        return
    got = quick.layout_again(ctx, layout, data, writing=True, t0=t0)
    if got is not None:
        if got[0] is not True:
            keptcall.keep(ctx, _write(ctx, None, t0=t0, pending=got[0]), layout)
        return

    def prepare(lay: Layout) -> tuple[npt.NDArray[np.uint8], None]:
        return lay.as_bytes(data), None

    call = _write(ctx, lambda: check.one_layout(ctx, layout, prepare, writing=True), t0=t0)
    note_layout(ctx, layout, writing=True)
    keptcall.keep(ctx, call, layout)


def write_many(ctx: Context, items: Any, *, disjoint: bool = False) -> None:
    """Collective over ``ctx.comm``: one two-phase write of every item of every rank
    (``(data, layout)`` pairs, the same number on every rank: :mod:`collio.batch`);
    with ``disjoint`` on every rank, each rank writes its own (see :func:`_check`)."""
    _write(
        ctx,
        lambda: batch.gather(ctx.backend, items, writing=True),
        count=batch.items_count(items),
        disjoint=disjoint,
    )


def again(ctx: Context, fview: Any, position: Any, data: Any, *, writing: bool) -> bool:
    """Collective over ``ctx.comm`` if it returns True: ``data`` written (read into)
    through the file view ``fview`` from etype ``position``, when the call repeats this
    rank's last one of its kind through the view (:func:`collio.quick.again`: in ints
    through a dense view, else :func:`collio.check.again`); False (nothing done, nothing
    communicated): the caller makes the call the general way."""
    t0 = time.perf_counter()
    got = quick.again(ctx, fview, position, data, writing=writing, t0=t0)
    if got is None or got is True:
        return got is not None
    (_write if writing else _read)(ctx, None, t0=t0, pending=got)
    return True


def resume(ctx: Context, headed: quick.Headed, layout: Any, t0: float, *, writing: bool) -> None:
    """Collective over ``ctx.comm``: a call that a :class:`~collio.quick.Step` took as far
    as its head and no further, on from its head as :func:`write` / :func:`read` (through
    ``layout``) or :func:`again` (``layout`` None: through the view) go on."""
    if not writing:
        _read(ctx, None, t0=t0, pending=headed)
        return
    call = _write(ctx, None, t0=t0, pending=headed)
    if layout is not None:
        keptcall.keep(ctx, call, layout)


def resume_lane(ctx: Context, headed: quick.Headed, layout: Any, t0: float) -> None:
    """Collective over ``ctx.comm``: a write that the kept lane
    (:func:`collio.keptcall.headed`) took as far as its head, on from it."""
    keptcall.keep(ctx, _write(ctx, None, t0=t0, pending=headed), layout, lane=True)


def _write(
    ctx: Context, source: Any, count: int | None = None, disjoint: bool = False,
    t0: float | None = None, pending: quick.Headed | None = None,
) -> Call:  # fmt: skip
    t0 = time.perf_counter() if t0 is None else t0
    ctx.writes += 1  # (every write the general way, batches and resumed calls too)
    if pending is None:
        runs, buf, kept, call = check.check(
            ctx, source, writing=True, count=count, disjoint=disjoint, t0=t0
        )
    else:
        runs, buf, kept, call = check.resume(ctx, pending)
    if call.settled:
        return call
    active = call.hi > call.lo  # (own_runs may shrink the extent to the shuffled rest)
    error = _transfer(ctx, call, runs, buf, writing=True, batch=count is not None)
    error = call.failed or error
    what = "backend I/O"
    if active and ctx.backend.needs_flush:  # flush may be collective: agree on the I/O first
        if any_flag(ctx.comm, error is not None, patient=True):
            raise_agreed(ctx.comm, error, what=what)
        step = Attempt()
        with step:
            ctx.backend.flush(ctx.comm)
        error, what = step.error, "backend flush"
    complete_call(ctx, call, t0, error, what, patient=True, items=count)
    if count is None:
        remember(ctx, call, runs, writing=True)
    else:
        keptcall.keep_batch(ctx, call, runs)
    del kept  # (a batch's item buffers, alive until the call is complete)
    return call


def read(ctx: Context, layout: Any, out: Any) -> Any:
    """Collective over ``ctx.comm``: two-phase read; returns the rank's piece."""

    t0 = time.perf_counter()
    got = quick.layout_again(ctx, layout, out, writing=False, t0=t0)
    if got is not None:
        if got[0] is not True:
            _read(ctx, None, t0=t0, pending=got[0])
        return got[1]

    def prepare(lay: Layout) -> tuple[npt.NDArray[np.uint8], Any]:
        arr, view = lay.allocate(out)
        return view, arr

    arr = _read(ctx, lambda c: check.one_layout(c, layout, prepare, writing=False), t0=t0)
    note_layout(ctx, layout, writing=False)
    return arr


def read_many(ctx: Context, layouts: Any, out: Any, *, disjoint: bool = False) -> list[Any]:
    """Collective over ``ctx.comm``: one two-phase read of every layout of every rank;
    returns the arrays, one per layout (``out[k]`` filled when given); ``disjoint``: as
    :func:`write_many`'s."""
    got: list[Any] = _read(
        ctx,
        lambda c: batch.gather(c.backend, layouts, writing=False, outs=out),
        count=batch.items_count(layouts),
        disjoint=disjoint,
    )
    return got


def _read(
    ctx: Context, source: Any, count: int | None = None, disjoint: bool = False,
    t0: float | None = None, pending: quick.Headed | None = None,
) -> Any:  # fmt: skip
    t0 = time.perf_counter() if t0 is None else t0
    if ctx.read_aggregators is not None:  # the backend reads with other aggregators
        ctx = dataclasses.replace(ctx, aggregators=ctx.read_aggregators)
    c = ctx
    if pending is None:
        runs, buf, arr, call = check.check(
            c, lambda: source(c), writing=False, count=count, disjoint=disjoint, t0=t0
        )
    else:
        runs, buf, arr, call = check.resume(c, pending)
    if call.settled:
        return arr
    if ctx.hints.read_past_eof == "disable":
        _refuse_past_eof(ctx, runs, call.name)
    error = _transfer(ctx, call, runs, buf, writing=False)
    # after rounds reads wait polling (sleeping gains nothing there); after each rank's own
    # I/O (direct path: it takes each rank its own time, e.g. decoding zarr chunks) and on
    # remote backends a rank done early sleeps instead of taking a core the others need
    patient = ctx.backend.remote or call.direct
    complete_call(ctx, call, t0, error, "backend I/O", patient=patient, items=count)
    remember(ctx, call, runs, writing=False, many=count is not None)
    return arr


def _refuse_past_eof(ctx: Context, runs: Runs, what: str) -> None:
    """Collective over ``ctx.comm`` (hint ``read_past_eof=disable``): the same
    :class:`LayoutError` on every rank when some rank's runs reach past the end."""
    step = Attempt()
    with step:
        end = runs.extent()[1] if len(runs) else 0
        size = ctx.backend.size()
        if end > size:
            raise LayoutError(
                f"{what} reaches byte {end}, past the end of {ctx.file[1]} ({size} bytes; "
                "hint read_past_eof=disable)"
            )
    if any_flag(ctx.comm, step.error is not None):
        raise_agreed(ctx.comm, step.error, what=what)


def _transfer(
    ctx: Context, call: Call, runs: Runs, buf: npt.NDArray[np.uint8], *, writing: bool,
    batch: bool = False,
) -> BaseException | None:  # fmt: skip
    """Collective (every rank): the direct path, or (kept runs first, then) plan and
    rounds (a write's kept round first: its batch lane's for a ``batch``).

    Returns this rank's I/O error, not yet agreed (``complete_call`` agrees on it).
    """
    if call.hi <= call.lo:
        return None
    be = ctx.backend
    if call.direct:
        action = be.write_runs if writing else be.read_runs
        return _direct(ctx, call, lambda: action(runs, buf), runs, writing=writing)
    runs = _own_first(ctx, call, runs, buf, writing=writing)
    if call.hi > call.lo and ctx.local is not None:
        return planning.two_level(ctx, call, runs, buf, writing=writing)
    if call.hi > call.lo:
        kept = keptcall.transfer(ctx, call, buf, runs if batch else None) if writing else None
        if kept is not None:
            return kept[0]
        plan = planning.plan(ctx, runs, call, writing=writing)
        call.counters.rounds = plan.nrounds
        local_when_read(ctx, plan)
        return (keptcall.write_rounds if writing else read_rounds)(ctx, plan, buf, call)
    return None


def _own_first(
    ctx: Context, call: Call, runs: Runs, buf: npt.NDArray[np.uint8], *, writing: bool
) -> Runs:
    """Collective: do the runs the backend let this rank keep; return the rest to shuffle.

    Used when ``Backend.own_runs`` splits a call (zarr: chunks only one rank touches
    are stored by it, shared ones go through their aggregator).  The extent is
    agreed again for the rest.
    """
    if call.own is None:
        return runs
    own, rest = runs.take(np.flatnonzero(call.own)), runs.take(np.flatnonzero(~call.own))
    be = ctx.backend
    do = be.write_runs if writing else be.read_runs
    error = _direct(ctx, call, lambda: do(own, buf), own, writing=writing)
    # ranks finish their own I/O at different times: wait sleeping (see complete_call)
    if any_flag(ctx.comm, error is not None, patient=True):
        raise_agreed(ctx.comm, error, what="backend I/O")
    lo, hi = rest.extent() if len(rest) else (_BIG, 0)
    agreed = agree_facts(ctx.comm, _Extent(lo=lo, hi=hi))
    call.lo, call.hi = agreed.lo, agreed.hi
    return rest


def _direct(
    ctx: Context, call: Call, action: Any, runs: Runs, *, writing: bool
) -> BaseException | None:
    """Local: this rank does its own (large, disjoint) I/O; returns its error, not agreed."""
    lengths = runs.length  # as it is, not a list of (up to millions of) Python ints ...
    if lengths.flags.writeable:  # ... read-only: a caller cannot change the runs
        lengths = lengths.view()
        lengths.flags.writeable = False
    ctx.stats.local = {"domain": -1, "direct": True, "requests": lengths}
    g, c = call.early, call.counters
    if g is not None:  # done before the head (collio.speculate): counted as if done here
        done, seconds = g.done, g.seconds
        c.direct_io_bytes, c.early_flushes, c.mapped_bytes = g.key[1:]
        error = None
    else:
        step = Attempt()
        t = time.perf_counter()
        done = None
        with step:
            if len(runs):
                with storage_errors(ctx.backend):
                    done = action()  # a request count (one per run) or the requests' sizes
        seconds, error = time.perf_counter() - t, step.error
    if done is not None:
        sizes = runs.length if isinstance(done, int) else done
        if writing:
            c.add_writes(sizes)
        else:
            c.add_reads(sizes)
    call.done = done
    c.time_io += seconds
    return error
