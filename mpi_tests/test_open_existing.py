"""Opening a file that the open makes nothing of ('r', 'r+' without ``create``): no
agreement but the open's head, instead of a broadcast and an agreement.

Rank 0 checks the target while every rank opens the same name, before the head, which
agrees that nothing failed, that every rank's name is rank 0's and on rank 0's size,
together with the open's arguments.  When it finds otherwise, the open goes the general
way (rank 0's name broadcast, every rank opens it), so its errors stay what they were,
and no descriptor of the early opens is left behind.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers import raises_everywhere
from mpi4py import MPI

import collio
from collio import mpi
from collio.backends import fileopen, posix
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
    """Whether each open on this rank used its early open (True) or went the general way."""
    seen: list[bool] = []
    real = fileopen.Early.agreed

    def spy(self, out):
        real(self, out)
        seen.append(self.route == "early")

    monkeypatch.setattr(fileopen.Early, "agreed", spy)
    return seen


def _fds(path: str) -> int:
    """This process's descriptors of ``path``."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:  # (the listing's own descriptor, closed since)
            pass
    return n


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


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_a_rank_failing_its_early_open_fails_on_every_rank(comm, mpi_tmp_path, taken, monkeypatch):
    """The last rank cannot open the file (refused to it alone): every rank learns it in
    the head, closes its early descriptor and goes the general way, where every rank
    raises the same error naming that rank; the file opens once it can."""
    path = str(comm.bcast(str(mpi_tmp_path / "a.bin"), root=0))
    want = np.arange(N * comm.size, dtype="<f8") * 3.0
    _romio_file(comm, path, want)
    last = comm.rank == comm.size - 1
    real = fileopen.open_regular

    def refused(name, flags):
        raise PermissionError(13, "Permission denied", name)

    if last:
        monkeypatch.setattr(fileopen, "open_regular", refused)
    before = _fds(path)
    err = raises_everywhere(comm, collio.BackendError, lambda: collio.open(path, "r", comm=comm))
    left = _fds(path) - before
    monkeypatch.setattr(fileopen, "open_regular", real)
    assert f"rank {comm.size - 1}" in str(err) and "ermission denied" in str(err)
    with collio.open(path, "r", comm=comm) as f:
        got = f.read_all(_layout(comm))
    assert comm.allgather((left, taken, got.tobytes())) == [
        (0, [False, True], want[q * N : (q + 1) * N].tobytes()) for q in range(comm.size)
    ]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_an_early_open_failing_once_goes_the_general_way(comm, mpi_tmp_path, taken, monkeypatch):
    """The last rank's early open fails once (a transient refusal): every rank closes its
    early descriptor and opens the general way, which succeeds; the file reads ROMIO's
    bytes, and each rank holds one descriptor of it, the backend's."""
    path = str(comm.bcast(str(mpi_tmp_path / "a.bin"), root=0))
    want = np.arange(N * comm.size, dtype="<f8") - 5.0
    _romio_file(comm, path, want)
    real = fileopen.open_regular
    refusals = [1 if comm.rank == comm.size - 1 else 0]

    def once(name, flags):
        if refusals[0]:
            refusals[0] = 0
            raise PermissionError(13, "Permission denied", name)
        return real(name, flags)

    monkeypatch.setattr(fileopen, "open_regular", once)
    before = _fds(path)
    with collio.open(path, "r", comm=comm) as f:
        held = _fds(path) - before
        got = f.read_all(_layout(comm))
    left = _fds(path) - before
    assert comm.allgather((held, left, taken, got.tobytes())) == [
        (1, 0, [False], want[q * N : (q + 1) * N].tobytes()) for q in range(comm.size)
    ]


def _on_rank0_after_the_others_opened(comm, monkeypatch, act):
    """Rank 0 runs ``act`` once every other rank made its early open (and before its
    own), as a rank 0 that changes the file just before its open can find it."""
    side = comm.Dup()
    real = posix.early_open

    def early(*args):
        if comm.rank == 0:
            for q in range(1, comm.size):
                side.recv(source=q)
            act()
            return real(*args)
        got = real(*args)
        side.send(None, dest=0)
        return got

    monkeypatch.setattr(posix, "early_open", early)
    return side


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["r", "r+"])
def test_a_file_replaced_by_rank_0_before_its_open_is_the_one_opened(
    comm, mpi_tmp_path, taken, monkeypatch, mode
):
    """Rank 0 replaces the file (a new one renamed over it) after the other ranks made
    their early open of the old one: the ranks find different files, every rank opens
    the new one the general way, reads rank 0's new bytes and writes into it."""
    path = str(comm.bcast(str(mpi_tmp_path / "a.bin"), root=0))
    old = np.zeros(N * comm.size, "<f8")
    new = np.arange(N * comm.size, dtype="<f8") + 0.5
    _romio_file(comm, path, old)

    def replace():
        with open(path + ".new", "wb") as fh:
            fh.write(new.tobytes())
        os.replace(path + ".new", path)

    side = _on_rank0_after_the_others_opened(comm, monkeypatch, replace)
    mine = np.arange(N, dtype="<f8") * -1.0 - comm.rank
    try:
        with collio.open(path, mode, comm=comm) as f:
            got = f.read_all(_layout(comm))
            if mode == "r+":
                f.write_all(mine, _layout(comm))
    finally:
        side.Free()
    want = np.concatenate(comm.allgather(mine)) if mode == "r+" else new
    blk = slice(comm.rank * N, (comm.rank + 1) * N)
    ok = (taken, got.tobytes() == new[blk].tobytes())
    assert comm.allgather(ok) == [([False], True)] * comm.size
    assert _romio_read(comm, path, N * comm.size).tobytes() == want.tobytes()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_append_pointers_start_at_the_size_every_rank_wrote_before_open(comm, mpi_tmp_path):
    """MPI.File.Open with MODE_APPEND after the last rank appended to the file on its own,
    while rank 0 was already in its open: every rank's pointer starts at the end of
    those bytes (the size is read after the open's head, never before)."""
    path = str(comm.bcast(str(mpi_tmp_path / "a.bin"), root=0))
    # (a first open: collio's duplicate of the communicator, made at the first open
    # on it, would hold rank 0 until every rank is in the open)
    mpi.File.Open(comm, path, MPI.MODE_WRONLY | MPI.MODE_CREATE).Close()
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(bytes(100))
    comm.Barrier()
    if comm.rank == comm.size - 1:
        time.sleep(0.3)  # (rank 0 is in its open by then)
        with open(path, "ab") as fh:
            fh.write(bytes(28))
    fh = mpi.File.Open(comm, path, MPI.MODE_WRONLY | MPI.MODE_APPEND)
    try:
        at = fh.Get_position()
    finally:
        fh.Close()
    assert comm.allgather(at) == [128] * comm.size


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60)
def test_create_asked_by_one_rank_alone_is_a_mismatch_on_every_rank(comm, mpi_tmp_path):
    """``create`` decides what rank 0 does to the target (as ``MPI_MODE_CREATE`` in an
    amode every rank passes alike): given by one rank alone, every rank raises the same
    MismatchError naming it, with or without the file there, and nothing is made or
    changed (rank 0 alone used to decide, and the others' option was never looked at)."""
    path = str(comm.bcast(str(mpi_tmp_path / "a.bin"), root=0))
    for asker, exists in ((0, True), (comm.size - 1, False)):
        if exists:
            _romio_file(comm, path, np.zeros(N * comm.size, "<f8"))
        opts = {"create": True} if comm.rank == asker else {}
        err = raises_everywhere(
            comm, collio.MismatchError, lambda opts=opts: collio.open(path, "r+", comm=comm, **opts)
        )
        if asker:
            assert f"rank {asker}: open arguments" in str(err) and "('create', True)" in str(err)
        else:
            assert "rank 1: open arguments" in str(err) and "('create', False)" in str(err)
        assert os.path.exists(path) is exists
        if exists:
            assert _romio_read(comm, path, N * comm.size).tobytes() == bytes(8 * N * comm.size)
            comm.Barrier()
            if comm.rank == 0:
                os.unlink(path)
            comm.Barrier()


@pytest.mark.mpi
@pytest.mark.timeout(60)
@pytest.mark.parametrize("declining", ["all", "rank 0"])
def test_ranks_off_a_local_file_system_open_after_the_head(
    comm, mpi_tmp_path, taken, monkeypatch, declining
):
    """A rank that cannot tell its file system is a local one declines its early open:
    every rank declining opens after the head (one agreement more, as before), some
    declining go the general way; both read ROMIO's bytes and write into the file."""
    path = str(comm.bcast(str(mpi_tmp_path / "a.bin"), root=0))
    old = np.arange(N * comm.size, dtype="<f8") * 0.25
    _romio_file(comm, path, old)
    if declining == "all" or comm.rank == 0:
        monkeypatch.setattr(fileopen, "fs_name", lambda fd: None)
    after: list[bool] = []
    real = fileopen._open_existing

    def spy(*args):
        got = real(*args)
        after.append(got is not None)
        return got

    monkeypatch.setattr(fileopen, "_open_existing", spy)
    mine = np.arange(N, dtype="<f8") + 0.5 * comm.rank
    with collio.open(path, "r+", comm=comm) as f:
        got = f.read_all(_layout(comm))
        f.write_all(mine, _layout(comm))
    blk = slice(comm.rank * N, (comm.rank + 1) * N)
    want_after = [True] if declining == "all" or comm.size == 1 else []
    ok = (taken, after == want_after, got.tobytes() == old[blk].tobytes())
    assert comm.allgather(ok) == [([False], True, True)] * comm.size
    want = np.concatenate(comm.allgather(mine))
    assert _romio_read(comm, path, N * comm.size).tobytes() == want.tobytes()


@pytest.mark.mpi(min_size=2)
def test_hints_that_differ_on_one_rank_are_named_by_what_was_given(comm, mpi_tmp_path):
    """The mismatch names each rank's hints by the ones given other values than the
    defaults, not every hint twice per rank (a message pages long at a few ranks)."""
    path = str(comm.bcast(str(mpi_tmp_path / "h.bin"), root=0))
    last = comm.rank == comm.size - 1
    hints = {"cb_buffer_size": "4m"} if last else None
    err = raises_everywhere(
        comm, collio.MismatchError, lambda: collio.open(path, "w", comm=comm, hints=hints)
    )
    want = (f"rank {comm.size - 1}: open arguments ('w', {{'cb_buffer_size': 4194304}}, "
            f"'posix', {path!r}) differs from rank 0's open arguments ('w', {{}}, 'posix', "
            f"{path!r})")  # fmt: skip
    assert str(err) == f"open: {want}", str(err)
    assert os.listdir(mpi_tmp_path) == []
