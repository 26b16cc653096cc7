"""Bytes inside a domain that no rank writes keep their previous content."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import reference

import collio
from collio import layouts

HINTS = [{"cb_buffer_size": 4096}, {"cb_buffer_size": 1000, "cb_nodes": 1}, {}]


def _every_other(comm, n_elems, phase):
    """Segments for every other 8-byte element (phase 0 or 1), dealt round-robin to ranks."""
    idx = np.arange(phase, n_elems, 2)
    mine = idx[comm.rank :: comm.size]
    return layouts.Segments(mine * 8, np.full(len(mine), 8)), mine


@pytest.mark.mpi
@pytest.mark.parametrize("hints", HINTS, ids=[str(h) for h in HINTS])
def test_update_keeps_untouched_bytes(comm, mpi_tmp_path, hints):
    path = str(mpi_tmp_path / "target.bin")
    old = reference((5000,), "<f8", seed=1)
    if comm.rank == 0:
        old.tofile(path)
    comm.Barrier()
    lay, mine = _every_other(comm, 5000, 1)
    new = -np.arange(5000, dtype="<f8")
    with collio.open(path, "r+", comm=comm, hints=hints) as f:
        f.write_all(new[mine].view(np.uint8), lay)
    comm.Barrier()
    got = np.fromfile(path, "<f8")
    want = old.copy()
    want[1::2] = new[1::2]
    np.testing.assert_array_equal(got, want)


@pytest.mark.mpi
@pytest.mark.parametrize("hints", HINTS, ids=[str(h) for h in HINTS])
def test_two_calls_fill_each_others_holes(comm, mpi_tmp_path, hints):
    path = str(mpi_tmp_path / "target.bin")
    vals = reference((3001,), "<f8", seed=2)
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        for phase in (0, 1):
            lay, mine = _every_other(comm, 3001, phase)
            f.write_all(vals[mine].view(np.uint8), lay)
        whole = layouts.Subarray((3001,), (0,), (3001,) if comm.rank == 0 else (0,), "<f8")
        back = f.read_all(whole)
    if comm.rank == 0:
        np.testing.assert_array_equal(back, vals)
    np.testing.assert_array_equal(np.fromfile(path, "<f8"), vals)


@pytest.mark.mpi
def test_write_past_the_end_leaves_zeros(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    if comm.rank == 0:
        with open(path, "wb") as fh:
            fh.write(b"\x07" * 100)
    comm.Barrier()
    lay = layouts.Segments([1000 + 10 * comm.rank], [10])
    with collio.open(path, "r+", comm=comm, hints={"cb_nodes": 1}) as f:
        f.write_all(np.full(10, 9, np.uint8), lay)
    comm.Barrier()
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:100] == b"\x07" * 100
    assert data[100:1000] == b"\0" * 900
    assert data[1000:] == b"\x09" * (10 * comm.size)


@pytest.mark.mpi
def test_read_holes_and_past_the_end(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    if comm.rank == 0:
        np.arange(100, dtype=np.uint8).tofile(path)
    comm.Barrier()
    lay = layouts.Segments([50 + comm.rank, 95, 120], [1, 10, 4])
    with collio.open(path, "r", comm=comm) as f:
        got = f.read_all(lay)
    want = np.concatenate(([50 + comm.rank], np.arange(95, 100), np.zeros(5 + 4))).astype(np.uint8)
    np.testing.assert_array_equal(got, want)


@pytest.mark.mpi
@pytest.mark.parametrize("policy", ["auto", "rmw", "runs"])
def test_hole_policies_agree(comm, mpi_tmp_path, policy):
    """Writing only the covered ranges and read-modify-write leave the same bytes."""
    path = str(mpi_tmp_path / "target.bin")
    old = reference((40_000,), "<f8", seed=3)
    if comm.rank == 0:
        old.tofile(path)
    comm.Barrier()
    # large runs with gaps: few covered ranges per round, so "auto" skips the read

    def runs_of(rank):
        offs = np.arange(rank, 40, comm.size) * 8000 + 800
        return offs, np.full(len(offs), 6400)

    offs, lens = runs_of(comm.rank)
    lay = layouts.Segments(offs, lens)
    new = np.arange(lay.nbytes, dtype=np.uint8)
    hints = {"cb_buffer_size": 65536}
    with collio.open(path, "r+", comm=comm, hints=hints, holes=policy) as f:
        f.write_all(new, lay)
    comm.Barrier()
    got = np.fromfile(path, np.uint8)
    want = old.view(np.uint8).copy()
    for rank in range(comm.size):
        o, n = runs_of(rank)
        theirs = np.arange(int(n.sum()), dtype=np.uint8)
        for a, m in zip(o.tolist(), range(0, int(n.sum()), 6400), strict=True):
            want[a : a + 6400] = theirs[m : m + 6400]
    np.testing.assert_array_equal(got, want)
