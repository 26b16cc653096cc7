"""A time series' repeats in a few operations (collio.quick.Step).

From a one-run series' fourth call through the lane (through a Subarray or a dense
file view), a kept step does the call: its
conditions, I/O, head and completion with the facts that do not change looked up once.
Each test checks that the step took the calls it should (the functions the call ran),
the bytes against numpy and ROMIO in the same run, and what the call reports
(``last_call``, the summed statistics); anything but the plain case (a failed write on
one rank, another layout between the steps, a second variable) goes the lane's way and
the series comes back to its step.
"""

from __future__ import annotations

import resource

import numpy as np
import pytest
from helpers import collio_calls, raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio import quick
from collio.layouts import Subarray
from collio.testing.romio import romio_read, romio_write

pytestmark = pytest.mark.mpi(min_size=1)


def _step(comm, s, n, order="C", var=0, at=None):
    """Rank r's piece of step ``s`` of variable ``var`` (``n`` float64 per rank; in
    ``order``, a (2, n // 2) block of a (2, p * n // 2) array) and the step's bytes."""
    p, r = comm.size, comm.rank
    glob = np.arange(p * n, dtype=np.float64) + 1e6 * s + 1e9 * var + 0.5
    offset = (2 * s + var) * glob.nbytes if at is None else at
    if order == "C":
        lay = Subarray((p * n,), (r * n,), (n,), "<f8", offset=offset)
        return glob[r * n : (r + 1) * n].copy(), lay, glob.tobytes()
    g2 = glob.reshape(2, p * n // 2, order="F")
    lay = Subarray(g2.shape, (0, r * n // 2), (2, n // 2), "<f8", order="F", offset=offset)
    piece = np.asfortranarray(g2[:, r * n // 2 : (r + 1) * n // 2])
    return piece, lay, g2.tobytes(order="F")


def _in_step(fn):
    """Whether ``fn()`` (one call) was done by a step and not the lane's general way."""
    seen, _ = collio_calls(fn)
    # (a mapped read's step: Step._read_mapped; any other: Step._go)
    step = "_go" in seen or "_read_mapped" in seen
    return step and not ({"_run", "_agree", "_settle", "check"} & seen)


def _same_file(comm, path, want):
    comm.Barrier()
    got = read_file(path)
    comm.Barrier()
    assert got == want


@pytest.mark.parametrize(("n", "order"), [(1, "C"), (512, "C"), (512, "F"), (1 << 17, "C")])
def test_a_series_in_steps_writes_and_reads_what_numpy_and_romio_do(comm, mpi_tmp_path, n, order):
    """8 B, 4 KiB (in both orders) and 1 MiB per rank (the backend's direct write): the
    steps take every call from the fourth, and write and read what ROMIO does."""
    path, theirs = str(mpi_tmp_path / "lane.bin"), str(mpi_tmp_path / "romio.bin")
    steps, parts, stepped = 7, [], []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            piece, lay, whole = _step(comm, s, n, order)
            stepped.append(_in_step(lambda: f.write_all(piece, lay)))  # noqa: B023
            assert f.stats.last_call["guessed"] == (s >= 2)
            romio_write(theirs, piece, lay, comm)
            parts.append(whole)
            parts.append(b"\0" * len(whole))  # (the second variable's steps: holes)
        assert isinstance(f._ctx.kept[True].step, quick.Step)
    assert stepped == [False] * 3 + [True] * (steps - 3)
    want = b"".join(parts[:-1])
    _same_file(comm, path, want)
    comm.Barrier()
    got = read_file(theirs)
    assert got is not None and got[: len(want)] == want
    stepped = []
    with collio.open(path, "r", comm=comm) as f:
        for s in list(range(steps)) + [1, 6]:  # (back to earlier steps: other shifts)
            piece, lay, _ = _step(comm, s, n, order)
            out = np.full_like(piece, np.nan)
            stepped.append(_in_step(lambda: f.read_all(lay, out=out)))  # noqa: B023
            np.testing.assert_array_equal(out, piece)
            np.testing.assert_array_equal(out, romio_read(theirs, lay, comm))
    assert stepped[3:steps] == [True] * (steps - 3)


def test_last_call_and_the_sums_of_a_step_are_what_the_lane_reports(comm, mpi_tmp_path):
    """A step's ``last_call`` is the lane's first call's but for its extent; its sums
    add what every call moved (bytes, requests and their sizes, direct calls)."""
    p, n, steps = comm.size, 512, 6
    path = str(mpi_tmp_path / "facts.bin")
    calls, before = [], None
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            piece, lay, whole = _step(comm, s, n)
            if s == steps - 1:
                before = f.stats.as_dict()
            f.write_all(piece, lay)
            calls.append(dict(f.stats.last_call))
        after = f.stats.as_dict()
        local = f.stats.local
    lane, step = calls[2], calls[-1]
    size = p * n * 8
    assert step["extent"] == [2 * (steps - 1) * size, (2 * steps - 1) * size]
    assert {k: v for k, v in step.items() if k != "extent"} == {
        k: v for k, v in lane.items() if k != "extent"
    }
    assert step["guessed"] and step["direct"] and step["path"] == "direct"
    assert local["direct"] and local["domain"] == -1
    np.testing.assert_array_equal(local["requests"], [n * 8])
    assert after["bytes_written"] == steps * size and after["write_ops"] == steps * p
    assert after["direct_calls"] - before["direct_calls"] == 1
    assert after["bytes_written"] - before["bytes_written"] == size
    hist = np.subtract(list(after["write_size_histogram"].values()),
                       list(before["write_size_histogram"].values()))  # fmt: skip
    assert hist.sum() == p and hist.max() == p  # (one request per rank, in one bucket)
    assert after["time_total"] > before["time_total"] and after["time_io"] > before["time_io"]


def test_the_request_size_histograms_of_steps_count_every_call(comm, mpi_tmp_path):
    """A series' steps count their requests' sizes without an array per call: the
    histograms read at any point hold every call's requests (two sizes of series in
    turn, writes and reads), an array read earlier is not changed by later calls, and
    the bytes are numpy's and ROMIO's."""
    from collio.stats import histogram

    p = comm.size
    path, theirs = str(mpi_tmp_path / "hist.bin"), str(mpi_tmp_path / "romio.bin")
    sizes = (512, 8)  # (float64 per rank: two buckets, 4 KiB and 64 B)
    steps, held, parts, want = 6, [], [], np.zeros(len(histogram([])), np.int64)
    at = 0
    with collio.open(path, "w", comm=comm) as f:
        for n in sizes:
            for s in range(steps):
                piece, lay, whole = _step(comm, s, n, at=at)
                f.write_all(piece, lay)
                romio_write(theirs, piece, lay, comm)
                want += histogram([n * 8] * p)
                if s % 3 == 2:  # (read at some points only: the counted ones add up later)
                    assert s < 3 or f.stats._again_n == 3  # (steps 3-5: counted, not added)
                    got = f.stats.write_sizes
                    held.append((got, got.copy()))
                    np.testing.assert_array_equal(got, want)
                parts.append(whole)
                at += len(whole)
            assert isinstance(f._ctx.kept[True].step, quick.Step)
        assert list(f.stats.as_dict()["write_size_histogram"].values()) == want.tolist()
        assert not f.stats.read_sizes.any()
    for arr, copy in held:
        np.testing.assert_array_equal(arr, copy)
    want_file = b"".join(parts)
    _same_file(comm, path, want_file)
    comm.Barrier()
    got_romio = read_file(theirs)
    assert got_romio is not None and got_romio[: len(want_file)] == want_file
    reads = np.zeros_like(want)
    with collio.open(path, "r", comm=comm) as f:
        at, stepped = 0, []
        for n in sizes:
            for s in range(steps):
                piece, lay, whole = _step(comm, s, n, at=at)
                out = np.full_like(piece, np.nan)
                stepped.append(_in_step(lambda: f.read_all(lay, out=out)))  # noqa: B023
                np.testing.assert_array_equal(out, piece)
                np.testing.assert_array_equal(out, romio_read(theirs, lay, comm))
                reads += histogram([n * 8] * p)
                if s % 2:  # (read at some points only: the counted ones add up later)
                    np.testing.assert_array_equal(f.stats.read_sizes, reads)
                at += len(whole)
        np.testing.assert_array_equal(f.stats.read_sizes, reads)
        assert not f.stats.write_sizes.any()
    assert stepped[3:steps] == [True] * (steps - 3)


def test_a_write_failing_on_one_rank_in_a_step_raises_everywhere_and_the_series_goes_on(
    comm, mpi_tmp_path
):
    """The last rank can write only half its piece (a file-size limit): every rank raises the same
    error, every rank's write of that step is taken back (the file keeps its earlier
    bytes and size), and the series goes on, in steps again."""
    path, n, bad = str(mpi_tmp_path / "fail.bin"), 64, comm.size - 1
    parts = []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(4):
            piece, lay, whole = _step(comm, s, n)
            f.write_all(piece, lay)
            parts += [whole, b"\0" * len(whole)]
        want = b"".join(parts[:-1])
        piece, lay, whole = _step(comm, 4, n)
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        if comm.rank == bad:
            # (half its piece written, then the file-size limit: a partial write)
            half = lay.offset + bad * n * 8 + n * 4
            resource.setrlimit(resource.RLIMIT_FSIZE, (half, limits[1]))
        seen = set()
        try:
            err = raises_everywhere(comm, collio.BackendError,
                                    lambda: collio_calls(lambda: f.write_all(piece, lay), seen),
                                    match=f"backend I/O: rank {bad}:")  # fmt: skip
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        assert err.ranks == (bad,)
        # (the step did the I/O, then went the lane's way from its head)
        assert "_go" in seen and "_settle" in seen
        _same_file(comm, path, want)
        stepped = []
        for s in range(4, 9):
            piece, lay, whole = _step(comm, s, n)
            stepped.append(_in_step(lambda: f.write_all(piece, lay)))  # noqa: B023
            parts[-1:] = [b"\0" * len(whole), whole, b"\0" * len(whole)]
        assert stepped[-2:] == [True, True]
        assert f.stats.last_call["guessed"]
    _same_file(comm, path, b"".join(parts[:-1]))


def test_other_calls_between_the_steps_and_two_variables_in_turn(comm, mpi_tmp_path):
    """The series leaves its step for another layout (two runs per rank) and a read, and
    comes back to it; two variables (of other shapes, each rank's piece one run of the
    same width) written in turn each keep a step."""
    path, theirs = str(mpi_tmp_path / "mixed.bin"), str(mpi_tmp_path / "romio.bin")
    p, r, n, steps = comm.size, comm.rank, 32, 14
    size = p * n * 8
    other = 2 * steps * size  # (the other layout's place: past the series)
    image = np.zeros(other + size, np.uint8)
    stepped = []
    with collio.open(path, "w", comm=comm) as f:

        def write(piece, lay):
            romio_write(theirs, piece, lay, comm)
            return _in_step(lambda: f.write_all(piece, lay))

        for s in range(steps):
            for var in (0, 1):
                piece, lay, whole = _step(comm, s, n, "CF"[var], var=var)
                stepped.append(write(piece, lay))
                image[lay.offset : lay.offset + size] = np.frombuffer(whole, np.uint8)
            if s in (5, 8):  # (another layout: each rank's two half-runs, interleaved)
                glob = np.arange(p * n, dtype=np.float64).reshape(2, p * n // 2) - s
                lay = Subarray(glob.shape, (0, r * n // 2), (2, n // 2), "<f8", offset=other)
                piece = np.ascontiguousarray(glob[:, r * n // 2 : (r + 1) * n // 2])
                assert not write(piece, lay)
                image[other : other + glob.nbytes] = np.frombuffer(glob.tobytes(), np.uint8)
                # (and a read of an earlier step between them)
                piece, lay, _ = _step(comm, s - 1, n, "F", var=1)
                np.testing.assert_array_equal(f.read_all(lay), piece)
        assert f.stats.last_call["guessed"]
    # in steps from the second variable's fourth call until the other layout, and each
    # variable again once the lane repeats its kept call after it
    assert stepped[7:12] == [True] * 5 and stepped[-2:] == [True] * 2
    _same_file(comm, path, image.tobytes())
    comm.Barrier()
    assert read_file(theirs) == image.tobytes()


@pytest.mark.parametrize("etype", ["byte", "int"])
def test_a_series_through_a_view_in_steps_writes_and_reads_what_romio_does(
    comm, mpi_tmp_path, etype
):
    """``write_at_all`` / ``read_at_all`` through a displaced view: steps from the fourth
    call, the bytes ROMIO writes, and a write that fails on one rank in a step is taken
    back everywhere (two ranks or more)."""
    path, theirs = str(mpi_tmp_path / "view.bin"), str(mpi_tmp_path / "romio.bin")
    p, r, n, disp, steps = comm.size, comm.rank, 96, 100, 6
    et = MPI.INT if etype == "int" else MPI.BYTE
    per = n * 8 // et.Get_size()  # etypes per rank per step

    def data(s):
        return np.arange(n, dtype=np.float64) + 1000 * s + 100 * r

    fh = MPI.File.Open(comm, theirs, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    fh.Set_view(disp, et, et)
    stepped = []
    with collio.open(path, "w", comm=comm) as f:
        f.set_view(disp, et, et)
        for s in range(steps):
            stepped.append(_in_step(lambda: f.write_at_all((s * p + r) * per, data(s))))  # noqa: B023
            fh.Write_at_all((s * p + r) * per, data(s))
        size = disp + steps * p * n * 8
        # (the last rank writes half its piece: every rank raises, nothing stays)
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        if r == p - 1:
            half = size + (p - 1) * n * 8 + n * 4
            resource.setrlimit(resource.RLIMIT_FSIZE, (half, limits[1]))
        seen = set()
        try:
            raises_everywhere(
                comm, collio.BackendError,
                lambda: collio_calls(lambda: f.write_at_all((steps * p + r) * per, data(0)), seen),
                match=f"backend I/O: rank {p - 1}:",
            )  # fmt: skip
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        assert "_go" in seen and "_settle" in seen
        comm.Barrier()
        assert len(read_file(path)) == size
        out = np.empty(n)
        for s in range(steps):
            stepped.append(_in_step(lambda: f.read_at_all((s * p + r) * per, out)))  # noqa: B023
            np.testing.assert_array_equal(out, data(s))
    fh.Close()
    assert stepped[3:steps] == [True] * (steps - 3)
    assert stepped[steps + 3 :] == [True] * (steps - 3)
    comm.Barrier()
    got, want = read_file(path), read_file(theirs)
    assert got is not None and want is not None and len(got) == size
    assert got[disp:] == want[disp:size]  # (ROMIO leaves the displacement's bytes undefined)
