"""A parallel ``.npy`` file: every rank writes its piece, ``np.load`` reads the whole array.

    mpiexec -n 4 python examples/parallel_npy.py [DIR]     # its files go to DIR (default: .)

``collio.save_npy`` writes numpy's own header (rank 0) and every rank's piece after it,
here a block-cyclic (ScaLAPACK-style) distribution in Fortran order; ``collio.load_npy``
checks the header against each rank's layout and reads the piece, in any decomposition.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import collio
from collio import layouts

SHAPE = (500, 300)


def main(comm: MPI.Intracomm = MPI.COMM_WORLD, directory: str = ".") -> None:
    path = os.path.join(directory, "matrix.npy")
    truth = np.asfortranarray(np.arange(SHAPE[0] * SHAPE[1], dtype="<f8").reshape(SHAPE))

    grid = layouts.dims_create(comm.size, 2)
    tiles = layouts.block_cyclic(SHAPE, "<f8", block=(32, 32), grid=grid, comm=comm, order="F")
    local = np.asfortranarray(truth[np.ix_(*tiles.indices)])  # this rank's tiles, gathered
    collio.save_npy(path, local, tiles, comm=comm)  # collective

    rows = layouts.block(SHAPE, "<f8", comm=comm, grid=(comm.size, 1), order="F")
    np.testing.assert_array_equal(collio.load_npy(path, rows, comm=comm), truth[rows.slices])

    if comm.rank == 0:
        whole = np.load(path, mmap_mode="r")  # numpy, nothing of collio
        assert whole.flags.f_contiguous and whole.shape == SHAPE
        np.testing.assert_array_equal(whole, truth)
        print(f"{path}: {SHAPE} float64, Fortran order, written by {comm.size} ranks")
        del whole
    comm.Barrier()


if __name__ == "__main__":
    main(directory=sys.argv[1] if len(sys.argv) > 1 else ".")
