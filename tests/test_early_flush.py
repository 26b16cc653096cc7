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


def test_a_failed_flush_is_raised_once_and_halts_flushes_until_wait(tmp_path, monkeypatch):
    fd = _fd(tmp_path)

    def failing(fd_):
        raise OSError(errno.EIO, "injected fdatasync error")

    monkeypatch.setattr(fsync, "fdatasync", failing)
    flush = EarlyFlush(fd)
    flush.kick()
    flush.future.exception()  # (let it fail first)
    with pytest.raises(OSError, match="injected fdatasync error"):
        flush.kick()
    flush.kick()  # halted until the next wait (sync): a write already past the
    assert flush.future is None and flush.take_count() == 1  # failure starts none
    assert flush.wait() is None  # reported once
    flush.kick()
    err = flush.wait()
    assert isinstance(err, OSError) and err.errno == errno.EIO
    assert flush.wait() is None
    os.close(fd)


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
    with pytest.raises(collio.BackendError, match="injected fdatasync error") as info:
        f.write_all(glob, lay)  # one request: its flush fails after the call returned
        f.sync()
    assert info.value.errno == errno.EIO
    monkeypatch.setattr(fsync, "fdatasync", real)
    f.write_all(glob[::-1].copy(), lay)
    f.sync()
    f.close()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(glob.shape), glob[::-1])
