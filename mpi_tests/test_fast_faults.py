"""Real faults (a refused rename, a file size limit, a full disk) met by the fast paths:
every rank raises the same error, nothing is left behind, the job goes on."""

from __future__ import annotations

import errno
import os
import resource
import shutil

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio import layouts
from collio.backends import fsync

pytestmark = pytest.mark.mpi(min_size=1)
N = 4096  # bytes per rank per step


def _data(step: int, rank: int) -> np.ndarray:
    return np.random.default_rng(7919 * step + rank).integers(0, 256, N, np.uint8)


def _shared(comm: MPI.Intracomm, tmp) -> str:
    return str(comm.bcast(str(tmp), root=0))


def _directory_at(comm: MPI.Intracomm, path: str) -> None:
    """Rank 0 puts a directory (not empty) where ``path`` is: a rename onto it fails."""
    comm.Barrier()
    if comm.rank == 0:
        if os.path.exists(path):
            os.unlink(path)
        os.mkdir(path)
        open(os.path.join(path, "other"), "w").close()
    comm.Barrier()


@pytest.mark.mpi
def test_a_refused_commit_removes_its_temporary_and_the_target_can_be_written_again(
    comm, mpi_tmp_path
):
    """A guessed time series into an atomic target whose commit's rename is refused (a
    directory now stands at the target): close raises the same BackendError on every
    rank, its temporary is gone, and a later atomic write of the target commits."""
    d = _shared(comm, mpi_tmp_path)
    path, p, r = os.path.join(d, "series.bin"), comm.size, comm.rank
    f = collio.open(path, "w", comm=comm, hints={"atomic_commit": True})
    for s in range(5):
        f.write_at_all((s * p + r) * N, _data(s, r))
    assert f.stats.last_call["guessed"]
    _directory_at(comm, path)
    err = raises_everywhere(comm, collio.BackendError, f.close)
    # (the target, not the temporary the rename was refused for)
    assert str(err) == f"commit {path!r}: rank 0: is a directory" and err.errno == errno.EISDIR
    assert f.closed
    f.close()  # (idempotent after the failure)
    comm.Barrier()
    assert sorted(os.listdir(d)) == ["series.bin"]
    assert os.listdir(path) == ["other"]  # (what stands at the target is left alone)
    comm.Barrier()
    if r == 0:
        shutil.rmtree(path)
    comm.Barrier()
    with collio.open(path, "w", comm=comm, hints={"atomic_commit": True}) as f:
        for s in range(5):
            f.write_at_all((s * p + r) * N, _data(s, r))
    comm.Barrier()
    want = b"".join(_data(s, q).tobytes() for s in range(5) for q in range(p))
    assert read_file(path) == want
    assert sorted(os.listdir(d)) == ["series.bin"]


@pytest.mark.mpi
def test_an_async_save_whose_commit_is_refused_leaves_no_temporary(comm, mpi_tmp_path, monkeypatch):
    """A checkpoint's commit refused (a directory at the target when the save renames):
    wait() raises the same error on every rank, no temporary is left, and the job saves
    again once the target is free."""
    d = _shared(comm, mpi_tmp_path)
    path, p = os.path.join(d, "model.ckpt"), comm.size
    lay = layouts.block((64, 32), "<f8", grid=(p, 1))
    glob = np.arange(64 * 32, dtype="<f8").reshape(64, 32)
    state = {"w": (np.ascontiguousarray(glob[lay.slices]), lay), "step": np.int64(3)}
    real_close = collio.File.close

    def refused(self):
        # (the directory appears once the data is written, just before the commit)
        if not self.closed and self.target == path:
            _directory_at(comm, path)
        return real_close(self)

    monkeypatch.setattr(collio.File, "close", refused)
    h = ckpt.async_save(path, state, comm=comm)
    err = raises_everywhere(comm, collio.BackendError, h.wait)
    assert str(err) == f"commit {path!r}: rank 0: is a directory" and err.errno == errno.EISDIR
    monkeypatch.undo()
    comm.Barrier()
    assert sorted(os.listdir(d)) == ["model.ckpt"]
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path)
    comm.Barrier()
    ckpt.async_save(path, state, comm=comm).wait()
    got = ckpt.load(path, {"w": lay, "step": None}, comm=comm)
    assert got["w"].tobytes() == np.ascontiguousarray(glob[lay.slices]).tobytes()
    assert int(got["step"]) == 3
    assert sorted(os.listdir(d)) == ["model.ckpt"]


def _fail_once(monkeypatch, module, name: str, text: str) -> None:
    """``module.name`` raises EIO at its next call, then works again, as Linux reports a
    writeback error to a descriptor once (the pages it could not write are lost)."""
    real = getattr(module, name)

    def once(fd):
        monkeypatch.setattr(module, name, real)
        raise OSError(errno.EIO, text)

    monkeypatch.setattr(module, name, once)


@pytest.mark.mpi
@pytest.mark.parametrize("where", ["fsync", "early-flush"])
def test_a_failed_sync_drops_the_atomic_commit(comm, mpi_tmp_path, monkeypatch, where):
    """The last rank's fsync in sync() fails once (or its early flush of a call's rounds
    did, which sync() reports): sync() raises the same BackendError on every rank, the
    commit is dropped as after a failed write (the close's fsync would succeed, the lost
    pages unknown to it), later writes are refused everywhere, and close() leaves the
    previous file as it was, with no temporary."""
    d = _shared(comm, mpi_tmp_path)
    path, p, r = os.path.join(d, "atomic.bin"), comm.size, comm.rank
    if r == 0:
        with open(path, "wb") as fh:
            fh.write(b"previous")
    comm.Barrier()
    hints = {"atomic_commit": True}
    if where == "early-flush":
        monkeypatch.setattr(fsync.EarlyFlush, "AFTER", 0)  # (a flush after every round)
        hints.update(romio_cb_write="enable", cb_buffer_size="1m")
    f = collio.open(path, "w", comm=comm, hints=hints)
    if where == "fsync":
        for s in range(5):
            f.write_at_all((s * p + r) * N, _data(s, r))
        assert f.stats.last_call["guessed"]
        if r == p - 1:
            _fail_once(monkeypatch, os, "fsync", "injected fsync error")
    else:
        if r == p - 1:
            _fail_once(monkeypatch, fsync, "fdatasync", "injected flush error")
        rows = 4 << 20 >> 6  # (4 MiB per rank, 64-byte columns: rounds of 1 MiB)
        lay = layouts.Subarray((rows, 64 * p), (0, 64 * r), (rows, 64), "u1")
        f.write_all(np.full((rows, 64), r, np.uint8), lay)
        assert f.stats.early_flushes > 0
    err = raises_everywhere(comm, collio.BackendError, f.sync)
    assert f"rank {p - 1}: " in str(err) and "injected" in str(err)
    raises_everywhere(
        comm, collio.ModeError, lambda: f.write_at_all(r * N, _data(9, r)), match="aborted"
    )
    f.close()
    comm.Barrier()
    assert read_file(path) == b"previous"
    assert sorted(os.listdir(d)) == ["atomic.bin"]


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_a_fifo_put_at_the_target_does_not_block_the_commit(comm, mpi_tmp_path):
    """A FIFO made at an atomic target after its open: the commit holds the file it
    replaces without waiting for a writer of the FIFO, and renames over it as over any
    file that is not a directory; every rank returns from close."""
    d = _shared(comm, mpi_tmp_path)
    path, p, r = os.path.join(d, "series.bin"), comm.size, comm.rank
    f = collio.open(path, "w", comm=comm, hints={"atomic_commit": True})
    for s in range(4):
        f.write_at_all((s * p + r) * N, _data(s, r))
    comm.Barrier()
    if r == 0:
        os.mkfifo(path)
    comm.Barrier()
    f.close()
    comm.Barrier()
    want = b"".join(_data(s, q).tobytes() for s in range(4) for q in range(p))
    assert read_file(path) == want
    assert sorted(os.listdir(d)) == ["series.bin"]


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["save", "failed-write"])
def test_a_target_directory_replaced_by_a_file_leaves_no_temporary(
    comm, mpi_tmp_path, monkeypatch, how
):
    """The target's directory is moved away and a file put in its place while the job
    writes: the commit's rename (a checkpoint save) fails with ENOTDIR, or a write fails
    (past the last rank's file size limit) and the close drops the commit; either way
    every rank raises the same error and the temporary, in the moved directory now, is
    removed there; the previous checkpoint there still loads."""
    d = _shared(comm, mpi_tmp_path)
    sub, p, r = os.path.join(d, "sub"), comm.size, comm.rank
    path, moved = os.path.join(sub, "model.ckpt"), os.path.join(d, "moved")
    if r == 0:
        os.mkdir(sub)
    comm.Barrier()
    lay = layouts.block((64, 32), "<f8", grid=(p, 1))
    glob = np.arange(64 * 32, dtype="<f8").reshape(64, 32)
    state = {"w": (np.ascontiguousarray(glob[lay.slices]), lay)}
    ckpt.save(path, state, comm=comm)

    def swap():
        comm.Barrier()
        if r == 0:
            os.rename(sub, moved)
            open(sub, "w").close()
        comm.Barrier()

    if how == "save":
        real_close = collio.File.close

        def swapping(self):
            if not self.closed and self.target == path:
                swap()
            return real_close(self)

        monkeypatch.setattr(collio.File, "close", swapping)
        err = raises_everywhere(
            comm, collio.BackendError, lambda: ckpt.save(path, state, comm=comm)
        )
        assert err.errno == errno.ENOTDIR and "commit" in str(err)
        monkeypatch.undo()
    else:
        f = collio.open(path, "w", comm=comm, hints={"atomic_commit": True})
        for s in range(4):
            f.write_at_all((s * p + r) * N, _data(s, r))
        swap()
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        if r == p - 1:
            resource.setrlimit(resource.RLIMIT_FSIZE, ((4 * p + r) * N, limits[1]))
        try:
            err = raises_everywhere(
                comm, collio.BackendError, lambda: f.write_at_all((4 * p + r) * N, _data(4, r))
            )
        finally:
            if r == p - 1:
                resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        assert err.errno == errno.EFBIG
        f.close()
    comm.Barrier()
    assert sorted(os.listdir(moved)) == ["model.ckpt"]
    got = ckpt.load(os.path.join(moved, "model.ckpt"), {"w": lay}, comm=comm)
    assert got["w"].tobytes() == np.ascontiguousarray(glob[lay.slices]).tobytes()


@pytest.mark.mpi
def test_an_open_failing_after_its_file_is_made_leaves_no_temporary(
    comm, mpi_tmp_path, monkeypatch
):
    """An atomic open that fails after the file is open, in the backend's last steps
    (memory exhausted there, on every rank): the previous file is as it was and rank 0's
    temporary is removed (the backend's own close used to let go of it first, and the
    removal then found nothing to remove), and the target can be written again."""
    from collio.backends import fileopen

    d = _shared(comm, mpi_tmp_path)
    path = os.path.join(d, "kept.bin")
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(b"previous")
    comm.Barrier()

    def exhausted(hints, fd):
        raise MemoryError("no memory left for the open's last step")

    monkeypatch.setattr(fileopen, "maps_for", exhausted)
    raises_everywhere(
        comm, MemoryError,
        lambda: collio.open(path, "w", comm=comm, hints={"atomic_commit": True}),
    )  # fmt: skip
    monkeypatch.undo()
    comm.Barrier()
    assert sorted(os.listdir(d)) == ["kept.bin"]
    assert read_file(path) == b"previous"
    with collio.open(path, "w", comm=comm, hints={"atomic_commit": True}) as f:
        f.write_at_all(comm.rank * N, _data(0, comm.rank))
    assert read_file(path) == b"".join(_data(0, k).tobytes() for k in range(comm.size))
