"""A zarr array written from every rank, whatever the decomposition: ``backend="zarr"``.

    mpiexec -n 4 python examples/zarr_user.py [DIR]     # its files go to DIR (default: .)

Ranks whose pieces share a chunk lose data when each writes its piece with plain zarr
(zarr re-encodes whole chunks).  Through collio every chunk has exactly one writer, so any
decomposition works: here a 2-D process grid whose boxes cut through the 100 x 100 chunks.
Plain zarr reads the result.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import zarr
from mpi4py import MPI

import collio
from collio import layouts

SHAPE, CHUNKS = (1000, 700), (100, 100)


def main(comm: MPI.Intracomm = MPI.COMM_WORLD, directory: str = ".") -> None:
    path = os.path.join(directory, "field.zarr")
    truth = np.arange(SHAPE[0] * SHAPE[1], dtype="f8").reshape(SHAPE)  # for the check

    lay = layouts.block(SHAPE, "f8", comm=comm)  # boxes that do not line up with the chunks
    with collio.open(path, "w", backend="zarr", comm=comm, shape=SHAPE, dtype="f8",
                     chunks=CHUNKS, compressors=zarr.codecs.ZstdCodec(),
                     fill_value=0.0) as f:  # fmt: skip
        f.write_all(truth[lay.slices], lay)  # collective
    with collio.open(path, "r", backend="zarr", comm=comm) as f:
        np.testing.assert_array_equal(f.read_all(lay), truth[lay.slices])

    comm.Barrier()
    if comm.rank == 0:
        arr = zarr.open_array(path, mode="r")  # plain zarr, nothing of collio
        np.testing.assert_array_equal(arr[...], truth)
        print(f"{path}: {arr.nchunks} chunks of {CHUNKS}, written by {comm.size} ranks")
    comm.Barrier()


if __name__ == "__main__":
    main(directory=sys.argv[1] if len(sys.argv) > 1 else ".")
