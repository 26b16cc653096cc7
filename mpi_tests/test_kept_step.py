"""The kept lane's step: a time series' repeats finished after their head without the
general way (:class:`collio.keptcall.Step`), with the bytes, errors and statistics of
the general way."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import column_step, raises_everywhere, read_file

import collio
import collio.keptcall
from collio.layouts import Subarray
from collio.testing.romio import romio_write

pytestmark = pytest.mark.mpi(min_size=1)
ROWS, COLS = 16, 32  # float64 per rank per step: ROWS runs of COLS * 8 bytes (small runs)
HINTS = {
    "default": None,  # (one aggregator on one node: the strided series' own way)
    "enable": {"romio_cb_write": "enable"},  # (through the aggregator at one rank too)
    "aggregators": {"romio_cb_write": "enable", "cb_config_list": "*:*"},
}
#: Statistics that are times (the step's and the general way's differ; nothing else may),
#: and the backend's description (its path)
NOT_COUNTED = {"time_plan", "time_exchange", "time_io", "time_total", "backend"}


def _step(comm, s, *, turn=0):
    return column_step(comm, s, ROWS, COLS, turn=turn)


@pytest.fixture
def finished(monkeypatch):
    """How many calls this rank's step finished (``Step._complete``)."""
    made = [0]
    complete = collio.keptcall.Step._complete

    def counted(self, *args, **kwargs):
        made[0] += 1
        return complete(self, *args, **kwargs)

    monkeypatch.setattr(collio.keptcall.Step, "_complete", counted)
    return made


def _series(comm, path, hints, steps, *, calls_between=None):
    """Write ``steps`` steps; the statistics after each call and at the end."""
    last = []
    collio.release_buffers()  # (no plan kept from an earlier series)
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        for s in range(steps):
            piece, lay, _ = _step(comm, s)
            f.write_all(piece, lay)
            last.append(f.stats.last_call)
            if calls_between is not None:
                calls_between(f, s)
        st = f.stats.as_dict()
    return last, {k: v for k, v in st.items() if k not in NOT_COUNTED}


@pytest.mark.parametrize("hints", list(HINTS))
def test_a_series_is_finished_by_the_step_with_the_general_ways_bytes_and_statistics(
    comm, mpi_tmp_path, finished, monkeypatch, hints
):
    """From its third call (the first takes the general way, the second the lane up to
    its head) a series' steps are finished by the step on every rank; the file holds
    numpy's and ROMIO's bytes, and every call's ``last_call`` and the file's statistics
    but times are those of the same series with no step.  (At one rank a piece is one
    run, and without the hint the path asks whether the ranks' runs overlap, an
    allgather in every call: no step is made there.)"""
    steps = 9
    path, theirs = str(mpi_tmp_path / "step.bin"), str(mpi_tmp_path / "romio.bin")
    last, st = _series(comm, path, HINTS[hints], steps)
    for s in range(steps):
        piece, lay, _ = _step(comm, s)
        romio_write(theirs, piece, lay, comm)
    taken = 0 if hints == "default" and comm.size == 1 else steps - 2
    assert comm.allgather(finished[0]) == [taken] * comm.size
    want = b"".join(_step(comm, s)[2] for s in range(steps))
    comm.Barrier()
    assert read_file(path) == want
    assert read_file(theirs) == want
    comm.Barrier()
    monkeypatch.setattr(collio.keptcall.Step, "made", staticmethod(lambda *a: None))
    plain = str(mpi_tmp_path / "plain.bin")
    last_plain, st_plain = _series(comm, plain, HINTS[hints], steps)
    assert finished[0] == taken  # (none more: no step was made)
    assert last == last_plain
    assert st == st_plain
    comm.Barrier()
    assert read_file(plain) == want


def test_a_rank_without_the_step_meets_the_ranks_that_take_it(
    comm, mpi_tmp_path, finished, monkeypatch
):
    """The last rank never makes a step: it goes the general way from every head while
    the others finish the same calls by theirs, in the same messages and agreements;
    nothing hangs and the file holds numpy's bytes."""
    steps = 8
    if comm.rank == comm.size - 1:
        monkeypatch.setattr(collio.keptcall.Step, "made", staticmethod(lambda *a: None))
    path = str(mpi_tmp_path / "mixed.bin")
    last, _ = _series(comm, path, HINTS["enable"], steps)
    want = [steps - 2] * (comm.size - 1) + [0]
    assert comm.allgather(finished[0]) == want
    assert all(c["plan_reused"] and c["path"] == "two-phase" for c in last[1:])
    comm.Barrier()
    assert read_file(path) == b"".join(_step(comm, s)[2] for s in range(steps))


def test_a_write_that_fails_in_the_step_fails_every_rank_and_the_series_goes_on(
    comm, mpi_tmp_path, finished, monkeypatch
):
    """At step 5 the aggregator's write of its window fails (EIO): every rank raises
    the same error naming rank 0, and the series goes on, its steps finished by the step
    still; every other step's bytes are numpy's."""
    steps, bad = 9, 5
    path = str(mpi_tmp_path / "failing.bin")
    real = os.pwrite

    def failing(fd, data, offset):
        raise OSError(5, "Input/output error")

    with collio.open(path, "w", comm=comm, hints=HINTS["enable"]) as f:
        for s in range(steps):
            piece, lay, _ = _step(comm, s)
            if s != bad:
                f.write_all(piece, lay)
                continue
            before = finished[0]
            if comm.rank == 0:  # (rank 0 aggregates)
                monkeypatch.setattr(os, "pwrite", failing)
            try:
                err = raises_everywhere(
                    comm, collio.CollioError, lambda p=piece, x=lay: f.write_all(p, x)
                )
            finally:
                monkeypatch.setattr(os, "pwrite", real)
            assert err.ranks == (0,) and "backend I/O: rank 0:" in str(err), str(err)
            assert finished[0] == before + 1  # (the failing call was the step's)
        assert f.stats.last_call["plan_reused"]
    # (the failed call was one of the step's, and so is every call after it)
    assert comm.allgather(finished[0]) == [steps - 2] * comm.size
    got = read_file(path)
    step = len(_step(comm, 0)[2])
    for s in range(steps):
        if s != bad:
            assert got[s * step : (s + 1) * step] == _step(comm, s)[2], s


def test_other_calls_between_steps_send_the_series_the_general_way_and_back(
    comm, mpi_tmp_path, finished, monkeypatch
):
    """A read of the last step after every third step, and a write of another layout
    after step 4: the calls after them go the general way and the step takes the series
    up again; every read returns the step's piece, the file holds numpy's bytes, and the
    statistics are those of the same calls with no step (the other layout's counters are
    not the series' kept ones)."""
    steps = 12
    other = Subarray((4, 4 * comm.size), (0, 4 * comm.rank), (4, 4), "<f8", offset=10**7)
    seen = []

    def between(f, s):
        if s % 3 == 2:
            piece, lay, _ = _step(comm, s)
            seen.append(np.array_equal(f.read_all(lay), piece))
        if s == 4:
            f.write_all(np.full((4, 4), float(comm.rank)), other)

    path = str(mpi_tmp_path / "between.bin")
    last, st = _series(comm, path, HINTS["enable"], steps, calls_between=between)
    assert all(seen) and len(seen) == steps // 3
    done = comm.allgather(finished[0])
    assert done == [done[0]] * comm.size and 0 < done[0] < steps - 2, done
    comm.Barrier()
    got = read_file(path)
    want = b"".join(_step(comm, s)[2] for s in range(steps))
    assert got[: len(want)] == want
    glob = np.repeat(np.arange(comm.size, dtype=np.float64), 4)[None, :].repeat(4, axis=0)
    assert got[10**7 : 10**7 + glob.nbytes] == glob.tobytes()
    comm.Barrier()
    monkeypatch.setattr(collio.keptcall.Step, "made", staticmethod(lambda *a: None))
    plain = str(mpi_tmp_path / "between_plain.bin")
    assert _series(comm, plain, HINTS["enable"], steps, calls_between=between) == (last, st)


def test_counters_the_backend_counted_otherwise_are_summed_on_every_rank(
    comm, mpi_tmp_path, finished, monkeypatch
):
    """At step 5 rank 0's backend reports an early flush that the step's first call did
    not make: that call's counters are not the kept ones, so the ranks sum them (a second
    allreduce) and every rank's statistics count that one flush; the next steps add the
    kept sums again."""
    steps, odd = 8, 5
    path = str(mpi_tmp_path / "counted.bin")
    with collio.open(path, "w", comm=comm, hints=HINTS["enable"]) as f:
        for s in range(steps):
            piece, lay, _ = _step(comm, s)
            if s == odd and comm.rank == 0:
                real = f.backend.take_counts
                monkeypatch.setattr(f.backend, "take_counts", lambda: (0, 1, 0))
                f.write_all(piece, lay)
                monkeypatch.setattr(f.backend, "take_counts", real)
            else:
                f.write_all(piece, lay)
        st = f.stats.as_dict()
    assert comm.allgather(finished[0]) == [steps - 2] * comm.size
    assert comm.allgather((st["early_flushes"], st["collective_calls"])) == [(1, steps)] * comm.size
    step = len(_step(comm, 0)[2])
    assert st["bytes_written"] == steps * step


#: Series the step must finish as the general way does, or leave to it: hints, the
#: steps' offsets, the piece (rows, columns per rank), and what is odd about them
SERIES = {
    "backward": ({"romio_cb_write": "enable"}, [(9 - s) * 65536 for s in range(10)], {}),
    "disable": ({"romio_cb_write": "disable"}, [s * 65536 for s in range(10)], {}),
    "default": (None, [s * 65536 for s in range(10)], {}),
    # (shifts that are not whole alignment units: the general way plans each step)
    "unaligned": (
        {"romio_cb_write": "enable", "striping_unit": 65536},
        [s * 65536 + 8 * s for s in range(10)],
        {},
    ),
    # (rank 0's piece at step 4 in Fortran order: a copy, that rank's call the general way)
    "fortran": ({"romio_cb_write": "enable"}, [s * 65536 for s in range(10)], {"fortran": 4}),
    # (a window of 4 MiB: written by the backend's write_at, in part with O_DIRECT)
    "large": (
        {"romio_cb_write": "enable", "direct_write": "true", "cb_buffer_size": 1 << 26},
        [s * (1 << 24) + 4096 * 3 for s in range(6)],
        {"rows": 1024, "cols": 128},
    ),
    # (the last rank has nothing: the aggregator's window has holes, read first)
    "empty": ({"romio_cb_write": "enable"}, [s * 65536 for s in range(10)], {"empty": True}),
}


def _odd_series(comm, path, hints, offsets, *, rows=16, cols=32, fortran=-1, empty=False):
    """Write the series; every call's ``last_call`` and ``local``, and the statistics
    that are not times."""
    p, r = comm.size, comm.rank
    calls = []
    collio.release_buffers()
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        for s, at in enumerate(offsets):
            glob = np.arange(rows * cols * p, dtype=np.float64).reshape(rows, cols * p) + 1e4 * s
            if empty and r == p - 1:
                piece = np.zeros((rows, 0))
                lay = Subarray(glob.shape, (0, 0), (rows, 0), "<f8", offset=at)
            else:
                piece = glob[:, r * cols : (r + 1) * cols]
                odd = s == fortran and r == 0
                piece = np.asfortranarray(piece) if odd else np.ascontiguousarray(piece)
                lay = Subarray(glob.shape, (0, r * cols), (rows, cols), "<f8", offset=at)
            f.write_all(piece, lay)
            local = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in f.stats.local.items()}
            calls.append((f.stats.last_call, local))
        st = f.stats.as_dict()
    return calls, {k: v for k, v in st.items() if k not in NOT_COUNTED}


@pytest.mark.parametrize("series", list(SERIES))
@pytest.mark.parametrize("mixed", [False, True], ids=["every-rank", "last-rank-without"])
def test_odd_series_end_as_the_general_way_ends_them(comm, mpi_tmp_path, monkeypatch, series,
                                                     mixed):  # fmt: skip
    """Each series of :data:`SERIES`, with every rank able to make a step or the last rank
    never making one, against the same series with no step: numpy's bytes in both files,
    every call's ``last_call`` and ``local``, and the same statistics but times."""
    hints, offsets, odd = SERIES[series]
    if series == "empty" and comm.size == 1:
        pytest.skip("needs a rank with nothing")
    no_step = staticmethod(lambda *a: None)
    if mixed and comm.rank == comm.size - 1:
        monkeypatch.setattr(collio.keptcall.Step, "made", no_step)
    path, plain = str(mpi_tmp_path / "odd.bin"), str(mpi_tmp_path / "odd_plain.bin")
    got = _odd_series(comm, path, hints, offsets, **odd)
    monkeypatch.setattr(collio.keptcall.Step, "made", no_step)
    want = _odd_series(comm, plain, hints, offsets, **odd)
    comm.Barrier()
    assert read_file(path) == read_file(plain) == _odd_bytes(comm.size, offsets, **odd)
    assert got == want


def _odd_bytes(p, offsets, *, rows=16, cols=32, fortran=-1, empty=False):
    """What :func:`_odd_series` leaves in a new file: each step's global array at its
    offset (the last rank's columns never written where it has nothing: zeros, and the
    file ends at the last byte written)."""
    del fortran  # (a Fortran-order piece holds the same values)
    end = max(offsets) + rows * cols * p * 8
    want = np.zeros(end, np.uint8)
    written = np.zeros(end, bool)
    for s, at in enumerate(offsets):
        glob = np.arange(rows * cols * p, dtype=np.float64).reshape(rows, cols * p) + 1e4 * s
        mask = np.ones(glob.shape, bool)
        if empty:
            mask[:, (p - 1) * cols :] = False
        step = glob.view(np.uint8).reshape(rows, cols * p, 8)
        want[at : at + glob.nbytes] = np.where(mask[:, :, None], step, 0).reshape(-1)
        written[at : at + glob.nbytes] |= np.repeat(mask.reshape(-1), 8)
    return want[: int(np.flatnonzero(written)[-1]) + 1].tobytes()


def test_repeats_go_from_write_all_straight_to_the_lane_and_errors_stay_agreed(
    comm, mpi_tmp_path, finished, monkeypatch
):
    """A series' repeats go from ``write_all`` to the lane's step without the engine's
    entry (``File._laned``), writing ROMIO's bytes; a failing write on the aggregator, a
    layout of another array on the last rank and a negative offset on the last rank each
    raise the same error on every rank inside the series, and its next calls take the
    route again."""
    p, steps = comm.size, 16
    pwrite_bad, other_bad, offset_bad = 4, 8, 12
    entries = [0]
    real_write, real_pwrite = collio.engine.write, os.pwrite

    def counted(*args, **kwargs):
        entries[0] += 1
        return real_write(*args, **kwargs)

    def failing(fd, data, offset):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(collio.engine, "write", counted)
    path, theirs = str(mpi_tmp_path / "route.bin"), str(mpi_tmp_path / "romio.bin")
    routed = []  # (steps whose call neither entered the engine nor left the step)
    with collio.open(path, "w", comm=comm, hints=HINTS["enable"]) as f:
        for s in range(steps):
            piece, lay, _ = _step(comm, s)
            before, done = entries[0], finished[0]
            if s == pwrite_bad:
                if comm.rank == 0:  # (rank 0 aggregates)
                    monkeypatch.setattr(os, "pwrite", failing)
                try:
                    err = raises_everywhere(
                        comm, collio.CollioError, lambda a=piece, b=lay: f.write_all(a, b)
                    )
                finally:
                    monkeypatch.setattr(os, "pwrite", real_pwrite)
                assert err.ranks == (0,) and "backend I/O: rank 0:" in str(err), str(err)
            elif s in (other_bad, offset_bad) and p > 1:
                if comm.rank == p - 1:  # (another array's layout; a negative offset)
                    shape = (ROWS + 1, COLS * p) if s == other_bad else lay.global_shape
                    where = -8 if s == offset_bad else lay.offset
                    lay = Subarray(shape, (0, (p - 1) * COLS), (ROWS, COLS), "<f8", offset=where)
                err = raises_everywhere(
                    comm, collio.CollioError, lambda a=piece, b=lay: f.write_all(a, b)
                )
                assert f"rank {p - 1}" in str(err), str(err)
            else:
                f.write_all(piece, lay)
            if entries[0] == before and finished[0] == done + 1:
                routed.append(s)
    for s in range(steps):
        piece, lay, _ = _step(comm, s)
        romio_write(theirs, piece, lay, comm)
    # every repeat after the first two takes the route but the calls that a rank's
    # layout sends the general way (the next one is the lane's again); the failing
    # write was the route's own
    bad = (other_bad, offset_bad) if p > 1 else ()
    want = [s for s in range(2, steps) if s not in bad]
    assert comm.allgather(routed) == [want] * p, (routed, want)
    comm.Barrier()
    got, ref = read_file(path), read_file(theirs)
    size = len(_step(comm, 0)[2])
    for s in range(steps):
        if s not in (pwrite_bad, *bad):
            assert got[s * size : (s + 1) * size] == ref[s * size : (s + 1) * size], s
