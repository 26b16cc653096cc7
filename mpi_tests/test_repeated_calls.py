"""A call that repeats the previous one's shape after many equal calls, but for one thing.

A time series of small calls reuses what its local checks derived last time (the view's
runs moved to the new offset, the agreed extents moved alike); one rank changing one
thing (its size, an offset overlapping another rank's, a bad buffer, the dtype of an
array layout) must still be seen: every rank raises the same error, or, where the change
is legal, the call goes the path it needs; either way the file holds what numpy says.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_everywhere, read_file

import collio
from collio import layouts

pytestmark = pytest.mark.mpi(min_size=1)
N = 4096  # bytes per rank per call
STEPS = 40  # equal calls before the changed one


def _data(step, rank, n=N):
    return np.random.default_rng(1000 * step + rank).integers(0, 256, n, np.uint8)


def _series(f, comm, want, steps=STEPS):
    """``steps`` equal calls: rank r's N bytes at step s at ``(s*p + r) * N``."""
    p, r = comm.size, comm.rank
    for s in range(steps):
        f.write_at_all((s * p + r) * N, _data(s, r))
        for q in range(p):
            at = (s * p + q) * N
            want[at : at + N] = _data(s, q)
    assert f.stats.last_call["path"] == "direct"


def _check_file(comm, path, want):
    comm.Barrier()
    got = np.frombuffer(read_file(path), np.uint8)
    np.testing.assert_array_equal(got[: len(want)], want)
    assert not got[len(want) :].any()


@pytest.mark.mpi
def test_one_rank_writes_more_after_many_equal_calls(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "more.bin")
    p, r = comm.size, comm.rank
    want = np.zeros((STEPS + 3) * p * N, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        _series(f, comm, want)
        # the last rank writes 3N bytes at the end: nobody else's bytes, legal
        at = (STEPS * p + r) * N if r < p - 1 else (STEPS * p + p - 1) * N
        n = 3 * N if r == p - 1 else N
        f.write_at_all(at, _data(STEPS, r, n))
        every = comm.allgather((at, n))
        for q, (a, m) in enumerate(every):
            want[a : a + m] = _data(STEPS, q, m)
        assert f.stats.last_call["extent"][1] == max(a + m for a, m in every)
        # and back to the series, the stats telling the truth each call
        _series(f, comm, want, steps=3)
        back = np.empty(N, np.uint8)
        f.read_at_all((2 * p + r) * N, back)
        np.testing.assert_array_equal(back, _data(2, r))
    _check_file(comm, path, want[: (STEPS * p + p + 2) * N])


@pytest.mark.mpi(min_size=2)
def test_one_rank_overlaps_another_after_many_equal_calls(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "overlap.bin")
    p, r = comm.size, comm.rank
    want = np.zeros(STEPS * p * N, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        _series(f, comm, want)
        # the last rank's next step lands half on rank 0's: one OverlapError everywhere
        at = (STEPS * p + r) * N if r < p - 1 else STEPS * p * N + N // 2
        raises_everywhere(
            comm, collio.OverlapError, lambda: f.write_at_all(at, _data(STEPS, r)),
            match="written by ranks",
        )  # fmt: skip
        assert f.stats.last_call["path"] == "direct"  # (the failed call left no record)
        # the same series goes on; the failed call wrote nothing
        _series(f, comm, want, steps=2)
    _check_file(comm, path, want)


@pytest.mark.mpi
def test_bad_buffer_on_one_rank_after_many_equal_calls(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "bad.bin")
    p, r = comm.size, comm.rank
    want = np.zeros(STEPS * p * N, np.uint8)
    bad = comm.size - 1
    with collio.open(path, "w", comm=comm) as f:
        _series(f, comm, want)
        buf = _data(STEPS, r, 2 * N)
        buf = buf[::2] if r == bad else buf[:N]  # strided memory on one rank
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_at_all((STEPS * p + r) * N, buf),
            match=f"rank {bad}: buffer must be contiguous",
        )  # fmt: skip
        # a read into a read-only buffer on one rank, after equal reads
        out = np.empty(N, np.uint8)
        for s in range(5):
            f.read_at_all((s * p + r) * N, out)
            np.testing.assert_array_equal(out, _data(s, r))
        ro = np.empty(N, np.uint8)
        ro.flags.writeable = r != bad
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.read_at_all(r * N, ro),
            match=f"read_at_all: rank {bad}: the buffer to read into is read-only",
        )  # fmt: skip
    _check_file(comm, path, want)


@pytest.mark.mpi
def test_other_dtype_on_one_rank_after_many_equal_calls(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "dtype.bin")
    p, r = comm.size, comm.rank
    rows = 8
    want = np.zeros((STEPS, p * rows), "<f8")
    bad = comm.size - 1
    with collio.open(path, "w", comm=comm) as f:
        for s in range(STEPS):  # a time series of one float64 row block per rank
            lay = layouts.Subarray((STEPS, p * rows), (s, r * rows), (1, rows), "<f8")
            f.write_all(np.full((1, rows), s + r / 10, "<f8"), lay)
            want[s] = np.repeat(s + np.arange(p) / 10, rows)
        lay = layouts.Subarray((STEPS, p * rows), (0, r * rows), (1, rows), "<f8")
        data = np.full((1, rows), -1.0, "<f4" if r == bad else "<f8")
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_all(data, lay),
            match=f"rank {bad}: data dtype float32 does not match layout dtype float64",
        )  # fmt: skip
        if p > 1:  # one rank's layout of another dtype: a mismatch of the global array
            other = layouts.Subarray(
                (STEPS, p * rows), (0, r * rows), (1, rows), "<f4" if r == bad else "<f8"
            )
            data = np.full((1, rows), -1.0, other.dtype)
            err = raises_everywhere(comm, collio.MismatchError, lambda: f.write_all(data, other))
            assert bad in err.ranks
    _check_rows(comm, path, want)


def _check_rows(comm, path, want):
    comm.Barrier()
    got = np.frombuffer(read_file(path), "<f8")
    np.testing.assert_array_equal(got, want.reshape(-1))
