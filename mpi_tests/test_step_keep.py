"""A step (collio.quick.Step) that overwrites bytes below the file's end keeps them as
one pread gives them (a range of a page or more: as keep_one keeps it, asking first
whether it lies in a hole), and puts them back when its call is taken back.

The file is filled first (by ROMIO) past where the series writes, so every step of the
series writes below the end and keeps what it overwrites.  A call that one rank's
write fails (a file-size limit), or that meets another call on one rank, is taken back
on every rank: the file's bytes are what they were before that call, byte for byte,
as numpy and ROMIO read them.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import collio_calls, file_limit, raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio.layouts import Subarray

pytestmark = pytest.mark.mpi(min_size=1)


def _step(comm, s, n):
    """Rank r's piece of step ``s`` (``n`` float64 per rank) and its layout."""
    p, r = comm.size, comm.rank
    glob = np.arange(p * n, dtype=np.float64) + 1e6 * (s + 1) + 0.5
    lay = Subarray((p * n,), (r * n,), (n,), "<f8", offset=s * glob.nbytes)
    return glob[r * n : (r + 1) * n].copy(), lay, glob.tobytes()


def _filled(comm, path, nbytes):
    """The file, ``nbytes`` of non-zero bytes written by ROMIO; its bytes."""
    old = (np.arange(nbytes, dtype=np.int64) * 7 + 3).astype(np.uint8)
    old[old == 0] = 1
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    if comm.rank == 0:
        fh.Write_at(0, old)
    fh.Close()
    return old.tobytes()


def _same(comm, path, want):
    comm.Barrier()
    assert read_file(path) == want
    got = np.empty(len(want), np.uint8)
    fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
    fh.Read_at_all(0, got)
    fh.Close()
    assert got.tobytes() == want
    comm.Barrier()


def _every_rank(comm, ok, what):
    """Assert ``ok`` on every rank alike (each rank's own fact gathered first: a rank
    failing alone would leave the others waiting in the test's next collective)."""
    oks = comm.allgather(bool(ok))
    assert all(oks), f"{what}: not so on ranks {[r for r, o in enumerate(oks) if not o]}"


def _fail_write(comm, bad, limit, call):
    """``call()`` on every rank, rank ``bad`` unable to write past ``limit``: the error
    every rank raises, naming ``bad`` alone."""
    with file_limit(comm.rank == bad, limit):
        err = raises_everywhere(comm, collio.BackendError, call)
    assert err.ranks == (bad,)
    return err


def _write_steps(comm, f, file, n, count, each=None):
    """Steps 0 to ``count - 1`` (``n`` float64 per rank each) written through ``f``, and
    into ``file``, the bytes the file should hold; ``each(s, seen)`` after step ``s``,
    ``seen`` the names of the calls it made (traced only for ``each``)."""
    step_bytes = comm.size * n * 8
    for s in range(count):
        piece, lay, whole = _step(comm, s, n)
        if each is None:
            f.write_all(piece, lay)
        else:
            seen: set[str] = set()
            collio_calls(lambda: f.write_all(piece, lay), seen)  # noqa: B023
            each(s, seen)
        file[s * step_bytes : (s + 1) * step_bytes] = whole


@pytest.mark.parametrize("n", [1, 64, 512])
def test_a_failed_step_below_the_end_puts_back_what_it_overwrote(comm, mpi_tmp_path, n):
    path, steps = str(mpi_tmp_path / "keep.bin"), 6
    step_bytes = comm.size * n * 8
    file = bytearray(_filled(comm, path, (steps + 4) * step_bytes))
    bad = comm.size - 1
    with collio.open(path, "r+", comm=comm) as f:
        _write_steps(comm, f, file, n, steps - 1)
        _same(comm, path, bytes(file))
        piece, lay, whole = _step(comm, steps - 1, n)
        seen: set[str] = set()
        call = lambda: collio_calls(lambda: f.write_all(piece, lay), seen)  # noqa: E731
        # (rank ``bad``'s write fails: past the limit from its first byte)
        _fail_write(comm, bad, lay.offset + bad * n * 8, call)
        _every_rank(comm, "_go" in seen and "_settle" in seen, "a step's write, taken back")
        _same(comm, path, bytes(file))  # (every rank's overwritten bytes put back)
        f.write_all(piece, lay)  # (the series goes on)
        file[(steps - 1) * step_bytes : steps * step_bytes] = whole
    _same(comm, path, bytes(file))


@pytest.mark.mpi(min_size=2)
def test_a_step_meeting_another_call_puts_back_what_it_overwrote(comm, mpi_tmp_path):
    path, n, steps = str(mpi_tmp_path / "meet.bin"), 16, 6
    step_bytes = comm.size * n * 8
    file = bytearray(_filled(comm, path, (steps + 4) * step_bytes))
    with collio.open(path, "r+", comm=comm) as f:
        _write_steps(comm, f, file, n, steps - 1)
        piece, lay, _ = _step(comm, steps - 1, n)
        seen: set[str] = set()
        if comm.rank == 0:
            fn = f.sync
        else:
            fn = lambda: collio_calls(lambda: f.write_all(piece, lay), seen)  # noqa: E731
        raises_everywhere(comm, collio.MismatchError, fn)
        _every_rank(comm, not comm.rank or {"_go", "_mismatch"} <= seen, "a step, taken back")
        _same(comm, path, bytes(file))


def _asked(seen):
    """Whether a call was a step's that asked whether its range is a hole and read none."""
    return "_go" in seen and "data_from" in seen and "pread_zeros" not in seen


def _holed(comm, path, nbytes):
    """The file, ``nbytes`` long: a hole but for its last byte (written by ROMIO)."""
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    if comm.rank == 0:
        fh.Write_at(nbytes - 1, np.full(1, 9, np.uint8))
    fh.Close()
    return bytes(nbytes - 1) + bytes([9])


@pytest.mark.parametrize("how", ["fails", "meets"])
def test_a_page_step_in_a_hole_keeps_no_bytes_and_puts_back_zeros(comm, mpi_tmp_path, how):
    """Steps of a page per rank below the file's end, in a hole: each asks whether its
    range is a hole (lseek SEEK_DATA) rather than reading its zeros, and a call taken
    back (one rank's write fails, or one rank makes another call) puts zeros back where
    every rank wrote, the file's size as it was."""
    if how == "meets" and comm.size < 2:
        pytest.skip("another call on one rank needs two ranks")
    path, n, steps = str(mpi_tmp_path / "hole.bin"), 512, 6
    step_bytes = comm.size * n * 8
    file = bytearray(_holed(comm, path, (steps + 4) * step_bytes))
    bad = comm.size - 1
    with collio.open(path, "r+", comm=comm) as f:

        def step_asked(s, seen):
            if s >= 3:  # (a step: its range asked, not read)
                _every_rank(comm, _asked(seen), f"step {s} asked about its hole")

        _write_steps(comm, f, file, n, steps - 1, step_asked)
        _same(comm, path, bytes(file))
        piece, lay, whole = _step(comm, steps - 1, n)
        seen: set[str] = set()
        call = lambda: collio_calls(lambda: f.write_all(piece, lay), seen)  # noqa: E731
        if how == "meets":
            raises_everywhere(comm, collio.MismatchError, f.sync if comm.rank == 0 else call)
        else:
            _fail_write(comm, bad, lay.offset + bad * n * 8, call)
        asked = _asked(seen) or (how == "meets" and not comm.rank)  # (rank 0 synced)
        _every_rank(comm, asked, "the last step asked about its hole")
        _same(comm, path, bytes(file))  # (zeros put back where the call wrote)
        f.write_all(piece, lay)  # (the series goes on)
        file[(steps - 1) * step_bytes : steps * step_bytes] = whole
    _same(comm, path, bytes(file))
