"""A batch of many small runs that each rank writes (reads) itself: a request per run.

The direct path writes such runs with one ``pwrite`` each in one tight loop
(:func:`collio.backends.fdio.pwrite_runs`) and reads them with one ``preadv`` each
(:func:`collio.backends.fdio.pread_runs`) where reads do not copy from a map.  Two ways
there: every rank's own block of the file (extents apart, hint ``romio_cb_write``
``disable``) and items interleaved across the ranks that the caller vouches for
(``_disjoint``).  The bytes are compared with numpy's and with ROMIO's (one
``Write_at_all`` per item); an item failing on one rank, different item counts and a
failing request on one rank are agreed on every rank, the first two before any byte
is written.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from helpers import assert_items_as_romio, items_image, prefill, raises_everywhere, read_file

import collio
from collio import layouts

pytestmark = pytest.mark.mpi(min_size=1)
#: run lengths, item by item (cycled): tiny, odd, a page, more than a page
LENGTHS = (8, 3000, 4096, 1, 4100, 512)
ITEMS = 40  # more than policy.DIRECT_MAX_RUNS: many small runs
GAP = 7  # bytes between items that no rank writes: no two runs of a rank meet
HINTS = {"mapped_reads": "disable", "romio_cb_write": "disable", "romio_cb_read": "disable"}
ROUTES = ("own blocks", "interleaved")


def _length(k):
    return LENGTHS[k % len(LENGTHS)]


def _offsets(p, r, route):
    """Where this rank's run of each item starts."""
    lens = np.array([_length(k) for k in range(ITEMS)], np.int64)
    if route == "own blocks":  # rank r: its items one after another, a gap between
        block = int(lens.sum()) + GAP * ITEMS
        return r * block + np.concatenate(([0], np.cumsum(lens[:-1] + GAP)))
    # item k: every rank's run of it side by side (rank order), then a gap
    starts = np.concatenate(([0], np.cumsum(p * lens[:-1] + GAP)))
    return starts + r * lens


def _items(comm, route, seed=0):
    offs = _offsets(comm.size, comm.rank, route)
    items = []
    for k in range(ITEMS):
        rng = np.random.default_rng(seed + 1000 * k + comm.rank)
        data = rng.integers(0, 256, _length(k), np.uint8)
        items.append((data, layouts.Segments([int(offs[k])], [_length(k)])))
    return items


def _write(f, items, route):
    f.write_all_many(items, _disjoint=route == "interleaved")


@pytest.mark.parametrize("route", ROUTES)
def test_many_small_runs_direct_match_numpy_andromio_items(comm, mpi_tmp_path, route):
    ours, romio = str(mpi_tmp_path / "collio.bin"), str(mpi_tmp_path / "romio.bin")
    items = _items(comm, route)
    with collio.open(ours, "w", comm=comm, hints=HINTS) as f:
        _write(f, items, route)
        assert f.stats.last_call["path"] == "direct"
    assert_items_as_romio(comm, ours, romio, items)
    with collio.open(ours, "r", comm=comm, hints=HINTS) as f:
        outs = [np.full(len(d), 0xEE, np.uint8) for d, _ in items]
        vouched = route == "interleaved"
        got = f.read_all_many([lay for _, lay in items], out=outs, _disjoint=vouched)
        assert f.stats.last_call["path"] == "direct"
    for (data, _), g, o in zip(items, got, outs, strict=True):
        assert g is o
        np.testing.assert_array_equal(g, data)


@pytest.mark.parametrize("route", ROUTES)
def test_a_failing_item_on_one_rank_keeps_the_bytes(comm, mpi_tmp_path, route):
    path = str(mpi_tmp_path / "target.bin")
    items = _items(comm, route)
    prefill(comm, [path], len(items_image(comm, items)) + 64)
    before = read_file(path)
    last = comm.size - 1
    bad = list(items)
    if comm.rank == last:  # item 5's data one byte short of its layout
        data, lay = bad[5]
        bad[5] = (data[:-1] if len(data) > 1 else np.zeros(2, np.uint8), lay)
    with collio.open(path, "r+", comm=comm, hints=HINTS) as f:
        err = raises_everywhere(comm, collio.CollioError, lambda: _write(f, bad, route))
        assert "item 5" in str(err)
        comm.Barrier()
        assert read_file(path) == before
        # a different number of items on one rank: agreed too, nothing written
        fewer = items[:-1] if comm.rank == last else items
        if comm.size > 1:
            err = raises_everywhere(comm, collio.MismatchError, lambda: _write(f, fewer, route))
            assert "different numbers of items" in str(err)
            comm.Barrier()
            assert read_file(path) == before
        _write(f, items, route)  # the file stays usable
        assert f.stats.last_call["path"] == "direct"
    comm.Barrier()
    assert read_file(path) == items_image(comm, items, before)


@pytest.mark.parametrize("route", ROUTES)
def test_a_failing_request_on_one_rank_is_agreed(comm, mpi_tmp_path, monkeypatch, route):
    path = str(mpi_tmp_path / "target.bin")
    items = _items(comm, route)
    last = comm.size - 1
    real = os.pwrite
    calls = [0]

    def failing(fd, buf, offset):
        calls[0] += 1
        if calls[0] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buf, offset)

    with collio.open(path, "w", comm=comm, hints=HINTS) as f:
        if comm.rank == last:
            monkeypatch.setattr(os, "pwrite", failing)
        err = raises_everywhere(comm, collio.CollioError, lambda: _write(f, items, route))
        assert f"rank {last}: no space left on device" in str(err) and err.errno == errno.ENOSPC
        monkeypatch.undo()
        again = _items(comm, route, seed=7)
        _write(f, again, route)  # the file stays usable: every run written again
        assert f.stats.last_call["path"] == "direct"
    comm.Barrier()
    assert read_file(path) == items_image(comm, again)


def test_short_requests_are_finished(comm, mpi_tmp_path, monkeypatch):
    """A pwrite (preadv) that moves part of a run: the rest follows, the bytes all arrive."""
    path = str(mpi_tmp_path / "target.bin")
    items = _items(comm, "own blocks")
    real_w, real_r = os.pwrite, os.preadv

    def half_write(fd, buf, offset):
        n = len(memoryview(buf))
        return real_w(fd, memoryview(buf)[: max(1, n // 2)], offset)

    def half_read(fd, bufs, offset):
        (b,) = bufs
        n = len(memoryview(b))
        return real_r(fd, [memoryview(b)[: max(1, n // 2)]], offset)

    with collio.open(path, "w", comm=comm, hints=HINTS) as f:
        monkeypatch.setattr(os, "pwrite", half_write)
        f.write_all_many(items)
        monkeypatch.undo()
        assert f.stats.last_call["path"] == "direct"
    comm.Barrier()
    assert read_file(path) == items_image(comm, items)
    with collio.open(path, "r", comm=comm, hints=HINTS) as f:
        monkeypatch.setattr(os, "preadv", half_read)
        got = f.read_all_many([lay for _, lay in items])
        monkeypatch.undo()
        assert f.stats.last_call["path"] == "direct"
    for (data, _), g in zip(items, got, strict=True):
        np.testing.assert_array_equal(g, data)


@pytest.mark.parametrize("route", ROUTES)
def test_reads_into_bad_outs_are_agreed(comm, mpi_tmp_path, route):
    """Outs of a read of Segments: the wrong length, or two sharing memory, on one rank
    is the same error on every rank, naming the item; the next read goes on."""
    path = str(mpi_tmp_path / "target.bin")
    items = _items(comm, route)
    lays = [lay for _, lay in items]
    last = comm.size - 1
    with collio.open(path, "w", comm=comm, hints=HINTS) as f:
        _write(f, items, route)
    vouched = route == "interleaved"
    with collio.open(path, "r", comm=comm, hints=HINTS) as f:

        def read(outs):
            return f.read_all_many(lays, out=outs, _disjoint=vouched)

        outs = [np.zeros(len(d), np.uint8) for d, _ in items]
        if comm.rank == last:
            outs[3] = np.zeros(len(items[3][0]) + 1, np.uint8)
        err = raises_everywhere(comm, collio.LayoutError, lambda: read(outs))
        assert f"rank {last}: item 3" in str(err)
        outs = [np.zeros(len(d), np.uint8) for d, _ in items]
        if comm.rank == last:  # items 0 and 6 are both 8 bytes long: one array for both
            outs[6] = outs[0]
        err = raises_everywhere(comm, collio.LayoutError, lambda: read(outs))
        assert f"rank {last}" in str(err)
        got = f.read_all_many(lays, _disjoint=vouched)
    for (data, _), g in zip(items, got, strict=True):
        np.testing.assert_array_equal(g, data)
