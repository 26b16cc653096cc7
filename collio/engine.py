"""Two-phase collective write and read, as ROMIO's ad_write_coll.c / ad_read_coll.c, vectorised.

Flow of one call (every rank runs every step, so nothing hangs):

1. *check*: validate the layout and data locally, then one allreduce agrees on
   errors, the shared signature (global shape, dtype), the global extent and
   whether the shuffle can be skipped;
2. *plan*: cut runs at file domains and round windows; send (offset, length)
   lists to the aggregators, which check overlaps and number their rounds;
3. *rounds*: per round, an allreduce of a status flag, then point-to-point
   messages straight into the round buffer; the backend request of round k runs
   in the I/O thread while round k+1 is exchanged (double buffering);
4. *complete*: wait for the I/O, agree on errors, reduce statistics.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators import file_domains, plan_aggregator, plan_sender, window_size
from .aggregators.domains import alignment
from .aggregators.plan import AggregatorPlan, SenderPlan
from .backends.base import Backend
from .buffers import io_executor, round_buffers
from .collective import Attempt, any_flag, raise_agreed
from .errors import LayoutError, MismatchError, ModeError, OverlapError
from .exchange import alltoallv_i64, messages
from .hints import Hints
from .layouts.base import Layout
from .runs import Runs, first_overlap, merge
from .stats import Stats

__all__ = ["Context", "write", "read"]

I64 = npt.NDArray[np.int64]
_BIG = np.int64(2**62)
_TAG = 0x0C01
#: A rank with at most this many runs may skip the shuffle whatever their size.
_DIRECT_MAX_RUNS = 16


@dataclasses.dataclass(slots=True)
class Context:
    """What a collective call needs: the file's private communicator and its parts."""

    comm: MPI.Comm
    backend: Backend
    hints: Hints
    aggregators: I64
    stats: Stats
    mode: str

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def my_domain(self) -> int:
        """Index of this rank's file domain, or -1 when it does not aggregate."""
        hit = np.flatnonzero(self.aggregators == self.rank)
        return int(hit[0]) if len(hit) else -1


@dataclasses.dataclass(slots=True)
class _Call:
    """Per-call facts every rank agreed on."""

    lo: int
    hi: int
    direct: bool
    counters: Stats


def _sig_hash(sig: tuple[Any, ...] | None) -> int:
    if sig is None:
        return -1
    digest = hashlib.blake2b(repr(sig).encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


def _check(
    ctx: Context, layout: Any, prepare: Any, *, writing: bool
) -> tuple[Runs, npt.NDArray[np.uint8], Any, _Call]:
    """Collective over ``ctx.comm``: local checks, then one agreement (see module doc)."""
    step = Attempt()
    runs = Runs.empty()
    buf: npt.NDArray[np.uint8] = np.zeros(0, np.uint8)
    extra: Any = None
    sig = None
    with step:
        if ctx.mode == "closed":
            raise ModeError("the file is closed")
        if writing and ctx.mode == "r":
            raise ModeError("write_all on a file opened in mode 'r'")
        if not writing and not ctx.backend.readable:
            raise ModeError(
                f"read_all is not possible on this {ctx.backend.name} target in mode {ctx.mode!r}"
            )
        if not isinstance(layout, Layout):
            raise LayoutError(f"layout must be a collio layout, not {type(layout).__name__}")
        layout.validate()
        ctx.backend.check_layout(layout)
        buf, extra = prepare(layout)
        runs = ctx.backend.runs_for(layout)
        bad = first_overlap(runs.file, runs.length)
        if bad >= 0 and writing:
            raise OverlapError(
                f"bytes [{int(runs.file[bad])}, {int(runs.file[bad] + runs.length[bad])}) "
                f"are written twice by this rank"
            )
        sig = layout.signature()
    lo, hi = runs.extent() if len(runs) else (int(_BIG), 0)
    # the shuffle may be skipped only if every rank has a few runs or large ones
    small = len(runs) > _DIRECT_MAX_RUNS and runs.nbytes < len(runs) * ctx.hints.direct_threshold
    h = _sig_hash(sig)
    vec = np.array(
        [1 if step.error else 0, h if h >= 0 else -_BIG, -h if h >= 0 else -_BIG, -lo, hi, small],
        np.int64,
    )
    out = np.empty_like(vec)
    ctx.comm.Allreduce([vec, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX)
    if out[0]:
        raise_agreed(ctx.comm, step.error, what="write_all" if writing else "read_all")
    if out[1] != -_BIG and out[1] != -out[2]:
        _raise_mismatch(ctx.comm, sig)
    glo, ghi, any_small = int(-out[3]), int(out[4]), bool(out[5])
    mode = ctx.hints.romio_cb_write if writing else ctx.hints.romio_cb_read
    direct = False
    if ctx.backend.independent and ghi > glo:
        if mode == "disable" or (mode == "automatic" and not any_small):
            direct = _disjoint(ctx.comm, lo, hi)
    return runs, buf, extra, _Call(glo, ghi, direct, Stats())


def _raise_mismatch(comm: MPI.Comm, sig: tuple[Any, ...] | None) -> None:
    sigs = comm.allgather(sig)
    ref_rank = next(r for r, s in enumerate(sigs) if s is not None)
    ref = sigs[ref_rank]
    bad = [r for r, s in enumerate(sigs) if s is not None and s != ref]
    shown = ", ".join(f"rank {r}: {_describe(sigs[r])}" for r in bad[:8])
    raise MismatchError(
        f"ranks disagree on the global array: rank {ref_rank} has {_describe(ref)}; {shown}",
        ranks=tuple(bad),
    )


def _describe(sig: tuple[Any, ...]) -> str:
    _, shape, dtype, order, offset = sig
    return f"global shape {shape} dtype {dtype} order {order} offset {offset}"


def _disjoint(comm: MPI.Comm, lo: int, hi: int) -> bool:
    """Collective: True when no two ranks' extents interleave (each may write alone)."""
    mine = np.array([lo, hi], np.int64)
    every = np.empty(2 * comm.Get_size(), np.int64)
    comm.Allgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
    ext = every.reshape(-1, 2)
    ext = ext[ext[:, 1] > ext[:, 0]]
    ext = ext[np.argsort(ext[:, 0], kind="stable")]
    return bool((ext[1:, 0] >= ext[:-1, 1]).all())


# ---------------------------------------------------------------- planning
@dataclasses.dataclass(slots=True)
class _Plan:
    bounds: I64
    window: int
    sender: SenderPlan
    sround: I64  # round of each sender group
    agg: AggregatorPlan | None
    nrounds: int


def _plan(ctx: Context, runs: Runs, call: _Call, *, writing: bool) -> _Plan:
    """Collective over ``ctx.comm``: domains, metadata exchange, overlap check, rounds."""
    t0 = time.perf_counter()
    comm, aggs = ctx.comm, ctx.aggregators
    # domain_extent first: a backend may settle its alignment from the global extent
    # (S3 plans its part size from the object size at the first write_all)
    lo, hi = ctx.backend.domain_extent(call.lo, call.hi)
    align = alignment(ctx.backend.alignment, ctx.hints.striping_unit)
    bounds = file_domains(lo, hi, len(aggs), align)
    window = window_size(min(ctx.hints.cb_buffer_size, 1 << 30), align)
    sp = plan_sender(runs, bounds, window)
    counts = np.zeros(comm.Get_size(), np.int64)
    counts[aggs] = 2 * sp.per_dom
    meta = np.empty(2 * len(sp.pieces), np.int64)
    meta[0::2], meta[1::2] = sp.pieces.file, sp.pieces.length
    recv, rcounts = alltoallv_i64(comm, meta, counts)
    d = ctx.my_domain
    step = Attempt()
    ap: AggregatorPlan | None = None
    replies = np.zeros(0, np.int64)
    rep_counts = np.zeros(comm.Get_size(), np.int64)
    with step:
        if d >= 0:
            src = np.repeat(np.arange(comm.Get_size(), dtype=np.int64), rcounts // 2)
            ap, bad = plan_aggregator(recv[0::2], recv[1::2], src, int(bounds[d]), window)
            if bad >= 0 and writing:
                raise _overlap_error(recv[0::2], recv[1::2], src, bad)
            replies, rep_counts = ap.replies(comm.Get_size())
    vec = np.array([1 if step.error else 0, ap.nrounds if ap else 0], np.int64)
    out = np.empty_like(vec)
    comm.Allreduce([vec, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX)
    if out[0]:
        raise_agreed(comm, step.error, what="write_all" if writing else "read_all")
    sround, _ = alltoallv_i64(comm, replies, rep_counts)
    call.counters.time_plan += time.perf_counter() - t0
    return _Plan(bounds, window, sp, sround, ap, int(out[1]))


def _overlap_error(file: I64, length: I64, src: I64, bad: int) -> OverlapError:
    a, e = int(file[bad]), int(file[bad] + length[bad])
    hit = np.flatnonzero((file < e) & (file + length > a))
    other = int(hit[hit != bad][0]) if (hit != bad).any() else bad
    lo, hi = max(a, int(file[other])), min(e, int(file[other] + length[other]))
    ranks = sorted({int(src[bad]), int(src[other])})
    who = f"ranks {ranks[0]} and {ranks[1]}" if len(ranks) > 1 else f"rank {ranks[0]} twice"
    return OverlapError(f"bytes [{lo}, {hi}) are written by {who}")


# ------------------------------------------------------------------ rounds
def _round_groups(sround: I64) -> tuple[I64, I64]:
    order = np.argsort(sround, kind="stable").astype(np.int64)
    nr = int(sround.max()) + 1 if len(sround) else 0
    starts = np.concatenate(([0], np.cumsum(np.bincount(sround, minlength=nr)))).astype(np.int64)
    return order, starts


def _window_request(ctx: Context, plan: _Plan, k: int) -> tuple[int, int]:
    """(offset, length) of the backend request of this aggregator's round k."""
    ap = plan.agg
    assert ap is not None
    if ctx.backend.partial_write:
        return int(ap.rlo[k]), int(ap.rhi[k] - ap.rlo[k])
    d = ctx.my_domain
    start = int(plan.bounds[d]) + int(ap.rwin[k]) * plan.window
    end = min(start + plan.window, int(plan.bounds[d + 1]))
    return start, end - start


def _write_rounds(ctx: Context, plan: _Plan, runs_buf: npt.NDArray[np.uint8], call: _Call) -> None:
    comm, be, ap, sp = ctx.comm, ctx.backend, plan.agg, plan.sender
    c = call.counters
    order, starts = _round_groups(plan.sround)
    bufs = round_buffers(plan.window) if ap is not None and ap.nrounds else []
    pending: list[concurrent.futures.Future[None] | None] = [None, None]
    pool = io_executor()
    io_error: BaseException | None = None
    for k in range(plan.nrounds):
        step = Attempt()
        req = (0, 0)
        with step:
            if io_error is not None:
                raise io_error
            if ap is not None and k < ap.nrounds:
                b = k % 2
                fut = pending[b]
                pending[b] = None
                if fut is not None:
                    t = time.perf_counter()
                    fut.result()
                    c.time_io += time.perf_counter() - t
                req = _window_request(ctx, plan, k)
                if ap.rcovered[k] < req[1]:
                    t = time.perf_counter()
                    cover = _round_cover(ap, k)
                    c.add_reads(be.fill_holes(req[0], bufs[b][: req[1]], cover))
                    c.time_io += time.perf_counter() - t
        if any_flag(comm, step.error is not None, patient=be.remote):
            io_error = step.error
            break
        t = time.perf_counter()
        with messages(comm, _TAG + (k & 0x3FF)) as msgs:
            if ap is not None and k < ap.nrounds:
                wbuf = bufs[k % 2]
                for g in ap.groups_of_round(k).tolist():
                    s, e = int(ap.gstart[g]), int(ap.gstart[g + 1])
                    msgs.recv(int(ap.gsrc[g]), wbuf, ap.file[s:e] - req[0], ap.length[s:e])
                    c.messages += 1
            for g in order[starts[k] : starts[k + 1]].tolist() if k + 1 < len(starts) else []:
                piece = sp.group(g)
                msgs.send(int(ctx.aggregators[sp.gdom[g]]), runs_buf, piece.mem, piece.length)
                c.exchanged_bytes += piece.nbytes
        c.time_exchange += time.perf_counter() - t
        if ap is not None and k < ap.nrounds:
            cover = _round_cover(ap, k) if ap.rcovered[k] < req[1] else _whole(req)
            pending[k % 2] = pool.submit(_write_window, be, req[0], bufs[k % 2][: req[1]], cover, c)
    _finish_io(pending, c, io_error, comm, be.remote)


def _write_window(
    be: Backend, offset: int, buf: npt.NDArray[np.uint8], cover: Runs, c: Stats
) -> None:
    c.add_writes(be.write_window(offset, buf, cover))


def _whole(req: tuple[int, int]) -> Runs:
    one = np.array([req[0]], np.int64)
    return Runs(one, np.array([req[1]], np.int64), np.zeros(1, np.int64))


def _round_cover(ap: AggregatorPlan, k: int) -> Runs:
    """The byte ranges that ranks write (or need) in aggregator round k, sorted and merged."""
    groups = ap.groups_of_round(k)
    parts = [np.arange(int(ap.gstart[g]), int(ap.gstart[g + 1])) for g in groups.tolist()]
    idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    order = idx[np.argsort(ap.file[idx], kind="stable")]
    runs = Runs(ap.file[order], ap.length[order], ap.file[order])  # mem = file: merge by file
    return merge(runs)


def _finish_io(
    pending: list[concurrent.futures.Future[None] | None],
    c: Stats,
    error: BaseException | None,
    comm: MPI.Comm,
    patient: bool = False,
) -> None:
    """Wait for outstanding I/O, then agree on every error of the rounds."""
    t = time.perf_counter()
    for fut in pending:
        if fut is None:
            continue
        try:
            fut.result()
        except Exception as exc:  # noqa: BLE001 - agreed below
            error = error or exc
    c.time_io += time.perf_counter() - t
    if any_flag(comm, error is not None, patient=patient):
        raise_agreed(comm, error, what="backend I/O")


def _read_rounds(ctx: Context, plan: _Plan, out_buf: npt.NDArray[np.uint8], call: _Call) -> None:
    comm, be, ap, sp = ctx.comm, ctx.backend, plan.agg, plan.sender
    c = call.counters
    order, starts = _round_groups(plan.sround)
    bufs = round_buffers(plan.window) if ap is not None and ap.nrounds else []
    pool = io_executor()
    pending: list[concurrent.futures.Future[None] | None] = [None, None]
    reqs: list[tuple[int, int]] = [(0, 0), (0, 0)]

    def prefetch(k: int) -> None:
        if ap is not None and k < ap.nrounds:
            req = _window_request(ctx, plan, k)
            reqs[k % 2] = req
            need = _round_cover(ap, k) if ap.rcovered[k] < req[1] else _whole(req)
            pending[k % 2] = pool.submit(_read_window, be, req[0], bufs[k % 2][: req[1]], need, c)

    step0 = Attempt()
    with step0:
        if ap is not None and ap.nrounds:  # what this aggregator reads, first to last byte
            be.read_extent(int(ap.rlo[0]), int(ap.rhi.max()))
        prefetch(0)
    error: BaseException | None = step0.error
    for k in range(plan.nrounds):
        step = Attempt()
        with step:
            if error is not None:
                raise error
            if ap is not None and k < ap.nrounds:
                fut = pending[k % 2]
                pending[k % 2] = None
                if fut is not None:
                    t = time.perf_counter()
                    fut.result()
                    c.time_io += time.perf_counter() - t
                prefetch(k + 1)
        if any_flag(comm, step.error is not None, patient=be.remote):
            error = step.error
            break
        t = time.perf_counter()
        with messages(comm, _TAG + (k & 0x3FF)) as msgs:
            for g in order[starts[k] : starts[k + 1]].tolist() if k + 1 < len(starts) else []:
                piece = sp.group(g)
                msgs.recv(int(ctx.aggregators[sp.gdom[g]]), out_buf, piece.mem, piece.length)
                c.exchanged_bytes += piece.nbytes
            if ap is not None and k < ap.nrounds:
                rbuf, base = bufs[k % 2], reqs[k % 2][0]
                for g in ap.groups_of_round(k).tolist():
                    s, e = int(ap.gstart[g]), int(ap.gstart[g + 1])
                    msgs.send(int(ap.gsrc[g]), rbuf, ap.file[s:e] - base, ap.length[s:e])
                    c.messages += 1
        c.time_exchange += time.perf_counter() - t
    _finish_io(pending, c, error, comm, be.remote)


def _read_window(
    be: Backend, offset: int, buf: npt.NDArray[np.uint8], need: Runs, c: Stats
) -> None:
    c.add_reads(be.read_window(offset, buf, need))


# ------------------------------------------------------------- entry points
def _complete(ctx: Context, call: _Call, t0: float) -> None:
    """Collective: reduce this call's counters into the file's statistics."""
    c = call.counters
    c.time_total = time.perf_counter() - t0
    sums, maxes = c.pack()
    rs, rm = np.empty_like(sums), np.empty_like(maxes)
    ctx.comm.Allreduce([sums, MPI.INT64_T], [rs, MPI.INT64_T], op=MPI.SUM)
    ctx.comm.Allreduce([maxes, MPI.DOUBLE], [rm, MPI.DOUBLE], op=MPI.MAX)
    ctx.stats.absorb(rs, rm)
    # calls are collective: count each once, not once per rank
    if call.hi > call.lo:
        if call.direct:
            ctx.stats.direct_calls += 1
        else:
            ctx.stats.collective_calls += 1
    ctx.stats.last_call = {
        "direct": call.direct,
        "rounds": int(rm[0]),
        "extent": [call.lo, call.hi] if call.hi > call.lo else [0, 0],
    }


def write(ctx: Context, data: Any, layout: Any) -> None:
    """Collective over ``ctx.comm``: two-phase write of every rank's piece."""
    t0 = time.perf_counter()

    def prepare(lay: Layout) -> tuple[npt.NDArray[np.uint8], None]:
        return lay.as_bytes(data), None

    runs, buf, _, call = _check(ctx, layout, prepare, writing=True)
    if call.hi > call.lo:
        if call.direct:
            _direct(ctx, call, lambda: ctx.backend.write_runs(runs, buf), runs, writing=True)
        else:
            plan = _plan(ctx, runs, call, writing=True)
            call.counters.rounds = plan.nrounds
            _write_rounds(ctx, plan, buf, call)
        step = Attempt()
        with step:
            ctx.backend.flush(ctx.comm)
        if ctx.comm.allreduce(1 if step.error else 0, op=MPI.MAX):
            raise_agreed(ctx.comm, step.error, what="backend flush")
    _complete(ctx, call, t0)


def read(ctx: Context, layout: Any, out: Any) -> Any:
    """Collective over ``ctx.comm``: two-phase read; returns the rank's piece."""
    t0 = time.perf_counter()

    def prepare(lay: Layout) -> tuple[npt.NDArray[np.uint8], Any]:
        arr, view = lay.allocate(out)
        return view, arr

    runs, buf, arr, call = _check(ctx, layout, prepare, writing=False)
    if call.hi > call.lo:
        if call.direct:
            _direct(ctx, call, lambda: ctx.backend.read_runs(runs, buf), runs, writing=False)
        else:
            plan = _plan(ctx, runs, call, writing=False)
            call.counters.rounds = plan.nrounds
            _read_rounds(ctx, plan, buf, call)
    _complete(ctx, call, t0)
    return arr


def _direct(ctx: Context, call: _Call, action: Any, runs: Runs, *, writing: bool) -> None:
    """Collective: every rank does its own (large, disjoint) I/O, then all agree."""
    step = Attempt()
    t = time.perf_counter()
    with step:
        if len(runs):
            action()
            if writing:
                call.counters.add_writes(runs.length)
            else:
                call.counters.add_reads(runs.length)
    call.counters.time_io += time.perf_counter() - t
    if ctx.comm.allreduce(1 if step.error else 0, op=MPI.MAX):
        raise_agreed(ctx.comm, step.error, what="backend I/O")
