"""Round windows: ``min_rounds`` cuts a domain into at least that many rounds.

The window each call used is in ``stats.last_call["window"]``; the file is checked
byte for byte and read back through the same rounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_everywhere

import collio
from collio import layouts
from collio.aggregators import window_size

pytestmark = pytest.mark.mpi(min_size=1)
MiB = 1 << 20
N = 1024  # 8 MiB of float64


@pytest.mark.parametrize("min_rounds", [None, 1, 3, 64])
def test_window_follows_min_rounds(comm, mpi_tmp_path, min_rounds):
    path = str(mpi_tmp_path / "target.bin")
    glob = np.random.default_rng(5).random((N, N))
    lay = layouts.block((N, N), "<f8", comm=comm, grid=(1, comm.size))
    hints: dict = {"romio_cb_write": "enable", "romio_cb_read": "enable"}  # 1 rank: no direct
    if min_rounds is not None:
        hints["min_rounds"] = min_rounds
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        naggs = len(f.stats.aggregators)
        window, rounds = f.stats.last_call["window"], f.stats.last_call["rounds"]
        assert f.stats.hints["min_rounds"] == (min_rounds or 8)
    largest = -(-N * N * 8 // naggs)
    want = window_size(16 * MiB, 1, largest, min_rounds or 8, comm.size)
    assert window == want
    assert rounds == -(-largest // window)
    if min_rounds == 1:
        assert window == 16 * MiB and rounds == 1
    else:  # shrunk to whole 64 KiB units, never below 1 MiB
        share = -(-largest // (min_rounds or 8))
        assert window == min(16 * MiB, max(MiB, comm.size * 65536, -(-share // 65536) * 65536))
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(N, N), glob)
    with collio.open(path, "r", comm=comm, hints=hints) as f:
        back = f.read_all(lay)
        assert f.stats.last_call["window"] == window
    assert np.array_equal(back, glob[lay.slices])


@pytest.mark.parametrize("everywhere", [True, False])
def test_min_rounds_must_be_positive(comm, mpi_tmp_path, everywhere):
    """min_rounds=0 (on every rank, or on the last only): the same HintError everywhere,
    and the existing target is not truncated."""
    path = str(mpi_tmp_path / "target.bin")
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(b"old")
    comm.Barrier()
    bad = everywhere or comm.rank == comm.size - 1
    hints = {"min_rounds": 0 if bad else 8}
    err = raises_everywhere(
        comm, collio.HintError, lambda: collio.open(path, "w", comm=comm, hints=hints)
    )
    assert "min_rounds=0" in str(err) and f"rank {comm.size - 1}" in str(err)
    with open(path, "rb") as fh:
        assert fh.read() == b"old"


def _direct_possible(comm, path: str) -> bool:
    from collio.backends.posix import direct_possible

    ok = False
    if comm.rank == 0:
        open(path, "ab").close()
        ok = direct_possible(path)
    return bool(comm.bcast(ok, root=0))


@pytest.mark.parametrize("kind", ["colblock", "cyclic"])
def test_direct_write_same_bytes_and_holes_kept(comm, mpi_tmp_path, kind):
    """Hint ``direct_write``: aggregators write the aligned middle of each round with
    O_DIRECT; the file is the numpy reference, in 'w' and in 'r+' around holes."""
    path = str(mpi_tmp_path / "target.bin")
    if not _direct_possible(comm, path):
        pytest.skip("this file system refuses O_DIRECT")
    glob = np.random.default_rng(6).random((N, N))
    if kind == "colblock":
        lay = layouts.block((N, N), "<f8", comm=comm, grid=(1, comm.size))
        piece = glob[lay.slices]
    else:
        lay = layouts.block_cyclic((N, N), "<f8", block=(64, 64), grid=(comm.size, 1), comm=comm)
        piece = glob[np.ix_(*lay.indices)]
    # rounds of whole 2-3 MiB domains: their aligned middles are over direct I/O's 1 MiB
    hints = {"direct_write": True, "romio_cb_write": "enable", "min_rounds": 1}
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        f.write_all(np.ascontiguousarray(piece), lay)
        assert f.stats.hints["direct_write"] is True
        direct = f.stats.direct_io_bytes  # summed over ranks, the same on every rank
    assert comm.allgather(direct) == [direct] * comm.size
    assert direct >= N * N * 8 // 2  # most of it went around the page cache
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(N, N), glob)
    # r+: each rank's box leaves out a few columns of every row; those keep the old bytes
    cols = -(-N // comm.size)
    c0 = min(comm.rank * cols, N)
    w = max(0, min(N, c0 + cols) - c0 - 7)
    box = layouts.Subarray((N, N), (0, c0), (N, w), "<f8")
    new = np.random.default_rng(10 + comm.rank).random(box.local_shape)
    with collio.open(path, "r+", comm=comm, hints=hints) as f:
        f.write_all(new, box)
        assert f.stats.direct_io_bytes > 0
    want = glob.copy()
    for r, got in enumerate(comm.allgather(new)):
        c = min(r * cols, N)
        want[:, c : c + got.shape[1]] = got
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(N, N), want)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("cb", [4096, 1 << 20])
def test_read_of_overlapping_runs_across_domains_and_windows(comm, mpi_tmp_path, cb):
    """A read may name a byte twice: a long run over several domains and windows with
    short runs inside it (its later pieces must not be sent before the short runs' ones,
    or the messages do not match: MPI 'message truncated')."""
    path = str(mpi_tmp_path / "target.bin")
    size = 60000
    ref = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
    if comm.rank == 0:
        ref.tofile(path)
    comm.Barrier()
    r = comm.rank
    offsets = [0, 100 + r, 30000 - 7 * r, 59990, 12345]
    lengths = [size, 10, 4000, 10, 1]
    lay = layouts.Segments(offsets, lengths)
    hints = {"romio_cb_read": "enable", "cb_buffer_size": cb}
    want = np.concatenate([ref[o : o + n] for o, n in zip(offsets, lengths, strict=True)])
    with collio.open(path, "r", comm=comm, hints=hints) as f:
        for _ in range(2):  # the second read reuses the kept plan
            np.testing.assert_array_equal(f.read_all(lay), want)


def test_direct_write_is_agreed_at_open(comm, mpi_tmp_path, monkeypatch):
    """One rank cannot open the file with O_DIRECT (as on a mount that refuses it): no
    rank writes around the page cache, and every rank's stats say so alike."""
    path = str(mpi_tmp_path / "target.bin")
    from collio.backends import fileopen

    if comm.rank == comm.size - 1:
        monkeypatch.setattr(fileopen, "open_direct", lambda name: -1)
    shape = (N, N)
    lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
    glob = np.random.default_rng(45).random(shape)
    with collio.open(path, "w", comm=comm, hints={"direct_write": True}) as f:
        f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        flags = comm.allgather((f.stats.hints["direct_write"], f.backend.dfd >= 0))
        direct = f.stats.direct_io_bytes
    assert flags == [(False, False)] * comm.size
    assert direct == 0
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(shape), glob)


@pytest.mark.parametrize("start", [0, 16, 4095])
def test_direct_write_from_an_unaligned_user_buffer(comm, mpi_tmp_path, start):
    """The no-shuffle path writes from the user's own array, which numpy rarely aligns
    to a page: the middle goes O_DIRECT through a kept bounce buffer (> 8 MiB: several
    pieces), the bytes stay right."""
    from collio.buffers import PAGE

    path = str(mpi_tmp_path / "u.bin")
    if not _direct_possible(comm, path):
        pytest.skip("this file system refuses O_DIRECT")
    n = 20 * MiB // 8 + 3 if comm.rank == 0 else 0
    raw = np.empty(n * 8 + 2 * PAGE, np.uint8)
    skip = (start - raw.ctypes.data) % PAGE
    data = raw[skip : skip + n * 8].view("<f8")
    data[:] = np.random.default_rng(5).standard_normal(n)
    total = comm.bcast(n + 100)
    lay = layouts.Subarray((total,), (100,), (n,), "<f8")
    with collio.open(path, "w", comm=comm, hints={"direct_write": True}) as f:
        f.write_all(data, lay)
        assert f.stats.last_call["direct"] is True  # one run on one rank: no shuffle
        assert f.stats.direct_io_bytes >= 19 * MiB
        assert f.read_all(lay).tobytes() == data.tobytes()
    comm.Barrier()
    got = np.fromfile(path, "<f8")
    assert len(got) == total and np.array_equal(got[100:], comm.bcast(data))
