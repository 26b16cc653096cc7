"""Plans kept across calls: reused only when every rank repeats an identical call.

Each test changes what the kept plan would get wrong (one rank's layout, the
direction, the window, data in place) and checks the file byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import collio
from collio import check, layouts

pytestmark = pytest.mark.mpi(min_size=1)
N = 96


def _global(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((N, N))


def _write(path: str, comm: MPI.Comm, glob: np.ndarray, lay, hints=None) -> bool:
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        return bool(f.stats.last_call["plan_reused"])


def _on_disk(path: str) -> np.ndarray:
    return np.fromfile(path, "<f8").reshape(N, N)


def test_repeated_write_and_read_reuse_the_plan(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    lay = layouts.block((N, N), "<f8", comm=comm, grid=(1, comm.size))
    small = {"cb_buffer_size": 4096, "romio_cb_write": "enable", "romio_cb_read": "enable"}
    seen = []
    for it in range(3):
        glob = _global(it)
        seen.append(_write(path, comm, glob, lay, small))
        comm.Barrier()
        assert np.array_equal(_on_disk(path), glob)
        with collio.open(path, "r", comm=comm, hints=small) as f:
            back = f.read_all(lay)
            seen.append(bool(f.stats.last_call["plan_reused"]))
        assert np.array_equal(back, glob[lay.slices])
    # the first write and the first read plan; every later call reuses
    assert seen == [False, False, True, True, True, True]


def test_an_equal_layout_made_again_reuses_the_plan(comm, mpi_tmp_path):
    """The kept plan is found by its runs' values, not only by the same layout object."""
    path = str(mpi_tmp_path / "target.bin")
    small = {"cb_buffer_size": 12288, "romio_cb_write": "enable"}  # (no other test's plan)
    seen = []
    for it in range(3):
        lay = layouts.block((N, N), "<f8", comm=comm, grid=(comm.size, 1))  # a new object
        glob = _global(10 + it)
        seen.append(_write(path, comm, glob, lay, small))
        comm.Barrier()
        assert np.array_equal(_on_disk(path), glob)
    assert seen == [False, True, True]


def test_one_rank_changing_its_layout_is_never_served_a_kept_plan(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    p = comm.size
    hints = {"cb_buffer_size": 8192, "romio_cb_write": "enable"}
    # rows dealt round-robin, then the last two ranks swap their rows (same global array)
    rows = [np.arange(r, N, p) for r in range(p)]
    for swap in (False, True, False):
        mine = rows[comm.rank]
        if swap and p >= 2 and comm.rank >= p - 2:
            mine = rows[(2 * p - 3 - comm.rank) % p]
        offsets = mine * N * 8
        seg = layouts.Segments(offsets, np.full(len(mine), N * 8))
        glob = _global(7 if swap else 8)
        with collio.open(path, "w", comm=comm, hints=hints) as f:
            f.write_all(np.ascontiguousarray(glob[mine]).view(np.uint8).reshape(-1), seg)
            if swap and p >= 2:  # two ranks changed their runs: nobody may reuse
                assert not f.stats.last_call["plan_reused"]
        comm.Barrier()
        assert np.array_equal(_on_disk(path), glob)


def test_changed_window_or_data_in_place(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    lay = layouts.block_cyclic((N, N), "<f8", block=(8, 8), grid=_grid(comm.size), comm=comm)
    glob = _global(3)
    local = np.ascontiguousarray(glob[np.ix_(*lay.indices)])
    for call, size in enumerate((4096, 4096, 16384, 4096)):
        local += 1.0  # new values each call, same buffer
        glob[np.ix_(*lay.indices)] = local
        full = comm.allreduce(np.where(_mask(lay), glob, 0.0), op=MPI.SUM)
        with collio.open(path, "w", comm=comm, hints={"cb_buffer_size": size}) as f:
            f.write_all(local, lay)
            # the repeat reuses the plan with new data in the same buffer; a new window cannot
            if not f.stats.last_call["direct"]:  # (one rank holding everything goes direct)
                assert f.stats.last_call["plan_reused"] == (call in (1, 3))
        comm.Barrier()
        assert np.array_equal(_on_disk(path), full)


def test_a_failed_call_leaves_nothing_stale(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    lay = layouts.block((N, N), "<f8", comm=comm, grid=(comm.size, 1))
    glob = _global(11)
    _write(path, comm, glob, lay)
    if comm.size > 1:  # rank 0 also writes rank 1's first row: refused on every rank
        bad = (
            layouts.Subarray((N, N), (0, 0), (lay.local_shape[0] + 1, N), "<f8")
            if comm.rank == 0
            else lay
        )
        with collio.open(path, "r+", comm=comm) as f:
            with pytest.raises(collio.OverlapError):
                f.write_all(np.zeros(bad.local_shape), bad)
    glob2 = _global(12)
    _write(path, comm, glob2, lay)
    comm.Barrier()
    assert np.array_equal(_on_disk(path), glob2)


def _grid(p: int) -> tuple[int, int]:
    return (2, p // 2) if p % 2 == 0 else (1, p)


def _mask(lay) -> np.ndarray:
    m = np.zeros((N, N), bool)
    m[np.ix_(*lay.indices)] = True
    return m


def test_a_plan_too_big_on_one_rank_is_kept_by_none(comm, mpi_tmp_path, monkeypatch):
    """Keeping is agreed: a plan that one rank cannot keep (an aggregator's is larger)
    is kept by no rank, instead of holding memory on the others that no call can reuse."""
    path = str(mpi_tmp_path / "target.bin")
    from collio import plancache
    from collio.comms import private

    private(comm).plans.clear()
    if comm.rank == 0:
        monkeypatch.setattr(plancache, "MAX_BYTES", 0)
    lay = layouts.block((N, N), "<f8", comm=comm, grid=(1, comm.size))
    hints = {"cb_buffer_size": 4096, "romio_cb_write": "enable"}
    for it in range(3):
        glob = _global(it)
        assert not _write(path, comm, glob, lay, hints)
        assert not private(comm).plans.entries  # on every rank
        comm.Barrier()
        np.testing.assert_array_equal(_on_disk(path), glob)
        comm.Barrier()


def test_release_buffers_drops_kept_plans(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    from collio.comms import private

    lay = layouts.block((N, N), "<f8", comm=comm, grid=(1, comm.size))
    hints = {"cb_buffer_size": 4096, "romio_cb_write": "enable"}
    _write(path, comm, _global(0), lay, hints)
    assert _write(path, comm, _global(1), lay, hints)  # kept and reused
    assert private(comm).plans.entries
    collio.release_buffers()
    assert not private(comm).plans.entries
    glob = _global(2)
    assert not _write(path, comm, glob, lay, hints)  # planned again, still right
    comm.Barrier()
    np.testing.assert_array_equal(_on_disk(path), glob)
    comm.Barrier()


def _step_layout(comm: MPI.Comm, rows: int, cols: int, offset: int) -> layouts.Subarray:
    """Column block ``comm.rank`` of a ``(rows, cols * size)`` float64 step at ``offset``."""
    shape = (rows, cols * comm.size)
    return layouts.Subarray(shape, (0, comm.rank * cols), (rows, cols), "<f8", offset=offset)


def _romio_steps(comm, path, rows, cols, offsets, pieces):
    """ROMIO's file of the same steps: a subarray view at each step's offset."""
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    ft = MPI.DOUBLE.Create_subarray((rows, cols * comm.size), (rows, cols), (0, comm.rank * cols))
    ft.Commit()
    for off, piece in zip(offsets, pieces, strict=True):
        fh.Set_view(off, MPI.DOUBLE, ft)
        fh.Write_all(piece)
    ft.Free()
    fh.Close()


@pytest.mark.parametrize("gap", [0, 4096 + 8])
def test_a_time_series_reuses_the_plan_moved_by_its_step(comm, mpi_tmp_path, gap):
    """Steps of one strided pattern, each further on in the file (gap: bytes between
    steps, so the step is not a multiple of any alignment): from the second call on every
    write and read reuses the kept plan moved by the step, in several rounds and domains;
    the file is the numpy reference and ROMIO's file of the same steps, byte for byte, and
    every step reads back."""
    path, romio = str(mpi_tmp_path / "target.bin"), str(mpi_tmp_path / "romio.bin")
    rows, cols, nsteps = 32, 24, 5
    step = rows * cols * comm.size * 8 + gap
    hints = {"cb_buffer_size": 4096, "romio_cb_write": "enable", "romio_cb_read": "enable",
             "cb_nodes": comm.size}  # fmt: skip
    rng = np.random.default_rng(21)
    steps = [rng.random((rows, cols * comm.size)) for _ in range(nsteps)]
    offsets = [k * step + 8 for k in range(nsteps)]
    pieces = [np.ascontiguousarray(s[:, comm.rank * cols : (comm.rank + 1) * cols]) for s in steps]
    reused, back = [], []
    collio.release_buffers()  # (no plan of an earlier test: the first call plans)
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        for off, piece in zip(offsets, pieces, strict=True):
            f.write_all(piece, _step_layout(comm, rows, cols, off))
            reused.append(f.stats.last_call["plan_reused"])
        for off in offsets:
            back.append(f.read_all(_step_layout(comm, rows, cols, off)))
            reused.append(f.stats.last_call["plan_reused"])
    assert reused == [False] + [True] * (nsteps - 1) + [False] + [True] * (nsteps - 1)
    assert all(np.array_equal(b, p) for b, p in zip(back, pieces, strict=True))
    _romio_steps(comm, romio, rows, cols, offsets, pieces)
    comm.Barrier()
    ref = np.zeros(offsets[-1] + rows * cols * comm.size * 8, np.uint8)
    for off, s in zip(offsets, steps, strict=True):
        ref[off : off + s.nbytes] = s.reshape(-1).view(np.uint8)
    got, theirs = np.fromfile(path, np.uint8), np.fromfile(romio, np.uint8)
    assert np.array_equal(got, ref)
    for off, s in zip(offsets, steps, strict=True):  # (ROMIO's holes are undefined)
        assert np.array_equal(theirs[off : off + s.nbytes], got[off : off + s.nbytes])


def test_one_rank_moving_by_another_step_is_never_served_a_moved_plan(comm, mpi_tmp_path):
    """Three steps of one array; rank 0's piece of the second call is its column of the
    third step, the others' of the second: the ranks' shifts differ, so the plan is made
    anew, and the bytes are where every rank's layout says."""
    if comm.size < 2:
        pytest.skip("needs two ranks whose shifts can differ")
    path = str(mpi_tmp_path / "target.bin")
    rows, cols = 16, 8
    shape = (3, rows, cols * comm.size)
    hints = {"cb_buffer_size": 4096, "romio_cb_write": "enable", "cb_nodes": comm.size}
    glob = np.random.default_rng(22).random(shape)
    collio.release_buffers()
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        for k in (0, 1):
            at = 2 if k == 1 and comm.rank == 0 else k  # rank 0 writes its column of step 2
            c0 = comm.rank * cols
            lay = layouts.Subarray(shape, (at, 0, c0), (1, rows, cols), "<f8")
            f.write_all(np.ascontiguousarray(glob[at : at + 1, :, c0 : c0 + cols]), lay)
            assert f.stats.last_call["plan_reused"] is False
    comm.Barrier()
    got = np.zeros(glob.size)
    disk = np.fromfile(path, "<f8")  # (it ends with rank 0's last run of step 2)
    got[: len(disk)] = disk
    got = got.reshape(shape)
    assert np.array_equal(got[0], glob[0])
    assert np.array_equal(got[1][:, cols:], glob[1][:, cols:])  # every column but rank 0's
    assert np.array_equal(got[2][:, :cols], glob[2][:, :cols])


def test_a_time_series_through_a_view_reuses_the_plan_every_call(comm, mpi_tmp_path):
    """The benchmark sweep's strided step (64 runs per rank, column blocks of a float64
    matrix) written with ``write_at_all`` through a subarray view, each call one step
    further on, with the default hints: every call after the first reuses the kept plan
    (two-phase; at one rank a view row is contiguous, so the shuffle is forced there),
    and so does every read of the steps back; the file is ROMIO's of the same calls and
    the numpy reference, byte for byte, and every step reads back."""
    path, romio = str(mpi_tmp_path / "target.bin"), str(mpi_tmp_path / "romio.bin")
    rows, cols, nsteps = 64, 8, 12
    step = rows * cols * comm.size  # float64 elements of one step: the view's extent
    hints = None
    if comm.size == 1:
        hints = {"romio_cb_write": "enable", "romio_cb_read": "enable"}
    ft = MPI.DOUBLE.Create_subarray((rows, cols * comm.size), (rows, cols), (0, comm.rank * cols))
    ft.Commit()
    rng = np.random.default_rng(23)
    steps = [rng.random((rows, cols * comm.size)) for _ in range(nsteps)]
    pieces = [np.ascontiguousarray(s[:, comm.rank * cols : (comm.rank + 1) * cols]) for s in steps]
    seen, back = [], []
    collio.release_buffers()  # (no plan of an earlier test: the first call plans)
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        f.set_view(0, MPI.DOUBLE, ft)
        for k, piece in enumerate(pieces):
            f.write_at_all(k * rows * cols, piece)  # (offsets in etypes of this rank's view)
            seen.append((f.stats.last_call["path"], f.stats.last_call["plan_reused"]))
        for k in range(nsteps):
            back.append(f.read_at_all(k * rows * cols, np.empty((rows, cols))))
            if hints is not None:  # (reads copy from the mapped file: no plan to keep)
                seen.append((f.stats.last_call["path"], f.stats.last_call["plan_reused"]))
    planned_once = [("two-phase", False)] + [("two-phase", True)] * (nsteps - 1)
    assert seen[:nsteps] == planned_once  # the writes
    assert seen[nsteps:] in ([], planned_once)  # the reads (their own plan, kept as well)
    assert all(np.array_equal(b, p) for b, p in zip(back, pieces, strict=True))
    fh = MPI.File.Open(comm, romio, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    fh.Set_view(0, MPI.DOUBLE, ft)
    for k, piece in enumerate(pieces):
        fh.Write_at_all(k * rows * cols, piece)
    fh.Close()
    ft.Free()
    comm.Barrier()
    ref = np.concatenate([s.reshape(-1) for s in steps])
    got = np.fromfile(path, "<f8")
    assert len(got) == nsteps * step and np.array_equal(got, ref)
    assert np.array_equal(np.fromfile(romio, "<f8"), got)
    comm.Barrier()


def test_alternating_variables_each_reuse_their_plan(comm, mpi_tmp_path):
    """A solver's step: five variables of different shapes, one strided call each, then
    the next step further on in the file: more layouts alternate than a write and a read,
    and from the second step on every call reuses its variable's kept plan moved by the
    step, writes and reads alike; the file is the numpy reference and ROMIO's file of the
    same calls, byte for byte, and every call reads back."""
    path, romio = str(mpi_tmp_path / "target.bin"), str(mpi_tmp_path / "romio.bin")
    cols, nsteps = 8, 3
    hints = {"cb_buffer_size": 4096, "romio_cb_write": "enable", "romio_cb_read": "enable",
             "cb_nodes": comm.size}  # fmt: skip
    rows = [16 + 8 * v for v in range(5)]
    sizes = [r * cols * comm.size * 8 for r in rows]
    rng = np.random.default_rng(24)
    calls = []  # (offset, rows, global array) of every call, in order
    for k in range(nsteps):
        off = 8 + k * sum(sizes)
        for r, n in zip(rows, sizes, strict=True):
            calls.append((off, r, rng.random((r, cols * comm.size))))
            off += n
    mine = [
        np.ascontiguousarray(g[:, comm.rank * cols : (comm.rank + 1) * cols]) for *_, g in calls
    ]
    reused, back = [], []
    collio.release_buffers()
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        for (off, r, _), piece in zip(calls, mine, strict=True):
            f.write_all(piece, _step_layout(comm, r, cols, off))
            reused.append(f.stats.last_call["plan_reused"])
        # each variable's checked runs are kept too, moved to its next step's offset
        assert len(check._BOX) == len(rows)
        for off, r, _ in calls:
            back.append(f.read_all(_step_layout(comm, r, cols, off)))
            reused.append(f.stats.last_call["plan_reused"])
    first = [False] * len(rows) + [True] * (len(calls) - len(rows))
    assert reused == first + first
    assert all(np.array_equal(b, p) for b, p in zip(back, mine, strict=True))
    fh = MPI.File.Open(comm, romio, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    for (off, r, _), piece in zip(calls, mine, strict=True):
        ft = MPI.DOUBLE.Create_subarray((r, cols * comm.size), (r, cols), (0, comm.rank * cols))
        ft.Commit()
        fh.Set_view(off, MPI.DOUBLE, ft)
        fh.Write_all(piece)
        ft.Free()
    fh.Close()
    comm.Barrier()
    ref = np.zeros(calls[-1][0] + calls[-1][2].nbytes, np.uint8)
    for off, _, g in calls:
        ref[off : off + g.nbytes] = g.reshape(-1).view(np.uint8)
    got, theirs = np.fromfile(path, np.uint8), np.fromfile(romio, np.uint8)
    assert np.array_equal(got, ref)
    for off, _, g in calls:  # (ROMIO's holes are undefined)
        assert np.array_equal(theirs[off : off + g.nbytes], got[off : off + g.nbytes])


def test_what_a_kept_plan_costs_is_the_same_on_every_rank(comm, mpi_tmp_path):
    """An aggregator's plan holds more than a sender's; the cost the cache counts is the
    most of any rank, so every rank drops the same entries when the kept plans exceed
    their bytes."""
    from collio.comms import private

    path = str(mpi_tmp_path / "target.bin")
    collio.release_buffers()
    hints = {"cb_buffer_size": 4096, "romio_cb_write": "enable", "cb_nodes": 1}
    _write(
        path, comm, _global(30), layouts.block((N, N), "<f8", comm=comm, grid=(1, comm.size)), hints
    )
    entries = private(comm).plans.entries
    assert len(entries) == 1
    costs = comm.allgather(entries[0].cost)
    assert len(set(costs)) == 1
    assert costs[0] >= entries[0].plan.nbytes() > 0
