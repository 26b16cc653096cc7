"""A time series of column-strided calls: reads in the layout lane, writes in the kept lane.

Each step is a column block of a ``(ROWS, COLS * p)`` float64 matrix: ROWS runs per rank,
interleaved across ranks (the sweep's strided pattern).  From the second read each rank's
runs are the last read's moved by the offset's change (:func:`collio.quick.layout_again`)
and copied from the mapped file; a write goes through the kept two-phase lane
(:mod:`collio.keptcall`).  Every step is checked against numpy and against ROMIO's
``Read_all`` in the same run, and ``last_call`` after every call.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import column_step, on_local_fs, raises_everywhere, read_file

import collio
import collio.keptcall
import collio.quick
from collio.testing.romio import romio_read

pytestmark = pytest.mark.mpi(min_size=1)
ROWS, COLS = 8, 64  # float64 per rank per step: ROWS runs of COLS * 8 bytes


def _step(comm, s, *, turn=0):
    return column_step(comm, s, ROWS, COLS, turn=turn)


@pytest.fixture
def lane_reads(monkeypatch):
    """How many reads this rank made in the layout lane (its runs the last read's moved)."""
    made = [0]
    again = collio.quick.layout_again

    def counted(ctx, layout, data, *, writing, t0):
        got = again(ctx, layout, data, writing=writing, t0=t0)
        made[0] += got is not None and not writing
        return got

    monkeypatch.setattr(collio.quick, "layout_again", counted)
    # (a repeat whose step the file calls straight: collio.File._stepped)
    stepped = collio.File._stepped

    def counted_step(self, step, layout, position, data, name):
        got = stepped(self, step, layout, position, data, name)
        made[0] += got is not collio.file._NOT and name == "read_all"
        return got

    monkeypatch.setattr(collio.File, "_stepped", counted_step)
    # (a read_all through a layout: File._read_stepped, the same route for that call)
    read_stepped = collio.File._read_stepped

    def counted_read_step(self, step, layout, out):
        got = read_stepped(self, step, layout, out)
        made[0] += got is not collio.file._NOT
        return got

    monkeypatch.setattr(collio.File, "_read_stepped", counted_read_step)
    return made


def _series_file(comm, path, steps):
    """Rank 0 writes ``steps`` steps with numpy (no collio); every rank then reads."""
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(b"".join(_step(comm, s)[2] for s in range(steps)))
    comm.Barrier()


def _checked(comm, f, lay, want, path, mapped):
    """``lay`` read into a NaN-filled array equals ``want``, as ROMIO reads it too, and
    ``last_call`` names this call."""
    out = np.full_like(want, np.nan)
    assert f.read_all(lay, out=out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(romio_read(path, lay, comm), want)
    last, span = f.stats.last_call, ROWS * COLS * 8 * comm.size
    assert last["extent"] == [lay.offset, lay.offset + span]
    assert last["runs"] == (ROWS * comm.size if comm.size > 1 else 1)
    assert last["path"] == ("mapped" if mapped else last["path"])


def test_a_strided_read_series_takes_the_lane_and_reads_what_romio_and_numpy_do(
    comm, mpi_tmp_path, lane_reads
):
    path, steps = str(mpi_tmp_path / "series.bin"), 8
    _series_file(comm, path, steps)
    mapped = on_local_fs(path)
    order = [0, 1, 2, 3, 5, 4, 6, 7]  # (a step back: the runs move by a negative shift)
    with collio.open(path, "r", comm=comm) as f:
        for s in order:
            piece, lay, _ = _step(comm, s)
            _checked(comm, f, lay, piece, path, mapped)
        st = f.stats.as_dict()
    assert lane_reads[0] == (steps - 1 if mapped else lane_reads[0])
    assert st["bytes_read"] == steps * ROWS * COLS * 8 * comm.size


def test_ranks_leaving_the_read_lane_meet_the_others_and_come_back(comm, mpi_tmp_path, lane_reads):
    """Every rank reads the next block at steps 3 and 4 (a new layout: the general way,
    then the lane from it) and its own again from step 5; at step 6 rank 0 alone reads
    the next rank's block (its box is not the kept one: the general way, the others in
    the lane) and at step 7 its own again (the general way once more)."""
    path, steps = str(mpi_tmp_path / "mixed.bin"), 8
    _series_file(comm, path, steps)
    mapped = on_local_fs(path)
    turns = [0, 0, 0, 1, 1, 0, 0, 0]
    lanes = []
    with collio.open(path, "r", comm=comm) as f:
        for s, turn in enumerate(turns):
            piece, lay, _ = _step(comm, s, turn=1 if s == 6 and comm.rank == 0 else turn)
            out = np.full_like(piece, np.nan)
            before = lane_reads[0]
            f.read_all(lay, out=out)
            lanes.append(lane_reads[0] - before)
            np.testing.assert_array_equal(out, piece)
            np.testing.assert_array_equal(romio_read(path, lay, comm), piece)
            blocks = comm.allgather(lay.start[1] // COLS)  # (the extent of every rank's runs)
            row = COLS * 8 * comm.size
            ext = [min(blocks) * COLS * 8, (ROWS - 1) * row + (max(blocks) + 1) * COLS * 8]
            assert f.stats.last_call["extent"] == [lay.offset + ext[0], lay.offset + ext[1]]
    if mapped:
        moved = 1 if comm.size == 1 else 0  # (at one rank the turned block is the same one)
        alone = moved if comm.rank == 0 else 1
        assert lanes == [0, 1, 1, moved, 1, moved, alone, alone]


def test_a_rank_failing_mid_read_series_fails_every_rank_and_the_series_goes_on(
    comm, mpi_tmp_path, lane_reads
):
    """At step 4 the last rank reads into a float32 array: every rank raises the same
    error naming it, and the steps after it read right, in the lane again."""
    path, steps, last = str(mpi_tmp_path / "fail.bin"), 8, comm.size - 1
    _series_file(comm, path, steps)
    mapped = on_local_fs(path)
    with collio.open(path, "r", comm=comm) as f:
        for s in range(4):
            piece, lay, _ = _step(comm, s)
            _checked(comm, f, lay, piece, path, mapped)
        piece, lay, _ = _step(comm, 4)
        out = np.empty(piece.shape, np.float32 if comm.rank == last else np.float64)
        err = raises_everywhere(comm, collio.LayoutError, lambda: f.read_all(lay, out=out))
        assert err.ranks == (last,) and f"rank {last}: out has" in str(err)
        done = lane_reads[0]
        for s in range(5, steps):
            piece, lay, _ = _step(comm, s)
            _checked(comm, f, lay, piece, path, mapped)
    assert lane_reads[0] == (done + steps - 5 if mapped else lane_reads[0])


def test_writes_and_reads_of_a_series_alternate_each_in_its_lane(
    comm, mpi_tmp_path, lane_reads, monkeypatch
):
    """Each step is written (the kept two-phase lane from the second write) and read back
    at once (the layout lane from the second read) through one file: neither lane's kept
    call is the other's, and every step's bytes are numpy's and ROMIO's."""
    path, steps = str(mpi_tmp_path / "both.bin"), 7
    if comm.rank == 0:
        open(path, "wb").close()
    comm.Barrier()
    mapped = on_local_fs(path)
    wrote, heads = [], [0]
    head, go = collio.keptcall._head, collio.keptcall.Step.go

    def counted(*args, **kwargs):
        heads[0] += 1
        return head(*args, **kwargs)

    def stepped(*args, **kwargs):
        heads[0] += 1
        return go(*args, **kwargs)

    monkeypatch.setattr(collio.keptcall, "_head", counted)
    monkeypatch.setattr(collio.keptcall.Step, "go", stepped)
    with collio.open(path, "r+", comm=comm, hints={"romio_cb_write": "enable"}) as f:
        for s in range(steps):
            piece, lay, _ = _step(comm, s)
            f.write_all(piece, lay)
            last = f.stats.last_call
            assert last["path"] == "two-phase" and last["extent"][0] == lay.offset
            wrote.append(last["plan_reused"])
            _checked(comm, f, lay, piece, path, mapped)
    assert all(wrote[1:]) and heads[0] == steps - 1
    assert lane_reads[0] == (steps - 1 if mapped else lane_reads[0])
    comm.Barrier()
    assert read_file(path) == b"".join(_step(comm, s)[2] for s in range(steps))
