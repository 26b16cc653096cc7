"""Interleaved extents of few large runs: the ranks compare their runs and go direct.

A batch of many arrays puts item k of every rank before item k+1: every rank's extent
spans the file, but its runs meet no other rank's.  When every rank's runs are few and
at least ``policy.CHECKED_MIN_RUN`` (64 KiB) long, the ranks gather every run and, when
no two overlap, each does its own I/O (``stats.last_call["path"]``); otherwise the call
goes two-phase, where an overlapping write is the agreed ``OverlapError``.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import items_image, prefill, raises_everywhere, read_file, romio_items

import collio
from collio import layouts, policy

pytestmark = pytest.mark.mpi(min_size=1)
L = policy.CHECKED_MIN_RUN  # bytes of each rank's run of each item
ITEMS = 20  # more than policy.DIRECT_MAX_RUNS: the runs count as many small ones
#: reads copy from the file, not from a map
HINTS = {"mapped_reads": "disable"}


def _batch(comm, length=L, shift=None):
    """This rank's items: item k's global array of p runs of ``length`` bytes, at
    ``k * (p + 1) * L`` (a gap after it: one rank's runs never merge), rank r's run r
    of it; ``shift`` (item, bytes): the last rank's run of
    that item moved back by so many bytes."""
    p, r = comm.size, comm.rank
    items = []
    for k in range(ITEMS):
        at = k * (p + 1) * L + r * L
        if shift is not None and k == shift[0] and r == p - 1:
            at -= shift[1]
        data = np.random.default_rng(1000 * k + r).integers(0, 256, length, np.uint8)
        items.append((data, layouts.Segments([at], [length])))
    return items


def test_interleaved_large_runs_go_direct(comm, mpi_tmp_path):
    paths = [str(mpi_tmp_path / n) for n in ("batch.bin", "single.bin", "romio.bin")]
    items = _batch(comm)
    with collio.open(paths[0], "w", comm=comm, hints=HINTS) as f:
        f.write_all_many(items)
        assert f.stats.last_call["path"] == "direct"
    with collio.open(paths[1], "w", comm=comm, hints=HINTS) as f:
        for data, lay in items:
            f.write_all(data, lay)
    romio_items(paths[2], comm, items)
    comm.Barrier()
    want = items_image(comm, items)
    assert [read_file(p) for p in paths] == [want] * 3
    with collio.open(paths[0], "r", comm=comm, hints=HINTS) as f:
        got = f.read_all_many([lay for _, lay in items])
        assert f.stats.last_call["path"] == "direct"
        # one write_all of the same runs goes direct too (not only batches)
        lay = layouts.Segments([int(x.offsets[0]) for _, x in items], [L] * ITEMS)
        one = f.read_all(lay)
        assert f.stats.last_call["path"] == "direct"
    for (data, _), g in zip(items, got, strict=True):
        np.testing.assert_array_equal(g, data)
    np.testing.assert_array_equal(one, np.concatenate([d for d, _ in items]))
    with collio.open(paths[1], "w", comm=comm, hints=HINTS) as f:
        f.write_all(one[::-1].copy(), lay)
        assert f.stats.last_call["path"] == "direct"
    comm.Barrier()
    again = items_image(comm, [(one[::-1][k * L : (k + 1) * L], x) for k, (_, x) in
                             enumerate(items)])  # fmt: skip
    assert read_file(paths[1]) == again


@pytest.mark.mpi(min_size=2)
def test_one_overlap_between_two_ranks_is_agreed(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    size = ITEMS * (comm.size + 1) * L
    prefill(comm, [path], size)
    before = read_file(path)
    bad = _batch(comm, shift=(3, L // 2))  # the last rank's item 3 reaches into another's
    with collio.open(path, "r+", comm=comm, hints=HINTS) as f:
        err = raises_everywhere(comm, collio.OverlapError, lambda: f.write_all_many(bad))
        assert comm.size - 1 in err.ranks and comm.size - 2 in err.ranks
        comm.Barrier()
        assert read_file(path) == before
        # reads may overlap: the shuffle reads them
        got = f.read_all_many([lay for _, lay in bad])
        assert f.stats.last_call["path"] == "two-phase"
        raw = np.frombuffer(before, np.uint8)
        for _, lay in bad:
            at = int(lay.offsets[0])
            np.testing.assert_array_equal(got.pop(0), raw[at : at + L])
        good = _batch(comm)  # the file stays usable
        f.write_all_many(good)
        assert f.stats.last_call["path"] == "direct"
    comm.Barrier()
    assert read_file(path) == items_image(comm, good, before)


@pytest.mark.parametrize(
    ("length", "hints"),
    [(L // 2, {}), (L, {"romio_cb_write": "enable", "romio_cb_read": "enable"})],
    ids=["small runs", "hint enable"],
)
def test_small_runs_and_the_hint_keep_two_phase(comm, mpi_tmp_path, length, hints):
    path = str(mpi_tmp_path / "target.bin")
    items = _batch(comm, length=length)
    with collio.open(path, "w", comm=comm, hints={**HINTS, **hints}) as f:
        f.write_all_many(items)
        assert f.stats.last_call["path"] == "two-phase"
        got = f.read_all_many([lay for _, lay in items])
        assert f.stats.last_call["path"] == "two-phase"
    for (data, _), g in zip(items, got, strict=True):
        np.testing.assert_array_equal(g, data)
    comm.Barrier()
    assert read_file(path) == items_image(comm, items)


@pytest.mark.parametrize("where", ["_pair_buffers", "_pairs_disjoint"])
def test_a_rank_failing_in_the_run_check_is_agreed(comm, mpi_tmp_path, monkeypatch, where):
    import collio.choose

    path = str(mpi_tmp_path / "target.bin")
    size = ITEMS * (comm.size + 1) * L
    prefill(comm, [path], size)
    before = read_file(path)
    last = comm.size - 1

    def failing(*args):
        raise MemoryError("no memory for every rank's runs")

    items = _batch(comm)
    with collio.open(path, "r+", comm=comm, hints=HINTS) as f:
        if comm.rank == last:
            monkeypatch.setattr(collio.choose, where, failing)
        err = raises_everywhere(comm, collio.CollioError, lambda: f.write_all_many(items))
        assert f"rank {last}: MemoryError" in str(err) and err.ranks == (last,)
        monkeypatch.undo()
        comm.Barrier()
        assert read_file(path) == before
        f.write_all_many(items)  # the same call works with memory back
        assert f.stats.last_call["path"] == "direct"
    comm.Barrier()
    assert read_file(path) == items_image(comm, items, before)
