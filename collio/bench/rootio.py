"""The "everything through rank 0" baselines: gather the global array there, or scatter it.

What a Python job does today without collective I/O: rank 0 assembles the whole
array and writes it with a serial library (h5py, boto3), or reads it and sends each
rank its piece.  Rank 0 receives each rank's piece straight into place in the
global array (one MPI datatype per rank, the layout's own file view), so the
gather costs one copy of the array on rank 0 and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..collective import Attempt, agree
from ..testing.romio import filetype
from .apis import Job

__all__ = ["gather_whole", "read_on_root", "scatter_whole"]

_TAG = 0x4B1


def _raw(arr: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    return arr.reshape(-1).view(np.uint8)


def _exchange(job: Job, whole: npt.NDArray[Any] | None, receive: bool) -> None:
    """On rank 0: one request per other rank with a piece, through its layout's datatype."""
    comm, work = job.comm, job.work
    assert whole is not None
    raw = _raw(whole)
    reqs: list[MPI.Request] = []
    types: list[MPI.Datatype] = []
    try:
        for r in range(1, comm.size):
            lay = work.layout(r)
            if lay.nbytes == 0:
                continue
            et, ft, disp = filetype(lay, comm)
            types += [et, ft]
            msg = [raw[disp:], 1, ft]
            reqs.append(comm.Irecv(msg, r, _TAG) if receive else comm.Isend(msg, r, _TAG))
        MPI.Request.Waitall(reqs)
    finally:
        for t in types:
            t.Free()


def gather_whole(job: Job) -> npt.NDArray[Any] | None:
    """Collective over ``job.comm``: the global array on rank 0 (None elsewhere)."""
    comm, work = job.comm, job.work
    whole = None
    step = Attempt()
    if comm.rank == 0:
        with step:  # (the whole array may not fit: say so on every rank, nobody hangs)
            whole = np.empty(work.shape, work.dtype)
            whole[work.where(0)] = job.data
    agree(comm, step.error, what="gather to rank 0")
    if comm.rank != 0:
        if job.data.size:
            comm.Send([_raw(job.data), MPI.BYTE], 0, _TAG)
        return None
    _exchange(job, whole, receive=True)
    return whole


def scatter_whole(job: Job, whole: npt.NDArray[Any] | None) -> None:
    """Collective over ``job.comm``: every rank's piece of rank 0's ``whole`` into ``job.out``."""
    comm, work = job.comm, job.work
    if comm.rank != 0:
        if job.out.size:
            comm.Recv([_raw(job.out), MPI.BYTE], 0, _TAG)
        return
    assert whole is not None
    job.out[...] = work.piece(whole, 0)
    _exchange(job, whole, receive=False)


def read_on_root(job: Job, read: Callable[[], npt.NDArray[Any]], what: str) -> None:
    """Collective over ``job.comm``: rank 0 reads the whole array, all agree, then it scatters."""
    whole = None
    step = Attempt()
    if job.comm.rank == 0:
        with step:
            whole = read()
    agree(job.comm, step.error, what=what)
    scatter_whole(job, whole)
