"""A time series of batches: the same shapes at new offsets, the same layouts again.

A batch of layouts of known shapes reuses their templates, a batch of the same layout
objects as the last one what the layouts alone decide, and with its arrays at the same
addresses the same union of runs (:mod:`collio.boxes`); a batch of new layouts, the last
ones all moved by one offset, over the same arrays, that union moved.  These tests change one thing
at a time (the data in place, other arrays, an array reshaped in place, an offset on
one rank, an item twice) and check every file byte for byte against numpy, one call per
item, and ROMIO.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio import layouts
from collio.testing.romio import romio_write

#: Items per batch: contiguous pieces of four lengths and one strided shape, alternating.
N = 24
#: int32 rows and columns per rank of a strided item.
ROWS, COLS = 8, 4


def _len(j: int) -> int:
    """float64 per rank of contiguous item 2j (four distinct shapes)."""
    return 64 + 8 * (j % 4)


def _step_bytes(p: int) -> int:
    """Bytes of one step (every rank's items)."""
    return sum(8 * _len(j) * p + 4 * ROWS * COLS * p for j in range(N // 2))


def _layouts(comm: MPI.Intracomm, step: int) -> list[Any]:
    """Step ``step``'s layouts: item 2j a contiguous piece of a 1-D array (the ranks'
    pieces side by side), item 2j+1 a column block of an int32 matrix (interleaved)."""
    p, r = comm.size, comm.rank
    out: list[Any] = []
    at = step * _step_bytes(p)
    for j in range(N // 2):
        n = _len(j)
        out.append(layouts.Subarray((n * p,), (n * r,), (n,), "<f8", offset=at))
        at += 8 * n * p
        out.append(
            layouts.Subarray((ROWS, COLS * p), (0, COLS * r), (ROWS, COLS), "<i4", offset=at)
        )
        at += 4 * ROWS * COLS * p
    return out


def _data(comm: MPI.Intracomm, seed: int) -> list[np.ndarray[Any, Any]]:
    """One array per item, different for every rank and seed."""
    rng = np.random.default_rng(1000 * seed + comm.rank)
    return [
        rng.standard_normal(_len(k // 2))
        if k % 2 == 0
        else rng.integers(-9, 9, (ROWS, COLS), np.int32)
        for k in range(N)
    ]


def _pairs(datas: list[Any], lays: list[Any]) -> list[tuple[Any, Any]]:
    return list(zip(datas, lays, strict=True))


@pytest.mark.mpi
@pytest.mark.parametrize("hints", [{}, {"cb_nodes": 2, "cb_buffer_size": 4096}])
def test_a_series_of_batches_matches_single_calls_and_romio(comm, mpi_tmp_path, hints):
    """Steps 0 and 1 at new offsets (step 1's layouts made anew, of step 0's shapes);
    step 1 again through its own layout objects with the data changed in place, then with
    other arrays; reads through the same layouts twice, into the same outputs and into
    new ones."""
    many, single, romio = (str(mpi_tmp_path / f"{n}.bin") for n in ("many", "single", "romio"))
    lays0, lays1 = _layouts(comm, 0), _layouts(comm, 1)
    d0, d1 = _data(comm, 0), _data(comm, 1)
    with collio.open(many, "w", comm=comm, hints=hints) as f:
        f.write_all_many(_pairs(d0, lays0))
        f.write_all_many(_pairs(d1, lays1))
        for d in d1:  # the same arrays, new values: the same layouts and addresses
            d += 7
        f.write_all_many(_pairs(d1, lays1))
        final = [d * 3 for d in d1]  # other arrays at other addresses
        f.write_all_many(_pairs(final, lays1))
        assert f.stats.last_call["items"] == N
        outs = [np.zeros_like(d) for d in final]
        back = [f.read_all_many(lays1, out=outs) for _ in range(2)]
        fresh = f.read_all_many(lays1)
        zero = f.read_all_many(lays0)
    for got in (*back, fresh):
        for k, (g, want) in enumerate(zip(got, final, strict=True)):
            np.testing.assert_array_equal(g, want, err_msg=f"item {k}")
    assert all(g is o for g, o in zip(back[1], outs, strict=True))
    for k, (g, want) in enumerate(zip(zero, d0, strict=True)):
        np.testing.assert_array_equal(g, want, err_msg=f"step 0 item {k}")
    with collio.open(single, "w", comm=comm, hints=hints) as f:
        for d, lay in (*_pairs(d0, lays0), *_pairs(final, lays1)):
            f.write_all(d, lay)
    for d, lay in (*_pairs(d0, lays0), *_pairs(final, lays1)):
        romio_write(romio, d, lay, comm)
    comm.Barrier()
    ours = read_file(many)
    assert ours is not None and len(ours) == 2 * _step_bytes(comm.size)
    assert ours == read_file(single) == read_file(romio)  # (the steps leave no holes)


@pytest.mark.mpi
def test_a_reused_batch_that_changed_is_refused_everywhere(comm, mpi_tmp_path):
    """After a batch through some layouts, the same layouts again with one thing changed
    on the last rank: an array reshaped in place, an item passed twice, an item's offset.
    Each is the same error on every rank, naming the item and the rank, and writes
    nothing; the series then goes on."""
    path = str(mpi_tmp_path / "reused.bin")
    lays, datas = _layouts(comm, 0), _data(comm, 2)
    last = comm.size - 1
    with collio.open(path, "w", comm=comm) as f:
        f.write_all_many(_pairs(datas, lays))
        f.write_all_many(_pairs(datas, lays))
    before = read_file(path)
    with collio.open(path, "r+", comm=comm) as f:
        bad = [d + 1 for d in datas]
        if comm.rank == last:
            bad[3].shape = (ROWS * COLS,)  # (the same array object, reshaped in place)
        raises_everywhere(comm, collio.LayoutError, lambda: f.write_all_many(_pairs(bad, lays)),
                          match=f"rank {last}: item 3: data shape (32,)")  # fmt: skip
        twice = _pairs(datas, lays)
        if comm.rank == last:
            twice[5] = twice[1]
        raises_everywhere(comm, collio.OverlapError, lambda: f.write_all_many(twice),
                          match="items 1 and 5 both write them")  # fmt: skip
        if comm.size > 1:
            moved = list(lays)
            if comm.rank == last:
                old = lays[4]
                moved[4] = layouts.Subarray(old.global_shape, old.start, old.shape, "<f8",
                                            offset=old.offset + 8)  # fmt: skip
            raises_everywhere(comm, collio.MismatchError,
                              lambda: f.write_all_many(_pairs(datas, moved)),
                              match="disagree on the global array of item 4")  # fmt: skip
        assert read_file(path) == before  # nothing was written
        f.write_all_many(_pairs([d - 1 for d in datas], lays))
        back = f.read_all_many(lays)
    for k, (g, d) in enumerate(zip(back, datas, strict=True)):
        np.testing.assert_array_equal(g, d - 1, err_msg=f"item {k}")
    theirs = str(mpi_tmp_path / "reused-romio.bin")  # (the same items, one ROMIO call each)
    for d, lay in zip(datas, lays, strict=True):
        romio_write(theirs, d - 1, lay, comm)
    comm.Barrier()
    assert read_file(path) == read_file(theirs)  # (the items leave no holes)


@pytest.mark.mpi
@pytest.mark.parametrize("hints", [{}, {"cb_nodes": 2, "cb_buffer_size": 4096}])
def test_steps_through_moved_layouts_match_single_calls_and_romio(comm, mpi_tmp_path, hints):
    """Steps 0 to 3, each through layouts made anew one step further on, over the same
    arrays changed in place: each step after the first takes the last batch's union
    moved (boxes' kept shapes moved), and the file is that of one call per item and of
    ROMIO's; reads through the moved layouts give every step back."""
    from collio import boxes

    many, single, romio = (str(mpi_tmp_path / f"{n}.bin") for n in ("many", "single", "romio"))
    datas = _data(comm, 3)
    steps, values = [_layouts(comm, s) for s in range(4)], []
    moved, laned = [], []
    collio.release_buffers()  # (step 0 made anew, not moved from an earlier test's)
    with collio.open(many, "w", comm=comm, hints=hints) as f:
        for lays in steps:
            for d in datas:
                d += 1
            values.append([d.copy() for d in datas])
            f.write_all_many(_pairs(datas, lays))
            moved.append(boxes._KEPT[0] is not None and boxes._KEPT[0].origin is not None)
            lane = f._ctx.batch_lane
            laned.append(-1 if lane is None else lane.entry.epoch)
        outs = [np.zeros_like(d) for d in datas]
        back = [[g.copy() for g in f.read_all_many(lays, out=outs)] for lays in steps]
    assert all(comm.allgather(moved == [False, True, True, True]))
    # (every step through the plan made at step 0, kept with the batch lane)
    assert all(comm.allgather(len(set(laned)) == 1 and laned[0] >= 0))
    for s, (got, vals) in enumerate(zip(back, values, strict=True)):
        for k, (g, v) in enumerate(zip(got, vals, strict=True)):
            np.testing.assert_array_equal(g, v, err_msg=f"step {s} item {k}")
    with collio.open(single, "w", comm=comm, hints=hints) as f:
        for lays, vals in zip(steps, values, strict=True):
            for v, lay in zip(vals, lays, strict=True):
                f.write_all(v, lay)
    for lays, vals in zip(steps, values, strict=True):
        for v, lay in zip(vals, lays, strict=True):
            romio_write(romio, v, lay, comm)
    comm.Barrier()
    ours = read_file(many)
    assert ours is not None and len(ours) == 4 * _step_bytes(comm.size)
    assert ours == read_file(single) == read_file(romio)


@pytest.mark.mpi
@pytest.mark.parametrize(("hints", "who"), [({}, "every"), ({"cb_nodes": 3}, "every"),
                                           ({}, "last"), ({"cb_nodes": 3}, "last")])  # fmt: skip
def test_a_series_of_uniform_batches_posts_the_kept_round(comm, mpi_tmp_path, hints, who):
    """A time series of 200 variables of 512 int64 per rank, the ranks' pieces of each
    side by side, the rank's arrays rows of one (every message one vector; with three
    aggregators, the domains' edges cut pieces, and a message of cut runs is made an
    indexed type once, as a vector is): from the second step on, each step's
    one round is posted from the batch lane's record, but for a step whose arrays lie
    elsewhere (on ``every`` rank, or on the ``last`` alone while the others post their
    kept round); the file is ROMIO's, one Write_at_all per item, and numpy's."""
    from collio import boxes

    p, r, n, elems = comm.size, comm.rank, 200, 512
    datas = list(np.zeros((n, elems), "<i8"))  # (rows of one array: evenly spaced in memory)
    step_bytes = n * 8 * elems * p
    many, romio = str(mpi_tmp_path / "many.bin"), str(mpi_tmp_path / "romio.bin")
    collio.release_buffers()
    rounds, want = [], []
    rows = datas
    with collio.open(many, "w", comm=comm, hints=hints) as f:
        for s in range(6):
            lays = [layouts.Subarray((elems * p,), (elems * r,), (elems,), "<i8",
                                     offset=s * step_bytes + k * 8 * elems * p)
                    for k in range(n)]  # fmt: skip
            # (step 4: the rows in reverse, each item's bytes elsewhere in the span, as no
            # kept round has them; step 5: as before)
            datas = rows[::-1] if s == 4 and (who == "every" or r == p - 1) else rows
            for k, d in enumerate(datas):
                d[:] = np.arange(elems * r, elems * (r + 1)) + 10**6 * (s * n + k)
            f.write_all_many(_pairs(datas, lays))
            lane = f._ctx.batch_lane
            rounds.append(lane is not None and lane.round is not None)
            if s and (s != 4 or datas is rows):
                assert boxes._KEPT[0] is not None and boxes._KEPT[0].origin is not None
            fh = MPI.File.Open(comm, romio, MPI.MODE_CREATE | MPI.MODE_WRONLY)
            try:
                for d, lay in zip(datas, lays, strict=True):
                    fh.Write_at_all(lay.offset + 8 * elems * r, [d, MPI.BYTE])
            finally:
                fh.Close()
            want.append(np.arange(elems * p)[None, :] + 10**6 * (s * n + np.arange(n))[:, None])
    # (step 5's lane is made again after it: its round is posted from step 6 on)
    if who == "every":
        assert all(comm.allgather(rounds == [False, True, True, True, False, False] or p == 1))
    else:
        assert all(comm.allgather(rounds[:4] == [False, True, True, True] or p == 1))
    image = np.concatenate(want).astype("<i8").tobytes()
    assert read_file(many) == image and read_file(romio) == image
