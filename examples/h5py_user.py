"""An h5py user's parallel HDF5 file with the serial h5py wheel: ``collio.h5``.

    mpiexec -n 4 python examples/h5py_user.py [DIR]     # its files go to DIR (default: .)

Every rank makes the same metadata calls (groups, attributes, datasets), as with parallel
HDF5; the raw data goes through collio's two-phase writes.  Afterwards stock h5py (on
rank 0, after the file is closed) reads the file like any other.
"""

from __future__ import annotations

import os
import sys

import h5py
import numpy as np
from mpi4py import MPI

import collio.h5
from collio import layouts

SHAPE = (512, 384)


def main(comm: MPI.Intracomm = MPI.COMM_WORLD, directory: str = ".") -> None:
    path = os.path.join(directory, "run.h5")
    truth = np.arange(SHAPE[0] * SHAPE[1], dtype="f8").reshape(SHAPE)  # for the check

    cols = layouts.block(SHAPE, "f8", comm=comm, grid=(1, comm.size))  # column blocks
    local = truth[cols.slices]
    with collio.h5.File(path, "w", comm=comm) as f:  # h5py.File(..., driver="collio")
        run = f.create_group("run")  # metadata: the same calls on every rank
        run.attrs["step"] = 7
        x = collio.h5.create_dataset(run, "x", SHAPE, "f8")  # contiguous
        collio.h5.write_all(x, local, cols)  # collective
        z = collio.h5.create_dataset(
            run, "z", SHAPE, "f8", chunks=(64, 64), compression="gzip", shuffle=True
        )
        collio.h5.collective(z)[cols.slices] = local  # h5py-style indexing, collective
        rows = layouts.block(SHAPE, "f8", comm=comm, grid=(comm.size, 1))  # another decomposition
        np.testing.assert_array_equal(collio.h5.read_all(z, rows), truth[rows.slices])
    # leaving the block closed the file on every rank: metadata written, fsynced

    if comm.rank == 0:
        with h5py.File(path, "r") as f:  # stock h5py, nothing of collio
            assert f["run"].attrs["step"] == 7
            np.testing.assert_array_equal(f["run/x"][...], truth)
            np.testing.assert_array_equal(f["run/z"][...], truth)
            assert f["run/z"].compression == "gzip"
        print(f"{path}: /run/x and gzip /run/z written by {comm.size} ranks, read by h5py")
    comm.Barrier()


if __name__ == "__main__":
    main(directory=sys.argv[1] if len(sys.argv) > 1 else ".")
