"""Hint ``mapped_reads``: :func:`collio.backends.mapped.read_mapped` copies a rank's runs
out of the mapped file; every shape of runs must land byte for byte where a loop of
slices would put it.  One descriptor, no MPI (collective reads: ``mpi_tests/test_mapped.py``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from collio.backends.mapped import (
    FEW,
    Rows,
    copyable,
    fs_name,
    read_gathered,
    read_mapped,
    rows_of,
)
from collio.batch import span
from collio.runs import Runs
from collio.testing.guarded import far_apart

SIZE = 1 << 20


@pytest.fixture
def blob(tmp_path):
    """A 1 MiB file of random bytes: (fd, its bytes)."""
    data = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    data.tofile(path)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


def _reference(data: np.ndarray, runs: Runs, nbytes: int) -> np.ndarray:
    out = np.full(nbytes, 0xEE, np.uint8)
    for f, n, m in zip(runs.file.tolist(), runs.length.tolist(), runs.mem.tolist(), strict=True):
        out[m : m + n] = data[f : f + n]
    return out


def _runs(file, length, mem) -> Runs:
    f, n, m = (np.asarray(a, np.int64) for a in (file, length, mem))
    order = np.argsort(f, kind="stable")
    return Runs(f[order], n[order], m[order])


def _cases():
    rng = np.random.default_rng(3)
    k = 3000
    # rows of 96 bytes every 320 (column blocks), memory in file order
    yield "aligned-rows", _runs(np.arange(k) * 320 + 32, np.full(k, 96), np.arange(k) * 96)
    # offsets that are not multiples of the length (a header before the array)
    yield "unaligned", _runs(np.arange(k) * 300 + 7, np.full(k, 40), np.arange(k) * 40)
    # memory in another order than the file (a Fortran-order piece)
    perm = rng.permutation(k)
    yield "scattered-mem", _runs(np.arange(k) * 256, np.full(k, 64), perm * 64)
    # memory with gaps, offsets not multiples of the length
    yield "gapped-mem", _runs(np.arange(k) * 200 + 3, np.full(k, 24), np.arange(k) * 31 + 5)
    # full blocks and edge blocks (block-cyclic with a ragged edge): two lengths
    lens = np.where(np.arange(k) % 5 == 4, 24, 64)
    file = np.cumsum(np.full(k, 300)) - 300
    mem = np.concatenate(([0], np.cumsum(lens)[:-1]))
    yield "two-lengths", _runs(file, lens, mem)
    # a few runs of any length
    yield "few", _runs([5, 70_000, 500_000], [10, 60_000, 200_000], [0, 10, 60_010])
    # runs reaching the file's last byte, memory reversed
    yield (
        "to-the-end",
        _runs(SIZE - 64 * np.arange(1, 41), np.full(40, 64), np.arange(40)[::-1] * 64),
    )


@pytest.mark.parametrize("window", [1 << 20, 4096, 10_000])
@pytest.mark.parametrize(("name", "runs"), list(_cases()), ids=[c[0] for c in _cases()])
def test_read_mapped_equals_slices(blob, name, runs, window):
    fd, data = blob
    assert copyable(runs)
    nbytes = int((runs.mem + runs.length).max()) + 100
    out = np.full(nbytes, 0xEE, np.uint8)
    read_mapped(fd, runs, out, window=window)
    np.testing.assert_array_equal(out, _reference(data, runs, nbytes))


@pytest.mark.parametrize(("name", "runs"), list(_cases()), ids=[c[0] for c in _cases()])
def test_read_gathered_equals_slices(blob, name, runs):
    """The same runs through one pread of their extent into a buffer that held other
    bytes (kept from an earlier call) and one gather."""
    fd, data = blob
    lo, hi = runs.extent()
    buf = np.full(hi - lo + 999, 0x5A, np.uint8)
    nbytes = int((runs.mem + runs.length).max()) + 100
    out = np.full(nbytes, 0xEE, np.uint8)
    read_gathered(fd, runs, out, buf)
    np.testing.assert_array_equal(out, _reference(data, runs, nbytes))


def test_too_many_lengths_are_not_copyable():
    k = 200
    lens = 8 + np.arange(k) % 20  # 20 distinct lengths
    runs = _runs(np.arange(k) * 64, lens, np.arange(k) * 64)
    assert not copyable(runs)
    assert copyable(runs.take(slice(0, FEW)))  # a few runs are always copyable


_KERNEL_NAMES = {
    "ext2": "ext2/3/4", "ext3": "ext2/3/4", "ext4": "ext2/3/4", "xfs": "xfs", "btrfs": "btrfs",
    "tmpfs": "tmpfs", "overlay": "overlayfs", "zfs": "zfs", "f2fs": "f2fs", "ramfs": "ramfs",
}  # fmt: skip


def _mount_type(path: str) -> str:
    """The type /proc/mounts gives the mount holding ``path`` (the longest mount point)."""
    best, kind = "", ""
    real = os.path.realpath(path)
    with open("/proc/mounts") as mounts:
        for line in mounts:
            point, fstype = line.split()[1:3]
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fstype
    return kind


@pytest.mark.skipif(not os.path.exists("/proc/mounts"), reason="Linux only")
def test_fs_name_agrees_with_proc_mounts(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        name = fs_name(fd)
    finally:
        os.close(fd)
    assert name == _KERNEL_NAMES.get(_mount_type(str(path)))


def test_an_error_in_the_copy_is_the_one_raised_and_the_map_is_closed(blob, monkeypatch):
    """The traceback's frames hold views of the map: they are cleared, so the map
    closes and the copy's own error is raised (not a BufferError from close)."""
    from collio.backends import mapped

    def boom(*args, **kwargs):
        raise MemoryError("boom")

    fd, _ = blob
    monkeypatch.setattr(mapped, "_copy_uniform", boom)
    runs = _runs(np.arange(40) * 1000, np.full(40, 10), np.arange(40) * 10)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(MemoryError, match="boom"):
        read_mapped(fd, runs, np.zeros(400, np.uint8))
    assert len(os.listdir("/proc/self/fd")) == before  # (mmap's duplicate closed)


def test_zero_length_runs_are_skipped(blob):
    """A user layout may give empty runs (the built-in ones merge them away): they
    copy nothing, even at the file's end."""
    fd, data = blob
    runs = _runs([8] * 20 + [SIZE, 100], [0] * 21 + [30], [0] * 21 + [5])
    out = np.full(40, 0xEE, np.uint8)
    read_mapped(fd, runs, out)
    np.testing.assert_array_equal(out, _reference(data, runs, 40))


def test_runs_into_memory_terabytes_apart(tmp_path):
    """A batch's buffer spans its items' addresses (collio.batch): a heap array and a
    mapped one lie terabytes apart.  Runs of 256 KiB alternating between two such items
    land byte for byte; a view of rows over the whole span would count more bytes than
    numpy can (it raised ``ValueError: array is too big``)."""
    size, k = 256 << 10, 24
    data = np.random.default_rng(8).integers(0, 256, k * size, dtype=np.uint8)
    path = tmp_path / "runs.bin"
    data.tofile(path)
    a, b = far_apart(k // 2 * size, 3 << 44)
    lo = a.ctypes.data
    whole = span(lo, b.ctypes.data + len(b) - lo, writable=True, holds=(a, b))
    half = np.arange(k) // 2 * size
    mem = np.where(np.arange(k) % 2 == 0, half, b.ctypes.data - lo + half)
    fd = os.open(path, os.O_RDONLY)
    try:
        read_mapped(fd, _runs(np.arange(k) * size, np.full(k, size), mem), whole)
    finally:
        os.close(fd)
    rows = data.reshape(k, size)
    np.testing.assert_array_equal(a.reshape(-1, size), rows[0::2])
    np.testing.assert_array_equal(b.reshape(-1, size), rows[1::2])


def test_rows_of_knows_strided_rows_only():
    """Runs of one length evenly spaced in the file and one after another in memory
    are rows; any other shape is not (and takes the gather)."""
    k = 50
    rows = rows_of(_runs(np.arange(k) * 320 + 32, np.full(k, 96), np.arange(k) * 96 + 8))
    assert rows == Rows(count=k, length=96, stride=320, mem=8)
    assert rows_of(_runs(np.arange(k) * 64, np.full(k, 64), np.arange(k) * 64)) is not None
    for file, length, mem in [
        (np.arange(k) * 40, np.full(k, 64), np.arange(k) * 64),  # overlapping runs
        (np.arange(k) ** 2 * 64, np.full(k, 64), np.arange(k) * 64),  # uneven spacing
        (np.arange(k) * 256, np.full(k, 64), np.arange(k)[::-1] * 64),  # memory reversed
        (np.arange(k) * 256, np.full(k, 64), np.arange(k) * 65),  # memory with gaps
        (np.arange(k) * 256, 60 + np.arange(k) % 2, np.arange(k) * 64),  # two lengths
        ([128], [64], [0]),  # one run
    ]:
        assert rows_of(_runs(file, length, mem)) is None


_ROWS = [c for c in _cases() if rows_of(c[1]) is not None]


def test_some_cases_are_rows():
    assert [c[0] for c in _ROWS] == ["aligned-rows", "unaligned", "to-the-end"]


@pytest.mark.parametrize(("name", "runs"), _ROWS, ids=[c[0] for c in _ROWS])
def test_read_gathered_as_rows_equals_slices(blob, name, runs):
    """Runs that are rows, copied as rows from a kept buffer holding other bytes: the
    view of the last row reaches past the extent into those bytes, which never land."""
    rows = rows_of(runs)
    assert rows is not None
    fd, data = blob
    lo, hi = runs.extent()
    buf = np.full(max(hi - lo, rows.span), 0x5A, np.uint8)
    nbytes = int((runs.mem + runs.length).max()) + 100
    out = np.full(nbytes, 0xEE, np.uint8)
    read_gathered(fd, runs, out, buf, rows)
    np.testing.assert_array_equal(out, _reference(data, runs, nbytes))


def test_rows_past_the_end_read_zeros(tmp_path):
    """Rows whose last ones lie past the file's end read as zeros there, as the preads'
    do, not as what the kept buffer held."""
    data = np.arange(1, 251, dtype=np.uint8)
    path = tmp_path / "short.bin"
    data.tofile(path)
    runs = _runs(np.arange(8) * 40, np.full(8, 16), np.arange(8) * 16)  # 296 bytes' extent
    rows = rows_of(runs)
    assert rows is not None
    buf = np.full(rows.span, 0x5A, np.uint8)
    out = np.full(8 * 16, 0xEE, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        read_gathered(fd, runs, out, buf, rows)
    finally:
        os.close(fd)
    padded = np.concatenate([data, np.zeros(400, np.uint8)])
    np.testing.assert_array_equal(out, _reference(padded, runs, 8 * 16))
    assert not out[-16:].any() and out[:16].all()
