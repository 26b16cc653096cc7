"""Opening a file that the open makes nothing of ('r', 'r+' without ``create``): one
agreement after the head instead of a broadcast and an agreement.

Rank 0 checks the target while every rank opens the same name; one allreduce agrees
that nothing failed, that every rank's name is rank 0's and on rank 0's size.  When it
finds otherwise, the open goes the general way (rank 0's name broadcast, every rank
opens it), so its errors stay what they were.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import raises_everywhere
from mpi4py import MPI

import collio
from collio.backends import fileopen
from collio.layouts import Subarray

N = 24  # float64 per rank


def _layout(comm: MPI.Comm) -> Subarray:
    return Subarray((N * comm.size,), (N * comm.rank,), (N,), "<f8")


def _romio_file(comm: MPI.Comm, path: str, data: np.ndarray) -> None:
    """The whole ``data`` written by ROMIO, each rank its block."""
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    fh.Write_at_all(comm.rank * N * 8, data[comm.rank * N : (comm.rank + 1) * N])
    fh.Close()


def _romio_read(comm: MPI.Comm, path: str, n: int) -> np.ndarray:
    out = np.empty(n, "<f8")
    fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
    fh.Read_at_all(0, out)
    fh.Close()
    return out


@pytest.fixture
def taken(monkeypatch):
    """Whether each open on this rank took the one agreement (True) or the general way."""
    seen: list[bool] = []
    real = fileopen._open_existing

    def spy(*args):
        got = real(*args)
        seen.append(got is not None)
        return got

    monkeypatch.setattr(fileopen, "_open_existing", spy)
    return seen


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_read_then_update_an_existing_file(comm, mpi_tmp_path, taken):
    path = str(mpi_tmp_path / "a.bin")
    total = N * comm.size
    want = np.arange(total, dtype="<f8") * 1.5 + 7
    _romio_file(comm, path, want)
    with collio.open(path, "r", comm=comm) as f:
        assert f._ctx.backend.opened_size == total * 8  # (rank 0's, agreed)
        got = f.read_all(_layout(comm))
    assert got.tobytes() == want[comm.rank * N : (comm.rank + 1) * N].tobytes()
    new = np.arange(N, dtype="<f8") - 100.0 * (comm.rank + 1)
    with collio.open(path, "r+", comm=comm) as f:
        f.write_all(new, _layout(comm))
    want = want.reshape(comm.size, N).copy()
    want[comm.rank] = new
    want = np.concatenate(comm.allgather(want[comm.rank]))
    assert _romio_read(comm, path, total).tobytes() == want.tobytes()
    with open(path, "rb") as fh:
        assert fh.read() == want.tobytes()
    assert taken == [True, True]


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["r", "r+"])
def test_a_missing_file_fails_on_every_rank(comm, mpi_tmp_path, taken, mode):
    path = str(mpi_tmp_path / "none.bin")
    err = raises_everywhere(comm, collio.BackendError, lambda: collio.open(path, mode, comm=comm))
    assert f"rank 0: no such file: {path!r}" in str(err)
    assert not os.path.exists(path)
    assert taken == [False]
    ok = str(mpi_tmp_path / "ok.bin")
    mine = np.arange(N, dtype="<f8") + 1000.0 * comm.rank
    with collio.open(ok, "w", comm=comm) as f:  # (still works)
        f.write_all(mine, _layout(comm))
    want = np.concatenate(comm.allgather(mine))
    assert _romio_read(comm, ok, N * comm.size).tobytes() == want.tobytes()
