"""Fixtures for the tests run under mpiexec with pytest-mpi (``--with-mpi``).

Temporary paths every rank sees come from pytest-mpi's ``mpi_tmp_path`` (rank 0's
``tmp_path``), which pytest removes after a test that passed (``tmp_path_retention_policy``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mpi4py import MPI


def pytest_configure(config: pytest.Config) -> None:
    """Each rank gets a base temporary directory of its own, inside one per job.

    pytest's numbered directories (``pytest-of-USER/pytest-N`` and the ``pytest-current``
    link) are made and cleaned up by every pytest process of a user; the ranks of one job
    are such processes, started together, and race on them (one unlinking the link another
    just removed).  A given ``--basetemp`` takes them out of that scheme.
    """
    if config.option.basetemp is not None:
        return
    comm = MPI.COMM_WORLD
    job = comm.bcast(os.getpid() if comm.rank == 0 else None, root=0)
    root = Path(tempfile.gettempdir()) / f"collio-tests-{os.getuid()}" / f"job-{job}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    config.option.basetemp = str(root / f"rank-{comm.rank}")
    config.stash[_JOB_ROOT] = root


_JOB_ROOT = pytest.StashKey[Path]()


def pytest_unconfigure(config: pytest.Config) -> None:
    """A job's directories go when it ends, unless a test failed (then they stay for a look)."""
    root = config.stash.get(_JOB_ROOT, None)
    if root is None or getattr(config, "_collio_failed", False):
        return
    shutil.rmtree(root / f"rank-{MPI.COMM_WORLD.rank}", ignore_errors=True)
    try:
        root.rmdir()  # (the last rank out removes the job's directory)
    except OSError:
        pass


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._collio_failed = exitstatus != 0  # type: ignore[attr-defined]


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
