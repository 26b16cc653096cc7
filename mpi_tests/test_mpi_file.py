"""collio.mpi.File against mpi4py's MPI.File (ROMIO), call by call, in the same run.

Every data access call, with a file view of every datatype constructor: the same
program runs once with each class, on two files that start as the same random bytes
(holes then keep them in both, so whole files compare, though ROMIO leaves the holes
of a new file undefined); the files and the file pointers must be the same.  Reads go
both ways: each class reads a file the other wrote, and must fill the same buffers.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import prefill
from mpi4py import MPI

from collio import mpi
from collio.testing.views import datatype_cases, type_bag

DISP = 24
AMODE = MPI.MODE_RDWR
INFO = {"cb_buffer_size": "512"}  # (a few rounds per call, in both)
#: ROMIO moves the individual pointer back when the first of two pending ``Iwrite_all``
#: (``Iread_all``) of a strided view completes last; MPI moves it when a call is made,
#: as collio does: for these, the pointer is checked against MPI's rule, not ROMIO's.
ROMIO_MOVES_BACK = ("Iwrite_all", "Iread_all")


def turns(comm, fn):
    """``fn`` on one rank after the other (shared-pointer calls land in rank order)."""
    for r in range(comm.size):
        if comm.rank == r:
            fn()
        comm.Barrier()


def wait_all(reqs):
    MPI.Request.Waitall(reqs)


def _at(op):
    return lambda fh, c, a, b, k: (getattr(fh, op)(k, a), getattr(fh, op)(k + a.n, b))


def _individual(op):
    return lambda fh, c, a, b, k: (fh.Seek(k), getattr(fh, op)(a), getattr(fh, op)(b))


def _shared(op, wait=False):
    def program(fh, c, a, b, k):
        call = (lambda x: getattr(fh, op)(x).Wait()) if wait else getattr(fh, op)
        fh.Seek_shared(k)
        turns(c, lambda: call(a))
        turns(c, lambda: call(b))

    return program


def _ordered(op):
    return lambda fh, c, a, b, k: (fh.Seek_shared(k), getattr(fh, op)(a), getattr(fh, op)(b))


def _i_at(op):
    """Two pending calls, completed by one MPI.Request.Waitall."""
    return lambda fh, c, a, b, k: wait_all([getattr(fh, op)(k, a), getattr(fh, op)(k + a.n, b)])


def _i_individual(op):
    """Each request waited for before the next call."""
    return lambda fh, c, a, b, k: (
        fh.Seek(k), getattr(fh, op)(a).Wait(), getattr(fh, op)(b).Wait()
    )  # fmt: skip


def _i_all(op):
    """Two pending collectives on the individual pointer, then one MPI.Request.Waitall."""
    return lambda fh, c, a, b, k: (fh.Seek(k), wait_all([getattr(fh, op)(a), getattr(fh, op)(b)]))


def _i_at_all(op):
    return lambda fh, c, a, b, k: (
        getattr(fh, op)(k, a).Wait(), getattr(fh, op)(k + a.n, b).Wait()
    )  # fmt: skip


def _split(op):
    """``X_begin`` then ``X_end`` for each part; from the pointer ``X`` uses."""
    base = op[: -len("_begin")]
    explicit, shared = "_at_" in op, "ordered" in op

    def program(fh, c, a, b, k):
        (fh.Seek_shared if shared else fh.Seek)(k)
        for part, off in ((a, k), (b, k + a.n)):
            getattr(fh, op)(*((off, part) if explicit else (part,)))
            getattr(fh, base + "_end")(part)

    return program


#: Each program gets (fh, comm, a, b, k): the two parts of the rank's data, accessed from
#: etype k (k = 1) one after the other; ``W`` and ``w`` are ``Write``/``write`` or
#: ``Read``/``read``.
PROGRAMS = {
    "{W}_at": _at, "{W}": _individual, "{W}_shared": _shared, "{W}_all": _individual,
    "{W}_at_all": _at, "{W}_ordered": _ordered, "I{w}_at": _i_at, "I{w}": _i_individual,
    "I{w}_shared": lambda op: _shared(op, wait=True), "I{w}_all": _i_all,
    "I{w}_at_all": _i_at_all, "{W}_all_begin": _split, "{W}_at_all_begin": _split,
    "{W}_ordered_begin": _split,
}  # fmt: skip


def _programs(upper, lower):
    return {
        p.format(W=upper, w=lower): kind(p.format(W=upper, w=lower)) for p, kind in PROGRAMS.items()
    }


WRITES = _programs("Write", "write")
READS = _programs("Read", "read")


class Part(np.ndarray):
    """A buffer that knows how many etypes it holds (``.n``)."""


def halves(buf: np.ndarray, esize: int) -> tuple[Part, Part]:
    cut = (len(buf) // esize // 3) * esize
    out = []
    for piece in (buf[:cut], buf[cut:]):
        p = piece.view(Part)
        p.n = len(piece) // esize
        out.append(p)
    return out[0], out[1]


def span(ft, nbytes, disp=DISP):
    """A bound on the end of the bytes a view touches (shared pointers: every rank's)."""
    tiles = -(-nbytes // max(ft.Get_size(), 1)) * 2 + 2
    lb, extent = ft.Get_extent()
    tlb, text = ft.Get_true_extent()
    return disp + tiles * extent + abs(lb) + tlb + text + 64


def run(cls, comm, path, et, ft, program, a, b):
    """Open with ``cls``, set the view, run the program; the pointers after it."""
    info = MPI.Info.Create(INFO)
    try:
        fh = cls.Open(comm, path, AMODE, info)
    finally:
        info.Free()
    try:
        fh.Set_view(DISP, et, ft)
        program(fh, comm, a, b, 1)
        return fh.Get_position(), fh.Get_position_shared()
    finally:
        fh.Close()


def read(path):
    with open(path, "rb") as fh:
        return fh.read()


def case_data(comm, et, ft):
    esize = et.Get_size()
    n_et = (ft.Get_size() // esize) * 5 // 2  # two and a half filetypes
    rng = np.random.default_rng(comm.rank + 1)
    return rng.integers(0, 256, n_et * esize, dtype=np.uint8), esize


@pytest.mark.mpi
@pytest.mark.parametrize("call", list(WRITES))
def test_writes_the_bytes_romio_writes(comm, mpi_tmp_path, call):
    mine, theirs = str(mpi_tmp_path / "collio.bin"), str(mpi_tmp_path / "romio.bin")
    with type_bag() as t:
        for name, et, ft in datatype_cases(t, comm.rank, comm.size):
            buf, esize = case_data(comm, et, ft)
            a, b = halves(buf, esize)
            prefill(comm, [mine, theirs], comm.size * span(ft, buf.nbytes))
            got = run(mpi.File, comm, mine, et, ft, WRITES[call], a, b)
            want = run(MPI.File, comm, theirs, et, ft, WRITES[call], a, b)
            if call in ROMIO_MOVES_BACK:
                want = (1 + a.n + b.n, want[1])
            assert got == want, f"{call} {name}: pointers {got} != ROMIO's {want}"
            comm.Barrier()
            assert read(mine) == read(theirs), f"{call} {name}: collio and ROMIO files differ"


@pytest.mark.mpi
@pytest.mark.parametrize("writer", ["romio", "collio"])
@pytest.mark.parametrize("call", list(READS))
def test_reads_what_the_other_wrote(comm, mpi_tmp_path, call, writer):
    path = str(mpi_tmp_path / "data.bin")
    source = {"romio": MPI.File, "collio": mpi.File}[writer]
    with type_bag() as t:
        for name, et, ft in datatype_cases(t, comm.rank, comm.size):
            buf, esize = case_data(comm, et, ft)
            prefill(comm, [path], comm.size * span(ft, buf.nbytes))
            # written the way it is read: shared-pointer data lies where shared writes put it
            writer_call = call.replace("Read", "Write").replace("read", "write")
            run(source, comm, path, et, ft, WRITES[writer_call], *halves(buf, esize))
            got = {}
            for cls in (mpi.File, MPI.File):
                out = np.zeros_like(buf)
                a, b = halves(out, esize)
                pointers = run(cls, comm, path, et, ft, READS[call], a, b)
                got[cls] = (out, pointers)
            ours, romio = got[mpi.File], got[MPI.File]
            if call in ROMIO_MOVES_BACK:
                romio = (romio[0], (1 + len(buf) // esize, romio[1][1]))
            assert ours[1] == romio[1], f"{call} {name}: pointers {ours[1]} != ROMIO's {romio[1]}"
            np.testing.assert_array_equal(romio[0], buf, err_msg=f"ROMIO {call} {name}")
            np.testing.assert_array_equal(ours[0], buf, err_msg=f"collio {call} {name}")


@pytest.mark.mpi
@pytest.mark.parametrize("call", ["Write_at", "Write_all", "Write_ordered", "Iwrite_all"])
def test_comm_self_files(comm, mpi_tmp_path, call):
    """Each rank opens its own file on COMM_SELF (a job of one rank per file)."""
    mine = str(mpi_tmp_path / f"collio-{comm.rank}.bin")
    theirs = str(mpi_tmp_path / f"romio-{comm.rank}.bin")
    with type_bag() as t:
        for name, et, ft in datatype_cases(t, 0, 1):
            buf, esize = case_data(comm, et, ft)
            a, b = halves(buf, esize)
            prefill(MPI.COMM_SELF, [mine, theirs], span(ft, buf.nbytes))
            got = run(mpi.File, MPI.COMM_SELF, mine, et, ft, WRITES[call], a, b)
            want = run(MPI.File, MPI.COMM_SELF, theirs, et, ft, WRITES[call], a, b)
            assert got == want, f"{call} {name}"
            assert read(mine) == read(theirs), f"{call} {name}: collio and ROMIO files differ"
            back = np.zeros_like(buf)
            reader = READS[call.replace("Write", "Read").replace("write", "read")]
            run(mpi.File, MPI.COMM_SELF, theirs, et, ft, reader, *halves(back, esize))
            np.testing.assert_array_equal(back, buf, err_msg=f"{call} {name}")
