"""A series of steps appending to a file (collio.quick.Step), each rank writing before
the ranks agree: a rank whose range the others' writes of the same call already passed
knows that the file ended where the call's extent starts (the step's last call left it
there), so it keeps nothing and asks no question of the file (whether its range is a
hole, which would wait for the others' writes); a step taken back cuts the file back to
that end.  A step whose extent does not start where the file ended (another variable's
step between) keeps what it overwrites as before.  Bytes checked against numpy and ROMIO.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import collio_calls, file_limit, raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio.layouts import Subarray

pytestmark = pytest.mark.mpi(min_size=1)
N = 512  # float64 per rank per step: 4 KiB, a range keep_one would ask about


def _piece(comm, slot):
    """Rank r's piece of the global array written at ``slot`` (its layout, and the
    array's bytes)."""
    p, r = comm.size, comm.rank
    glob = np.arange(p * N, dtype=np.float64) + 1e6 * (slot + 1) + 0.25
    lay = Subarray((p * N,), (r * N,), (N,), "<f8", offset=slot * glob.nbytes)
    return glob[r * N : (r + 1) * N].copy(), lay, glob.tobytes()


def _same(comm, path, want):
    comm.Barrier()
    got = np.empty(len(want), np.uint8)
    fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
    size = fh.Get_size()
    fh.Read_at_all(0, got)
    fh.Close()
    ok = read_file(path) == want and got.tobytes() == want and size == len(want)
    assert comm.allgather(ok) == [True] * comm.size


def _failing(comm, f, slot, seen):
    """Slot ``slot`` written with the last rank unable to write from its first byte: the
    error every rank raises, naming that rank."""
    piece, lay, _ = _piece(comm, slot)
    bad = comm.size - 1
    with file_limit(comm.rank == bad, lay.offset + bad * N * 8):
        err = raises_everywhere(
            comm, collio.BackendError, lambda: collio_calls(lambda: f.write_all(piece, lay), seen)
        )
    assert err.ranks == (bad,)


def test_an_appending_series_keeps_nothing_and_a_failed_step_is_cut_off(comm, mpi_tmp_path):
    path, steps = str(mpi_tmp_path / "series.bin"), 8
    want = b""
    asked = []
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            piece, lay, whole = _piece(comm, s)
            comm.Barrier()
            if comm.rank < comm.size - 1:  # (the last rank's write first: the file then
                time.sleep(0.02)  # ends past every other rank's range when it writes)
            seen, _ = collio_calls(lambda: f.write_all(piece, lay))  # noqa: B023
            asked.append("data_from" in seen or "keep_one" in seen)
            want += whole
        _same(comm, path, want)
        seen: set[str] = set()
        _failing(comm, f, steps, seen)
        _same(comm, path, want)  # (cut back to the steps before: nothing of the failed one)
        piece, lay, whole = _piece(comm, steps)
        f.write_all(piece, lay)  # (the series goes on)
        want += whole
    _same(comm, path, want)
    took = "_go" in seen and "_settle" in seen
    # (from the step's second call: its first learns where the file ends)
    assert comm.allgather((asked[4:], took)) == [([False] * (steps - 4), True)] * comm.size


@pytest.mark.mpi(min_size=2)
def test_two_variables_in_turn_keep_what_the_other_wrote(comm, mpi_tmp_path):
    """Variables a and b written in turn, each its own series (a step's extent starts
    where the other variable's last step ended, not where its own did): a failed step of
    a leaves b's last step in the file, byte for byte."""
    path, steps = str(mpi_tmp_path / "turns.bin"), 5
    want = b""
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            for v in range(2):
                piece, lay, whole = _piece(comm, 2 * s + v)
                f.write_all(piece, lay)
                want += whole
        _same(comm, path, want)
        seen: set[str] = set()
        _failing(comm, f, 2 * steps, seen)
        _same(comm, path, want)
    took = "_go" in seen and "_settle" in seen
    assert comm.allgather(took) == [True] * comm.size


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("other", ["write_all", "write_all_many"])
def test_a_step_after_another_write_keeps_what_it_overwrites(comm, mpi_tmp_path, other):
    """Variables a and b interleaved per rank in each step's slot (a0 b0 a1 b1 ...), a
    written then b (b by ``other``): a's next step, failing on the last rank after rank 0
    found the file grown by rank 1, must not cut off b's last pieces (another write came
    after a's last step, so a does not trust the end that step left)."""
    p, r = comm.size, comm.rank
    path, slots = str(comm.bcast(str(mpi_tmp_path / "mixed.bin"), root=0)), 6
    width = N * 8
    slot = 2 * p * width

    def piece(v, s):
        return np.full(N, 1000.0 * s + 10 * v + r + 0.5)

    def lay(v, s):
        return Subarray((2 * p * N,), ((2 * r + v) * N,), (N,), "<f8", offset=s * slot)

    with collio.open(path, "w", comm=comm) as f:
        for s in range(slots):
            f.write_all(piece(0, s), lay(0, s))
            if other == "write_all":
                f.write_all(piece(1, s), lay(1, s))
            else:
                f.write_all_many([(piece(1, s), lay(1, s))])
        comm.Barrier()
        want = read_file(path)
        comm.Barrier()
        if r == 0:
            time.sleep(0.3)  # (rank 0 asks the file's size after rank 1 wrote)
        bad = p - 1
        with file_limit(r == bad, slots * slot + 2 * bad * width):
            raises_everywhere(
                comm, collio.BackendError, lambda: f.write_all(piece(0, slots), lay(0, slots))
            )
        _same(comm, path, want)
