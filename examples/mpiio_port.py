"""An mpi4py MPI-IO program ported to collio: the file view and buffers stay, the calls change.

    mpiexec -n 4 python examples/mpiio_port.py [DIR]     # its files go to DIR (default: .)

The program writes and reads a 2-D array distributed block-cyclically (an MPI darray)
through a file view.  Before, with mpi4py's ``MPI.File`` (ROMIO)::

    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    fh.Set_view(0, MPI.DOUBLE, filetype)
    fh.Write_all(local)
    fh.Close()
    fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
    fh.Set_view(0, MPI.DOUBLE, filetype)
    fh.Read_all(back)
    fh.Close()

After, with collio (the changed lines are marked ``# was``)::

    with collio.open(path, "w", comm=comm) as f:    # was MPI.File.Open(..., CREATE | WRONLY)
        f.set_view(0, MPI.DOUBLE, filetype)           # was fh.Set_view: same arguments
        f.write_all(local)                            # was fh.Write_all: same buffer
    with collio.open(path, "r", comm=comm) as f:    # was MPI.File.Open(..., RDONLY)
        f.set_view(0, MPI.DOUBLE, filetype)
        f.read_all(back)                              # was fh.Read_all: fills back in place

Both run here, into two files, which must hold the same bytes.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import collio

SHAPE, BLOCK = (300, 240), (16, 16)


def darray(comm: MPI.Intracomm) -> MPI.Datatype:
    """This rank's CYCLIC(16) x CYCLIC(16) filetype on a 2-D process grid."""
    grid = MPI.Compute_dims(comm.size, 2)
    dist = [MPI.DISTRIBUTE_CYCLIC] * 2
    return MPI.DOUBLE.Create_darray(comm.size, comm.rank, SHAPE, dist, BLOCK, grid).Commit()


def with_mpi4py(comm: MPI.Intracomm, path: str, ft: MPI.Datatype, local: np.ndarray) -> None:
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    fh.Set_view(0, MPI.DOUBLE, ft)
    fh.Write_all(local)
    fh.Close()


def with_collio(comm: MPI.Intracomm, path: str, ft: MPI.Datatype, local: np.ndarray) -> None:
    with collio.open(path, "w", comm=comm) as f:  # was MPI.File.Open(..., CREATE | WRONLY)
        f.set_view(0, MPI.DOUBLE, ft)  # was fh.Set_view: same arguments
        f.write_all(local)  # was fh.Write_all: same buffer
    back = np.empty_like(local)
    with collio.open(path, "r", comm=comm) as f:  # was MPI.File.Open(..., RDONLY)
        f.set_view(0, MPI.DOUBLE, ft)
        f.read_all(back)  # was fh.Read_all: fills back in place
    np.testing.assert_array_equal(back, local)


def main(comm: MPI.Intracomm = MPI.COMM_WORLD, directory: str = ".") -> None:
    theirs, mine = (os.path.join(directory, name) for name in ("romio.bin", "collio.bin"))
    ft = darray(comm)
    try:  # the rank's elements, in the order the view lays them out
        local = np.random.default_rng(comm.rank).standard_normal(ft.Get_size() // 8)
        with_mpi4py(comm, theirs, ft, local)
        with_collio(comm, mine, ft, local)
    finally:
        ft.Free()
    comm.Barrier()
    if comm.rank == 0:
        with open(theirs, "rb") as a, open(mine, "rb") as b:
            assert a.read() == b.read(), "collio's file differs from ROMIO's"
        print(f"{SHAPE} block-cyclic over {comm.size} ranks: collio wrote ROMIO's bytes")
    comm.Barrier()


if __name__ == "__main__":
    main(directory=sys.argv[1] if len(sys.argv) > 1 else ".")
