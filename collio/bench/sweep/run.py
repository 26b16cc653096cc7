"""Run the sweep under mpiexec: APIs alternating call by call, each on its own file.

For each pattern and size every API opens its own file, then makes one call per round
in an order that changes from round to round (:func:`~collio.bench.run.balanced_orders`),
so that all of them see the same state of the machine; a round is one call of each.  A
call is one step (``Step``) at a new offset; a batch call is ``count`` steps.  Before
each call the ranks agree on the previous call's outcome (an allreduce, which is also
the barrier that starts every call together); the call's time is each rank's from then
to its return, and the slowest rank's time per call is what the medians are made of.
The data of each step is written into the same buffer before the call (as a solver's
state array), so a step's bytes differ from every other's.  Reads read the steps back
in the same order, as many calls as the writes made.  Every API's first call per size
is checked byte for byte against numpy (``-W`` / ``-R``: every call).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ...collective import Attempt, raise_agreed
from ..patterns import human
from ..run import balanced_orders
from .callers import Caller, make_caller
from .work import ITEMSIZE, Step, expected, words

__all__ = ["Budget", "Result", "SweepConfig", "Sweeper"]

F64 = npt.NDArray[np.float64]
#: Elements a check reads from a file at once (64 MiB of float64).
CHUNK = 1 << 23


@dataclasses.dataclass(frozen=True, slots=True)
class Budget:
    """How many rounds a phase makes: at least ``least``, at most ``most``, and no more
    once ``seconds`` per API have passed."""

    least: int = 5
    most: int = 50
    seconds: float = 0.5

    def done(self, rounds: int, elapsed: float, napis: int) -> bool:
        if rounds >= self.most:
            return True
        return rounds >= self.least and elapsed >= self.seconds * napis


@dataclasses.dataclass(frozen=True, slots=True)
class SweepConfig:
    """What the command line asked for (the same on every rank)."""

    sizes: tuple[int, ...]
    patterns: tuple[str, ...]
    apis: tuple[str, ...]  # (of the calls' and batches' APIs, those the user names)
    runs: int = 64
    batch: int = 0  # arrays per batch call (0: no batches)
    batch_sizes: tuple[int, ...] = ()
    batch_apis: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()  # of open, sync, close
    fsync: bool = False
    read: bool = True
    check_write: bool = False
    check_read: bool = False
    budget: Budget = Budget()
    batch_budget: Budget = Budget(3, 50, 0.5)
    path: str = "sweep"
    hints: tuple[tuple[str, str], ...] = ()
    keep: bool = False
    call_apis: tuple[str, ...] = ()  # the single calls' (empty: ``apis``)


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """One API's calls of one kind, pattern, operation and size."""

    kind: str  # "call", "batch" or "file" (open, sync, close)
    pattern: str | None
    op: str  # write, read, open, sync, close
    size: int | None  # bytes per rank per array
    api: str
    family: str  # "collio" or "romio"
    count: int  # arrays per call
    times: list[float]  # the slowest rank's seconds, per call
    errors: int | None  # float64 elements found wrong, summed over ranks; None: not checked
    verified: int  # calls checked
    path: str | None  # how collio moved the first call's bytes


class Sweeper:
    """The sweep's loops; every method is collective over ``comm``."""

    def __init__(self, comm: MPI.Intracomm, cfg: SweepConfig, emit: Callable[[str], None]):
        self.comm, self.cfg, self.emit = comm, cfg, emit
        self.results: list[Result] = []
        self.used: dict[str, dict[str, Any]] = {}
        self.attempt = Attempt()
        self.last = ""

    def run(self) -> None:
        cfg, p = self.cfg, self.comm.size
        for pattern in cfg.patterns:
            for size in cfg.sizes:
                self.size(Step(pattern, size, p, cfg.runs), 0)
        for pattern in cfg.patterns if cfg.batch else ():
            for size in cfg.batch_sizes:
                self.size(Step(pattern, size, p, cfg.runs), cfg.batch)
        if cfg.calls:
            self.file_calls()

    def size(self, work: Step, batch: int) -> None:
        """Write then read the steps of one size (``batch`` arrays per call, 0: one)."""
        cfg = self.cfg
        names = cfg.batch_apis if batch else cfg.call_apis or cfg.apis
        hints = dict(cfg.hints)
        callers = [make_caller(n, self.comm, hints) for n in names]
        kind = f"batch-{batch}-" if batch else ""
        paths = [f"{cfg.path}.{kind}{work.pattern}-{work.size}.{c.name}" for c in callers]
        try:
            rounds = self.phase(work, callers, paths, batch, None)
            if cfg.read:
                self.phase(work, callers, paths, batch, rounds)
        finally:
            self.comm.Barrier()
            if self.comm.rank == 0 and not cfg.keep:
                for path in paths:
                    _remove(path)
        for c in callers:
            self.used.setdefault(c.name, c.used)

    def phase(
        self, work: Step, callers: list[Caller], paths: list[str], batch: int, rounds: int | None
    ) -> int:
        """Collective: the calls of one phase (``rounds`` None: writes, else that many reads)."""
        ph = _Phase(work, callers, batch, rounds is None, self.comm.rank)
        mode = "w" if ph.writing else "r"

        def open_all() -> None:
            for c, path in zip(callers, paths, strict=True):
                c.open(path, mode, work)

        def close_all() -> None:
            for c in callers:
                c.close()

        self.together(open_all, "open")
        orders = balanced_orders(len(callers))
        budget = self.cfg.batch_budget if batch else self.cfg.budget
        r, t0 = 0, time.perf_counter()
        while True:
            for i in orders[r % len(orders)]:
                self.one(ph, i, r)
            r += 1
            elapsed = time.perf_counter() - t0
            done = budget.done(r, elapsed, len(callers)) if rounds is None else r >= rounds
            if self.comm.bcast(done if self.comm.rank == 0 else None, root=0):
                break
        self.settle()
        self.together(close_all, "close")
        if ph.writing:
            upto = r if self.cfg.check_write else 1
            for i, path in enumerate(paths):
                if callers[i].family == "ceiling":  # (its own layout: checked as it reads)
                    continue
                ph.wrong[i] += _wrong_in_file(self.comm, path, work, upto * ph.count, r * ph.count)
                ph.checked[i] += upto
        self.keep(ph)
        return r

    def one(self, ph: _Phase, i: int, r: int) -> None:
        """Collective: API ``i``'s call of round ``r`` (its data or its check untimed)."""
        c, steps = ph.callers[i], range(r * ph.count, (r + 1) * ph.count)
        check = r == 0 or (self.cfg.check_read and not ph.writing)
        if ph.writing:
            np.add(ph.first, _offsets(steps, ph.work, ph.first.ndim), out=ph.bufs)
        elif check:
            ph.bufs.fill(np.nan)
        if ph.batch:
            arg = c.batch_target(ph.work, steps, ph.views)
        else:
            arg = c.target(ph.work, r, ph.views[0])
        call = _call(c, arg, ph.writing, ph.batch, self.cfg.fsync)
        ph.times[i].append(self.timed(call, f"{c.name} {ph.op}"))
        if r == 0:
            ph.paths[i] = c.path()
        if check and not ph.writing:
            want = ph.first + _offsets(steps, ph.work, ph.first.ndim)
            ph.wrong[i] += int(np.count_nonzero(words(ph.bufs) != words(want)))
            ph.checked[i] += 1

    def timed(self, fn: Callable[[], None], what: str) -> float:
        """Collective: ``fn`` timed, after the agreement on the last call (its barrier)."""
        self.settle()
        self.last = what
        t0 = time.perf_counter()
        with self.attempt:
            fn()
        return time.perf_counter() - t0

    def settle(self) -> None:
        """Collective: the ranks' agreement on the last call (and their barrier)."""
        failed = self.attempt.error is not None
        if self.comm.allreduce(failed, op=MPI.LOR):
            raise_agreed(self.comm, self.attempt.error, what=self.last)

    def together(self, fn: Callable[[], Any], what: str) -> None:
        """Collective: ``fn`` (not timed) on every rank, a failure raised on all of them."""
        self.last = what
        with self.attempt:
            fn()
        self.settle()

    def keep(self, ph: _Phase) -> None:
        """Collective: the slowest rank's times and every rank's errors, kept as results."""
        wrong = self.comm.allreduce(ph.wrong, op=MPI.SUM)
        kind = "batch" if ph.batch else "call"
        medians = []
        for i, c in enumerate(ph.callers):
            mine = np.array(ph.times[i])
            slowest = np.empty_like(mine)
            self.comm.Allreduce(mine, slowest, op=MPI.MAX)
            errors = int(wrong[i]) if ph.checked[i] else None
            self.results.append(Result(kind, ph.work.pattern, ph.op, ph.work.size, c.name,
                                       c.family, ph.count, slowest.tolist(), errors,
                                       int(ph.checked[i]), ph.paths[i]))  # fmt: skip
            medians.append(f"{c.name} {np.median(slowest) * 1e3:.3f}")
        self.emit(
            f"# {kind} {ph.work.pattern} {ph.op} {human(ph.work.size)}: {len(ph.times[0])} calls "
            "each; " + ", ".join(medians) + " ms (median)"
        )

    def file_calls(self) -> None:
        """Collective: open ("r+"), sync with nothing written, close, alternating APIs."""
        cfg, comm = self.cfg, self.comm
        callers = [make_caller(n, comm, dict(cfg.hints)) for n in cfg.apis]
        paths = [f"{cfg.path}.calls.{c.name}" for c in callers]
        if comm.rank == 0:
            for path in paths:
                open(path, "wb").close()
        times: dict[tuple[int, str], list[float]] = {
            (i, op): [] for i in range(len(callers)) for op in cfg.calls
        }
        orders, r, t0 = balanced_orders(len(callers)), 0, time.perf_counter()
        try:
            while True:
                for i in orders[r % len(orders)]:
                    self.file_round(callers[i], paths[i], i, times)
                r += 1
                done = cfg.budget.done(r, time.perf_counter() - t0, len(callers))
                if comm.bcast(done if comm.rank == 0 else None, root=0):
                    break
            self.settle()
        finally:
            comm.Barrier()
            if comm.rank == 0 and not cfg.keep:
                for path in paths:
                    _remove(path)
        for (i, op), mine in times.items():
            slowest = np.empty(len(mine))
            comm.Allreduce(np.array(mine), slowest, op=MPI.MAX)
            c = callers[i]
            self.results.append(Result("file", None, op, None, c.name, c.family, 1,
                                       slowest.tolist(), None, 0, None))  # fmt: skip

    def file_round(
        self, c: Caller, path: str, i: int, times: dict[tuple[int, str], list[float]]
    ) -> None:
        """Collective: one open, sync (when timed) and close of API ``i``'s file."""

        def opened() -> None:
            c.open(path, "r+", None)

        for op, fn in (("open", opened), ("sync", c.sync), ("close", c.close)):
            if op == "sync" and op not in self.cfg.calls:
                continue
            took = self.timed(fn, f"{c.name} {op}")
            if op in self.cfg.calls:
                times[i, op].append(took)


class _Phase:
    """One phase's buffers and what its calls found (per API, in the callers' order)."""

    def __init__(
        self, work: Step, callers: list[Caller], batch: int, writing: bool, rank: int
    ) -> None:
        self.work, self.callers, self.batch, self.writing = work, callers, batch, writing
        self.op = "write" if writing else "read"
        self.count = max(batch, 1)
        self.first = work.first(rank)
        # one buffer per array of a call, touched now: no first-touch page fault in a call
        self.bufs: F64 = np.full((self.count, *work.local_shape), np.nan)
        self.views = list(self.bufs)
        n = len(callers)
        self.times: list[list[float]] = [[] for _ in range(n)]
        self.wrong, self.checked = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.paths: list[str | None] = [None] * n


def _call(c: Caller, arg: Any, writing: bool, batch: int, sync: bool) -> Callable[[], None]:
    """The timed part of one call: the write (and its sync with ``-e``) or the read."""
    if not writing:
        return functools.partial(c.read_batch if batch else c.read, arg)
    write = c.write_batch if batch else c.write
    if not sync:
        return functools.partial(write, arg)

    def write_and_sync() -> None:
        write(arg)
        c.sync()

    return write_and_sync


def _offsets(steps: range, work: Step, ndim: int) -> F64:
    """What step k's data adds to step 0's (``k * step_elements``), shaped to broadcast."""
    k = np.arange(steps.start, steps.stop, dtype=np.float64) * work.step_elements
    return k.reshape(-1, *(1,) * ndim)


def _wrong_in_file(comm: MPI.Intracomm, path: str, work: Step, upto: int, steps: int) -> int:
    """Elements wrong in the file's first ``upto`` steps, this rank's share of them (rank 0
    adds the elements by which the file is longer or shorter than ``steps`` steps)."""
    total = upto * work.step_elements
    lo, hi = total * comm.rank // comm.size, total * (comm.rank + 1) // comm.size
    bad = 0
    with open(path, "rb") as fh:
        for a in range(lo, hi, CHUNK):  # (a few large reads, not one per element or run)
            b = min(hi, a + CHUNK)
            fh.seek(a * ITEMSIZE)
            data = fh.read((b - a) * ITEMSIZE)
            got = np.frombuffer(data[: len(data) // ITEMSIZE * ITEMSIZE], np.uint64)
            want = words(expected(a, b))
            bad += int(np.count_nonzero(got != want[: got.size])) + want.size - got.size
    if comm.rank == 0:
        bad += -(-abs(os.path.getsize(path) - steps * work.step_bytes) // ITEMSIZE)
    return bad


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
