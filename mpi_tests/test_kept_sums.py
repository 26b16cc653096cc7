"""A repeated two-phase call's completion: the kept sums, and the sums again when any rank's
counters change.

A call that reuses a kept plan agrees on its error and maxima with MPI's own MAX, and takes
the sums of the last call of its name when every rank's counters repeat that call's
(``collio.completion``); a rank whose counters differ makes every rank sum them again.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import raises_everywhere

import collio
from collio.completion import complete_call
from collio.context import Call
from collio.errors import BackendError
from collio.layouts import Subarray
from collio.policy import Path
from collio.stats import Stats

ROWS, COLS = 16, 8  # float64 per rank per step: 16 runs of 64 bytes, interleaved


def _step(comm, k):
    """Rank r's columns of step k, and its data (every element its global index + 1)."""
    p, r = comm.size, comm.rank
    shape = (ROWS, COLS * p)
    lay = Subarray(shape, (0, r * COLS), (ROWS, COLS), "<f8", offset=k * ROWS * COLS * p * 8)
    glob_ = np.arange(ROWS * COLS * p, dtype=np.float64).reshape(shape) + 1 + k * ROWS * COLS * p
    return lay, np.ascontiguousarray(glob_[:, r * COLS : (r + 1) * COLS])


@pytest.mark.mpi
def test_a_strided_series_counts_every_call_and_writes_every_byte(comm, mpi_tmp_path):
    """Ten steps through kept plans: the statistics grow by one step's bytes and runs per
    call (the kept sums are those of a call like it), and the file holds every step."""
    path, p, steps = str(mpi_tmp_path / "series.bin"), comm.size, 10
    step_bytes = ROWS * COLS * p * 8
    with collio.open(path, "w", comm=comm, hints={"cb_min_domain": 0}) as f:
        for k in range(steps):
            f.write_all(*reversed(_step(comm, k)))
            last = f.stats.last_call
            assert f.stats.bytes_written == (k + 1) * step_bytes, (k, f.stats.bytes_written)
            assert last["runs"] == ROWS * p or p == 1, last
            if k >= 2 and p > 1:
                assert last["path"] == "two-phase" and last["plan_reused"], last
        for k in range(steps):
            lay, want = _step(comm, k)
            np.testing.assert_array_equal(f.read_all(lay), want)
    comm.Barrier()
    got = np.fromfile(path, "<f8")
    assert np.array_equal(got, np.arange(steps * ROWS * COLS * p, dtype=np.float64) + 1)


def _complete(f, nbytes, *, reused, error=None):
    """One completion on the file's context of a call that wrote ``nbytes`` in one request
    on this rank; returns what the file's bytes_written grew by."""
    ctx = f._ctx
    call = Call(0, 1, Path.TWO_PHASE, Stats(), name="write_all")
    call.reused = reused
    call.counters.add_writes([nbytes])
    before = ctx.stats.bytes_written
    complete_call(ctx, call, time.perf_counter(), error, "backend I/O")
    return ctx.stats.bytes_written - before


@pytest.mark.mpi
def test_kept_sums_only_when_every_rank_repeats_its_counters(comm, mpi_tmp_path):
    p, r, last = comm.size, comm.rank, comm.size - 1
    base = sum(10 + k for k in range(p))
    with collio.open(str(mpi_tmp_path / "sums.bin"), "w", comm=comm) as f:
        assert _complete(f, 10 + r, reused=False) == base  # (summed: nothing kept yet)
        assert _complete(f, 10 + r, reused=True) == base  # (every rank repeats: kept sums)
        assert _complete(f, 10 + r, reused=True) == base
        # one rank's counters change: every rank sums them again, and keeps the new ones
        assert _complete(f, 10 + r + (r == last) * 5, reused=True) == base + 5
        assert _complete(f, 10 + r + (r == last) * 5, reused=True) == base + 5
        # back, on one rank only: its counters differ from the kept ones again
        assert _complete(f, 10 + r, reused=True) == base
        assert f.stats.write_ops == 6 * p
        # a rank's error is every rank's, through the kept call's agreement too
        error = OSError(5, "injected") if r == last else None
        raises_everywhere(
            comm, BackendError, lambda: _complete(f, 10 + r, reused=True, error=error),
            match="injected",
        )  # fmt: skip
        assert f.stats.write_ops == 6 * p  # (the failed call added nothing)
        assert _complete(f, 10 + r, reused=True) == base
