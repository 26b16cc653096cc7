"""Hint ``early_flush`` under MPI: aggregators flush while the rounds go on.

The bytes must not change (numpy reference, read back after close), every rank
counts in ``stats.early_flushes``, and a flush that fails on one rank makes every
rank raise the same error in the same call, after which the file goes on.  The
failure is injected where the flush calls the system
(``collio.backends.fsync.fdatasync``), on the last rank only.
"""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest
from helpers import local_piece, raises_everywhere, reference
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends import fsync, posix
from collio.backends.posix import PosixBackend
from collio.buffers import PAGE

SHAPE = (2048, 1024)  # 16 MiB: rounds of 1 MiB and more, which start flushes


@pytest.fixture(autouse=True)
def _flush_after_every_large_write(monkeypatch):
    """These tests are about what a flush does, not when enough was written for one:
    every write of 1 MiB and more starts one (when none runs)."""
    monkeypatch.setattr(fsync.EarlyFlush, "AFTER", 0)


#: Aggregators flush: the rounds must run (block-cyclic row blocks at 3 ranks are few runs
#: of 512 KiB, which the automatic path would write directly, with no aggregator), two or
#: more per aggregator up to 8 ranks (a flush starts after a round with another after it).
SHUFFLE = {"romio_cb_write": "enable", "cb_buffer_size": "1m"}


def _lay(comm, pattern):
    if pattern == "colblock":
        return layouts.block(SHAPE, "<f8", comm=comm, grid=(1, comm.size))
    grid = MPI.Compute_dims(comm.size, 2)
    return layouts.block_cyclic(SHAPE, "<f8", block=64, grid=grid, comm=comm)


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["posix", "mpiio"])
@pytest.mark.parametrize("pattern", ["colblock", "cyclic"])
@pytest.mark.parametrize("early", [True, False])
def test_early_flush_keeps_the_bytes(comm, mpi_tmp_path, backend, pattern, early):
    path = str(mpi_tmp_path / "target.bin")
    glob = reference(SHAPE, "<f8", seed=31)
    lay = _lay(comm, pattern)
    hints = {**SHUFFLE, "early_flush": early}
    with collio.open(path, "w", comm=comm, hints=hints, backend=backend) as f:
        f.write_all(local_piece(glob, lay), lay)
        flushes = f.stats.early_flushes  # summed over ranks, the same on every rank
    assert comm.allgather(flushes) == [flushes] * comm.size
    assert (flushes > 0) is early, flushes
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


def _failing(fd):
    raise OSError(errno.EIO, "injected fdatasync error")


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["posix", "mpiio"])
@pytest.mark.parametrize("pattern", ["colblock", "cyclic"])
def test_a_failed_early_flush_is_raised_everywhere_by_sync(
    comm, mpi_tmp_path, monkeypatch, backend, pattern
):
    """The write itself succeeds everywhere (the flush covers data written before);
    the sync after it raises on every rank, naming the last rank, once; then the
    file goes on."""
    path = str(mpi_tmp_path / "target.bin")
    glob = reference(SHAPE, "<f8", seed=32)
    lay = _lay(comm, pattern)
    piece = local_piece(glob, lay)
    hints = SHUFFLE
    f = collio.open(path, "w", comm=comm, hints=hints, backend=backend)
    if comm.rank == comm.size - 1:
        monkeypatch.setattr(fsync, "fdatasync", _failing)
    f.write_all(piece, lay)
    err = raises_everywhere(comm, collio.BackendError, f.sync)
    assert err.errno == errno.EIO
    assert f"rank {comm.size - 1}: early flush (fdatasync) of " in str(err)
    assert "injected fdatasync error" in str(err) and "may not be durable" in str(err)
    monkeypatch.undo()
    f.sync()  # reported once
    f.write_all(piece, lay)  # the file goes on
    f.close()
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi
@pytest.mark.parametrize("early", [True, False])
def test_hdf5_contiguous_dataset_flushes_early(comm, mpi_tmp_path, early):
    """collio.h5 writes a contiguous dataset through the posix path, so the hint applies
    there too; the file reads back right with stock h5py in another process."""
    pytest.importorskip("h5py")
    from h5check import check_file

    import collio.h5

    path = str(mpi_tmp_path / "early.h5")
    glob = reference(SHAPE, "<f8", seed=33)
    lay = _lay(comm, "colblock")
    hints = {**SHUFFLE, "early_flush": early}  # (one rank alone would write directly)
    with collio.h5.File(path, "w", comm=comm, hints=hints) as f:
        d = collio.h5.create_dataset(f, "m", SHAPE, "<f8")
        collio.h5.write_all(d, local_piece(glob, lay), lay)
        flushes = collio.h5.stats(f).early_flushes
    assert (flushes > 0) is early, flushes
    check_file(comm, path, {"m": glob})


@pytest.mark.mpi
def test_a_failed_hdf5_early_flush_is_raised_everywhere_by_close(comm, mpi_tmp_path, monkeypatch):
    pytest.importorskip("h5py")
    from h5check import check_file

    import collio.h5

    path = str(mpi_tmp_path / "early-fail.h5")
    glob = reference(SHAPE, "<f8", seed=34)
    lay = _lay(comm, "colblock")
    f = collio.h5.File(path, "w", comm=comm, hints=SHUFFLE)
    d = collio.h5.create_dataset(f, "m", SHAPE, "<f8")
    if comm.rank == comm.size - 1:
        monkeypatch.setattr(fsync, "fdatasync", _failing)
    collio.h5.write_all(d, local_piece(glob, lay), lay)
    err = raises_everywhere(comm, collio.BackendError, f.close)
    assert f"rank {comm.size - 1}: early flush (fdatasync) of " in str(err)
    monkeypatch.undo()
    check_file(comm, path, {"m": glob})  # (the injected failure lost nothing)


@pytest.mark.mpi
def test_close_waits_for_the_running_flush(comm, mpi_tmp_path, monkeypatch):
    """The backend's close (also on error paths, without sync) must not close the
    descriptor under a running flush: the flush still sees its file."""
    gate, seen = threading.Event(), []

    def held(fd_):
        gate.wait(10)
        seen.append(os.fstat(fd_).st_size)  # EBADF if the descriptor were closed

    monkeypatch.setattr(fsync, "fdatasync", held)
    path = str(mpi_tmp_path / f"c{comm.rank}.bin")
    be = PosixBackend.open(path, "w", comm=MPI.COMM_SELF, hints=collio.Hints())
    be.write_at(0, np.ones(2 << 20, np.uint8))
    assert be.flusher is not None and be.flusher.future is not None
    threading.Timer(0.2, gate.set).start()
    be.close()
    assert seen == [2 << 20]


@pytest.mark.mpi
def test_a_flush_failing_after_its_call_is_reported_by_sync_not_the_next_write(
    comm, mpi_tmp_path, monkeypatch
):
    """The flush of call 1's data fails after call 1 returned: calls 2 and 3 write
    fine, and the sync after them reports it (the kernel reports a writeback error to a
    descriptor once: the flush took that report, so sync's own fsync would succeed)."""
    glob = reference(SHAPE, "<f8", seed=35)
    lay = _lay(comm, "colblock")
    piece = local_piece(glob, lay)
    gate = threading.Event()

    def late(fd_):
        gate.wait(10)
        raise OSError(errno.EIO, "injected late fdatasync error")

    monkeypatch.setattr(fsync, "fdatasync", late)
    hints = {"cb_nodes": 1, "romio_cb_write": "enable", "cb_buffer_size": "4m"}
    f = collio.open(str(mpi_tmp_path / "late.bin"), "w", comm=comm, hints=hints)
    f.write_all(piece, lay)  # call 1: the aggregator's flush is held, then fails
    f.write_all(piece, lay)  # call 2: a flush is running, none started
    gate.set()
    if f.backend.flusher is not None and f.backend.flusher.future is not None:
        f.backend.flusher.future.exception()  # (call 1's flush has failed now)
    comm.Barrier()
    f.write_all(piece, lay)  # call 3: finds the failure, keeps it, starts none
    assert f.stats.early_flushes == 1
    err = raises_everywhere(comm, collio.BackendError, f.sync)
    assert "rank 0: early flush (fdatasync) of " in str(err)
    assert "injected late fdatasync error" in str(err)
    f.sync()  # reported once
    f.close()
    comm.Barrier()
    assert np.array_equal(np.fromfile(str(mpi_tmp_path / "late.bin"), "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi
@pytest.mark.parametrize("early", [True, False])
@pytest.mark.parametrize("rows", [SHAPE[0], 64])
@pytest.mark.parametrize("mode", ["r+", "w"])
def test_a_rank_overwriting_its_own_rows_starts_their_writeback(
    comm, mpi_tmp_path, monkeypatch, early, rows, mode
):
    """Row blocks go direct, each rank its own request.  A rank that overwrites 1 MiB or
    more of what the file held at its open in the call starts the writeback of its own
    whole pages at once (and only those: the others' pages may still be filling), with
    ``early_flush``; a smaller call, ``early_flush=false``, or a file emptied at its open
    (``'w'``: new blocks) starts none.  No background flush starts either way, and the
    file holds every row.  ``sync_file_range`` is Linux's own, recorded on its way."""
    if posix.sync_file_range is None:
        pytest.skip("no sync_file_range here")
    shape = (rows, SHAPE[1])
    path = str(mpi_tmp_path / "rows.bin")
    if comm.rank == 0:  # (the file an 'r+' open overwrites: as long, other bytes)
        np.full(shape, -1.0, "<f8").tofile(path)
    comm.Barrier()
    started: list[tuple[int, int]] = []
    real = posix.sync_file_range

    def record(fd, offset, nbytes, flags):
        started.append((offset, nbytes))
        return real(fd, offset, nbytes, flags)

    monkeypatch.setattr(posix, "sync_file_range", record)
    glob = reference(shape, "<f8", seed=37)
    lay = layouts.block(shape, "<f8", comm=comm, grid=(comm.size, 1))
    mine = local_piece(glob, lay)
    lo = int(lay.start[0]) * shape[1] * 8
    with collio.open(path, mode, comm=comm, hints={"early_flush": early}) as f:
        f.write_all(mine, lay)
        assert f.stats.last_call["path"] == "direct"
        assert f.stats.early_flushes == 0
        if early and mode == "r+" and mine.nbytes >= posix.DIRECT_FLUSH_MIN:
            first, end = -(-lo // PAGE) * PAGE, (lo + mine.nbytes) // PAGE * PAGE
            assert started == [(first, end - first)]
        else:
            assert started == []
    comm.Barrier()
    np.testing.assert_array_equal(np.fromfile(path, "<f8").reshape(shape), glob)


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["posix", "mpiio"])
def test_a_call_of_one_round_starts_no_flush(comm, mpi_tmp_path, backend, monkeypatch):
    """Each aggregator's domain fits one window: after its one round the call only waits
    for the others, so neither writeback nor a flush starts (the close's fsync makes the
    bytes durable); with smaller windows the same call flushes while its rounds go on."""
    started = []
    real = fsync.sync_file_range
    monkeypatch.setattr(
        "collio.backends.posix.sync_file_range", lambda *a: started.append(a[1:3]) or real(*a)
    )
    path = str(mpi_tmp_path / "one.bin")
    glob = reference(SHAPE, "<f8", seed=39)
    lay = _lay(comm, "colblock")
    counts = {}
    for window in ("16m", "1m"):
        hints = {"romio_cb_write": "enable", "cb_buffer_size": window, "early_flush": True}
        if window == "16m":
            hints["min_rounds"] = 1  # (else domains are split for rounds to overlap)
        with collio.open(path, "w", comm=comm, hints=hints, backend=backend) as f:
            f.write_all(local_piece(glob, lay), lay)
            assert f.stats.last_call["path"] == "two-phase", f.stats.last_call
            counts[window] = (f.stats.last_call["rounds"], f.stats.early_flushes)
        counts[window] += (comm.allreduce(len(started)),)
        started.clear()
        comm.Barrier()
        assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)
    assert counts["16m"] == (1, 0, 0), counts
    assert counts["1m"][0] > 1 and counts["1m"][1] > 0, counts
    if backend == "posix":  # (the mpiio backend starts writeback on a descriptor of its own)
        assert counts["1m"][2] > 0, counts
