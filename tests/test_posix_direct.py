"""Hint ``direct_write``: the posix backend writes the page-aligned middle of large requests
with ``O_DIRECT`` and the rest through the page cache; the bytes must not change (one rank)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import collio
from collio import layouts
from collio.backends.posix import open_direct, write_split
from collio.buffers import PAGE

MiB = 1 << 20


def _direct_or_skip(path: str) -> int:
    """An O_DIRECT descriptor for the file ``path`` (made if missing), or skip."""
    open(path, "ab").close()
    dfd = open_direct(path)
    if dfd < 0:
        pytest.skip("this file system refuses O_DIRECT")
    return dfd


def _at(offset: int, nbytes: int, shift: int = 0) -> np.ndarray:
    """A buffer whose first byte sits at ``offset + shift`` modulo the page size."""
    raw = np.empty(nbytes + 2 * PAGE, np.uint8)
    skip = (offset + shift - raw.ctypes.data) % PAGE
    return raw[skip : skip + nbytes]


@pytest.mark.parametrize(
    ("offset", "nbytes", "shift", "direct"),
    [
        (0, 3 * MiB, 0, 3 * MiB),  # all aligned: all direct
        (100, 2 * MiB + 777, 0, 2 * MiB - PAGE),  # unaligned edges through the page cache
        (PAGE - 1, MiB + 2 * PAGE, 0, MiB + PAGE),
        (100, 2 * MiB + 777, 1, 2 * MiB - PAGE),  # memory off by one: through a bounce buffer
        (0, MiB - PAGE, 0, 0),  # too small to bother
    ],
)
def test_write_split_puts_every_byte_where_it_belongs(tmp_path, offset, nbytes, shift, direct):
    path = str(tmp_path / "f.bin")
    old = np.random.default_rng(1).integers(0, 256, 6 * MiB, np.uint8)
    old.tofile(path)
    buf = _at(offset, nbytes, shift)
    buf[:] = np.random.default_rng(2).integers(0, 256, nbytes, np.uint8)
    fd, dfd = os.open(path, os.O_RDWR), _direct_or_skip(path)
    try:
        os.pread(fd, 8 * MiB, 0)  # the old bytes in the page cache: a direct write must drop them
        assert write_split(fd, dfd, buf, offset) == direct
        os.fsync(fd)
    finally:
        os.close(fd)
        os.close(dfd)
    want = old.copy()
    want[offset : offset + nbytes] = buf
    assert np.array_equal(np.fromfile(path, np.uint8), want)


def test_collio_direct_write_w_and_r_plus_with_holes(tmp_path):
    path = str(tmp_path / "m.bin")
    n = 1024  # 8 MiB of float64
    glob = np.random.default_rng(3).standard_normal((n, n))
    lay = layouts.block((n, n), "<f8")
    hints = {"direct_write": True, "romio_cb_write": "enable", "min_rounds": 2}
    os.close(_direct_or_skip(path))
    with collio.open(path, "w", hints=hints) as f:
        f.write_all(glob, lay)
        assert f.stats.hints["direct_write"] is True
        assert f.stats.direct_io_bytes >= 6 * MiB
    assert np.array_equal(np.fromfile(path, "<f8").reshape(n, n), glob)
    # r+: a box with a hole in every row keeps the old bytes around it
    box = layouts.Subarray((n, n), (3, 5), (n - 9, n - 40), "<f8")
    new = np.random.default_rng(4).standard_normal(box.local_shape)
    with collio.open(path, "r+", hints=hints) as f:
        f.write_all(new, box)
        assert f.stats.direct_io_bytes > 0
        back = f.read_all(lay)
    want = glob.copy()
    want[box.slices] = new
    assert np.array_equal(np.fromfile(path, "<f8").reshape(n, n), want)
    assert np.array_equal(back, want)


@pytest.mark.parametrize("start", [0, 16, 4095])
def test_direct_write_from_an_unaligned_user_buffer(tmp_path, start):
    """The no-shuffle path writes from the user's own array, which numpy rarely aligns
    to a page: the middle goes O_DIRECT through a kept bounce buffer (> 8 MiB: several
    pieces), the bytes stay right."""
    path = str(tmp_path / "u.bin")
    os.close(_direct_or_skip(path))
    n = 20 * MiB // 8 + 3
    raw = np.empty(n * 8 + 2 * PAGE, np.uint8)
    skip = (start - raw.ctypes.data) % PAGE
    data = raw[skip : skip + n * 8].view("<f8")
    data[:] = np.random.default_rng(5).standard_normal(n)
    lay = layouts.Subarray((n + 100,), (100,), (n,), "<f8")
    with collio.open(path, "w", hints={"direct_write": True}) as f:
        f.write_all(data, lay)
        assert f.stats.last_call["direct"] is True  # one rank, one run: no shuffle
        assert f.stats.direct_io_bytes >= 19 * MiB
        assert f.read_all(lay).tobytes() == data.tobytes()
    got = np.fromfile(path, "<f8")
    assert np.array_equal(got[100:], data) and len(got) == n + 100


def test_mpiio_backend_keeps_collio_only_hints_from_romio():
    from collio.backends.mpiio import info_from_hints

    hints = {"direct_write": True, "early_flush": False, "cb_nodes": 2}
    info = info_from_hints(collio.Hints.coerce(hints))
    try:
        keys = {info.Get_nthkey(i) for i in range(info.Get_nkeys())}
    finally:
        info.Free()
    collio_only = {"direct_write", "early_flush", "min_rounds", "atomic_commit"}
    assert "cb_nodes" in keys and not keys & collio_only


def test_direct_write_where_the_file_system_refuses_it(tmp_path, monkeypatch):
    """No O_DIRECT (older tmpfs, some FUSE mounts): plain writes, and the stats say so."""
    import collio.backends.posix as posix

    monkeypatch.setattr(posix, "open_direct", lambda name: -1)  # what such a mount gives
    path = str(tmp_path / "f.bin")
    glob = np.arange(512 * 512, dtype="<f8").reshape(512, 512)
    with collio.open(path, "w", hints={"direct_write": "true"}) as f:
        f.write_all(glob, layouts.block(glob.shape, "<f8"))
        assert f.stats.hints["direct_write"] is False  # asked for, not possible: said so
    assert np.array_equal(np.fromfile(path, "<f8").reshape(glob.shape), glob)


def test_direct_write_is_a_boolean_hint():
    with pytest.raises(collio.HintError, match="direct_write='sometimes'"):
        collio.Hints.coerce({"direct_write": "sometimes"})
    assert collio.Hints.coerce({"direct_write": "1"}).direct_write is True
    assert collio.Hints().direct_write is False
