"""A save whose data is written before its checksums and index: what fails after the data
(the early flush started for the disk, a checksum) still keeps the previous checkpoint."""

from __future__ import annotations

import errno
import os
from typing import Any

import numpy as np
import pytest
from helpers import assert_rows_load, fail_fsync_on_last_rank, raises_everywhere, read_file
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio.backends import fsync, localfile, posix
from collio.backends.localfile import spare_name
from collio.testing import checkpoint as model


def _path(comm: MPI.Intracomm, tmp: Any) -> str:
    return str(comm.bcast(os.path.join(str(tmp), "model.ckpt"), root=0))


def _kept(comm: MPI.Intracomm, path: str, before: bytes, *, spare: bool = False) -> None:
    """The target holds ``before`` byte for byte, nothing else is left beside it but
    the spare of the checkpoint a save replaced (where there was one), and it loads
    (its checksums hold).  Rank 0's findings are asserted on every rank, so a failing
    one fails the test everywhere instead of leaving the others in the load."""
    seen = comm.bcast(
        (read_file(path) == before, sorted(os.listdir(os.path.dirname(path))))
        if comm.rank == 0 else None
    )  # fmt: skip
    want = [os.path.basename(path)]
    if spare:
        want.append(os.path.basename(spare_name(path)))
    assert seen == (True, sorted(want)), seen
    assert_rows_load(comm, path)


@pytest.mark.mpi
def test_an_fsync_that_fails_on_one_rank_keeps_the_previous_checkpoint(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last rank's fsync of the written data fails (EIO) at the close: the save
    raises the same BackendError on every rank, and the commit is dropped."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    before = read_file(path) if comm.rank == 0 else b""
    fail_fsync_on_last_rank(comm, monkeypatch)
    state = model.rows_state(comm.rank, comm.size, scale=2)
    err = raises_everywhere(comm, collio.BackendError, lambda: ckpt.save(path, state, comm=comm))
    monkeypatch.undo()
    assert "injected fsync error" in str(err)
    _kept(comm, path, before)


@pytest.mark.mpi
def test_a_checksum_that_fails_on_one_rank_after_the_data_keeps_the_previous_checkpoint(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checksums are made once the data is written: the last rank's failing there
    (the library raising) is raised on every rank, naming it, and the temporary with the
    new data is removed."""
    from collio.checkpoint import writer

    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    before = read_file(path) if comm.rank == 0 else b""
    if comm.rank == comm.size - 1:

        def failing(data: Any, value: int = 0) -> int:
            raise MemoryError("injected checksum failure")

        monkeypatch.setattr(writer.algo(), "_fn", failing)
    state = model.rows_state(comm.rank, comm.size, scale=2)
    err = raises_everywhere(comm, collio.CollioError, lambda: ckpt.save(path, state, comm=comm))
    assert f"rank {comm.size - 1}" in str(err) and "injected checksum failure" in str(err)
    monkeypatch.undo()
    _kept(comm, path, before)


@pytest.mark.mpi
def test_a_save_over_a_checkpoint_writes_the_same_bytes_as_into_a_new_file(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """The index written in its own call after the data: a save over an older checkpoint
    gives the very bytes of a save into a new file, and those bytes load."""
    path = _path(comm, mpi_tmp_path)
    fresh = path + ".new"
    ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=2), comm=comm)
    state = model.rows_state(comm.rank, comm.size)
    ckpt.save(path, state, comm=comm)
    ckpt.save(fresh, state, comm=comm)
    if comm.rank == 0:
        assert read_file(path) == read_file(fresh)
        os.unlink(fresh)
    comm.Barrier()
    _kept(comm, path, read_file(path) if comm.rank == 0 else b"", spare=True)


def _flushes_started(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The early flushes this rank starts from now on (each the bytes it was kicked
    with): the real :meth:`EarlyFlush.kick` runs, and each flush it starts is noted."""
    started: list[int] = []
    real = fsync.EarlyFlush.kick

    def kick(self: Any, nbytes: int, *, now: bool = False) -> None:
        before = self.count
        real(self, nbytes, now=now)
        if self.count > before:
            started.append(nbytes)

    monkeypatch.setattr(fsync.EarlyFlush, "kick", kick)
    return started


def _columns(comm: MPI.Intracomm) -> tuple[np.ndarray, Any, np.ndarray]:
    """An 8 MiB-per-rank array cut in column blocks (pieces not one range: two-phase)."""
    rows, cols = 2048, 512
    whole = np.arange(rows * cols * comm.size, dtype=np.float64).reshape(rows, -1)
    piece = np.ascontiguousarray(whole[:, comm.rank * cols : (comm.rank + 1) * cols])
    lay = collio.layouts.Subarray(whole.shape, (0, comm.rank * cols), (rows, cols), "<f8")
    return piece, lay, whole


def _writeback_started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The byte ranges whose writeback this rank starts from now on (the real
    ``sync_file_range`` runs; each call is noted)."""
    started: list[tuple[int, int]] = []
    real = posix.sync_file_range

    def sfr(fd: int, offset: int, nbytes: int, flags: int) -> int:
        started.append((offset, nbytes))
        return int(real(fd, offset, nbytes, flags))

    monkeypatch.setattr(posix, "sync_file_range", sfr)
    return started


@pytest.mark.mpi
def test_a_save_starts_the_disk_on_each_ranks_piece_as_it_writes_it(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row shard per rank (one run each): each rank starts the writeback of its own
    piece's bytes, no more (where Linux has no sync_file_range, an early flush)."""
    path = _path(comm, mpi_tmp_path)
    whole = np.arange(64 * 1024 * comm.size, dtype=np.float64).reshape(64 * comm.size, 1024)
    lay = collio.layouts.Subarray(whole.shape, (64 * comm.rank, 0), (64, 1024), "<f8")
    piece = np.ascontiguousarray(whole[64 * comm.rank : 64 * (comm.rank + 1)])
    ranges = _writeback_started(monkeypatch)
    flushes = _flushes_started(monkeypatch)
    ckpt.save(path, {"a": (piece, lay)}, comm=comm)
    monkeypatch.undo()
    if posix.sync_file_range is None:
        every = comm.allgather(len(flushes))  # (every rank asserts the same: none waits alone)
        assert min(every) >= 1, every
    else:
        at = ckpt.info(path).file_offset("a", piece.nbytes * comm.rank)
        every = comm.allgather((at, piece.nbytes) in ranges and not flushes)
        assert all(every), every
    np.testing.assert_array_equal(ckpt.load(path, {"a": None}, comm=comm)["a"], whole)


@pytest.mark.mpi
def test_a_save_starts_the_disk_on_each_ranks_region_whole_pages_only(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank's pieces (125 KiB, then 1 KiB) follow each other in its region, written as
    one range: it starts the writeback of that range's whole pages only, once (a page
    written back half filled is written again when filled).  The close's fsync takes
    the rest, and every byte loads."""
    path = _path(comm, mpi_tmp_path)
    r, p = comm.rank, comm.size
    big = np.arange(16 * p * 1000, dtype=np.float64).reshape(16 * p, 1000)
    small = np.arange(128 * p, dtype=np.float64)
    state = {
        "big": (big[16 * r : 16 * (r + 1)].copy(),
                collio.layouts.Subarray(big.shape, (16 * r, 0), (16, 1000), "<f8")),
        "small": (small[128 * r : 128 * (r + 1)].copy(),
                  collio.layouts.Subarray(small.shape, (128 * r,), (128,), "<f8")),
    }  # fmt: skip
    ranges = _writeback_started(monkeypatch)
    ckpt.save(path, state, comm=comm)
    monkeypatch.undo()
    if posix.sync_file_range is not None:  # (the same on every rank)
        meta = ckpt.info(path)
        at, end = meta.file_offset("big", 128000 * r), meta.file_offset("small", 1024 * r) + 1024
        assert meta.file_runs("big", 128000 * r, 128000 * (r + 1)) == [(at, 128000)]
        lo, hi = -(-at // 4096) * 4096, end // 4096 * 4096
        every = comm.allgather([x for x in ranges if x[1] > 0] == [(lo, hi - lo)])
        assert all(every), (every, ranges, (lo, hi))
    got = ckpt.load(path, {"big": None, "small": None}, comm=comm)
    np.testing.assert_array_equal(got["big"], big)
    np.testing.assert_array_equal(got["small"], small)


@pytest.mark.mpi
def test_an_async_save_starts_no_early_flush(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """async_save's only flush is its thread's fsync at the close (at the lowest
    priority): two-phase pieces' rounds start none beside the job's compute."""
    path = _path(comm, mpi_tmp_path)
    piece, lay, whole = _columns(comm)
    started = _flushes_started(monkeypatch)
    ckpt.async_save(path, {"a": (piece, lay)}, comm=comm).wait()
    monkeypatch.undo()
    every = comm.allgather(len(started))
    assert max(every) == 0, every
    np.testing.assert_array_equal(ckpt.load(path, {"a": None}, comm=comm)["a"], whole)


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["save", "async_save"])
def test_a_hint_one_rank_cannot_parse_raises_everywhere_and_keeps_the_checkpoint(
    comm: MPI.Intracomm, mpi_tmp_path: Any, how: str
) -> None:
    """The last rank's unparsable hint: the same HintError on every rank, before the
    target is opened, and the previous checkpoint as it was."""
    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    before = read_file(path) if comm.rank == 0 else b""
    hints = {"cb_buffer_size": "bogus"} if comm.rank == comm.size - 1 else None
    state = model.rows_state(comm.rank, comm.size, scale=2)

    def saving() -> None:
        if how == "save":
            ckpt.save(path, state, comm=comm, hints=hints)
        else:
            ckpt.async_save(path, state, comm=comm, hints=hints).wait()

    err = raises_everywhere(comm, collio.HintError, saving)
    assert f"rank {comm.size - 1}" in str(err) and "'bogus'" in str(err)
    _kept(comm, path, before)


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["save", "async_save"])
def test_a_full_disk_at_the_reservation_keeps_the_previous_checkpoint(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Rank 0 has the data's blocks allocated before any rank writes (``fallocate``):
    a full disk there (ENOSPC) is the same BackendError on every rank, before a byte is
    written, and the previous checkpoint stays; a file system that cannot allocate
    (EOPNOTSUPP) just saves."""
    import ctypes

    path = _path(comm, mpi_tmp_path)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    before = read_file(path) if comm.rank == 0 else b""
    calls: list[int] = []

    def full(fd: int, mode: int, offset: int, nbytes: int) -> int:
        calls.append(nbytes)
        ctypes.set_errno(errno.ENOSPC)
        return -1

    monkeypatch.setattr(posix, "fallocate", full)
    state = model.rows_state(comm.rank, comm.size, scale=2)

    def run() -> None:
        if how == "save":
            ckpt.save(path, state, comm=comm)
        else:
            ckpt.async_save(path, state, comm=comm).wait()

    err = raises_everywhere(comm, collio.BackendError, run)
    assert "rank 0" in str(err) and "no space left" in str(err).lower(), str(err)
    assert comm.allgather(len(calls)) == [1] + [0] * (comm.size - 1)
    _kept(comm, path, before)

    def unsupported(fd: int, mode: int, offset: int, nbytes: int) -> int:
        ctypes.set_errno(errno.EOPNOTSUPP)
        return -1

    monkeypatch.setattr(posix, "fallocate", unsupported)
    run()
    monkeypatch.undo()
    spec = model.rows_layouts(comm.rank, comm.size, scale=2)
    got = ckpt.load(path, dict(spec), comm=comm)
    for name, lay in spec.items():
        want = np.ascontiguousarray(model.rows_reference(name, scale=2)[lay.slices])  # type: ignore[attr-defined]
        assert got[name].tobytes() == want.tobytes(), (comm.rank, name)


def _cached_pages(fd: int) -> int:
    """How many of the file's pages are in the page cache (``mincore`` of a mapping)."""
    import ctypes
    import mmap

    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    try:
        buf = (ctypes.c_char * size).from_buffer(mm)
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec) == 0
        del buf
        return int(np.count_nonzero(np.frombuffer(vec, np.uint8) & 1))
    finally:
        mm.close()


def _read_all(fd: int) -> None:
    while os.read(fd, 1 << 20):
        pass
    os.lseek(fd, 0, os.SEEK_SET)


@pytest.mark.mpi
@pytest.mark.parametrize("free", ["background", "automatic", "automatic-elsewhere"])
def test_a_save_gives_back_the_replaced_checkpoints_cached_pages(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch, free: str
) -> None:
    """Replacing a checkpoint with a new file (``free_replaced=background``, or the
    default where no spare is kept: ``elsewhere``, a file system that is not a local
    disk's), the save drops the old file's page cache before the ranks write (the new
    bytes' pages then come back from it, not from free memory); a save that keeps the
    old file as its spare (the default on a local disk) leaves its pages cached, since
    the next save writes into them.  The new checkpoint loads byte for byte."""
    path = _path(comm, mpi_tmp_path)
    hints = {"free_replaced": free.split("-")[0]}
    if free.endswith("elsewhere"):
        monkeypatch.setattr(localfile, "fs_name", lambda fd: None)
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm, hints=hints)
    can, cached, fd = True, 0, -1
    if comm.rank == 0:
        # (the replaced file watched through a descriptor: a second name would keep it
        # from being kept as the spare)
        fd = os.open(path, os.O_RDONLY)
        _read_all(fd)
        cached = _cached_pages(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        can = cached > 0 and _cached_pages(fd) == 0  # (tmpfs keeps its pages)
        _read_all(fd)
        can = can and _cached_pages(fd) == cached
    if not comm.bcast(can):
        if fd >= 0:
            os.close(fd)
        pytest.skip("this file system keeps its pages in memory")
    ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=2), comm=comm, hints=hints)
    # (rank 0 looks, every rank asserts: a failure must not leave the others in the load)
    left = None
    if comm.rank == 0:
        st = os.fstat(fd)
        left = (_cached_pages(fd), st.st_ino != os.stat(path).st_ino, cached,
                os.path.exists(spare_name(path)))  # fmt: skip
        os.close(fd)
    left = comm.bcast(left)
    kept, whole = free == "automatic", left[2]  # (rank 0's count: every page, or none)
    assert whole > 0 and left == (whole if kept else 0, True, whole, kept), left
    spec = model.rows_layouts(comm.rank, comm.size, scale=2)
    got = ckpt.load(path, dict(spec), comm=comm)
    for name, lay in spec.items():
        want = np.ascontiguousarray(model.rows_reference(name, scale=2)[lay.slices])  # type: ignore[attr-defined]
        assert got[name].tobytes() == want.tobytes(), (comm.rank, name)


def _open_deleted(path: str) -> list[str]:
    """This process's descriptors of a removed file that was at ``path``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link == f"{path} (deleted)":
            out.append(link)
    return out


@pytest.mark.mpi
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("where", ["background", "commit"])
def test_the_replaced_checkpoint_is_freed_where_the_hint_says(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """``free_replaced=background`` hands rank 0's descriptor of the replaced file to a
    thread that closes it after the commit; ``commit`` closes it inside the commit, so
    once the save returns no process holds the old file and its blocks are free.  The
    new checkpoint loads byte for byte either way."""
    path = os.path.realpath(_path(comm, mpi_tmp_path))
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    handed: list[int] = []
    monkeypatch.setattr(posix, "release_later", handed.append)  # (kept open: looked at below)
    state = model.rows_state(comm.rank, comm.size, scale=2)
    ckpt.save(path, state, comm=comm, hints={"free_replaced": where})
    monkeypatch.undo()
    seen = comm.bcast((handed, _open_deleted(path)) if comm.rank == 0 else None)
    for fd in handed:
        if fd >= 0:
            os.close(fd)
    if where == "commit":
        assert seen == ([-1], []), seen
    else:
        assert len(seen[0]) == 1 and seen[0][0] >= 0 and len(seen[1]) == 1, seen
    spec = model.rows_layouts(comm.rank, comm.size, scale=2)
    got = ckpt.load(path, dict(spec), comm=comm)
    for name, lay in spec.items():
        want = np.ascontiguousarray(model.rows_reference(name, scale=2)[lay.slices])  # type: ignore[attr-defined]
        assert got[name].tobytes() == want.tobytes(), (comm.rank, name)
