"""Fixtures for the tests run under mpiexec with pytest-mpi (``--with-mpi``).

Temporary paths every rank sees come from pytest-mpi's ``mpi_tmp_path``.
"""

from __future__ import annotations

import pytest
from mpi4py import MPI


@pytest.fixture
def comm() -> MPI.Intracomm:
    return MPI.COMM_WORLD
