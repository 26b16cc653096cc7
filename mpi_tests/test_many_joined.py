"""A batch whose items each rank writes one after another in its own part of the file.

Many small items are many small runs, which the default hints send through the
aggregators; but runs that follow each other in the file are one ``pwritev`` on the
posix backend (:meth:`~collio.backends.base.Backend.joins_runs`), so a batch counts the
ranges of the file its runs cover: a rank's arrays back to back take the direct path
like a few large runs, as long as no two ranks' extents interleave.  Items with gaps
between them, items of every rank side by side, the hint ``romio_cb_write=enable`` and
``O_DIRECT`` writes keep the shuffle.  The bytes are compared with numpy's and with
ROMIO's (one ``Write_at_all`` per item); a failing item and items that overlap are
agreed on every rank before any byte is written.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_items_as_romio, items_image, prefill, raises_everywhere, read_file

import collio
from collio import layouts

pytestmark = pytest.mark.mpi(min_size=1)
ITEMS = 40  # more than policy.DIRECT_MAX_RUNS: many small runs
SIZE = 4096  # bytes per item (float64)


def _offsets(p, r, route):
    """Where this rank's item k starts (bytes)."""
    k = np.arange(ITEMS, dtype=np.int64)
    if route == "back to back":  # rank r: its items one after another
        return (r * ITEMS + k) * SIZE
    if route == "gaps":  # ... with 8 bytes between them
        return r * ITEMS * (SIZE + 8) + k * (SIZE + 8)
    return (k * p + r) * SIZE  # "side by side": item k of every rank, then item k + 1


def _box(p, r, k, route):
    """Item k of rank r as a box of a global float64 array that every rank's item k
    shares (its global shape and start), at the bytes :func:`_offsets` says."""
    n = SIZE // 8
    if route == "back to back":  # row r of a (ranks, items) matrix of pieces
        return (p, ITEMS * n), (r, k * n)
    if route == "gaps":  # ... with one element between pieces
        return (p, ITEMS * (n + 1)), (r, k * (n + 1))
    return (ITEMS, p * n), (k, r * n)


def _items(comm, route, kind="segments", seed=0):
    """The rank's items as (data, layout): uint8 data and Segments, or (1, n) float64
    boxes; and as (bytes, Segments) for the images numpy and ROMIO make."""
    items, raw = [], []
    n = SIZE // 8
    for k, at in enumerate(_offsets(comm.size, comm.rank, route).tolist()):
        data = np.random.default_rng(seed + 1000 * k + comm.rank).random((1, n))
        seg = layouts.Segments([at], [SIZE])
        if kind == "segments":
            items.append((data.view(np.uint8).reshape(-1), seg))
        else:
            shape, start = _box(comm.size, comm.rank, k, route)
            items.append((data, layouts.Subarray(shape, start, (1, n), "<f8")))
        raw.append((data.view(np.uint8).reshape(-1), seg))
    return items, raw


@pytest.mark.parametrize("kind", ["segments", "subarray"])
def test_back_to_back_items_go_direct_others_keep_the_shuffle(comm, mpi_tmp_path, kind):
    ours, romio = str(mpi_tmp_path / "collio.bin"), str(mpi_tmp_path / "romio.bin")
    items, raw = _items(comm, "back to back", kind)
    with collio.open(ours, "w", comm=comm) as f:
        f.write_all_many(items)
        assert f.stats.last_call["path"] == "direct"
    assert_items_as_romio(comm, ours, romio, raw)
    with collio.open(ours, "r", comm=comm) as f:
        got = f.read_all_many([lay for _, lay in items])
    for (data, _), g in zip(items, got, strict=True):
        np.testing.assert_array_equal(g, data)
    routes = ["gaps", "side by side"] if comm.size > 1 else ["gaps"]
    for route in routes:  # (one rank's items side by side are back to back)
        path = str(mpi_tmp_path / f"{route}.bin")
        items, raw = _items(comm, route, kind, seed=5)
        with collio.open(path, "w", comm=comm) as f:
            f.write_all_many(items)
            assert f.stats.last_call["path"] == "two-phase", route
        comm.Barrier()
        assert read_file(path) == items_image(comm, raw), route


@pytest.mark.parametrize("hints", [{"romio_cb_write": "enable"}, {"direct_write": "enable"}])
def test_hints_that_keep_the_shuffle(comm, mpi_tmp_path, hints):
    path = str(mpi_tmp_path / "target.bin")
    items, raw = _items(comm, "back to back")
    with collio.open(path, "w", comm=comm) as f:  # (the same batch by default: direct)
        f.write_all_many(items)
        assert f.stats.last_call["path"] == "direct"
    again, raw = _items(comm, "back to back", seed=3)
    with collio.open(path, "r+", comm=comm, hints=hints) as f:
        if hints.get("direct_write") and not f.stats.hints.get("direct_write"):
            pytest.skip("no O_DIRECT on this file system")
        f.write_all_many(again)
        assert f.stats.last_call["path"] == "two-phase"
    comm.Barrier()
    assert read_file(path) == items_image(comm, raw)


def test_a_failing_item_or_an_overlap_on_one_rank_writes_nothing(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    items, raw = _items(comm, "back to back")
    prefill(comm, [path], len(items_image(comm, raw)) + 64)
    before = read_file(path)
    last = comm.size - 1
    with collio.open(path, "r+", comm=comm) as f:
        bad = list(items)
        if comm.rank == last:  # item 5's data one byte short of its layout
            bad[5] = (items[5][0][:-1], items[5][1])
        err = raises_everywhere(comm, collio.CollioError, lambda: f.write_all_many(bad))
        assert f"rank {last}: item 5" in str(err)
        comm.Barrier()
        assert read_file(path) == before
        twice = list(items)
        if comm.rank == last:  # item 7 over item 6's bytes
            twice[7] = (items[7][0], items[6][1])
        err = raises_everywhere(comm, collio.OverlapError, lambda: f.write_all_many(twice))
        assert f"rank {last}" in str(err) and "6" in str(err) and "7" in str(err)
        comm.Barrier()
        assert read_file(path) == before
        f.write_all_many(items)  # the file stays usable
        assert f.stats.last_call["path"] == "direct"
    comm.Barrier()
    assert read_file(path) == items_image(comm, raw, before)


def test_tiny_items_back_to_back_keep_the_shuffle(comm, mpi_tmp_path):
    """Items of tens of bytes back to back: the direct write would handle each in Python,
    which costs more than the shuffle's numpy work, so they keep the shuffle (the mean
    run is below ``policy.JOINED_MIN_RUN``); the bytes are numpy's and ROMIO's."""
    from collio import policy

    ours, romio = str(mpi_tmp_path / "collio.bin"), str(mpi_tmp_path / "romio.bin")
    n, size = 400, 64
    assert size < policy.JOINED_MIN_RUN
    rng = np.random.default_rng(11 + comm.rank)
    at = (comm.rank * n + np.arange(n)) * size
    items = [
        (rng.integers(0, 256, size, np.uint8), layouts.Segments([o], [size])) for o in at.tolist()
    ]
    with collio.open(ours, "w", comm=comm) as f:
        f.write_all_many(items)
        assert f.stats.last_call["path"] == "two-phase"
    assert_items_as_romio(comm, ours, romio, items)
