"""``collio-bench --pattern checkpoint``: a model state saved and loaded by collio's
checkpoint and by the ways jobs save one today, with the issue's targets checked.

Every figure is the slowest rank's time between two barriers, so a method is done
when its last rank is; medians over iterations, the methods' order rotated each
iteration so that none always follows the same one.  The compute loops (alone, during
an async save, beside a control) are first measured as a job runs between its
checkpoints, with nothing else (the issue's target); then every method, in three
groups one after the other in each iteration (the writers, the readers, the loops
again, named apart): what the others' I/O leaves the machine to do meets those loops.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import checkpoint as ckpt
from ..checkpoint import asyncsave, writer
from ..checkpoint.verify import CHUNK
from ..collective import Attempt, bcast_outcome, raise_agreed
from ..hints import parse_size
from ..waits import quiet_barrier, sleep_until_done
from . import ckpt_peers as peers

__all__ = ["run_checkpoint"]

MiB = 1 << 20
#: The suffix of the compute loops' figures measured among the other methods (after the
#: writers and the readers in each iteration), apart from those of the job alone.
MIXED = " among the others"

#: (what, numerator, denominator, bound, at least, the issue's): the issue's targets as
#: time ratios, and stricter bounds beside them (not the issue's: what the ceilings
#: themselves reach, or a harder peer than the issue names)
TARGETS = (
    ("save vs ceiling (bandwidth)", "ceiling write", "collio save", 0.9, True, True),
    ("save vs file-per-rank (bandwidth)", "file-per-rank write", "collio save", 1.0, True,
     True),
    # (both among the others: the copy is one of the writers)
    ("async_save return vs one numpy copy (time)", f"async_save return{MIXED}", "numpy copy",
     1.25, False, True),
    ("compute slowdown during async I/O", "compute during I/O", "compute alone", 1.10, False,
     True),
    # (the issue's "reading the ceiling's file back": a load makes new arrays, so the
    # ceiling's read of the file into new arrays of the pieces' shapes; the same read
    # into memory the job already touched is the harder bound, and the one for a load
    # into the job's arrays)
    ("load vs ceiling read into new arrays (bandwidth)", "ceiling read new", "collio load",
     0.9, True, True),
    ("resharded load vs same-count load (bandwidth)", "collio load", "collio load 3 of N",
     0.8, True, True),
    # (what checksums cost a save as the issue means it: the save with them against the
    # same save without them, run by turns)
    ("save with checksums vs without (time)", "collio save", "collio save unchecked", 1.05,
     False, True),
    ("load vs ceiling read into touched memory (bandwidth)", "ceiling read", "collio load",
     0.9, True, False),
    ("load into the job's arrays vs ceiling read into touched memory (bandwidth)",
     "ceiling read", "collio load into", 0.9, True, False),
    # (a load verifies what it reads: the unverified preadv against the same preadv with
    # the checksum of its bytes after it, or of each chunk right after its read, says
    # whether any verified load can reach the bounds above; the loads against the better)
    ("ceiling read + checksum vs ceiling read (bandwidth)", "ceiling read",
     "ceiling read + checksum", 0.9, True, False),
    ("ceiling read + checksum by chunk vs ceiling read (bandwidth)", "ceiling read",
     "ceiling read + checksum by chunk", 0.9, True, False),
    ("load vs verified ceiling read into touched memory (bandwidth)",
     "verified ceiling read", "collio load", 0.9, True, False),
    ("load into the job's arrays vs verified ceiling read (bandwidth)",
     "verified ceiling read", "collio load into", 0.9, True, False),
    # (the resharded ratio of the least a mapping load does, its share mapped and
    # checksummed: whether the issue's bound can be met at all with this many ranks on
    # these cores)
    ("verified ceiling map 3 of N vs same count (bandwidth)", "verified ceiling map",
     "verified ceiling map 3 of N", 0.8, True, False),
    # (the checksum's CPU time alone against the save's time: the save sums while the
    # disk writes, so this is what the checksums would cost a save bound by the CPU alone)
    ("checksum alone vs save (time)", "checksum", "collio save", 0.05, False, False),
    # (the compute loops again in the iterations of every method, after the writers and
    # the readers: what their I/O leaves the kernel and the machine to do meets them)
    ("compute slowdown during async I/O among the others", f"compute during I/O{MIXED}",
     f"compute alone{MIXED}", 1.10, False, False),
)  # fmt: skip

#: (what, numerator, denominator): no targets, the floor under the compute slowdown's: the
#: same loop while each rank's thread at the save's priority does the ceiling's write (one
#: pwrite of its share and the fsync: no MPI, no checksum) or one numpy copy of its share
#: (no I/O); the save's own part is what it costs beyond the plain write.  And the
#: resharded ratios at half the ranks, which every core serves alike.
CONTROLS = (
    ("compute slowdown during a plain write thread", "compute during plain write",
     "compute alone"),
    ("compute slowdown during a numpy copy thread", "compute during thread copy",
     "compute alone"),
    # (bandwidth: the same-count time over the resharded one)
    ("resharded load, half the ranks, vs same-count load (bandwidth)", "collio load",
     "collio load half of N"),
    ("verified ceiling map half of N vs same count (bandwidth)", "verified ceiling map",
     "verified ceiling map half of N"),
    ("compute during async I/O vs during a plain write", "compute during I/O",
     "compute during plain write"),
    # (the plain write's loop among the others: the floor under the bound above)
    ("compute slowdown during a plain write thread among the others",
     f"compute during plain write{MIXED}", f"compute alone{MIXED}"),
    # (the ceiling written into the blocks it has, none freed or allocated: what a save
    # with free_replaced=reuse can reach)
    ("save vs ceiling overwrite (bandwidth)", "ceiling overwrite", "collio save"),
)  # fmt: skip


#: A load into new arrays that copies (reads) every piece instead of mapping the file.
COPIED = {"checkpoint_map": "disable"}

#: The compute loop's length (seconds) the bench aims at: long enough for a save's I/O to
#: be under way, short enough to end before it does (only such loops are kept).
LOOP = 0.08

#: The longest a rank done first sleeps between tests of the others being done: long
#: enough that its wake-ups take next to nothing from the cores the others work on.
WAIT = 2e-3


def _timed(comm: MPI.Intracomm, fn: Callable[[], Any]) -> float:
    """Collective over `comm`: the slowest rank's time of ``fn``; an error on some ranks
    (the resharded load fails on its sub-communicator's ranks alone) is raised on all,
    so none waits in a collective the failed ranks never reach.

    A rank done first waits sleeping (up to :data:`WAIT`): MPI's blocking wait polls, and with
    more ranks than cores a polling rank takes a core from the ranks still working; the
    resharded load's rank outside the load would then measure those ranks on one core
    less, not a job of their size (each rank's time is taken before the wait, so it is
    not in the figure)."""
    comm.Barrier()
    t0 = time.perf_counter()
    step = Attempt()
    with step:
        fn()
    mine = time.perf_counter() - t0
    vec = np.array([float(step.error is not None), mine])
    # (waking late delays the next method's barrier, no figure)
    sleep_until_done(comm.Iallreduce(MPI.IN_PLACE, [vec, MPI.DOUBLE], op=MPI.MAX), cap=WAIT)
    if vec[0]:
        raise_agreed(comm, step.error, what="collio-bench checkpoint")
    return float(vec[1])


def _on(sub: Any, fn: Callable[[], Any]) -> None:
    """``fn`` on the ranks of ``sub`` (a smaller job's; the others wait sleeping in
    :func:`_timed`)."""
    if sub != MPI.COMM_NULL:
        fn()


def _compute(x: np.ndarray[Any, Any], reps: int) -> None:
    """A job's numpy work: single-threaded element-wise passes over a cache-sized array."""
    for _ in range(reps):
        np.sqrt(x * 1.0001 + 1.0, out=x)


#: The prefix of the figures that are a background thread's CPU seconds during a loop.
CPU = "thread CPU during "
#: The prefix of the figures that are the seconds the loop's own thread spent during the
#: loop neither running nor waiting for a core (slowest rank): waiting for the GIL, which
#: a background thread of the same process held.
BLOCKED = "loop blocked during "


def _schedstat(tid: int | None) -> tuple[float, float]:
    """Seconds thread ``tid`` of this process has run and has waited for a core (Linux:
    its ``schedstat``; zeros where there is none)."""
    if tid is None:
        return 0.0, 0.0
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as fh:
            run, wait = fh.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def _thread_cpu(tid: int | None) -> float:
    """Seconds a thread of this process has run: the CPU a background thread took from
    the cores during a window."""
    return _schedstat(tid)[0]


def _thread_named(prefix: str) -> int | None:
    """The native id of this process's first thread whose name starts with ``prefix``
    (async_save's, a control's), once it runs."""
    for t in threading.enumerate():
        if t.name.startswith(prefix):
            return t.native_id
    return None


class _Run:
    def __init__(self, args: argparse.Namespace, comm: MPI.Intracomm, d: str) -> None:
        self.comm, self.d = comm, d
        self.total = parse_size(args.size or "256MiB", "--size")
        # (--hints: collio's saves and loads take them, e.g. free_replaced=commit)
        self.hints = dict(args.hints)
        self.state, self.spec = peers.model_state(self.total, comm)
        self.nbytes = int(sum(
            (v[1].global_nbytes if isinstance(v, tuple) else v.nbytes) for v in self.state.values()
        ))  # fmt: skip
        self.share = np.ones(peers.share(self.nbytes, comm)[1], np.uint8)
        self.sub: Any = comm.Split(
            0 if comm.Get_rank() < max(comm.Get_size() - 1, 1) else MPI.UNDEFINED
        )
        self.spec3 = peers.model_spec(self.total, self.sub) if self.sub != MPI.COMM_NULL else {}
        # (half the ranks: with two ranks a core, one rank fewer leaves a core with one
        # rank more than the other, whose ranks the load waits for; half keeps every core
        # as busy as the others, so the two resharded loads tell the cores' share of the
        # resharded ratio from the load's own)
        self.half: Any = comm.Split(
            0 if comm.Get_rank() < max(comm.Get_size() // 2, 1) else MPI.UNDEFINED
        )
        self.spec_half = (
            peers.model_spec(self.total, self.half) if self.half != MPI.COMM_NULL else {}
        )
        # a job's arrays already in memory (a model restored in place), every page touched
        self.into = {name: (peers.empty_piece(st, lay), lay) for name, lay, st in (
            (n, self.spec[n], self.state[n]) for n in self.spec
        )}  # fmt: skip
        self.work = np.ones(1 << 15)
        self.reps = 1
        while (t := _timed(comm, lambda: _compute(self.work, self.reps))) < LOOP / 4:
            self.reps *= 2
        # (scaled to LOOP from the median of five loops: doubling until one loop was long
        # enough left it anywhere between that length and twice it, by one noisy loop, and
        # a loop half as long meets less of the save's I/O; the same on every rank, as
        # _timed's figure is)
        t = statistics.median([t] + [_timed(comm, lambda: _compute(self.work, self.reps))
                                     for _ in range(4)])  # fmt: skip
        self.reps = max(1, round(self.reps * LOOP / t))
        self.path = os.path.join(d, "collio.ckpt")
        # (async_save replaces its own last checkpoint, as each other writer here does
        # its own output: the loads read the blocking save's)
        self.async_path = os.path.join(d, "collio-async.ckpt")
        self.turn = 0
        self.plain = os.path.join(d, "plain.bin")
        self.rounds = 0
        # (the controls' thread: one per rank, at the save thread's priority)
        self.control = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="bench-control", initializer=asyncsave._lower_priority
        )

    def methods(self) -> dict[str, Callable[[], float | dict[str, float]]]:
        c, d, st = self.comm, self.d, self.state
        fpr = os.path.join(d, "fpr")
        npd = os.path.join(d, "npsave")
        ceil = os.path.join(d, "ceiling.bin")
        for sub in (fpr, npd):
            os.makedirs(sub, exist_ok=True)
        return {
            "collio save": self._saves,
            "file-per-rank write": lambda: _timed(c, lambda: peers.per_rank_write(fpr, st, c)),
            "np.save write": lambda: _timed(c, lambda: peers.npsave_write(npd, st, c)),
            "ceiling write": lambda: _timed(
                c, lambda: peers.ceiling_write(ceil, self.share, self.nbytes, c)
            ),
            "ceiling overwrite": lambda: _timed(
                c, lambda: peers.ceiling_write(ceil, self.share, self.nbytes, c, new=False)
            ),
            "numpy copy": lambda: _timed(c, lambda: [np.copy(a) for a in peers.pieces(st, c)]),
            "checksum": self._crc,
        }

    def overlap(self) -> dict[str, Callable[[], float | dict[str, float]]]:
        """The compute loop alone, during an async save's I/O and beside a control thread,
        each after a step of the job's compute (untimed), as a job's save and its loops
        follow its own work: measured among the other methods, the loop during the I/O
        followed the blocking saves in most iterations and met what their writes left the
        kernel to do, which no job that saves in the background meets."""
        c = self.comm
        # (one control an iteration, by turns: both in every one would add a second's
        # worth of writes and fsyncs to each)
        self.rounds += 1
        control = "plain write" if self.rounds % 2 else "thread copy"
        return {
            "compute alone": self._after_step(
                lambda: _timed(c, lambda: _compute(self.work, self.reps))
            ),
            "async_save": self._after_step(self._async),
            f"compute during {control}": self._after_step(lambda: self._control(control)),
        }

    def _after_step(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        def stepped() -> Any:
            _compute(self.work, self.reps)
            return fn()

        return stepped

    def loads(self) -> dict[str, Callable[[], float]]:
        c, d, st = self.comm, self.d, self.state
        ceil = os.path.join(d, "ceiling.bin")
        return {
            "collio load": lambda: _timed(
                c, lambda: ckpt.load(self.path, self.spec, comm=c, hints=self.hints)
            ),
            "collio load copied": lambda: _timed(
                c, lambda: ckpt.load(self.path, self.spec, comm=c, hints=self.hints | COPIED)
            ),
            "collio load into": lambda: _timed(
                c, lambda: ckpt.load(self.path, self.into, comm=c, hints=self.hints)
            ),
            "collio load 3 of N": lambda: _timed(c, self._load_sub),
            "collio load half of N": lambda: _timed(c, self._load_half),
            "file-per-rank read": lambda: _timed(
                c, lambda: peers.per_rank_read(os.path.join(d, "fpr"), st, c)
            ),
            "np.load read": lambda: _timed(
                c, lambda: peers.npsave_read(os.path.join(d, "npsave"), st, c)
            ),
            "ceiling read": lambda: _timed(
                c, lambda: peers.ceiling_read(ceil, self.share, self.nbytes, c)
            ),
            "ceiling read + checksum": lambda: _timed(
                c, lambda: peers.ceiling_read_crc(ceil, self.share, self.nbytes, c)
            ),
            "ceiling read + checksum by chunk": lambda: _timed(
                c, lambda: peers.ceiling_read_crc(ceil, self.share, self.nbytes, c, CHUNK)
            ),
            "verified ceiling map": lambda: _timed(
                c, lambda: peers.ceiling_map(ceil, self.nbytes, c)
            ),
            "verified ceiling map 3 of N": lambda: _timed(
                c, lambda: self._sub(lambda: peers.ceiling_map(ceil, self.nbytes, self.sub))
            ),
            "verified ceiling map half of N": lambda: _timed(
                c, lambda: _on(self.half, lambda: peers.ceiling_map(ceil, self.nbytes, self.half))
            ),
            "ceiling read new": lambda: _timed(
                c,
                lambda: peers.ceiling_read(
                    ceil, [np.empty_like(a) for a in peers.pieces(st, c)], self.nbytes, c
                ),
            ),
        }

    def _saves(self) -> dict[str, float]:
        """The save, and the same save without checksums right before or after it, by
        turns: whichever runs second follows a save's writes, the first whatever method
        came before (a fixed order measured that, not the checksums)."""
        c, st = self.comm, self.state
        self.turn += 1
        got = {}
        for name in ("collio save", "collio save unchecked")[:: 1 if self.turn % 2 else -1]:
            fn = self._unchecked if name.endswith("unchecked") else (
                lambda: ckpt.save(self.path, st, comm=c, hints=self.hints))  # fmt: skip
            got[name] = _timed(c, fn)
        return got

    def _unchecked(self) -> None:
        """:func:`~collio.checkpoint.save` without its checksums, to a file of its own (one
        no load would pass: the loads read the checked save's)."""
        writer.CHECKSUMS = False
        try:
            ckpt.save(self.path + ".unchecked", self.state, comm=self.comm, hints=self.hints)
        finally:
            writer.CHECKSUMS = True

    def _load_sub(self) -> None:
        self._sub(lambda: ckpt.load(self.path, self.spec3, comm=self.sub, hints=self.hints))

    def _load_half(self) -> None:
        _on(
            self.half,
            lambda: ckpt.load(self.path, self.spec_half, comm=self.half, hints=self.hints),
        )

    def _sub(self, fn: Callable[[], Any]) -> None:
        """``fn`` on the ranks of the job one rank smaller (the others wait sleeping)."""
        _on(self.sub, fn)

    def _crc(self) -> float:
        """The save's checksum of every piece of this rank, one library call each."""
        fn = writer.algo().fn
        arrs = peers.pieces(self.state, self.comm)
        return _timed(self.comm, lambda: [fn(a.data) for a in arrs])

    def _async(self) -> dict[str, float]:
        c = self.comm
        c.Barrier()
        t0 = time.perf_counter()
        h = ckpt.async_save(self.async_path, self.state, comm=c, hints=self.hints)
        ret = time.perf_counter() - t0
        # (the loops start together, once every rank's save runs in the background, as
        # "compute alone" and the controls' loops start after a barrier: a rank's loop
        # started at its own return would also meet the other ranks still copying their
        # state, which the return's figure counts, not the background I/O's; the ranks
        # wait sleeping, as in :func:`_timed`, not taking cores from ranks still copying)
        quiet_barrier(c, cap=WAIT)
        during, cpu, busy, blocked = self._loop_beside(_thread_named("collio-ckpt"), h.done)
        h.wait()
        total = time.perf_counter() - t0
        mx = np.array([ret, during, total, blocked])
        c.Allreduce(MPI.IN_PLACE, mx, op=MPI.MAX)
        out = {"async_save return": mx[0], "async_save total": mx[2]}
        if c.allreduce(busy, op=MPI.LAND):  # the loop ran while the I/O did, on every rank
            out["compute during I/O"] = mx[1]
            out[f"{CPU}I/O"] = c.allreduce(cpu)
            out[f"{BLOCKED}I/O"] = mx[3]
        return out

    def _loop_beside(
        self, tid: int | None, done: Callable[[], bool]
    ) -> tuple[float, float, bool, float]:
        """The compute loop's seconds while thread ``tid`` works, the CPU that thread
        took meanwhile, whether its job (``done``) was still running after the loop, and
        the seconds of the loop this thread was blocked (neither running nor waiting for
        a core: the numpy loop's only wait is for the GIL)."""
        cpu = _thread_cpu(tid)
        me = threading.get_native_id()
        run, wait = _schedstat(me)
        t1 = time.perf_counter()
        _compute(self.work, self.reps)
        during = time.perf_counter() - t1
        run2, wait2 = _schedstat(me)
        blocked = max(0.0, during - (run2 - run) - (wait2 - wait)) if run2 else 0.0
        return during, _thread_cpu(tid) - cpu, not done(), blocked

    def _control(self, what: str) -> dict[str, float]:
        c = self.comm
        if what == "plain write":
            return self._beside(
                what,
                lambda: peers.plain_write(self.plain, self.share, self.nbytes, c.rank, c.size),
                self._empty_plain,
            )
        return self._beside(what, lambda: np.copy(self.share))

    def _empty_plain(self) -> None:
        """Rank 0 makes the plain write's file empty, as a save writes a new one."""
        if self.comm.Get_rank() == 0:
            os.close(os.open(self.plain, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))

    def _beside(
        self, what: str, job: Callable[[], Any], before: Callable[[], None] | None = None
    ) -> dict[str, float]:
        """The compute loop while this rank's control thread runs ``job`` (kept where the
        job outlasted the loop on every rank, as the save's is), and the CPU the thread
        took meanwhile, summed over the ranks."""
        c = self.comm
        if before is not None:
            before()
        c.Barrier()
        fut = self.control.submit(job)
        during, cpu, busy, blocked = self._loop_beside(_thread_named("bench-control"), fut.done)
        step = Attempt()
        with step:
            fut.result()
        # (one gather of every rank's error, loop, thread CPU, whether its job outlasted
        # the loop and the loop's blocked time, waited for sleeping as :func:`_timed` waits)
        mine = np.array([float(step.error is not None), during, cpu, float(busy), blocked])
        every = np.empty((c.Get_size(), 5))
        sleep_until_done(c.Iallgather([mine, MPI.DOUBLE], [every, MPI.DOUBLE]), cap=WAIT)
        if every[:, 0].any():
            raise_agreed(c, step.error, what="collio-bench checkpoint")
        if not every[:, 3].all():
            return {}
        return {
            f"compute during {what}": float(every[:, 1].max()),
            f"{CPU}{what}": float(every[:, 2].sum()),
            f"{BLOCKED}{what}": float(every[:, 4].max()),
        }


def _rotate(names: list[str], k: int) -> list[str]:
    k %= max(len(names), 1)
    return names[k:] + names[:k]


def _permute(names: list[str], k: int) -> list[str]:
    """Every order of ``names`` by turns: over each run of as many iterations as there
    are orders (six for three names), each name follows each other one (and the group
    before) equally often, so none is measured after another's I/O more often than the
    others are (a rotation of three puts the same one after the async save in two
    iterations of three); over fewer iterations, nearly so."""
    orders = list(itertools.permutations(names))
    return list(orders[k % len(orders)])


def run_checkpoint(args: argparse.Namespace) -> int:
    """Collective over ``MPI.COMM_WORLD``: the benchmark; rank 0 prints and writes."""
    comm = MPI.COMM_WORLD
    root = comm.Get_rank() == 0
    step, made = Attempt(), None
    if root:
        with step:  # (a -o that names no directory: raised on every rank, none left waiting)
            made = tempfile.mkdtemp(prefix="collio-ckpt-bench-", dir=args.test_file)
    d = bcast_outcome(comm, made, step.error, what="collio-bench checkpoint")
    try:
        run = _Run(args, comm, d)
        times: dict[str, list[float]] = {}
        iters = args.iterations or 5
        if root:
            n = len(run.state)
            print(f"checkpoint: {n} arrays, {run.nbytes / MiB:.1f} MiB, {comm.Get_size()} ranks, "
                  f"{iters} iterations", flush=True)  # fmt: skip

        # (first the job alone: its compute and its saves in the background, as a job
        # runs between its checkpoints; then every method, the same loops among them,
        # their figures named apart)
        def alone() -> list[tuple[Any, Any, str]]:
            return [(run.overlap(), _permute, "")]

        def mixed() -> list[tuple[Any, Any, str]]:
            return [(run.methods(), _rotate, ""), (run.loads(), _rotate, ""),
                    (run.overlap(), _permute, MIXED)]  # fmt: skip

        for groups, what in ((alone, "the job's compute and async saves"),
                             (mixed, "every method")):  # fmt: skip
            for it in range(iters):
                for group, order, suffix in groups():
                    for name in order(list(group), it):
                        got = group[name]()
                        for k, v in got.items() if isinstance(got, dict) else [(name, got)]:
                            times.setdefault(k + suffix, []).append(float(v))
                if root:
                    line = ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items())
                    print(f"iteration {it + 1}/{iters}, {what}: {line}", flush=True)
        if root:
            _report(args, run, times)
    finally:
        comm.Barrier()
        if root:
            shutil.rmtree(d, ignore_errors=True)
    return 0


def _controls(med: dict[str, float]) -> list[dict[str, Any]]:
    """Print and return the controls' ratios (:data:`CONTROLS`) and the CPU each loop's
    background threads took during it, summed over the ranks, against the CPU the loop's
    time gave the job's cores."""
    out: list[dict[str, Any]] = []
    print("\ncontrols (no targets):")
    for what, num, den in CONTROLS:
        if num in med and den in med:
            out.append({"control": what, "ratio": med[num] / med[den]})
            print(f"  {what:<48} {med[num] / med[den]:6.3f}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for what in ("I/O", "plain write", "thread copy"):
        cpu, loop = med.get(f"{CPU}{what}"), med.get(f"compute during {what}")
        if cpu is None or loop is None:
            continue
        share = cpu / (loop * (cores or 1))
        out.append({"control": f"{CPU}{what}", "seconds": cpu, "of_cores": share})
        print(f"  {CPU + what:<48} {cpu * 1e3:6.1f} ms, {share:.1%} of the cores in the loop")
    for what in ("I/O", "plain write", "thread copy"):
        held, loop = med.get(f"{BLOCKED}{what}"), med.get(f"compute during {what}")
        if held is None or loop is None:
            continue
        out.append({"control": f"{BLOCKED}{what}", "seconds": held, "of_loop": held / loop})
        print(f"  {BLOCKED + what:<48} {held * 1e3:6.1f} ms, {held / loop:.1%} of the loop")
    return out


def _report(args: argparse.Namespace, run: _Run, times: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    verified = [med[k] for k in ("ceiling read + checksum", "ceiling read + checksum by chunk")
                if k in med]  # fmt: skip
    if verified:  # (the faster way of the two: the bound a verified load could reach)
        med["verified ceiling read"] = min(verified)
    rows = []
    for name, ts in times.items():
        if name.startswith((CPU, BLOCKED)):  # (seconds in a loop, not a method's: controls)
            continue
        op = "read" if ("read" in name or "load" in name) else "write"
        bw = [run.nbytes / MiB / t for t in ts]
        rows.append({"op": op, "api": name, "median": statistics.median(bw), "min": min(bw),
                     "max": max(bw), "median_time": med[name], "iterations": len(ts)})  # fmt: skip
    print("\nmedian seconds (MiB/s of the whole state):")
    for r in rows:
        print(f"  {r['api']:<22} {r['median_time']:8.4f} s {r['median']:10.1f} MiB/s")
    targets = []
    for issue in (True, False):
        print("\nthe issue's targets:" if issue else "\nstricter bounds (not the issue's):")
        for what, num, den, bound, at_least, theirs in TARGETS:
            if theirs != issue or num not in med or den not in med:
                continue
            ratio = med[num] / med[den]
            ok = ratio >= bound if at_least else ratio <= bound
            targets.append({"target": what, "ratio": ratio, "bound": bound,
                            "at_least": at_least, "met": ok, "issue": issue})  # fmt: skip
            rel = ">=" if at_least else "<="
            print(f"  {what:<48} {ratio:6.3f} ({rel} {bound}) {'met' if ok else 'MISSED'}")
    controls = _controls(med)
    if args.json:
        from .machine import command, describe
        from .report import write_json

        write_json(args.json, {
            "pattern": "checkpoint", "bytes": run.nbytes, "arrays": len(run.state),
            "nranks": run.comm.Get_size(), "times": times, "summary": rows, "targets": targets,
            "controls": controls, "command": command(), "machine": describe(run.d),
        })  # fmt: skip
    if args.plot:
        from .report import plot

        plot(
            args.plot,
            rows,
            f"checkpoint of {run.nbytes / MiB:.0f} MiB, {run.comm.Get_size()} ranks",
        )
