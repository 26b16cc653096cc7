"""A batch of many boxes of one shape: grouped by the layouts' shape keys, each item at
its own offset, and an item that differs on one rank named on every rank."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio import boxes, layouts

N = 200
ELEMS = 512  # int64 per rank per item: 4 KiB, the size of a small batch's arrays


def _items(comm: MPI.Intracomm) -> list[tuple[Any, Any]]:
    """Item k: rank r's 4 KiB of a global int64 array at slot ``where[k]`` of the file
    (out of item order), each element its global index plus a million times k."""
    p, r = comm.size, comm.rank
    where = np.random.default_rng(11).permutation(N)  # (the same on every rank)
    step = 8 * ELEMS * p
    out = []
    for k, w in enumerate(where.tolist()):
        lay = layouts.Subarray((ELEMS * p,), (ELEMS * r,), (ELEMS,), "<i8", offset=w * step)
        out.append((np.arange(ELEMS * r, ELEMS * (r + 1), dtype="<i8") + 1_000_000 * k, lay))
    return out


def _image(comm: MPI.Intracomm) -> bytes:
    """What the file holds after every rank's items (numpy)."""
    p = comm.size
    where = np.random.default_rng(11).permutation(N)
    glob = np.arange(ELEMS * p, dtype="<i8")[None, :] + 1_000_000 * np.arange(N)[:, None]
    want = np.empty((N, ELEMS * p), "<i8")
    want[where] = glob
    return want.tobytes()


@pytest.mark.mpi
def test_boxes_of_one_shape_at_their_offsets(comm, mpi_tmp_path):
    """The batch takes the box path (one template for 200 items), and its file is
    numpy's image and ROMIO's (one Write_at_all per item); a read gives every item."""
    mine, romio = str(mpi_tmp_path / "many.bin"), str(mpi_tmp_path / "romio.bin")
    items = _items(comm)
    with collio.open(mine, "w", comm=comm) as f:
        f.write_all_many(items)
        kept = boxes._KEPT[0]
        assert kept is not None and len(kept.templates) == 1 and len(kept.lays) == N
        outs = [np.full(ELEMS, -1, "<i8") for _ in range(N)]
        back = f.read_all_many([lay for _, lay in items], out=outs)
    fh = MPI.File.Open(comm, romio, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    try:
        for d, lay in items:
            fh.Write_at_all(lay.offset + 8 * ELEMS * comm.rank, [d, MPI.BYTE])
    finally:
        fh.Close()
    want = _image(comm)
    assert read_file(mine) == want and read_file(romio) == want
    for (d, _), got, out in zip(items, back, outs, strict=True):
        assert got is out
        np.testing.assert_array_equal(got, d)


@pytest.mark.mpi
def test_an_item_that_differs_on_one_rank_is_named(comm, mpi_tmp_path):
    """Item 137 at another offset, or of another global shape, on the last rank only:
    every rank raises the same MismatchError naming item 137 and that rank, and nothing
    is written; an item failing its own check on one rank is named with its values."""
    path = str(mpi_tmp_path / "odd.bin")
    items = _items(comm)
    last, p = comm.size - 1, comm.size
    with collio.open(path, "w", comm=comm) as f:
        f.write_all_many(items)
    before = read_file(path)
    with collio.open(path, "r+", comm=comm) as f:
        again = [(d + 7, lay) for d, lay in items]
        if p > 1:
            for odd in (
                layouts.Subarray((ELEMS * p,), (ELEMS * last,), (ELEMS,), "<i8",
                                 offset=items[137][1].offset + 8),
                layouts.Subarray((ELEMS * p + 1,), (ELEMS * last,), (ELEMS,), "<i8",
                                 offset=items[137][1].offset),
            ):  # fmt: skip
                mine = list(again)
                if comm.rank == last:
                    mine[137] = (mine[137][0], odd)
                err = raises_everywhere(
                    comm,
                    collio.MismatchError,
                    lambda m=mine: f.write_all_many(m),
                    match="disagree on the global array of item 137",
                )
                assert err.ranks == (last,) and f"rank {last}: global shape" in str(err)
        bad = list(again)
        if comm.rank == last:
            bad[150] = (bad[150][0].astype("<f8"), bad[150][1])
        raises_everywhere(comm, collio.LayoutError, lambda: f.write_all_many(bad),
                          match="item 150: data dtype float64 does not match layout dtype "
                                "int64")  # fmt: skip
    assert read_file(path) == before
