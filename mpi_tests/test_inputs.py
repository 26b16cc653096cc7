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


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["numpy-scalar", "list"])
def test_load_into_what_numpy_copies(comm: MPI.Intracomm, mpi_tmp_path: Any, kind: str) -> None:
    """A numpy scalar or a list as the array to load into: numpy converts it to a new array,
    and the load filled that and returned the caller's object as it was (a scalar 0.0 for
    a stored 5.0); now the same error on every rank.  A 0-d array loads in place."""
    path = _path(comm, mpi_tmp_path, "scalar.ckpt")
    ckpt.save(path, {"s": np.float64(5.0), "v": np.arange(3.0)}, comm=comm)
    name, obj = ("s", np.float64(0.0)) if kind == "numpy-scalar" else ("v", [0.0, 0.0, 0.0])
    raises_everywhere(
        comm, collio.LayoutError, lambda: ckpt.load(path, {name: (obj, None)}, comm=comm),
        match=f"array {name!r}: cannot load into a {type(obj).__name__}, which numpy copies",
    )  # fmt: skip
    zero_d, vec = np.zeros(()), np.zeros(3)
    got = ckpt.load(path, {"s": (zero_d, None), "v": (vec, None)}, comm=comm)
    assert got["s"] is zero_d and zero_d.tobytes() == np.float64(5.0).tobytes()
    assert got["v"] is vec and vec.tobytes() == np.arange(3.0).tobytes()
