"""Hint ``early_flush``: fdatasync in a background thread while a write call still runs.

One process, a real file and the real flush thread; the failure of a flush is injected
where the flush calls the system (``collio.backends.fsync.fdatasync``)."""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

import collio
from collio import layouts
from collio.backends import fsync
from collio.backends.fsync import EarlyFlush

MiB = 1 << 20


def _fd(tmp_path, name="f.bin"):
    fd = os.open(tmp_path / name, os.O_RDWR | os.O_CREAT, 0o666)
    os.pwrite(fd, b"x" * MiB, 0)
    return fd


def test_kick_starts_one_flush_at_a_time(tmp_path, monkeypatch):
    """A kick while a flush runs starts nothing; after it finished, the next one does."""
    fd = _fd(tmp_path)
    gate, seen = threading.Event(), []

    def held(fd_):
        seen.append(fd_)
        gate.wait(10)

    monkeypatch.setattr(fsync, "fdatasync", held)
    flush = EarlyFlush(fd)
    flush.kick()
    flush.kick()
    flush.kick()
    gate.set()
    assert flush.wait() is None
    assert seen == [fd] and flush.take_count() == 1 and flush.take_count() == 0
    flush.kick()
    assert flush.wait() is None and seen == [fd, fd] and flush.take_count() == 1
    os.close(fd)


def test_a_failed_flush_is_kept_for_wait_and_halts_flushes(tmp_path, monkeypatch):
    fd = _fd(tmp_path)

    def failing(fd_):
        raise OSError(errno.EIO, "injected fdatasync error")

    monkeypatch.setattr(fsync, "fdatasync", failing)
    flush = EarlyFlush(fd, "x.bin")
    flush.kick()
    flush.future.exception()  # (let it fail first)
    flush.kick()  # not raised here: it is about data of earlier writes
    flush.kick()
    assert flush.future is None and flush.take_count() == 1  # halted: none started
    err = flush.wait()
    assert isinstance(err, collio.BackendError) and err.errno == errno.EIO
    assert "early flush (fdatasync) of 'x.bin' failed: injected fdatasync error" in str(err)
    assert "may not be durable" in str(err)
    assert flush.wait() is None  # reported once
    flush.kick()  # flushes start again after the report
    assert isinstance(flush.wait(), collio.BackendError) and flush.take_count() == 1
    os.close(fd)


def test_close_waits_for_the_running_flush(tmp_path, monkeypatch):
    """The backend's close (also on error paths, without sync) must not close the
    descriptor under a running flush: the flush still sees its file."""
    from mpi4py import MPI

    from collio.backends.posix import PosixBackend

    gate, seen = threading.Event(), []

    def held(fd_):
        gate.wait(10)
        seen.append(os.fstat(fd_).st_size)  # EBADF if the descriptor were closed

    monkeypatch.setattr(fsync, "fdatasync", held)
    path = str(tmp_path / "c.bin")
    be = PosixBackend.open(path, "w", comm=MPI.COMM_SELF, hints=collio.Hints())
    be.write_at(0, np.ones(2 * MiB, np.uint8))
    assert be.flusher is not None and be.flusher.future is not None
    threading.Timer(0.2, gate.set).start()
    be.close()
    assert seen == [2 * MiB]


def _matrix(n=2048):
    return np.arange(n * 1024, dtype="<f8").reshape(n, 1024)


@pytest.mark.parametrize("hint", [None, "true", "false"])
def test_posix_write_flushes_early_and_keeps_the_bytes(tmp_path, hint):
    """16 MiB in one call: flushed while writing unless the hint says false; the file
    holds the array either way (read back with numpy)."""
    glob = _matrix()
    lay = layouts.block(glob.shape, "<f8")
    path = str(tmp_path / "m.bin")
    hints = {} if hint is None else {"early_flush": hint}
    with collio.open(path, "w", hints=hints) as f:
        f.write_all(glob, lay)
        flushes = f.stats.early_flushes
        assert f.stats.hints["early_flush"] is (hint != "false")
    assert (flushes > 0) is (hint != "false"), flushes
    assert np.array_equal(np.fromfile(path, "<f8").reshape(glob.shape), glob)


def test_a_failed_early_flush_fails_sync_and_the_file_goes_on(tmp_path, monkeypatch):
    glob = _matrix()
    lay = layouts.block(glob.shape, "<f8")
    path = str(tmp_path / "m.bin")
    real = fsync.fdatasync

    def failing(fd_):
        raise OSError(errno.EIO, "injected fdatasync error")

    f = collio.open(path, "w")
    monkeypatch.setattr(fsync, "fdatasync", failing)
    f.write_all(glob, lay)  # the flush fails in the background: not this call's error
    with pytest.raises(collio.BackendError, match="injected fdatasync error") as info:
        f.sync()
    assert info.value.errno == errno.EIO and "may not be durable" in str(info.value)
    monkeypatch.setattr(fsync, "fdatasync", real)
    f.write_all(glob[::-1].copy(), lay)
    f.sync()
    f.close()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(glob.shape), glob[::-1])


def test_a_flush_failing_after_its_call_is_reported_by_sync_not_the_next_write(
    tmp_path, monkeypatch
):
    """The flush of call 1's data fails after call 1 returned: calls 2 and 3 write
    fine, and the sync after them reports it (the kernel reports a writeback error to a
    descriptor once: the flush took that report, so sync's own fsync would succeed)."""
    glob = _matrix()
    lay = layouts.block(glob.shape, "<f8")
    gate = threading.Event()

    def late(fd_):
        gate.wait(10)
        raise OSError(errno.EIO, "injected late fdatasync error")

    monkeypatch.setattr(fsync, "fdatasync", late)
    f = collio.open(str(tmp_path / "m.bin"), "w")
    f.write_all(glob, lay)  # call 1: its flush is held, then fails
    f.write_all(glob, lay)  # call 2: a flush is running, none started
    gate.set()
    f.backend.flusher.future.exception()  # (call 1's flush has failed now)
    f.write_all(glob, lay)  # call 3: finds the failure, keeps it, starts none
    assert f.stats.early_flushes == 1
    with pytest.raises(collio.BackendError, match="injected late fdatasync error"):
        f.sync()
    f.sync()  # reported once
    f.close()
