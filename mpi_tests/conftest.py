"""Fixtures for the tests run under mpiexec with pytest-mpi (``--with-mpi``).

Temporary paths every rank sees come from pytest-mpi's ``mpi_tmp_path`` (rank 0's
``tmp_path``), which pytest removes after a test that passed (``tmp_path_retention_policy``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mpi4py import MPI


@pytest.fixture
def comm() -> MPI.Intracomm:
    return MPI.COMM_WORLD


@pytest.fixture(autouse=True)
def _ranks_leave_the_directory_together(request: pytest.FixtureRequest) -> Iterator[None]:
    """Rank 0 removes the shared directory when its test ends; the others may still be
    reading in it, so every rank waits for the rest first."""
    if "mpi_tmp_path" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("mpi_tmp_path")  # set up first, so torn down after the barrier
    yield
    MPI.COMM_WORLD.Barrier()
