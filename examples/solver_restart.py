"""A solver's checkpoint: write a 2-D field from every rank, restart it on another rank count.

    mpiexec -n 4 python examples/solver_restart.py [DIR]     # its files go to DIR (default: .)

The "solver" holds its piece of a 2-D field on a process grid (MPI_Dims_create, as
``layouts.block`` does by default) and writes a checkpoint after some steps: one file,
the field in C order, as if one process had written it.  The restart runs on fewer ranks
(here the first ``size - 1`` of them, in a job of its own in practice) with another
decomposition (row blocks), reads its pieces and checks them against the formula.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import collio
from collio import layouts

SHAPE = (600, 800)  # 3.7 MiB of float64


def field(lay: layouts.Subarray, t: float) -> np.ndarray:
    """The solution on this rank's box at time ``t`` (a decaying mode of the heat equation)."""
    y = (np.arange(lay.start[0], lay.start[0] + lay.shape[0]) + 0.5) / SHAPE[0]
    x = (np.arange(lay.start[1], lay.start[1] + lay.shape[1]) + 0.5) / SHAPE[1]
    decay = np.exp(-2 * np.pi**2 * t)
    return decay * np.outer(np.sin(np.pi * y), np.sin(2 * np.pi * x))


def checkpoint(comm: MPI.Intracomm, path: str, t: float) -> None:
    """Collective over `comm`: every rank writes its box of the field at time ``t``."""
    lay = layouts.block(SHAPE, "f8", comm=comm)  # this rank's box on a 2-D process grid
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(field(lay, t), lay)
        f.sync()  # durable when it returns


def restart(comm: MPI.Intracomm, path: str, t: float) -> None:
    """Collective over `comm`: read the checkpoint in row blocks and check it."""
    lay = layouts.block(SHAPE, "f8", comm=comm, grid=(comm.size, 1))
    with collio.open(path, "r", comm=comm) as f:
        piece = f.read_all(lay)
    np.testing.assert_array_equal(piece, field(lay, t))


def main(comm: MPI.Intracomm = MPI.COMM_WORLD, directory: str = ".") -> None:
    path = os.path.join(directory, "checkpoint.bin")

    checkpoint(comm, path, t=0.01)

    fewer = max(1, comm.size - 1)  # the restart's ranks
    sub = comm.Split(0 if comm.rank < fewer else MPI.UNDEFINED, comm.rank)
    failed: Exception | None = None
    if sub != MPI.COMM_NULL:
        try:
            restart(sub, path, t=0.01)
        except Exception as exc:  # (raised on every rank of sub: collio agrees errors)
            failed = exc
        finally:
            sub.Free()
    # the ranks left out of the restart learn its outcome too, instead of waiting in a
    # collective of comm that the failed ranks never reach
    if comm.allreduce(failed is not None, op=MPI.LOR):
        raise failed or RuntimeError("the restart failed on the other ranks")
    if comm.rank == 0:
        print(f"checkpoint of {SHAPE} written by {comm.size} ranks, read back by {fewer}")


if __name__ == "__main__":
    main(directory=sys.argv[1] if len(sys.argv) > 1 else ".")
