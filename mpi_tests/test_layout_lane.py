"""A time series through array layouts in the one-run lane (collio.quick.layout_again).

Each step is a new :class:`~collio.layouts.Subarray` equal to the last one but for its
offset; from the third call each rank's one run is found from the offset alone, its I/O
done before the head.  Each test checks the bytes against ROMIO or numpy, and that
anything wrong on one rank (its data, its output array, its call, its offset) raises on
every rank with every guessed write taken back.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers import mismatch_message, raises_everywhere, read_file

import collio
from collio import speculate
from collio.layouts import Subarray
from collio.testing.romio import romio_write

pytestmark = pytest.mark.mpi(min_size=1)
ROWS, COLS = 3, 16  # float64 per rank per step: one run (whole rows of the step)


def _step(comm, s, order="C", at=None):
    """Rank r's rows of step ``s`` (a (ROWS * p, COLS) float64 array from byte ``at``) and
    the whole step, which every rank can build."""
    p, r = comm.size, comm.rank
    shape = (ROWS * p, COLS) if order == "C" else (COLS, ROWS * p)
    glob = np.arange(ROWS * p * COLS, dtype=np.float64).reshape(shape) + 1000 * s
    offset = s * glob.nbytes if at is None else at
    if order == "C":
        lay = Subarray(shape, (r * ROWS, 0), (ROWS, COLS), "<f8", offset=offset)
        piece = np.ascontiguousarray(glob[r * ROWS : (r + 1) * ROWS])
    else:
        lay = Subarray(shape, (0, r * ROWS), (COLS, ROWS), "<f8", order="F", offset=offset)
        piece = np.asfortranarray(glob[:, r * ROWS : (r + 1) * ROWS])
    return piece, lay, glob.tobytes(order=order)


def _same_file(comm, path, want):
    comm.Barrier()
    got = read_file(path)
    comm.Barrier()  # (every rank reads before any goes on)
    assert got == want


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_series_of_subarrays_takes_the_lane_and_writes_and_reads_what_romio_does(
    comm, mpi_tmp_path, order
):
    path, theirs = str(mpi_tmp_path / "lane.bin"), str(mpi_tmp_path / "romio.bin")
    steps, parts, guessed = 7, [], []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            piece, lay, whole = _step(comm, s, order)
            f.write_all(piece, lay)
            guessed.append(f.stats.last_call["guessed"])
            romio_write(theirs, piece, lay, comm)
            parts.append(whole)
        st = f.stats.as_dict()
    assert guessed == [False, False] + [True] * (steps - 2)
    assert st["bytes_written"] == steps * comm.size * ROWS * COLS * 8
    assert st["write_ops"] == steps * comm.size
    _same_file(comm, path, b"".join(parts))
    assert read_file(theirs) == b"".join(parts)
    read_guessed = []
    with collio.open(path, "r", comm=comm) as f:
        for s in list(range(steps)) + [2, 0]:  # (back to earlier steps: new shifts)
            piece, lay, _ = _step(comm, s, order)
            out = np.full_like(piece, np.nan)
            got = f.read_all(lay, out=out) if s % 2 else f.read_all(lay)
            assert got.flags.f_contiguous if order == "F" else got.flags.c_contiguous
            assert (got is out) == bool(s % 2)
            np.testing.assert_array_equal(got, piece)
            read_guessed.append(f.stats.last_call["guessed"])
    assert read_guessed[2:steps] == [True] * (steps - 2)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("bad", ["shape", "dtype", "strided"])
def test_one_rank_bad_data_in_the_lane_raises_everywhere_and_takes_back_every_write(
    comm, mpi_tmp_path, bad
):
    path = str(mpi_tmp_path / "bad.bin")
    last, parts = comm.size - 1, []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(4):
            piece, lay, whole = _step(comm, s)
            f.write_all(piece, lay)
            parts.append(whole)
        assert f.stats.last_call["guessed"]
        piece, lay, whole = _step(comm, 4)
        if comm.rank == last:
            piece = {"shape": piece[:1], "dtype": piece.astype(np.float32),
                     "strided": np.repeat(piece, 2, axis=1)[:, ::2]}[bad]  # fmt: skip
        if bad == "strided":  # (allowed: that rank leaves the lane, the others go on)
            f.write_all(piece, lay)
            parts.append(whole)
        else:
            raises_everywhere(comm, collio.LayoutError, lambda: f.write_all(piece, lay),
                              match=f"rank {last}: data")  # fmt: skip
        _same_file(comm, path, b"".join(parts))
        if bad != "strided":
            parts.append(b"\0" * len(whole))  # (step 4 stays a hole)
        for s in range(5, 8):  # (the series goes on, in the lane again)
            piece, lay, whole = _step(comm, s)
            f.write_all(piece, lay)
            parts.append(whole)
        assert f.stats.last_call["guessed"]
        out = np.empty_like(piece)
        if comm.rank == last:
            out = out.astype(np.float32)
        raises_everywhere(comm, collio.LayoutError, lambda: f.read_all(lay, out=out),
                          match=f"rank {last}: out has shape")  # fmt: skip
    _same_file(comm, path, b"".join(parts))


@pytest.mark.mpi(min_size=2)
def test_a_different_call_or_offset_on_one_rank_meets_the_lane_and_raises_everywhere(
    comm, mpi_tmp_path
):
    path = str(mpi_tmp_path / "other.bin")
    parts = []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(4):
            piece, lay, whole = _step(comm, s)
            f.write_all(piece, lay)
            parts.append(whole)
        piece, lay, whole = _step(comm, 4)
        if comm.rank == 0:
            call = lambda: f.read_all(_step(comm, 1)[1])  # noqa: E731
        else:
            call = lambda: f.write_all(piece, lay)  # noqa: E731
        err = raises_everywhere(comm, collio.MismatchError, call,
                                match=mismatch_message(comm, "read_all", "write_all"))  # fmt: skip
        assert err.call_mismatch
        _same_file(comm, path, b"".join(parts))
        # rank 0's step at another offset (the others in the lane): the head compares them
        at = 9 * len(whole) if comm.rank == 0 else None
        piece, lay, _ = _step(comm, 4, at=at)
        raises_everywhere(comm, collio.MismatchError, lambda: f.write_all(piece, lay),
                          match="ranks disagree on the global array")  # fmt: skip
        _same_file(comm, path, b"".join(parts))
        for s in range(4, 7):
            piece, lay, whole = _step(comm, s)
            f.write_all(piece, lay)
            parts.append(whole)
        assert f.stats.last_call["guessed"]
    _same_file(comm, path, b"".join(parts))


def _slab_step(p, s):
    return np.arange(p * 4 * 8, dtype=np.float64).reshape(p, 4, 8) - 100 * s


def _slab(comm, s, cols=4):
    """Rank r's half-rows of slab r of step ``s`` (a (p, 4, 8) float64 array): four runs
    within its own slab, so the ranks' extents are disjoint (the direct path)."""
    r = comm.rank
    glob = _slab_step(comm.size, s)
    lay = Subarray(glob.shape, (r, 0, 8 - cols), (1, 4, cols), "<f8", offset=s * glob.nbytes)
    return np.ascontiguousarray(glob[r : r + 1, :, 8 - cols :]), lay


def test_several_runs_per_rank_take_the_lane_and_match_romio(comm, mpi_tmp_path):
    path, theirs = str(mpi_tmp_path / "runs.bin"), str(mpi_tmp_path / "romio.bin")
    steps, guessed = 6, []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            piece, lay = _slab(comm, s)
            f.write_all(piece, lay)
            guessed.append((f.stats.last_call["guessed"], f.stats.last_call["path"]))
            romio_write(theirs, piece, lay, comm)
    assert guessed == [(False, "direct")] * 2 + [(True, "direct")] * (steps - 2)
    comm.Barrier()
    mine, romio = (np.frombuffer(read_file(x), np.float64) for x in (path, theirs))
    comm.Barrier()
    glob = np.stack([_slab_step(comm.size, s) for s in range(steps)])
    # (the columns the layouts cover: ROMIO leaves the holes of a new file undefined)
    np.testing.assert_array_equal(mine.reshape(glob.shape)[..., 4:], glob[..., 4:])
    np.testing.assert_array_equal(romio.reshape(glob.shape)[..., 4:], glob[..., 4:])
    with collio.open(path, "r", comm=comm) as f:
        for i, s in enumerate([0, 1, 2, 3, 5, 4]):  # (a step back: a negative shift)
            piece, lay = _slab(comm, s)
            out = np.full_like(piece, np.nan)
            f.read_all(lay, out=out)
            np.testing.assert_array_equal(out, piece)
            assert f.stats.last_call["guessed"] == (i > 0)  # (mapped: from the second)
        piece, lay = _slab(comm, 1)
        out = np.empty_like(piece) if comm.rank else np.empty(piece.shape, np.float32)
        raises_everywhere(comm, collio.LayoutError, lambda: f.read_all(lay, out=out),
                          match="rank 0: out has shape")  # fmt: skip
        np.testing.assert_array_equal(f.read_all(_slab(comm, 5)[1]), _slab(comm, 5)[0])


@pytest.mark.mpi(min_size=2)
def test_a_rank_with_other_runs_leaves_the_lane_and_the_others_still_write_right(
    comm, mpi_tmp_path
):
    """The last rank writes fewer columns at the next step (another box): it takes the
    general way, the others' guessed writes are taken back or kept as the head decides,
    and the file holds every rank's bytes."""
    path = str(mpi_tmp_path / "other.bin")
    with collio.open(path, "w", comm=comm) as f:
        for s in range(4):
            piece, lay = _slab(comm, s)
            f.write_all(piece, lay)
        cols = 2 if comm.rank == comm.size - 1 else 4
        piece, lay = _slab(comm, 4, cols)
        f.write_all(piece, lay)
        assert not f.stats.last_call["guessed"]
    comm.Barrier()
    got = np.frombuffer(read_file(path), np.float64).reshape(5, comm.size, 4, 8)
    comm.Barrier()
    want = np.stack([_slab_step(comm.size, s) for s in range(5)])
    want[4, -1, :, 4:6] = 0  # (the last rank's two columns fewer at step 4: a hole)
    np.testing.assert_array_equal(got[..., 4:], want[..., 4:])


def _columns(comm, s, rows=8, cols=2, offset=None):
    """Rank r's column block of step ``s`` (a (rows, p * cols) float64 array): ``rows``
    runs interleaved with the other ranks' (the shuffled path)."""
    p, r = comm.size, comm.rank
    glob = np.arange(rows * p * cols, dtype=np.float64).reshape(rows, p * cols) + 0.5 * s
    at = s * glob.nbytes if offset is None else offset
    lay = Subarray(glob.shape, (0, r * cols), (rows, cols), "<f8", offset=at)
    return np.ascontiguousarray(glob[:, r * cols : (r + 1) * cols]), lay, glob.tobytes()


def test_a_shuffled_series_moves_the_last_runs_and_writes_what_romio_does(comm, mpi_tmp_path):
    """Each step's Subarray equals the last one but for its offset: its runs are the last
    ones moved (collio.check), byte for byte as ROMIO writes them; a rank whose step has a
    negative offset still fails its checks, on every rank."""
    path, theirs = str(mpi_tmp_path / "cols.bin"), str(mpi_tmp_path / "romio.bin")
    parts = []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(5):
            piece, lay, whole = _columns(comm, s)
            f.write_all(piece, lay)
            romio_write(theirs, piece, lay, comm)
            parts.append(whole)
        piece, lay, _ = _columns(comm, 5, offset=-8 if comm.rank == 0 else None)
        raises_everywhere(comm, collio.LayoutError, lambda: f.write_all(piece, lay),
                          match="rank 0: offset -8 is negative")  # fmt: skip
        for s in (3, 1):  # (back to earlier steps: the runs moved down)
            piece, lay, _ = _columns(comm, s)
            np.testing.assert_array_equal(f.read_all(lay), piece)
    _same_file(comm, path, b"".join(parts))
    assert read_file(theirs) == b"".join(parts)


class _NoMemory:
    """numpy as collio.quick sees it on one rank whose allocations fail (a rank short of
    memory); every other name is numpy's own."""

    def __getattr__(self, name):
        return getattr(np, name)

    def empty(self, *args, **kwargs):
        raise MemoryError("no memory for the lane's array")


def test_a_lane_read_whose_array_cannot_be_allocated_on_one_rank_reads_the_general_way(
    comm, mpi_tmp_path, monkeypatch
):
    # The lane allocates before the call's agreement: a rank that cannot must leave the
    # lane (the general way allocates inside an agreed step), not raise alone.
    import collio.quick

    path = str(mpi_tmp_path / "lane.bin")
    with collio.open(path, "w", comm=comm) as f:
        for s in range(4):
            piece, lay, _ = _step(comm, s)
            f.write_all(piece, lay)
    with collio.open(path, "r", comm=comm) as f:
        for s in range(4):
            piece, lay, _ = _step(comm, s)
            if s == 3 and comm.rank == comm.size - 1:
                monkeypatch.setattr(collio.quick, "np", _NoMemory())
            np.testing.assert_array_equal(f.read_all(lay), piece)
            monkeypatch.undo()


def test_a_layouts_offset_cannot_change_after_it_is_made(comm):
    # Its runs are kept once worked out, and reused for the next step of a series:
    # a changed offset would write where the old one pointed.
    _, lay, _ = _step(comm, 0)
    with pytest.raises(AttributeError):
        lay.offset = 8
    assert lay.offset == 0


def _big_step(comm, s, cols=2048):
    """Rank r's row of step ``s``: ``cols`` float64 (past HOLE_MIN), one run per rank."""
    p, r = comm.size, comm.rank
    glob = np.arange(p * cols, dtype=np.float64).reshape(p, cols) + 1e6 * (s + 1)
    lay = Subarray(glob.shape, (r, 0), (1, cols), "<f8", offset=s * glob.nbytes)
    return np.ascontiguousarray(glob[r : r + 1]), lay, glob.tobytes()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sparse", [False, True])
def test_large_steps_past_the_end_or_in_holes_take_the_lane_and_a_failure_leaves_zeros(
    comm, mpi_tmp_path, sparse
):
    """Steps of 16 KiB per rank: the other ranks' writes of a step pass a rank's range,
    or the file was made long (holes): the lane reads none of it to keep, and a failing
    step still leaves the old bytes (a hole: zeros) and size, the bytes as ROMIO's."""
    path, theirs = str(mpi_tmp_path / "big.bin"), str(mpi_tmp_path / "romio.bin")
    steps, bad = 8, comm.size - 1
    whole = [_big_step(comm, s)[2] for s in range(steps)]
    size = steps * len(whole[0]) if sparse else 0
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.truncate(size)
    comm.Barrier()
    with collio.open(path, "r+", comm=comm) as f:
        for s in range(steps):
            piece, lay, _ = _big_step(comm, s)
            if s == 4 and comm.rank == bad:
                piece = piece.astype(np.float32)
            if s == 4:
                assert f.stats.last_call["guessed"]
                call = functools.partial(f.write_all, piece, lay)
                raises_everywhere(comm, collio.LayoutError, call, match=f"rank {bad}: data")
                continue
            f.write_all(piece, lay)
            romio_write(theirs, piece, lay, comm)
        assert f.stats.last_call["guessed"]
    want = b"".join(whole[:4]) + b"\0" * len(whole[0]) + b"".join(whole[5:])
    _same_file(comm, path, want)
    assert read_file(theirs) == want


def test_steps_larger_than_the_keep_limit_take_the_lane_past_the_end(comm, mpi_tmp_path):
    """Each rank's step is larger than a write may keep to take back: the ranks that find
    the other ranks' writes of the step past theirs find a hole, keep nothing, and guess."""
    path = str(mpi_tmp_path / "large.bin")
    cols = speculate.KEEP_LIMIT // 8 + 512
    whole, guessed = [], []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(4):
            piece, lay, step = _big_step(comm, s, cols)
            f.write_all(piece, lay)
            guessed.append(f.stats.last_call["guessed"])
            whole.append(step)
    assert guessed == [False, False, True, True]
    _same_file(comm, path, b"".join(whole))
