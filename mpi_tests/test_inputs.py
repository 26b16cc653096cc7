"""Unusual and illegal inputs: every rank raises the same error, nothing given is changed
by a rejected call, and legal input comes back byte for byte as numpy has it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt


def _path(comm: MPI.Intracomm, tmp: Any, name: str) -> str:
    return str(comm.bcast(os.path.join(str(tmp), name), root=0))


Arr = np.ndarray[Any, Any]


def _two_arrays(comm: MPI.Intracomm, tmp: Any) -> tuple[str, Arr, Arr]:
    """A checkpoint of two replicated (6, 4) float64 arrays "a" and "b" of other values."""
    path = _path(comm, tmp, "two.ckpt")
    a, b = np.arange(24.0).reshape(6, 4), -1.5 - np.arange(24.0).reshape(6, 4)
    ckpt.save(path, {"a": a, "b": b}, comm=comm)
    return path, a, b


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["same", "overlapping", "last-rank-only"])
def test_load_into_arrays_sharing_memory(comm: MPI.Intracomm, mpi_tmp_path: Any, how: str) -> None:
    """Two arrays loaded into memory they share: one would silently hold the other's bytes
    (the load returned both, "a" holding b's values); now the same error on every rank,
    naming both, the arrays as they were; apart, both load byte for byte."""
    path, a, b = _two_arrays(comm, mpi_tmp_path)
    mem = np.full((12, 4), 7.0)
    into = {"same": (mem[:6], mem[:6]), "overlapping": (mem[:6], mem[3:9])}.get(how)
    if into is None:  # (the last rank alone passes one array twice)
        into = (mem[:6], mem[:6] if comm.rank == comm.size - 1 else mem[6:])
    spec = {"a": (into[0], None), "b": (into[1], None)}
    raises_everywhere(
        comm, collio.LayoutError, lambda: ckpt.load(path, spec, comm=comm),
        match="arrays 'a' and 'b' are loaded into arrays that share memory",
    )  # fmt: skip
    assert (mem == 7.0).all()
    got = ckpt.load(path, {"a": (mem[:6], None), "b": (mem[6:], None)}, comm=comm)
    assert got["a"].tobytes() == a.tobytes() and got["b"].tobytes() == b.tobytes()
    assert mem.tobytes() == np.concatenate([a, b]).tobytes()
