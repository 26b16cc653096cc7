"""Fixtures for tests run under mpiexec with pytest-mpi (``--with-mpi``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from mpi4py import MPI


@pytest.fixture
def comm() -> MPI.Comm:
    return MPI.COMM_WORLD


@pytest.fixture
def shared_dir(comm: MPI.Comm) -> Iterator[str]:
    """A temporary directory chosen by rank 0 and seen by every rank."""
    path = tempfile.mkdtemp(prefix="collio-") if comm.rank == 0 else None
    path = comm.bcast(path, root=0)
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shared_path(shared_dir: str) -> str:
    return os.path.join(shared_dir, "target.bin")
