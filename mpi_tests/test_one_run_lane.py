"""A repeated small call through a dense view, in Python ints (collio.quick).

The lane finds the call's one run from the view's displacement and the position, asks the
backend about that run alone, and leaves the call to the general way's steps whenever
they must decide: before any I/O when it cannot take the call, after the head when the
call is not complete there.  Each test checks the bytes (against ROMIO where it can) and
the statistics the agreed calls would give.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio

pytestmark = pytest.mark.mpi(min_size=1)
N = 4096


def _data(step, rank, n=N):
    return np.random.default_rng(1013 * step + rank).integers(0, 256, n, np.uint8)


@pytest.mark.parametrize("etype", ["byte", "int", "contiguous"])
def test_a_series_through_a_displaced_view_writes_and_reads_what_romio_does(
    comm, mpi_tmp_path, etype
):
    """A displacement and a wide etype (or a contiguous filetype of them): positions count
    etypes from the displacement, in the lane as in the general way and in ROMIO."""
    path, theirs = str(mpi_tmp_path / "lane.bin"), str(mpi_tmp_path / "romio.bin")
    p, r, steps, disp = comm.size, comm.rank, 8, 100
    et = {"byte": MPI.BYTE, "int": MPI.INT, "contiguous": MPI.INT}[etype]
    ft = MPI.INT.Create_contiguous(4).Commit() if etype == "contiguous" else et
    per = N // et.Get_size()  # etypes per rank per step
    fh = MPI.File.Open(comm, theirs, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    fh.Set_view(disp, et, ft)
    guessed = []
    with collio.open(path, "w", comm=comm) as f:
        f.set_view(disp, et, ft)
        for s in range(steps):
            f.write_at_all((s * p + r) * per, _data(s, r))
            guessed.append(f.stats.last_call["guessed"])
            fh.Write_at_all((s * p + r) * per, _data(s, r))
        st = f.stats.as_dict()
        out = np.empty(N, np.uint8)
        for s in range(steps):
            f.read_at_all((s * p + r) * per, out)
            np.testing.assert_array_equal(out, _data(s, r))
        assert f.stats.last_call["guessed"]
    fh.Close()
    if etype == "contiguous":
        ft.Free()
    assert guessed == [False, False] + [True] * (steps - 2)
    assert st["bytes_written"] == steps * p * N and st["write_ops"] == steps * p
    comm.Barrier()
    got, want = read_file(path), read_file(theirs)
    assert got is not None and want is not None and len(got) == disp + steps * p * N
    assert got[disp:] == want[disp:]  # (ROMIO leaves the displacement's bytes undefined)


@pytest.mark.mpi(min_size=2)
def test_overwrites_too_large_to_keep_are_not_guessed_and_a_bad_buffer_keeps_the_file(
    comm, mpi_tmp_path
):
    """A rewrite of more bytes than a guess keeps to take back (speculate.KEEP_LIMIT) is
    not done before the head: when one rank's buffer is bad, no byte has moved."""
    from collio import speculate

    path = str(mpi_tmp_path / "big.bin")
    p, r, bad = comm.size, comm.rank, comm.size - 1
    m = 2 * speculate.KEEP_LIMIT
    want = np.zeros(p * m, np.uint8)
    with collio.open(path, "w", comm=comm) as f:
        for s in range(4):
            f.write_at_all(r * m, _data(s, r, m))
            assert not f.stats.last_call["guessed"]
        for q in range(p):
            want[q * m : (q + 1) * m] = _data(3, q, m)
        buf = _data(9, r, 2 * m)
        buf = buf[::2] if r == bad else buf[:m]  # strided memory on one rank
        raises_everywhere(
            comm, collio.LayoutError, lambda: f.write_at_all(r * m, buf),
            match=f"rank {bad}: buffer must be contiguous",
        )  # fmt: skip
        comm.Barrier()
        assert read_file(path) == want.tobytes()
        comm.Barrier()


def _direct_bytes(offset: int, total: int) -> int:
    """Bytes that a write of ``total`` at ``offset`` sends around the page cache (its
    page-aligned middle when that is at least 1 MiB: posix.write_split)."""
    page = 4096
    a = -(-offset // page) * page - offset
    b = (offset + total) // page * page - offset
    return b - a if b - a >= 1 << 20 else 0


def test_a_repeat_with_other_requests_is_counted_as_it_went(comm, mpi_tmp_path):
    """With ``direct_write``, a step's page alignment decides how many bytes go around the
    page cache: a repeat whose requests differ from its last call's is completed by the
    general way's completion, which counts what it did (not the last call's sums)."""
    path = str(mpi_tmp_path / "direct.bin")
    p, r, steps = comm.size, comm.rank, 8
    m = (1 << 20) + 8192  # bytes per rank per step: a multiple of pages
    stride = m + 4096  # between ranks' blocks, and each step 1 KiB further (below)
    want = 0
    with collio.open(path, "w", comm=comm, hints={"direct_write": True}) as f:
        if not f.stats.hints["direct_write"]:
            pytest.skip("no O_DIRECT here")
        at = [(s * p + r) * stride + s * 1024 for s in range(steps)]
        for s in range(steps):
            f.write_at_all(at[s], _data(s, r, m))
        st = f.stats.as_dict()
        everyone = comm.allgather(at)
    for offsets in everyone:
        want += sum(_direct_bytes(a, m) for a in offsets)
    assert st["direct_io_bytes"] == want
    assert st["bytes_written"] == steps * p * m and st["write_ops"] == steps * p
    comm.Barrier()
    got = np.fromfile(path, np.uint8)
    image = np.zeros(max(a + m for offsets in everyone for a in offsets), np.uint8)
    for q, offsets in enumerate(everyone):
        for s, a in enumerate(offsets):
            image[a : a + m] = _data(s, q, m)
    np.testing.assert_array_equal(got, image)  # (the gaps zeros, the length the last end)
