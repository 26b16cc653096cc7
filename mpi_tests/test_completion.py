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
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends import memory, register_backend
from collio.backends.memory import MemoryBackend
from collio.backends.posix import PosixBackend

SHAPE = (64, 48)


class FailingSync(PosixBackend):
    """fsync fails with EIO on one rank while ``fail`` is set (``once``: only the first
    time, as the kernel reports a writeback error once)."""

    fail_rank = -1
    fail = False
    once = False
    local_sync = True  # (a sync of its own that still only fsyncs: before the head)

    def sync(self) -> None:
        if FailingSync.fail and MPI.COMM_WORLD.rank == FailingSync.fail_rank and self.dirty:
            FailingSync.fail = not FailingSync.once
            self.dirty = not FailingSync.once  # (once: reported, the pages count as written)
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
    local_sync = True

    def sync(self) -> None:
        CountingSync.syncs += 1
        super().sync()


register_backend("counting-sync", CountingSync)


@pytest.mark.mpi
def test_a_sync_runs_the_backend_sync_only_where_a_rank_has_something_to_make_durable(
    comm, mpi_tmp_path
):
    """Each rank makes its own written bytes durable (posix: its fsync) before the sync's
    one agreement: a rank with nothing written since its last sync runs no backend sync,
    a sync (and a close) with nothing to make durable anywhere runs none, a write on one
    rank alone makes that rank run it again (its fsync error is agreed on every rank),
    and the bytes are those written."""
    path = str(mpi_tmp_path / "target.bin")
    CountingSync.syncs, FailingSync.fail_rank = 0, 0
    f, glob = _written(comm, path, 16, backend="counting-sync")
    wrote = not f.backend.clean()  # (this rank's share of the write: it wrote bytes)
    assert any(comm.allgather(wrote))

    def ran(want: int) -> None:  # (asserted on every rank: a rank failing alone would hang)
        every = comm.allgather(CountingSync.syncs)
        assert every == comm.allgather(want), every

    f.sync()
    ran(int(wrote))
    f.sync()
    ran(int(wrote))  # nothing written since: skipped everywhere
    lay = layouts.Segments([0], [8] if comm.rank == 0 else [0])
    one = np.arange(1, dtype="<f8") + 7.0 if comm.rank == 0 else np.zeros(0, "<f8")
    f.write_all(one.view(np.uint8), lay)
    glob.reshape(-1)[0] = 7.0
    dirty = not f.backend.clean()
    assert comm.allgather(dirty) == [r == 0 for r in range(comm.size)]
    FailingSync.fail = True
    try:
        _raises_everywhere(comm, f.sync, "rank 0: injected fsync error")
    finally:
        FailingSync.fail = False
    ran(int(wrote) + int(dirty))  # rank 0 alone had something to make durable
    f.sync()  # (rank 0's fsync failed: still dirty, so this one runs again there)
    ran(int(wrote) + 2 * int(dirty))
    f.close()
    ran(int(wrote) + 2 * int(dirty))  # close after a sync: nothing left to make durable
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi
@pytest.mark.parametrize("hints", [{}, {"atomic_commit": True}], ids=["plain", "atomic"])
def test_a_posix_sync_and_close_agree_once_after_the_fsync(comm, mpi_tmp_path, monkeypatch, hints):
    """On posix every rank fsyncs first, and the call's head is its one agreement: on the
    call and on every rank's fsync error at once, with no second agreement after the
    fsync (an atomic close's commit then agrees on its rename, as before).  The bytes
    are those written, every rank's durable once ``sync`` returns."""
    import collio.core as core

    path = str(mpi_tmp_path / "once.bin")
    f, glob = _written(comm, path, 17, hints=hints)
    heads: list[str] = []
    flags: list[int] = []
    real_head, real_flag = core.call_head, core.any_flag
    monkeypatch.setattr(core, "call_head", lambda *a, **k: heads.append(a[1]) or real_head(*a, **k))
    monkeypatch.setattr(core, "any_flag", lambda *a, **k: flags.append(1) or real_flag(*a, **k))
    synced = []
    real_sync = type(f.backend).sync

    def sync(self: object) -> None:
        synced.append(len(heads))  # (how many heads this rank had made when it fsynced)
        real_sync(self)

    monkeypatch.setattr(type(f.backend), "sync", sync)
    f.sync()
    f.close()
    monkeypatch.undo()
    every = comm.allgather((heads, flags, synced))
    assert any(s for _, _, s in every), every  # (some rank wrote, so fsynced)
    for h, fl, s in every:
        assert h == ["sync", "close"] and fl == [] and s in ([0], []), every
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("call", ["sync", "close"])
def test_an_fsync_error_beside_another_call_is_not_lost(comm, mpi_tmp_path, call):
    """Rank 0 syncs (or closes) while the others write: its fsync, made before the head,
    fails, and every rank raises the call mismatch.  The fsync's error, which the kernel
    reports once, is then the next sync's on every rank (after a close beside the
    others' call, the close's error), never dropped: the bytes may not be durable."""
    path = str(mpi_tmp_path / "lost.bin")
    FailingSync.fail_rank = 0
    f, glob = _written(comm, path, 18, backend="failing-sync", hints=EVERY_RANK)
    lay = _lay(comm)
    FailingSync.fail = FailingSync.once = True
    try:
        if comm.rank == 0:
            err = raises_everywhere(comm, collio.MismatchError, getattr(f, call))
        else:
            piece = local_piece(glob, lay)
            err = raises_everywhere(comm, collio.MismatchError, lambda: f.write_all(piece, lay))
    finally:
        FailingSync.fail = FailingSync.once = False
    if call == "close":
        assert f.closed
        assert "rank 0: injected fsync error" in str(err.close_error), err.close_error
        return
    _raises_everywhere(comm, f.sync, "rank 0: injected fsync error")
    f.sync()  # (reported once, as the kernel does)
    f.close()
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


class CollectiveSync(PosixBackend):
    """A posix backend whose sync is collective (every rank meets rank 0 after its fsync,
    as a parallel file system's metadata round might): not declared local, so it
    agrees before syncing, on every rank alike."""

    def sync(self) -> None:
        super().sync()
        MPI.COMM_WORLD.bcast(0, root=0)


register_backend("collective-sync", CollectiveSync)


@pytest.mark.mpi
def test_a_posix_subclass_with_a_sync_of_its_own_agrees_first(comm, mpi_tmp_path):
    """Only rank 0 writes, then every rank syncs: a subclass's own sync runs on every rank
    after the head (it may be collective), not before it where the rank wrote."""
    assert CollectiveSync.local_sync is False and FailingSync.local_sync is True
    path = str(mpi_tmp_path / "collective.bin")
    with collio.open(path, "w", comm=comm, backend="collective-sync") as f:
        lay = layouts.Segments([0], [8] if comm.rank == 0 else [0])
        one = np.full(1 if comm.rank == 0 else 0, 5.0, "<f8")
        f.write_all(one.view(np.uint8), lay)
        f.sync()
    comm.Barrier()
    assert np.fromfile(path, "<f8").tolist() == [5.0]


class LocalWithoutKeep(MemoryBackend):
    """A backend that says its sync is local but cannot keep an error for the next sync
    (no ``unsynced``); its sync fails once on rank 0."""

    local_sync = True
    fail = False

    def sync(self) -> None:
        if LocalWithoutKeep.fail and MPI.COMM_WORLD.rank == 0:
            LocalWithoutKeep.fail = False
            raise OSError(errno.EIO, "injected sync error")


register_backend("local-without-keep", LocalWithoutKeep)


@pytest.mark.mpi(min_size=2)
def test_a_local_sync_that_cannot_keep_its_error_agrees_first(comm):
    """A backend that declares a local sync but no ``unsynced`` syncs after the head, as
    every other backend does: rank 0 syncing beside the others' write raises the same
    MismatchError on every rank, and its sync, never run, fails the next sync instead,
    on every rank; rank 0 never raises alone what the others do not."""
    name = "mem://local-without-keep"
    lay = layouts.Segments([8 * comm.rank], [8])
    with collio.open(name, "w", comm=comm, backend="local-without-keep") as f:
        f.write_all(np.full(1, comm.rank, "<f8").view(np.uint8), lay)
        LocalWithoutKeep.fail = True
        if comm.rank == 0:
            raises_everywhere(comm, collio.MismatchError, f.sync)
        else:
            one = np.full(1, comm.rank, "<f8").view(np.uint8)
            raises_everywhere(comm, collio.MismatchError, lambda: f.write_all(one, lay))
        _raises_everywhere(comm, f.sync, "rank 0: injected sync error")
        LocalWithoutKeep.fail = False
    if comm.rank == 0:
        assert np.frombuffer(memory.contents(name), "<f8").tolist() == list(range(comm.size))
        memory.drop(name)
