"""A training loop that checkpoints every few steps in the background, then a restart on
another rank count.

    mpiexec -n 4 python examples/checkpoint_loop.py [DIR]    # checkpoints go to DIR (default: .)

Each rank holds row shards of the "model" (a weight matrix and its optimizer moment)
and a replicated bias and step counter.  Every ``EVERY`` steps the loop calls
``async_save``, which returns once the state is copied, and goes on computing (and
changing its arrays) while the checkpoint is written, checksummed and committed in a
background thread; the next save waits for the previous one.  The restart runs on
fewer ranks (the first ``size - 1``, a job of its own in practice) with another
decomposition, loads the last checkpoint and checks it against a replay of the steps.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import collio.checkpoint as ckpt
from collio import layouts

SHAPE = (512, 256)  # the weight matrix, float32
STEPS, EVERY = 9, 3


def weights(rows: slice, step: int) -> np.ndarray:
    """The weights after ``step`` updates (the loop's update has this closed form)."""
    r = np.arange(rows.start, rows.stop, dtype=np.float32)[:, None]
    c = np.arange(SHAPE[1], dtype=np.float32)[None, :]
    return (r * SHAPE[1] + c) * np.float32(0.5) ** step


def train(comm: MPI.Intracomm, directory: str) -> str:
    """Collective over `comm`: run the loop, saving every EVERY steps; the last checkpoint."""
    lay = layouts.block(SHAPE, "f4", comm=comm, grid=(comm.size, 1))  # row shards
    w = weights(lay.slices[0], 0)
    moment = np.zeros_like(w)
    bias = np.zeros(SHAPE[1], np.float32)
    handle, path = None, ""
    for step in range(1, STEPS + 1):
        w *= np.float32(0.5)  # "training": every array changes at every step
        moment += 1.0
        bias += 1.0
        if step % EVERY == 0:
            path = os.path.join(directory, f"step{step}.ckpt")
            state = {"model": {"w": (w, lay)}, "optim": {"m": (moment, lay)}, "bias": bias}
            handle = ckpt.async_save(path, state, comm=comm, metadata={"step": step})
    assert handle is not None
    handle.wait()  # durable and committed
    return path


def restart(comm: MPI.Intracomm, path: str) -> int:
    """Collective over `comm`: load the checkpoint in column blocks and check it."""
    step = int(ckpt.info(path).metadata["step"])
    cols = layouts.block(SHAPE, "f4", comm=comm, grid=(1, comm.size))
    state = ckpt.load(path, {"model/w": cols, "optim/m": cols, "bias": None}, comm=comm)
    np.testing.assert_array_equal(state["model/w"], weights(slice(0, SHAPE[0]), step)[cols.slices])
    np.testing.assert_array_equal(state["optim/m"], np.full(cols.shape, step, np.float32))
    np.testing.assert_array_equal(state["bias"], np.full(SHAPE[1], step, np.float32))
    return step


def main(comm: MPI.Intracomm = MPI.COMM_WORLD, directory: str = ".") -> None:
    path = train(comm, directory)
    fewer = max(1, comm.size - 1)  # the restart's ranks
    sub = comm.Split(0 if comm.rank < fewer else MPI.UNDEFINED, comm.rank)
    step = 0
    failed: Exception | None = None
    if sub != MPI.COMM_NULL:
        try:
            step = restart(sub, path)
        except Exception as exc:  # (raised on every rank of sub: collio agrees errors)
            failed = exc
        finally:
            sub.Free()
    # the ranks left out of the restart learn its outcome too, instead of waiting in a
    # collective of comm that the failed ranks never reach
    if comm.allreduce(failed is not None, op=MPI.LOR):
        raise failed or RuntimeError("the restart failed on the other ranks")
    if comm.rank == 0:
        print(f"step {step} saved in the background by {comm.size} ranks, restored by {fewer}")


if __name__ == "__main__":
    main(directory=sys.argv[1] if len(sys.argv) > 1 else ".")
