"""Hint ``direct_write``: the posix backend writes the page-aligned middle of large requests
with ``O_DIRECT`` and the rest through the page cache; the bytes must not change.

One descriptor, no MPI; collective writes with the hint are in ``mpi_tests/test_rounds.py``."""

from __future__ import annotations

import os

import numpy as np
import pytest

import collio
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


def test_mpiio_backend_keeps_collio_only_hints_from_romio():
    from collio.backends.mpiio import info_from_hints

    hints = {"direct_write": True, "early_flush": False, "cb_nodes": 2, "free_replaced": "commit"}
    info = info_from_hints(collio.Hints.coerce(hints))
    try:
        keys = {info.Get_nthkey(i) for i in range(info.Get_nkeys())}
    finally:
        info.Free()
    collio_only = {"direct_write", "early_flush", "min_rounds", "atomic_commit", "free_replaced"}
    assert "cb_nodes" in keys and not keys & collio_only


def test_direct_write_is_a_boolean_hint():
    with pytest.raises(collio.HintError, match="direct_write='sometimes'"):
        collio.Hints.coerce({"direct_write": "sometimes"})
    assert collio.Hints.coerce({"direct_write": "1"}).direct_write is True
