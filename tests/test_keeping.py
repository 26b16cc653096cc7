"""What a write keeps to be taken back (collio.backends.keeping), on a real file with holes.

A range that lies in a hole is not read: it is kept as zeros, and putting it back writes
zeros there; the bytes of a range that holds data are read and written back; the file
is cut back to its old size.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from collio.backends.fdio import data_from
from collio.backends.keeping import HOLE_MIN, keep_one, put_back

KIB = 1024
SIZE = 200 * KIB  # data [0, 64 KiB) and [192 KiB, 200 KiB), a hole between


@pytest.fixture
def sparse(tmp_path):
    """A file of SIZE bytes whose [64 KiB, 192 KiB) is a hole; its descriptor and bytes."""
    path = tmp_path / "sparse.bin"
    rng = np.random.default_rng(3)
    want = np.zeros(SIZE, np.uint8)
    want[: 64 * KIB] = rng.integers(1, 256, 64 * KIB, dtype=np.uint8)
    want[192 * KIB :] = rng.integers(1, 256, 8 * KIB, dtype=np.uint8)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.pwrite(fd, want[: 64 * KIB].tobytes(), 0)
    os.pwrite(fd, want[192 * KIB :].tobytes(), 192 * KIB)
    if data_from(fd, 64 * KIB, SIZE) != 192 * KIB:
        os.close(fd)
        pytest.skip("this file system does not report holes (SEEK_DATA)")
    yield fd, want
    os.close(fd)


def _bytes(fd):
    return np.frombuffer(os.pread(fd, 1 << 20, 0), np.uint8)


def test_a_range_in_a_hole_is_kept_as_zeros_without_reading(sparse):
    fd, _ = sparse
    kept = keep_one(fd, SIZE, 64 * KIB, 128 * KIB, limit=0)
    assert kept is not None  # (nothing to read: within any limit)
    assert kept.old == [] and kept.zeros == ((64 * KIB, 128 * KIB),)
    assert kept.size == SIZE


def test_a_range_from_a_hole_into_data_reads_only_the_data(sparse):
    fd, want = sparse
    kept = keep_one(fd, SIZE, 128 * KIB, 96 * KIB, limit=1 << 20)  # (past the end too)
    assert kept.zeros == ((128 * KIB, 64 * KIB),)
    [(at, old)] = kept.old
    assert at == 192 * KIB
    np.testing.assert_array_equal(old, want[192 * KIB :])
    assert keep_one(fd, SIZE, 128 * KIB, 96 * KIB, limit=4 * KIB) is None  # (8 KiB to read)


def test_a_small_range_and_a_range_of_data_are_read_whole(sparse):
    fd, want = sparse
    small = keep_one(fd, SIZE, 100 * KIB, HOLE_MIN - 8, limit=1 << 20)
    assert small.zeros == () and len(small.old) == 1
    np.testing.assert_array_equal(small.old[0][1], np.zeros(HOLE_MIN - 8, np.uint8))
    data = keep_one(fd, SIZE, 0, 80 * KIB, limit=1 << 20)  # (starts in data: read whole)
    assert data.zeros == ()
    np.testing.assert_array_equal(data.old[0][1], want[: 80 * KIB])


def test_putting_back_restores_data_holes_and_size(sparse):
    fd, want = sparse
    lo, n = 32 * KIB, 240 * KIB  # (data, the hole, data, and past the end)
    kept = keep_one(fd, SIZE, lo, n, limit=1 << 20)
    assert kept.zeros == () and kept.old[0][0] == lo  # (starts in data)
    hole = keep_one(fd, SIZE, 64 * KIB, 128 * KIB, limit=1 << 20)
    os.pwrite(fd, b"\xff" * n, lo)
    assert os.fstat(fd).st_size == lo + n
    put_back(fd, kept, SIZE, "sparse.bin")
    np.testing.assert_array_equal(_bytes(fd), want)
    os.pwrite(fd, b"\xee" * 128 * KIB, 64 * KIB)  # (a write into the hole alone)
    put_back(fd, hole, SIZE, "sparse.bin")
    np.testing.assert_array_equal(_bytes(fd), want)
    cut = keep_one(fd, SIZE, 64 * KIB, 128 * KIB, limit=1 << 20)
    os.pwrite(fd, b"\xdd" * 128 * KIB, 64 * KIB)
    put_back(fd, cut, 100 * KIB, "sparse.bin")  # (the agreed old size: below the hole's end)
    got = _bytes(fd)
    assert len(got) == 100 * KIB
    np.testing.assert_array_equal(got, want[: 100 * KIB])
