"""Run APIs side by side under mpiexec: alternating iterations, IOR's phases, verification.

Every iteration runs every API once, writing then reading the same file, in an
order that changes so that every API follows every other equally often (a
Williams design, :func:`balanced_orders`): rotating one order would keep each
API's predecessor fixed, and what the previous writer left behind (a burst of
writes a virtual disk is still absorbing after its fsync, say) would always fall
on the same API.  The file is
removed before each write.  Phases (open, transfer, close) are timed per rank
and the slowest rank's time is kept; bandwidth is the bytes over the
barrier-to-barrier time, as IOR reports it.  An API's ``prepare`` / ``finish``
(e.g. creating an empty zarr array) run before / after the timed phases.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from ..collective import Attempt, agree, raise_agreed
from ..waits import quiet_barrier
from .apis import Api, Job, get_api
from .patterns import Workload

__all__ = ["BenchConfig", "Row", "balanced_orders", "run_bench", "peak_rss"]

MiB = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class BenchConfig:
    """What the command line asked for."""

    work: Workload
    apis: tuple[str, ...]
    iterations: int = 5
    write: bool = True
    read: bool = True
    fsync: bool = True
    check_write: bool = False
    check_read: bool = False
    path: str | None = None
    hints: tuple[tuple[str, str], ...] = ()
    keep: bool = False
    options: tuple[tuple[str, str], ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (API, why it cannot run here)


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One API, one operation, one iteration (IOR's per-iteration line)."""

    api: str
    op: str
    iteration: int
    bw: float  # MiB/s
    ops: float  # transfers/s
    open: float
    xfer: float
    close: float
    total: float
    errors: int  # -1: not verified


def peak_rss(reset: bool = False) -> int:
    """This process's peak resident set (bytes).

    ``reset`` starts a new peak (Linux ``clear_refs``) and returns the resident set
    at that moment; elsewhere the peak is the process's lifetime peak.
    """
    try:
        if reset:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
        key = "VmRSS:" if reset else "VmHWM:"
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0 if reset else int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _shared_path(comm: MPI.Intracomm, path: str | None) -> tuple[str, str | None]:
    """The test file (``-o``, or a file in a temporary directory rank 0 makes)."""
    if path is not None:
        return path, None
    tmp = tempfile.mkdtemp(prefix="collio-bench-") if comm.rank == 0 else None
    tmp = comm.bcast(tmp, root=0)
    assert tmp is not None
    return os.path.join(tmp, "testFile"), tmp


def _sentinel(dtype: np.dtype[Any]) -> Any:
    """NaN for floats, the largest value for integers (the ior bytes stop at 250)."""
    if dtype.kind in "fc":
        return np.nan
    if dtype.kind in "iu":
        return np.iinfo(dtype).max
    return 0


def _fresh(comm: MPI.Intracomm, path: str) -> None:
    if comm.rank == 0 and os.path.exists(path):
        os.unlink(path)
    comm.Barrier()


def _timed(comm: MPI.Intracomm, api: Api, writing: bool) -> tuple[float, float, float, float]:
    """Collective: (open, transfer, close) of the slowest rank, and the total between barriers.

    A rank whose phase fails still reaches the barrier; then every rank raises the
    same :class:`~collio.CollioError` naming the failing ranks (nobody hangs).
    """
    wait = quiet_barrier if api.quiet else _barrier
    wait(comm)
    t0 = time.perf_counter()
    t = [t0, t0, t0]
    step = Attempt()
    with step:
        api.open(writing)
        t[0] = time.perf_counter()
        api.transfer(writing)
        t[1] = time.perf_counter()
        api.close()
        t[2] = time.perf_counter()
    wait(comm)
    total = time.perf_counter() - t0
    phases = np.array([t[0] - t0, t[1] - t[0], t[2] - t[1], 1.0 if step.error else 0.0])
    worst = np.empty_like(phases)
    comm.Allreduce(phases, worst, op=MPI.MAX)
    if worst[3]:
        raise_agreed(comm, step.error, what=f"{api.name} {'write' if writing else 'read'}")
    return float(worst[0]), float(worst[1]), float(worst[2]), total


def _barrier(comm: MPI.Intracomm) -> None:
    comm.Barrier()


def _untimed(comm: MPI.Intracomm, api: Api, writing: bool, step: str) -> None:
    """Collective: ``api.prepare`` / ``api.finish``; a failure on any rank is raised on all."""
    attempt = Attempt()
    with attempt:
        (api.prepare if step == "prepare" else api.finish)(writing)
    agree(comm, attempt.error, what=f"{api.name} {step}")


def _count_errors(comm: MPI.Intracomm, api: Api, job: Job, writing: bool) -> int:
    """Collective: elements that differ, summed over ranks (-1: not verifiable)."""
    attempt = Attempt()
    mine = 0
    verifiable = True
    with attempt:
        if writing:
            got = api.written()
            verifiable = got is not None
            if got is not None:
                want, got = job.data.reshape(-1), got.reshape(-1)
                # a short target (nothing or too little stored) counts every element wrong
                mine = int(np.count_nonzero(got != want)) if got.size == want.size else want.size
        else:
            mine = api.read_errors()
    agree(comm, attempt.error, what=f"{api.name} verify")
    if not comm.allreduce(1 if verifiable else 0, op=MPI.MIN):
        return -1
    return int(comm.allreduce(mine, op=MPI.SUM))


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` APIs in which each API directly follows each other equally often.

    Williams' design: the sequence 0, 1, n-1, 2, n-2, ... shifted by every i (and,
    for odd ``n``, the same orders reversed).  Over a cycle of ``n`` (odd: ``2n``)
    iterations every ordered pair of APIs is adjacent the same number of times and
    every API comes first equally often; the first order starts with API 0.  The
    orders are chained so that no API runs twice in a row across iterations either
    (possible from three APIs on; with two, every other boundary repeats one).
    """
    first, lo, hi = [0], 1, n - 1
    while lo <= hi:
        first.append(lo)
        lo += 1
        if lo <= hi:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return _chain(rows)


def _chain(rows: list[list[int]]) -> list[list[int]]:
    """``rows`` reordered so that no iteration starts with the API the previous one ended
    with (cyclically, from row 0); as given when that is impossible (two APIs)."""
    n = len(rows)

    def extend(path: list[int], left: set[int]) -> list[int] | None:
        if not left:
            return path if rows[path[-1]][-1] != rows[path[0]][0] else None
        for j in sorted(left):
            if rows[j][0] != rows[path[-1]][-1]:
                found = extend([*path, j], left - {j})
                if found is not None:
                    return found
        return None

    order = extend([0], set(range(1, n))) if n > 2 else None
    return rows if order is None else [rows[j] for j in order]


class Runner:
    """The iteration loop; rank 0 collects rows and prints progress through ``emit``."""

    def __init__(self, comm: MPI.Intracomm, cfg: BenchConfig, emit: Callable[[str], None]) -> None:
        self.comm, self.cfg, self.emit = comm, cfg, emit
        self.rows: list[Row] = []
        self.rss: dict[str, int] = {}
        self.extra: dict[str, int] = {}  # peak minus the resident set before the phase
        self.hints_used: dict[str, dict[str, Any]] = {}
        self.aggregators: list[int] = []
        self.aggregators_of: dict[str, list[int]] = {}

    def run(self, apis: list[Api], job: Job, transfers: int) -> None:
        cfg = self.cfg
        orders = balanced_orders(len(apis))
        for it in range(cfg.iterations):
            t = time.perf_counter()
            for i in orders[it % len(orders)]:
                self._one(apis[i], job, it, transfers)
            line = self._progress(it, time.perf_counter() - t)
            self.emit(line)

    def _one(self, api: Api, job: Job, it: int, transfers: int) -> None:
        cfg, comm = self.cfg, self.comm
        ops = [("write", True)] if cfg.write else []
        ops += [("read", False)] if cfg.read else []
        for op, writing in ops:
            if writing:
                _fresh(comm, job.path)
            else:  # a value the data never holds, so a byte not read shows in -R
                job.out[...] = _sentinel(job.out.dtype)
            _untimed(comm, api, writing, "prepare")
            base = peak_rss(reset=True)
            o, x, c, total = _timed(comm, api, writing)
            peak = peak_rss()
            self.rss[api.name] = max(self.rss.get(api.name, 0), peak)
            self.extra[api.name] = max(self.extra.get(api.name, 0), peak - base)
            check = (cfg.check_write if writing else cfg.check_read) or it == 0
            errors = -1
            if check and api.verifiable:
                errors = _count_errors(comm, api, job, writing)
            _untimed(comm, api, writing, "finish")
            nbytes = cfg.work.nbytes
            row = Row(
                api.name, op, it, nbytes / MiB / total, transfers / total, o, x, c, total, errors
            )
            self.rows.append(row)
            self.emit(format_row(row))
        self.hints_used[api.name] = api.hints_used()
        stats = getattr(api, "stats", None)
        if stats is not None:
            self.aggregators = list(stats.aggregators)
            self.aggregators_of[api.name] = self.aggregators

    def _progress(self, it: int, seconds: float) -> str:
        parts = [f"{r.api} {r.op[0]} {r.bw:.0f}" for r in self.rows if r.iteration == it]
        return (
            f"# iteration {it + 1}/{self.cfg.iterations} in {seconds:.1f} s: "
            + ", ".join(parts)
            + " MiB/s"
        )


HEADER = (
    f"{'access':<6} {'api':<12} {'bw(MiB/s)':>10} {'IOPS':>10} {'open(s)':>8} {'wr/rd(s)':>9} "
    f"{'close(s)':>8} {'total(s)':>8} {'iter':>4} {'errors':>6}"
)


def format_row(r: Row) -> str:
    err = "-" if r.errors < 0 else str(r.errors)
    return (
        f"{r.op:<6} {r.api:<12} {r.bw:>10.2f} {r.ops:>10.1f} {r.open:>8.4f} {r.xfer:>9.4f} "
        f"{r.close:>8.4f} {r.total:>8.4f} {r.iteration:>4} {err:>6}"
    )


def _ensure_file(comm: MPI.Intracomm, job: Job, apis: list[Api]) -> None:
    """For read-only runs: write the file once with collio, and each API's own target (untimed)."""
    if not os.path.exists(job.path):
        api = get_api("collio")(job)
        api.open(True)
        api.transfer(True)
        api.close()
    for api in apis:
        if api.own_target:
            _untimed(comm, api, True, "prepare")
            _timed(comm, api, True)
            _untimed(comm, api, True, "finish")


def run_bench(
    comm: MPI.Intracomm, cfg: BenchConfig, emit: Callable[[str], None]
) -> tuple[Runner, Job, dict[str, Any]]:
    """Collective over ``comm``: run every API ``cfg.iterations`` times.

    Parameters
    ----------
    comm
        The ranks taking part (each holds ``cfg.work.layout(rank)``).
    cfg
        What to run.
    emit
        Called with each output line (rows, progress); rank 0 prints them.

    Returns
    -------
    tuple
        The runner (its ``rows``, ``rss``, ``extra``, ``hints_used``), the rank's
        :class:`~collio.bench.apis.Job`, and facts (test file, transfers, data bytes).
    """
    path, tmp = _shared_path(comm, cfg.path)
    w = cfg.work
    lay = w.layout(comm.rank)
    data = np.ascontiguousarray(w.data(comm.rank))
    job = Job(
        comm, w, lay, data, np.empty_like(data), path, dict(cfg.hints), cfg.fsync,
        dict(cfg.options), cfg.keep,
    )  # fmt: skip
    transfers = int(comm.allreduce(len(job.pieces), op=MPI.SUM))
    runner = Runner(comm, cfg, emit)
    emit(HEADER)
    apis = [get_api(name)(job) for name in cfg.apis]
    try:
        for api in apis:
            api.setup()
        if not cfg.write:
            _ensure_file(comm, job, apis)
        runner.run(apis, job, transfers)
    finally:
        for api in apis:
            api.teardown()
        comm.Barrier()
        if comm.rank == 0 and not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True) if tmp else _remove(path)
    facts = {"path": path, "transfers": transfers, "data_bytes": int(data.nbytes)}
    return runner, job, facts


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
