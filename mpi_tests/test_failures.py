"""Failures are collective: every rank raises the same error, nothing hangs, work goes on.

pytest-timeout (``timeout`` in pyproject, thread method) turns a hang into a failure.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import subprocess

import numpy as np
import pytest
from helpers import local_piece, read_file, reference
from helpers import raises_everywhere as _raises_everywhere
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends import register_backend
from collio.backends.posix import PosixBackend

SHAPE = (16, 12)


def _col(comm, **kw):
    return layouts.block(SHAPE, "<f8", comm=comm, grid=(1, comm.size), **kw)


def _still_works(comm, path):
    """After an error the same processes go on with new collective calls."""
    glob = reference(SHAPE, "<f8", seed=5)
    lay = _col(comm)
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(local_piece(glob, lay), lay)
        np.testing.assert_array_equal(f.read_all(lay), local_piece(glob, lay))
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi
def test_region_outside_global_shape(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    last = comm.size - 1
    with collio.open(path, "w", comm=comm) as f:

        def bad():
            if comm.rank == last:
                lay = layouts.Subarray(SHAPE, (0, 9), (16, 4), "<f8")
            else:
                lay = layouts.Subarray(SHAPE, (0, 0), (0, 0), "<f8")
            f.write_all(np.zeros(lay.shape), lay)

        err = _raises_everywhere(comm, collio.LayoutError, bad)
        assert isinstance(err, ValueError)
        assert f"rank {last}: region (0, 9)+(16, 4) exceeds global shape (16, 12)" in str(err)
        assert err.ranks == (last,)
    _still_works(comm, path)


@pytest.mark.mpi
@pytest.mark.parametrize("what", ["dtype", "shape", "none-layout", "not-an-array"])
def test_bad_data_on_one_rank(comm, mpi_tmp_path, what):
    path = str(mpi_tmp_path / "target.bin")
    lay = _col(comm)
    data = np.zeros(lay.shape)
    layout = lay
    if comm.rank == 0:
        if what == "dtype":
            data = data.astype(np.float32)
        elif what == "shape":
            data = np.zeros((lay.shape[0], lay.shape[1] + 1))
        elif what == "none-layout":
            layout = None
        else:
            data = object()
    with collio.open(path, "w", comm=comm) as f:
        err = _raises_everywhere(comm, collio.LayoutError, lambda: f.write_all(data, layout))
        assert "rank 0:" in str(err)
        # the same file takes a correct write afterwards
        glob = reference(SHAPE, "<f8", seed=9)
        f.write_all(local_piece(glob, lay), lay)
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(SHAPE), glob)


@pytest.mark.mpi(min_size=2)
def test_global_shape_differs(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    shape = (16, 12) if comm.rank != 1 else (16, 13)
    lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
    with collio.open(path, "w", comm=comm) as f:
        err = _raises_everywhere(
            comm, collio.MismatchError, lambda: f.write_all(np.zeros(lay.shape), lay)
        )
        assert "rank 1: global shape (16, 13)" in str(err)
        assert "(16, 12)" in str(err)
    _still_works(comm, path)


@pytest.mark.mpi(min_size=2)
def test_dtype_differs(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    dt = "<f8" if comm.rank != 1 else "<i8"
    lay = layouts.block(SHAPE, dt, comm=comm, grid=(1, comm.size))
    with collio.open(path, "w", comm=comm) as f:
        err = _raises_everywhere(
            comm, collio.MismatchError, lambda: f.write_all(np.zeros(lay.shape, dt), lay)
        )
        assert "<i8" in str(err)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("hints", [{}, {"cb_nodes": 1}, {"romio_cb_write": "disable"}])
def test_overlapping_writes(comm, mpi_tmp_path, hints):
    # every rank writes its own row; ranks 0 and 1 both also write byte range [40, 48)
    path = str(mpi_tmp_path / "target.bin")
    offs = [comm.rank * 1000]
    if comm.rank in (0, 1):
        offs.append(40 + 2000 * 0)
    lay = layouts.Segments(offs, [8] * len(offs))
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        err = _raises_everywhere(
            comm, collio.OverlapError, lambda: f.write_all(np.ones(lay.local_shape, np.uint8), lay)
        )
        assert "bytes [40, 48) are written by ranks 0 and 1" in str(err)
    _still_works(comm, path)


@pytest.mark.mpi
def test_one_rank_overlaps_itself(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    lay = layouts.Segments([0, 4], [8, 8]) if comm.rank == 0 else layouts.Segments([], [])
    with collio.open(path, "w", comm=comm) as f:
        for _ in range(2):  # the second call finds the check kept on the layout: same error
            err = _raises_everywhere(
                comm,
                collio.OverlapError,
                lambda: f.write_all(np.zeros(lay.local_shape, np.uint8), lay),
            )
            assert "rank 0: bytes [4, 12) are written twice by this rank" in str(err)


@pytest.mark.mpi
def test_target_cannot_be_created(comm, mpi_tmp_path):
    blocker = str(mpi_tmp_path / "plain-file")
    if comm.rank == 0:
        with open(blocker, "w") as fh:
            fh.write("x")
    comm.Barrier()
    path = os.path.join(blocker, "sub", "target.bin")  # a file used as a directory: ENOTDIR
    err = _raises_everywhere(comm, collio.BackendError, lambda: collio.open(path, "w", comm=comm))
    assert isinstance(err, OSError)
    assert err.errno == errno.ENOTDIR
    assert "rank 0:" in str(err) and "plain-file" in str(err)
    _still_works(comm, str(mpi_tmp_path / "ok.bin"))


@pytest.mark.mpi
def test_missing_file_for_reading(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "absent.bin")
    err = _raises_everywhere(comm, collio.BackendError, lambda: collio.open(path, "r", comm=comm))
    assert err.errno == errno.ENOENT
    err = _raises_everywhere(comm, collio.BackendError, lambda: collio.open(path, "r+", comm=comm))
    assert isinstance(err, FileNotFoundError) or err.errno == errno.ENOENT
    # a directory is not a file to read (FIFOs and devices: test_hardening.py)
    err = _raises_everywhere(
        comm, collio.BackendError, lambda: collio.open(str(mpi_tmp_path), "r", comm=comm)
    )
    assert "rank 0:" in str(err) and "is a directory, not a regular file" in str(err)
    assert err.ranks == (0,) and err.errno == errno.EISDIR


@pytest.mark.mpi
def test_write_in_read_mode_and_after_close(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    _still_works(comm, path)
    lay = _col(comm)
    f = collio.open(path, "r", comm=comm)
    _raises_everywhere(comm, collio.ModeError, lambda: f.write_all(np.zeros(lay.shape), lay))
    f.close()
    f.close()  # idempotent
    _raises_everywhere(comm, collio.ModeError, lambda: f.read_all(lay))


@pytest.mark.mpi
def test_bad_mode_and_hints(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    _raises_everywhere(comm, collio.ModeError, lambda: collio.open(path, "a", comm=comm))
    _raises_everywhere(
        comm,
        collio.HintError,
        lambda: collio.open(path, "w", comm=comm, hints={"cb_nodes": 0}),
    )
    _raises_everywhere(
        comm,
        collio.HintError,
        lambda: collio.open(path, "w", comm=comm, hints={"romio_cb_write": "sometimes"}),
    )


@pytest.mark.mpi(min_size=2)
def test_hints_differ_between_ranks(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    hints = {"cb_buffer_size": 4096 if comm.rank == 1 else 8192}
    err = _raises_everywhere(
        comm,
        collio.MismatchError,
        lambda: collio.open(path, "w", comm=comm, hints=hints),
        match="rank 1: open arguments",
    )
    assert err.ranks == (1,)
    # (each rank's hints shown as the ones given other values than the defaults)
    assert "{'cb_buffer_size': 4096}" in str(err) and "{'cb_buffer_size': 8192}" in str(err)
    _still_works(comm, path)


@pytest.mark.mpi
def test_backend_options_bad_on_one_rank(comm, mpi_tmp_path):
    """Backend options are checked at open (only ``create`` is compared): a bad one on one
    rank is agreed, not a hang, and agreed before any rank touches the target (mode 'w'
    would truncate it)."""
    path = str(mpi_tmp_path / "target.bin")
    _bad_option_on_last_rank(
        comm, path, bytes(range(256)) * 4, "holes", "sometimes", "auto",
        "holes='sometimes' must be auto, rmw or runs",
    )  # fmt: skip


def _bad_option_on_last_rank(comm, path, before, name, bad, good, match):
    """Open ``path`` in 'w' with backend option ``name`` bad on the last rank only: the
    same ModeError everywhere, the existing bytes ``before`` untouched, then usable."""
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(before)
    comm.Barrier()
    value = bad if comm.rank == comm.size - 1 else good
    _raises_everywhere(
        comm,
        collio.ModeError,
        lambda: collio.open(path, "w", comm=comm, **{name: value}),
        match=match,
    )
    with open(path, "rb") as fh:
        assert fh.read() == before
    comm.Barrier()
    _still_works(comm, path)


@pytest.mark.mpi
def test_view_offset_not_an_integer_on_one_rank(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    with collio.open(path, "w", comm=comm) as f:
        f.set_view(8 * comm.rank, MPI.DOUBLE, MPI.DOUBLE)
        offset = "far" if comm.rank == 0 else 0
        _raises_everywhere(
            comm,
            collio.LayoutError,
            lambda: f.write_at_all(offset, np.zeros(1, "f8")),
            match="offset 'far' is not an integer",
        )
    _still_works(comm, path)


class FailingPosix(PosixBackend):
    """A real POSIX file whose k-th large write on one rank fails with EIO (fault injection)."""

    name = "failing-posix"
    fail_rank = 0
    fail_after = 1

    def write_at(self, offset, buf):
        if MPI.COMM_WORLD.rank == self.fail_rank:
            type(self).fail_after -= 1
            if type(self).fail_after < 0:
                raise OSError(errno.EIO, "injected I/O error", self.path)
        super().write_at(offset, buf)


class FailingReads(PosixBackend):
    """A real POSIX file whose k-th read on one rank fails with EIO."""

    name = "failing-reads"
    fail_rank = 0
    fail_after = 1

    def read_at(self, offset, buf):
        if MPI.COMM_WORLD.rank == self.fail_rank:
            type(self).fail_after -= 1
            if type(self).fail_after < 0:
                raise OSError(errno.EIO, "injected read error", self.path)
        super().read_at(offset, buf)


register_backend("failing-posix", FailingPosix)
register_backend("failing-reads", FailingReads)


@pytest.mark.mpi
@pytest.mark.parametrize("fail_after", [0, 1, 3])
def test_aggregator_write_fails_mid_round(comm, mpi_tmp_path, fail_after):
    path = str(mpi_tmp_path / "target.bin")
    shape = (256, 256)
    glob = reference(shape, "<f8")
    lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
    FailingPosix.fail_rank = comm.size - 1
    FailingPosix.fail_after = fail_after
    # many rounds (the others must not wait for the next one); shuffle even at one rank
    hints = {"cb_buffer_size": 16384, "romio_cb_write": "enable", "cb_min_domain": 0}
    with collio.open(path, "w", comm=comm, hints=hints, backend="failing-posix") as f:
        err = _raises_everywhere(
            comm, collio.BackendError, lambda: f.write_all(local_piece(glob, lay), lay)
        )
        assert err.errno == errno.EIO
        assert f"rank {comm.size - 1}: injected I/O error" in str(err)
        FailingPosix.fail_after = 10**9
        f.write_all(local_piece(glob, lay), lay)  # the file is usable after the error
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(shape), glob)


@pytest.mark.mpi
def test_enospc_on_a_small_tmpfs(comm, mpi_tmp_path):
    mnt = str(mpi_tmp_path / "small")
    ok = 0
    if comm.rank == 0:
        os.mkdir(mnt)
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], capture_output=True
        )
        ok = int(res.returncode == 0)
    if not comm.bcast(ok, root=0):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        shape = (512, 512)  # 2 MiB into a 1 MiB file system
        lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
        glob = reference(shape, "<f8")
        with collio.open(
            os.path.join(mnt, "big.bin"), "w", comm=comm, hints={"cb_buffer_size": 65536}
        ) as f:
            err = _raises_everywhere(
                comm, collio.BackendError, lambda: f.write_all(local_piece(glob, lay), lay)
            )
            assert err.errno in (errno.ENOSPC, errno.EFBIG)
        _still_works(comm, str(mpi_tmp_path / "after.bin"))
    finally:
        comm.Barrier()
        if comm.rank == 0:
            subprocess.run(["umount", "-l", mnt], check=False)


@pytest.mark.mpi
def test_atomic_commit_failure_keeps_previous_file(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "atomic.bin")
    _still_works(comm, path)
    with open(path, "rb") as fh:
        before = fh.read()
    comm.Barrier()
    shape = (256, 256)
    glob = reference(shape, "<f8", seed=1)
    lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
    FailingPosix.fail_rank = 0
    FailingPosix.fail_after = 2
    hints = {"cb_buffer_size": 16384, "atomic_commit": True, "romio_cb_write": "enable"}
    with collio.open(path, "w", comm=comm, hints=hints, backend="failing-posix") as f:
        _raises_everywhere(
            comm, collio.BackendError, lambda: f.write_all(local_piece(glob, lay), lay)
        )
        _raises_everywhere(comm, collio.ModeError, lambda: f.write_all(local_piece(glob, lay), lay))
    comm.Barrier()
    with open(path, "rb") as fh:
        assert fh.read() == before
    assert sorted(os.listdir(mpi_tmp_path)) == ["atomic.bin"]
    # success: the new content appears only at close, in one rename
    FailingPosix.fail_after = 10**9
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        f.write_all(local_piece(glob, lay), lay)
        comm.Barrier()
        with open(path, "rb") as fh:
            assert fh.read() == before
        comm.Barrier()
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(shape), glob)
    assert sorted(os.listdir(mpi_tmp_path)) == ["atomic.bin"]


@pytest.mark.mpi
@pytest.mark.parametrize("fail_after", [0, 2])
def test_aggregator_read_fails_mid_round(comm, mpi_tmp_path, fail_after):
    path = str(mpi_tmp_path / "target.bin")
    shape = (256, 256)
    glob = reference(shape, "<f8", seed=4)
    lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
    if comm.rank == 0:
        glob.tofile(path)
    comm.Barrier()
    FailingReads.fail_rank = comm.size - 1
    FailingReads.fail_after = fail_after
    hints = {"cb_buffer_size": 16384, "romio_cb_read": "enable", "cb_min_domain": 0}
    with collio.open(path, "r", comm=comm, hints=hints, backend="failing-reads") as f:
        err = _raises_everywhere(comm, collio.BackendError, lambda: f.read_all(lay))
        assert err.errno == errno.EIO and "injected read error" in str(err)
        FailingReads.fail_after = 10**9
        np.testing.assert_array_equal(f.read_all(lay), local_piece(glob, lay))


@pytest.mark.mpi(min_size=2)
def test_different_path_on_one_rank(comm, mpi_tmp_path):
    """Ranks naming different files is refused everywhere, before any file is touched."""
    paths = [str(mpi_tmp_path / f"mine-{r}.bin") for r in range(2)]
    if comm.rank == 0:
        with open(paths[0], "wb") as fh:
            fh.write(b"keep me")
    comm.Barrier()
    path = paths[1] if comm.rank == comm.size - 1 else paths[0]
    err = _raises_everywhere(comm, collio.MismatchError, lambda: collio.open(path, "w", comm=comm))
    assert f"rank {comm.size - 1}: open arguments" in str(err) and "mine-1.bin" in str(err)
    with open(paths[0], "rb") as fh:
        assert fh.read() == b"keep me"
    assert not os.path.exists(paths[1])
    comm.Barrier()
    _still_works(comm, paths[0])


@pytest.mark.mpi
def test_writeback_option_bad_on_one_rank(comm, mpi_tmp_path):
    """A bad backend option on one rank: the same error everywhere, before rank 0
    truncates the existing target ('w')."""
    path = str(mpi_tmp_path / "target.bin")
    _bad_option_on_last_rank(
        comm, path, b"keep me", "writeback", "yes", True,
        "writeback='yes' must be True or False",
    )  # fmt: skip


@pytest.mark.mpi
def test_user_communicator_freed_while_a_file_is_open(comm, mpi_tmp_path):
    """As with MPI-IO, a file stays usable after the communicator it was opened on is freed."""
    path = str(mpi_tmp_path / "target.bin")
    sub = comm.Dup()
    lay = _col(comm)
    glob = reference(lay.global_shape, lay.dtype)
    f = collio.open(path, "w", comm=sub)
    f.write_all(np.zeros(lay.shape), lay)
    sub.Free()
    f.write_all(local_piece(glob, lay), lay)
    np.testing.assert_array_equal(f.read_all(lay), local_piece(glob, lay))
    f.close()
    comm.Barrier()
    got = np.fromfile(path, lay.dtype).reshape(lay.global_shape)
    np.testing.assert_array_equal(got, glob)
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["subarray", "segments", "view", "at"])
@pytest.mark.parametrize("atomic", [False, True])
def test_read_beside_write_fails_everywhere_and_closes(comm, mpi_tmp_path, kind, atomic):
    """One rank reads where the others write (array layouts, byte segments, a file view,
    explicit offsets): the same MismatchError everywhere before any byte moves; with
    atomic_commit every rank aborts alike; close() still agrees."""
    path = str(mpi_tmp_path / "target.bin")
    n, r = SHAPE[0], comm.rank
    rows = -(-n // comm.size)
    a, b = min(r * rows, n), min(n, (r + 1) * rows)
    old = reference(SHAPE, "<f8", seed=3)
    mine = np.ascontiguousarray(old[a:b])
    box = layouts.Subarray(SHAPE, (a, 0), (b - a, SHAPE[1]), "<f8")
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(mine, box)
    lay = layouts.Segments([a * SHAPE[1] * 8], [mine.nbytes]) if kind == "segments" else box
    hints = {"atomic_commit": atomic}
    with collio.open(path, "r+", comm=comm, hints=hints) as f:
        if kind in ("view", "at"):
            f.set_view(a * SHAPE[1] * 8, MPI.DOUBLE)
        zeros = np.zeros_like(mine)
        if comm.rank == comm.size - 1:
            call = {
                "view": lambda: f.read_all(np.empty_like(mine)),
                "at": lambda: f.read_at_all(0, np.empty_like(mine)),
            }.get(kind, lambda: f.read_all(lay))
        else:
            call = {
                "view": lambda: f.write_all(zeros),
                "at": lambda: f.write_at_all(0, zeros),
            }.get(kind, lambda: f.write_all(zeros, lay))
        name = "read_at_all" if kind == "at" else "read_all"
        err = _raises_everywhere(
            comm, collio.MismatchError, call, match=f"rank {comm.size - 1}: {name}"
        )
        assert "ranks called different collective operations" in str(err)
        assert err.ranks == (comm.size - 1,)
        if not atomic:
            np.testing.assert_array_equal(f.read_all(box), mine)  # untouched, still usable
    comm.Barrier()
    np.testing.assert_array_equal(np.fromfile(path, "<f8").reshape(SHAPE), old)
    comm.Barrier()
    _still_works(comm, path)


def _address_space() -> int:
    with open("/proc/self/status") as status:
        line = next(s for s in status if s.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


@contextlib.contextmanager
def _little_memory(on: bool, more: int = 256 << 20):
    """On this rank (if ``on``), allocations beyond ``more`` bytes more fail (RLIMIT_AS)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if on:
        resource.setrlimit(resource.RLIMIT_AS, (_address_space() + more, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.mpi
@pytest.mark.parametrize("kept", [False, True], ids=["new-plan", "kept-plan"])
@pytest.mark.parametrize("op", ["write", "read"])
def test_round_buffers_out_of_memory_on_one_rank(comm, mpi_tmp_path, op, kept):
    """An aggregator that cannot allocate its round buffers fails before any message.

    In the rounds it would raise alone and leave the others waiting for its messages
    (a hang).  With a kept plan, the buffers are made in the
    call's check (here one rank dropped its kept buffers, as ``release_buffers`` or a
    larger call's failed growth would), else in the planning.
    """
    path = str(mpi_tmp_path / "target.bin")
    shape = (64, 64)
    glob = reference(shape, "<f8", seed=11)
    lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
    last = comm.size - 1
    # 2 x 1 GiB round buffers (address space only: untouched pages cost nothing)
    hints = {"cb_buffer_size": 1 << 30, "min_rounds": 1, "cb_min_domain": 0}
    hints.update(romio_cb_write="enable", romio_cb_read="enable")  # (shuffle at 1 rank too)
    try:
        with collio.open(path, "w", comm=comm, hints=hints) as f:
            f.write_all(local_piece(glob, lay), lay)
            if op == "read" or kept:  # the plan of the call below is kept
                np.testing.assert_array_equal(f.read_all(lay), local_piece(glob, lay))
            if kept:
                if comm.rank == last:
                    collio.buffers._kept.clear()  # this rank's kept buffers are gone
            else:
                collio.release_buffers()  # plans and buffers: planned and made anew
            call = (
                (lambda: f.write_all(local_piece(glob, lay) + 1, lay))
                if op == "write"
                else (lambda: f.read_all(lay))
            )
            with _little_memory(comm.rank == last):
                err = _raises_everywhere(comm, collio.CollioError, call)
            assert f"rank {last}: MemoryError" in str(err)
            assert err.ranks == (last,)
            # the file is untouched and usable: the same call works with memory back
            np.testing.assert_array_equal(f.read_all(lay), local_piece(glob, lay))
            f.write_all(local_piece(glob, lay) * 2, lay)
            assert f.stats.last_call["plan_reused"] == kept  # (the path the test meant)
        comm.Barrier()
        assert np.array_equal(np.fromfile(path, "<f8").reshape(shape), glob * 2)
    finally:
        collio.release_buffers()


@pytest.mark.mpi(min_size=2)
def test_metadata_out_of_memory_on_one_aggregator(comm, mpi_tmp_path):
    """An aggregator that cannot hold the metadata of its domain's pieces fails in the
    planning's exchange, on every rank (before, the others waited in ``Alltoallv``)."""
    path = str(mpi_tmp_path / "target.bin")
    last, m = comm.size - 1, 1 << 22
    if comm.rank == last:  # no data of its own, but a domain of 8-byte pieces
        offsets = np.zeros(0, np.int64)
    else:
        offsets = (np.arange(m, dtype=np.int64) * comm.size + comm.rank) * 8
    lay = collio.layouts.Segments(offsets, np.full(len(offsets), 8, np.int64))
    data = np.random.default_rng(comm.rank).integers(0, 256, len(offsets) * 8, dtype=np.uint8)
    with collio.open(path, "w", comm=comm, hints={"romio_cb_write": "enable"}) as f:
        collio.release_buffers()  # planned anew, as in a first call
        with _little_memory(comm.rank == last, 16 << 20):
            err = _raises_everywhere(comm, collio.CollioError, lambda: f.write_all(data, lay))
        assert f"write_all: rank {last}: MemoryError" in str(err)
        f.write_all(data, lay)  # the same call works with memory back
    comm.Barrier()
    got = np.zeros(m * comm.size * 8, np.uint8)
    raw = np.fromfile(path, np.uint8)
    got[: len(raw)] = raw  # (the file ends with the last piece written)
    got = got.reshape(m, comm.size, 8)
    if comm.rank != last:
        assert np.array_equal(got[:, comm.rank, :].reshape(-1), data)
    else:  # nobody wrote the last rank's slots
        assert not got[:, last, :].any()


@contextlib.contextmanager
def _no_descriptors(on: bool):
    """On this rank (if ``on``), no file can be opened: the limit on descriptors is the
    lowest free one, so the kernel refuses the next open (EMFILE), as it refuses a file
    the rank may not open (EACCES) in a job whose ranks run as different users."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if on:
        low = os.open(os.devnull, os.O_RDONLY)
        os.close(low)
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _open_w(path, comm, how):
    """Open ``path`` in 'w' by ``how`` (a backend name, or "h5": collio.h5.File), then close."""
    if how == "h5":
        from collio.h5 import File

        File(path, "w", comm=comm).close()
        return
    opts = {"dataset": "x", "shape": (4,), "dtype": "<f8"} if how == "hdf5" else {}
    collio.open(path, "w", comm=comm, backend=how, **opts).close()


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["posix", "mpiio", "hdf5", "h5"])
def test_w_open_that_one_rank_cannot_make_keeps_the_file(comm, mpi_tmp_path, how):
    """'w' on an existing file that the last rank cannot open: every rank raises the same
    error and the file keeps every byte, as ROMIO's open leaves it; it is emptied only
    once every rank opened it (the next 'w' open does)."""
    if how in ("hdf5", "h5"):
        pytest.importorskip("h5py")
    path = str(mpi_tmp_path / "kept.bin")
    old = np.random.default_rng(3).integers(0, 256, 5000, np.uint8).tobytes()
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(old)
    _open_w(str(mpi_tmp_path / "warm.bin"), comm, how)  # (collio has seen comm: no Dup below)
    comm.Barrier()
    with _no_descriptors(comm.rank == comm.size - 1):
        err = _raises_everywhere(comm, collio.CollioError, lambda: _open_w(path, comm, how))
    assert f"rank {comm.size - 1}:" in str(err), str(err)
    comm.Barrier()
    kept = comm.allgather(read_file(path) == old)
    assert kept == [True] * comm.size
    _open_w(path, comm, how)
    comm.Barrier()
    size = os.path.getsize(path)
    if how in ("posix", "mpiio"):
        assert size == 0
    else:
        import h5py

        with h5py.File(path, "r") as f:
            assert list(f) == (["x"] if how == "hdf5" else [])
