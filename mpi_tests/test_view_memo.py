"""A view made again hands out the same checked view and the same runs (collio.view's
memos), and neither ever serves a view it does not hold: each Set_view here writes the
bytes ROMIO writes through the same view, on a file that starts as the same random
bytes (so holes compare too).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import prefill
from mpi4py import MPI

from collio import mpi
from collio.view import BufferLayout, make_view

DISP = 16
INTS = 15  # a rank's buffer: two and a half filetypes of six ints


def _blocks(block: int, rank: int, size: int) -> MPI.Datatype:
    """Six ints of this rank in blocks of ``block``, the ranks' blocks interleaved (a
    tile of ``6 * size`` ints): every ``block`` gives the same size, different bytes."""
    where = [(k * size + rank) * block for k in range(6 // block)]
    ft = MPI.INT.Create_indexed_block(block, where)
    tile = ft.Create_resized(0, 6 * size * MPI.INT.Get_size())
    ft.Free()
    return tile.Commit()


#: (disp, block) of each Set_view: a new filetype of the same size, the first one again
#: (kept), another displacement, then the first one freed and made anew (equal content).
VIEWS = [(DISP, 2), (DISP, 3), (DISP, 2), (DISP + 8, 2), (DISP, 2)]


def _program(cls, path, comm, bufs):
    """Each view in turn: Set_view, then a collective write of the same size (the runs
    memo's key is the same each time) and an independent one after it."""
    fh = cls.Open(comm, path, MPI.MODE_RDWR)
    kept = {}
    try:
        for k, (disp, block) in enumerate(VIEWS):
            if k == len(VIEWS) - 1:  # the first filetype freed, an equal one made anew
                for t in kept.values():
                    t.Free()
                kept.clear()
            ft = kept.get(block) or kept.setdefault(block, _blocks(block, comm.rank, comm.size))
            fh.Set_view(disp, MPI.INT, ft)
            fh.Write_all([bufs[k][:INTS], MPI.INT])
            fh.Write_at(INTS, [bufs[k][INTS:], MPI.INT])
            back = np.zeros(2 * INTS, np.int32)
            fh.Read_at_all(0, [back, MPI.INT])
            assert np.array_equal(back, bufs[k])
    finally:
        fh.Close()
        for t in kept.values():
            t.Free()


@pytest.mark.mpi
def test_each_new_view_writes_the_bytes_romio_writes(comm, mpi_tmp_path):
    mine, theirs = str(mpi_tmp_path / "memo-collio.bin"), str(mpi_tmp_path / "memo-romio.bin")
    prefill(comm, [mine, theirs], (DISP + 8 + 3 * 6 * comm.size * 4) * 3)
    rng = np.random.default_rng(comm.rank + 7)
    bufs = [rng.integers(-(2**31), 2**31, 2 * INTS, dtype=np.int32) for _ in VIEWS]
    _program(mpi.File, mine, comm, bufs)
    _program(MPI.File, theirs, comm, bufs)
    comm.Barrier()
    if comm.rank == 0:
        with open(mine, "rb") as a, open(theirs, "rb") as b:
            assert a.read() == b.read()


@pytest.mark.mpi
def test_runs_handed_out_are_the_same_and_never_written(comm, mpi_tmp_path):
    """The runs of a contiguous buffer through a view are one read-only object, call after
    call; independent and collective calls on the file, reading and writing, leave them as
    they were (a backend writing into them would raise, read-only)."""
    path, theirs = str(mpi_tmp_path / "runs-collio.bin"), str(mpi_tmp_path / "runs-romio.bin")
    prefill(comm, [path, theirs], (DISP + 3 * 6 * comm.size * 4) * 2)
    ft = _blocks(2, comm.rank, comm.size)
    own = comm.Dup()
    try:
        view = make_view(own, (0, "runs-test"), DISP, MPI.INT, ft, "native")
        buf = np.arange(INTS, dtype=np.int32) + 100 * comm.rank

        def runs():
            lay = BufferLayout(view, 0, [buf, MPI.INT], writing=True)
            lay.validate()
            return lay.runs()

        first = runs()
        copy = [a.copy() for a in (first.file, first.length, first.mem)]
        assert runs() is first
        assert not any(a.flags.writeable for a in (first.file, first.length, first.mem))
        with pytest.raises(ValueError, match="read-only"):
            first.file[0] = 0
        got = {}
        for cls, name in ((mpi.File, path), (MPI.File, theirs)):
            fh = cls.Open(comm, name, MPI.MODE_RDWR)
            fh.Set_view(DISP, MPI.INT, ft)
            if cls is mpi.File:  # (the checked view kept: the very object made above)
                assert fh._view is view
            fh.Write_at(0, [buf, MPI.INT])
            fh.Write_all([buf, MPI.INT])
            fh.Iwrite_at(0, [buf, MPI.INT]).Wait()
            fh.Iwrite_at_all(0, [buf, MPI.INT]).Wait()
            fh.Sync()
            out = [np.zeros(INTS, np.int32) for _ in range(3)]
            fh.Read_at(0, [out[0], MPI.INT])
            fh.Read_at_all(0, [out[1], MPI.INT])
            fh.Iread_at(0, [out[2], MPI.INT]).Wait()
            fh.Close()
            got[cls] = out
        for out in got.values():
            for o in out:
                assert np.array_equal(o, buf)
        assert runs() is first  # (the file's calls found this very object)
        for a, b in zip((first.file, first.length, first.mem), copy, strict=True):
            assert np.array_equal(a, b)
    finally:
        own.Free()
        ft.Free()
    comm.Barrier()
    if comm.rank == 0:
        with open(path, "rb") as a, open(theirs, "rb") as b:
            assert a.read() == b.read()
