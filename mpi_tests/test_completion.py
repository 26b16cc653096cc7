"""Completion: sync and close agree on errors; close always agrees, even with nothing to do.

A rank that closed without an agreement (once the ranks had synced) would leave the
others waiting forever in their next call on the file; since every close agrees, a
rank closing alone meets the others' call there and every rank raises the same
``MismatchError`` (more pairs of calls in ``test_mismatch.py``).
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from helpers import local_piece, raises_everywhere, reference

import collio
from collio import layouts
from collio.backends import register_backend
from collio.backends.posix import PosixBackend

SHAPE = (64, 48)


class FailingSync(PosixBackend):
    """fsync fails with EIO on one rank while ``fail`` is set."""

    fail_rank = -1
    fail = False

    def sync(self) -> None:
        from mpi4py import MPI

        if FailingSync.fail and MPI.COMM_WORLD.rank == FailingSync.fail_rank and self.dirty:
            raise OSError(errno.EIO, "injected fsync error")
        super().sync()


register_backend("failing-sync", FailingSync)


@pytest.fixture
def failing_sync(comm):
    """The last rank's fsync fails (backend "failing-sync") until the test turns it off."""
    FailingSync.fail_rank, FailingSync.fail = comm.size - 1, True
    yield FailingSync
    FailingSync.fail = False


def _lay(comm):
    return layouts.block(SHAPE, "<f8", comm=comm, grid=(1, comm.size))


def _raises_everywhere(comm, fn, match):
    return raises_everywhere(comm, collio.BackendError, fn, match=match)


#: every rank aggregates even a small call (the last rank's failing fsync needs its bytes)
EVERY_RANK = {"cb_min_domain": 0}


def _written(comm, path, seed, **open_kw):
    """Open ``path`` for writing and write_all the reference array; (file, array)."""
    glob = reference(SHAPE, "<f8", seed=seed)
    lay = _lay(comm)
    f = collio.open(path, "w", comm=comm, **open_kw)
    f.write_all(local_piece(glob, lay), lay)
    return f, glob


@pytest.mark.mpi(min_size=2)
def test_close_after_sync_is_collective(comm, mpi_tmp_path):
    """Rank 0 closes alone after an agreed sync while the others sync again: a local
    close would leave the others waiting, so every rank raises and the file is closed on
    every rank (what was written and synced stays)."""
    path = str(mpi_tmp_path / "target.bin")
    f, glob = _written(comm, path, 11)
    f.sync()
    err = raises_everywhere(
        comm, collio.MismatchError, f.close if comm.rank == 0 else f.sync, match="rank 0 close; "
    )
    assert err.call_mismatch and err.calls == ("close",) + ("sync",) * (comm.size - 1)
    assert f.closed
    f.close()  # idempotent
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi(min_size=2)
def test_close_after_a_mismatch_syncs_and_agrees(comm, mpi_tmp_path, failing_sync):
    """Rank 0 closes while the others write again: the file is closed on every rank as
    close() closes it, its fsync and the agreement on it included.  The last rank's
    fsync fails there; every rank still raises the same MismatchError, which carries
    that failure, agreed."""
    path = str(mpi_tmp_path / "target.bin")
    f, glob = _written(comm, path, 15, backend="failing-sync", hints=EVERY_RANK)
    lay = _lay(comm)
    call = f.close if comm.rank == 0 else lambda: f.write_all(local_piece(glob, lay), lay)
    err = raises_everywhere(comm, collio.MismatchError, call, match="rank 0 close; ")
    assert isinstance(err.close_error, collio.BackendError)
    assert err.close_error.errno == errno.EIO
    msgs = comm.allgather(str(err.close_error))
    assert msgs == [msgs[0]] * comm.size
    assert f"close: rank {comm.size - 1}: " in msgs[0] and "injected fsync error" in msgs[0]
    assert f.closed
    comm.Barrier()  # the bytes were written before the mismatch
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi
def test_close_after_write_syncs_and_agrees(comm, mpi_tmp_path, failing_sync):
    path = str(mpi_tmp_path / "target.bin")
    f, glob = _written(comm, path, 12, backend="failing-sync", hints=EVERY_RANK)
    # the last rank's fsync fails inside close: every rank raises, naming it
    err = _raises_everywhere(comm, f.close, f"rank {comm.size - 1}: ")
    assert err.errno == errno.EIO
    assert f.closed
    comm.Barrier()  # the bytes were written before the failing fsync
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi
def test_failed_sync_leaves_close_collective(comm, mpi_tmp_path, failing_sync):
    path = str(mpi_tmp_path / "target.bin")
    f, glob = _written(comm, path, 13, backend="failing-sync", hints=EVERY_RANK)
    _raises_everywhere(comm, f.sync, "injected fsync error")
    # still unsynced after the failed sync: close syncs again, fails again, agrees
    _raises_everywhere(comm, f.close, "injected fsync error")
    assert f.closed
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi
def test_close_after_sync_still_commits_an_atomic_write(comm, mpi_tmp_path):
    """A backend with something to commit (the rename of atomic_commit) never skips close."""
    path = str(mpi_tmp_path / "target.bin")
    f, glob = _written(comm, path, 14, hints={"atomic_commit": True})
    f.sync()
    comm.Barrier()
    assert not os.path.exists(path)  # still the temporary beside it
    f.close()
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


class CountingSync(FailingSync):
    """Counts the backend syncs this rank ran (and fails as FailingSync when set)."""

    syncs = 0

    def sync(self) -> None:
        CountingSync.syncs += 1
        super().sync()


register_backend("counting-sync", CountingSync)


@pytest.mark.mpi
def test_a_sync_with_nothing_to_make_durable_is_skipped_on_every_rank(comm, mpi_tmp_path):
    """Once every rank's written bytes are synced, a sync (and a close) agrees in its head
    that no rank has anything to make durable and runs no backend sync; a write on one
    rank alone makes every rank run it again (its fsync error is agreed), and the bytes
    are those written."""
    path = str(mpi_tmp_path / "target.bin")
    CountingSync.syncs, FailingSync.fail_rank = 0, 0
    f, glob = _written(comm, path, 16, backend="counting-sync")
    f.sync()
    assert CountingSync.syncs == 1
    f.sync()
    assert CountingSync.syncs == 1  # nothing written since: skipped
    lay = layouts.Segments([0], [8] if comm.rank == 0 else [0])
    one = np.arange(1, dtype="<f8") + 7.0 if comm.rank == 0 else np.zeros(0, "<f8")
    f.write_all(one.view(np.uint8), lay)
    glob.reshape(-1)[0] = 7.0
    FailingSync.fail = True
    try:
        _raises_everywhere(comm, f.sync, "rank 0: injected fsync error")
    finally:
        FailingSync.fail = False
    assert CountingSync.syncs == 2  # every rank: rank 0 had something to make durable
    f.sync()  # (rank 0's fsync failed: still dirty, so this one runs again everywhere)
    assert CountingSync.syncs == 3
    f.close()
    assert CountingSync.syncs == 3  # close after a sync: nothing left to make durable
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)
