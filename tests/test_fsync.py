"""``EarlyFlush``: the background fdatasync behind hint ``early_flush``, one descriptor, no MPI.

A flush's failure is injected where it calls the system (``collio.backends.fsync.fdatasync``).
"""

from __future__ import annotations

import errno
import os
import threading

import collio
from collio.backends import fsync
from collio.backends.fsync import EarlyFlush

MiB = 1 << 20


def _fd(tmp_path, name="f.bin"):
    fd = os.open(tmp_path / name, os.O_RDWR | os.O_CREAT, 0o666)
    os.pwrite(fd, b"x" * MiB, 0)
    return fd


def _held(monkeypatch):
    """fdatasync held until the returned gate is set; the descriptors it was called for."""
    gate, seen = threading.Event(), []

    def held(fd_):
        seen.append(fd_)
        gate.wait(10)

    monkeypatch.setattr(fsync, "fdatasync", held)
    return gate, seen


def test_kick_starts_one_flush_at_a_time(tmp_path, monkeypatch):
    """A kick while a flush runs starts nothing; after it finished, the next one does."""
    fd = _fd(tmp_path)
    gate, seen = _held(monkeypatch)
    flush = EarlyFlush(fd)
    flush.kick(EarlyFlush.AFTER)
    flush.kick(EarlyFlush.AFTER)
    flush.kick(EarlyFlush.AFTER)
    gate.set()
    assert flush.wait() is None
    assert seen == [fd] and flush.take_count() == 1 and flush.take_count() == 0
    flush.kick(EarlyFlush.AFTER)
    assert flush.wait() is None and seen == [fd, fd] and flush.take_count() == 1
    os.close(fd)


def test_a_failed_flush_is_kept_for_wait_and_halts_flushes(tmp_path, monkeypatch):
    fd = _fd(tmp_path)

    def failing(fd_):
        raise OSError(errno.EIO, "injected fdatasync error")

    monkeypatch.setattr(fsync, "fdatasync", failing)
    flush = EarlyFlush(fd, "x.bin")
    flush.kick(EarlyFlush.AFTER)
    flush.future.exception()  # (let it fail first)
    flush.kick(EarlyFlush.AFTER)  # not raised here: it is about data of earlier writes
    flush.kick(EarlyFlush.AFTER)
    assert flush.future is None and flush.take_count() == 1  # halted: none started
    err = flush.wait()
    assert isinstance(err, collio.BackendError) and err.errno == errno.EIO
    assert "early flush (fdatasync) of 'x.bin' failed: injected fdatasync error" in str(err)
    assert "may not be durable" in str(err)
    assert flush.wait() is None  # reported once
    flush.kick(EarlyFlush.AFTER)  # flushes start again after the report
    assert isinstance(flush.wait(), collio.BackendError) and flush.take_count() == 1
    os.close(fd)


def test_small_writes_flush_once_enough_was_written(tmp_path, monkeypatch):
    """Kicks of small writes start no flush until :data:`EarlyFlush.AFTER` bytes add up."""
    fd = _fd(tmp_path)
    seen = []
    monkeypatch.setattr(fsync, "fdatasync", seen.append)
    flush = EarlyFlush(fd)
    for _ in range(7):
        flush.kick(EarlyFlush.AFTER // 8)
    assert flush.future is None and flush.take_count() == 0
    flush.kick(EarlyFlush.AFTER // 8)
    assert flush.wait() is None and seen == [fd] and flush.take_count() == 1
    flush.kick(1)
    assert flush.future is None  # counted again from the flush
    os.close(fd)


def test_kick_now_starts_a_flush_below_the_threshold(tmp_path, monkeypatch):
    """``now`` (``File._flush_soon``, a checkpoint's data before its checksums): a flush
    starts whatever was written; a second one waits for the first, as every kick."""
    fd = _fd(tmp_path)
    gate, seen = _held(monkeypatch)
    flush = EarlyFlush(fd)
    flush.kick(0)
    assert flush.future is None and flush.pending == 0  # (below the threshold: none)
    flush.kick(0, now=True)
    flush.kick(0, now=True)
    gate.set()
    assert flush.wait() is None and seen == [fd] and flush.take_count() == 1
    os.close(fd)
