"""Threads in calls at once, each on a communicator of its own (as the README says threads
doing I/O must be): what collio keeps across calls and files in the process is shared
by them, and neither thread's call may fail, hang or move the other's bytes for it.

The interpreter switches threads every few microseconds here (``sys.setswitchinterval``),
so that a thread is as likely to stop inside a kept structure's update as between two.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

import collio
from collio import layouts
from collio.plancache import PlanCache, clear_all
from collio.stats import BUCKET_NAMES, SUMS, Stats


@pytest.fixture
def shared_dir(mpi_tmp_path):
    """A directory every rank sees (pytest-mpi's, rank 0's tmp_path), as a str."""
    return str(mpi_tmp_path)


@pytest.fixture
def often():
    """Threads switched every 5 microseconds for the test."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(5e-6)
    yield
    sys.setswitchinterval(before)


def _in_threads(*works):
    """Run each of ``works`` on a thread of its own; the errors they raised."""
    errors: list[BaseException] = []

    def run(work):
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(w,), name=f"work{k}") for k, w in enumerate(works)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert not any(t.is_alive() for t in threads), "a thread's call hangs"
    return errors


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_threads_checking_new_subarray_shapes_at_once_raise_nothing(comm, shared_dir, often):
    """Two threads write and read Subarrays of a new shape at every call (more shapes
    than the checks of single calls keep): each keeps its layout's checks in the one
    dict of the process and drops the oldest, while the other counts the runs it
    holds.  Unguarded, that count failed with "dictionary changed size during
    iteration" in either thread's call."""
    cols, calls, most = 8, 1200, 24
    step = most * cols * comm.size * 8
    comms = [comm.Dup(), comm.Dup()]

    def lay(i):
        rows = 1 + i % most
        return layouts.Subarray((rows, cols * comm.size), (0, comm.rank * cols), (rows, cols),
                                "<f8", offset=i * step)  # fmt: skip

    def value(tag, i):
        return float(tag * 1000000 + i * 10 + comm.rank)

    bad: list[tuple[int, int]] = []

    def work(tag, c):
        path = os.path.join(shared_dir, f"thread{tag}.bin")
        with collio.open(path, "w", comm=c) as f:
            for i in range(calls):
                f.write_all(np.full(lay(i).shape, value(tag, i)), lay(i))
        with collio.open(path, "r", comm=c) as f:
            for i in range(calls):
                if not (f.read_all(lay(i)) == value(tag, i)).all():
                    bad.append((tag, i))

    try:
        errors = _in_threads(lambda: work(1, comms[0]), lambda: work(2, comms[1]))
    finally:
        for c in comms:
            c.Free()
    assert errors == [] and bad == []
    comm.Barrier()
    for tag in (1, 2):
        stored = np.fromfile(os.path.join(shared_dir, f"thread{tag}.bin"), "<f8")
        want = np.zeros(len(stored))
        for i in range(calls):
            rows = 1 + i % most
            block = np.full((rows, comm.size, cols), float(tag * 1000000 + i * 10))
            block += np.arange(comm.size)[None, :, None]
            start = i * step // 8
            want[start : start + block.size] = block.reshape(-1)
        assert len(stored) == (calls - 1) * step // 8 + most * cols * comm.size
        assert np.array_equal(stored, want), tag


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_release_buffers_beside_calls_on_another_thread_keeps_them_going(comm, shared_dir):
    """One thread writes and reads three variables' time series through the aggregators
    (each call agrees on a kept plan, then takes it from the cache) while another calls
    release_buffers every few milliseconds.  Cleared between the agreement and the take
    on one rank, that rank planned anew while the others went on with the kept plan,
    and the call hung; now a cache in a call is cleared when the call ends."""
    rows, cols, steps, nvars = 16, 64, 150, 3
    hints = {"romio_cb_write": "enable", "romio_cb_read": "enable",
             "mapped_reads": "disable", "cb_buffer_size": 16384}  # fmt: skip
    step = rows * cols * comm.size * 8
    path = os.path.join(shared_dir, "series.bin")
    done = threading.Event()
    bad: list[int] = []
    released = [0]

    def lay(k):
        return layouts.Subarray((rows, cols * comm.size), (0, comm.rank * cols), (rows, cols),
                                "<f8", offset=k * step)  # fmt: skip

    def value(k):
        return float(k * 10 + comm.rank)

    def series(c):
        try:
            with collio.open(path, "w", comm=c, hints=hints) as f:
                for k in range(steps * nvars):  # (step k // nvars, variable k % nvars)
                    f.write_all(np.full((rows, cols), value(k)), lay(k))
            with collio.open(path, "r", comm=c, hints=hints) as f:
                for k in range(steps * nvars):
                    if not (f.read_all(lay(k)) == value(k)).all():
                        bad.append(k)
        finally:
            done.set()

    def release():
        while not done.is_set():
            collio.release_buffers()
            released[0] += 1
            time.sleep(0.005)

    c = comm.Dup()
    try:
        errors = _in_threads(lambda: series(c), release)
    finally:
        c.Free()
    assert errors == [] and bad == [] and released[0] > 0
    comm.Barrier()
    stored = np.fromfile(path, "<f8").reshape(steps * nvars, rows, comm.size, cols)
    want = np.arange(steps * nvars, dtype=np.float64)[:, None, None, None] * 10
    want = want + np.arange(comm.size)[None, None, :, None] + np.zeros(stored.shape)
    assert np.array_equal(stored, want)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_release_buffers_clears_the_plans_of_communicators_not_in_a_call(comm, shared_dir):
    """A cache in no call is cleared at once (only one in a call waits for its end)."""
    lay = layouts.Subarray((8, 8 * comm.size), (0, comm.rank * 8), (8, 8), "<f8")
    hints = {"romio_cb_write": "enable", "cb_buffer_size": 4096}
    with collio.open(os.path.join(shared_dir, "kept.bin"), "w", comm=comm, hints=hints) as f:
        f.write_all(np.ones((8, 8)), lay)
        plans = f._ctx.plans
        assert plans is not None and plans.entries
        collio.release_buffers()
        assert plans.entries == []


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_plan_caches_made_while_another_thread_clears_them_raise_nothing(often):
    """A thread opening files on new communicators makes plan caches while another
    clears every cache (release_buffers): unguarded, the set of caches changed size
    while being listed."""
    stop = threading.Event()

    def make():
        kept: list[PlanCache] = []
        while not stop.is_set():
            kept.append(PlanCache())
            if len(kept) > 50:
                kept.clear()

    def clear():
        try:
            for _ in range(20000):
                clear_all()
        finally:
            stop.set()

    assert _in_threads(make, clear) == []


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_kept_sums_of_two_threads_at_once_raise_nothing(often):
    """Two threads' calls keep their sums to add again (Stats.again), each sums' adder
    made once and the oldest dropped past 256 of them: both dropping the same oldest
    one raised KeyError in one of the calls."""
    n = len(SUMS) + 2 * len(BUCKET_NAMES)

    def keep(base):
        for i in range(20000):
            sums = np.zeros(n, np.int64)
            sums[0] = base + i
            assert Stats.again(sums).moved == ((SUMS[0], base + i),)

    assert _in_threads(lambda: keep(1), lambda: keep(10**7)) == []
