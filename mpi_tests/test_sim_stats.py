"""The simulator's counts equal what a real collio write and read report in their stats.

Run at 4, 1 and 3 ranks by ./run-tests, and at 8 ranks from tests/test_bench_cli.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import on_local_fs
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends.filereads import preads
from collio.bench.patterns import make_workload
from collio.hints import Hints
from collio.sim import SimConfig, simulate
from collio.stats import histogram

CASES = [
    ("colblock", "96x100", {}),
    ("colblock", "64x90", {"cb_nodes": 3, "cb_buffer_size": 4096}),
    ("rowblock", "40x50", {}),
    ("rowblock", "40x50", {"romio_cb_write": "enable", "romio_cb_read": "enable",
                            "cb_buffer_size": 1000}),
    ("block2d", "60", {"striping_unit": 1000, "cb_buffer_size": 3000}),
    ("cyclic", "64", {"cb_nodes": 3, "cb_buffer_size": 2048}),
    ("cube", "20", {"cb_buffer_size": 5000, "cb_nodes": 5}),
    ("ior", None, {"cb_nodes": 2, "cb_buffer_size": 3333}),
    ("colblock", "48x50", {"striping_unit": 4096, "cb_buffer_size": 1000, "cb_nodes": 8}),
    ("cyclic", "48x50", {"striping_unit": 16384, "cb_buffer_size": 5000}),
    # 8 MiB: min_rounds shrinks the windows below cb_buffer_size (several rounds) ...
    ("colblock", "1024x1024", {}),
    ("cyclic", "1024", {"min_rounds": 4}),
    # ... unless the alignment is larger than the shrunk window
    ("colblock", "1024x1024", {"striping_unit": 3 << 20}),
    # interleaved runs of 64 KiB (at 4 ranks; more at 3): the ranks compare them, direct
    ("colblock", "64x32768", {}),
]  # fmt: skip


def _real(comm, path, work, hints, writing):
    """Every rank's ``stats.local`` and the reduced stats of one write (or read)."""
    lay = work.layout(comm.rank)
    if writing:
        with collio.open(path, "w", comm=comm, hints=hints) as f:
            f.write_all(work.data(comm.rank), lay)
            stats = f.stats
    else:
        with collio.open(path, "r", comm=comm, hints=hints) as f:
            got = f.read_all(lay)
            stats = f.stats
        assert np.array_equal(got, work.data(comm.rank))
    return comm.allgather(stats.local), stats


def _check_two_phase(sim, locals_, stats, writing):
    aggs = sorted((d for d in locals_ if d.get("domain", -1) >= 0), key=lambda d: d["domain"])
    busy = np.flatnonzero(sim.agg_rounds > 0)
    assert [d["domain"] for d in aggs if d["rounds"]] == busy.tolist()
    bytes_ = np.zeros(sim.naggs, np.int64)
    rounds = np.zeros(sim.naggs, np.int64)
    for d in aggs:
        bytes_[d["domain"]], rounds[d["domain"]] = d["bytes"], d["rounds"]
    np.testing.assert_array_equal(bytes_, sim.agg_bytes)
    np.testing.assert_array_equal(rounds, sim.agg_rounds)
    msgs = np.array([m for d in aggs for m in d["messages"]], np.int64)
    reqs = np.array([r for d in aggs for r in d["requests"]], np.int64)
    np.testing.assert_array_equal(msgs, sim.msgs)
    np.testing.assert_array_equal(reqs, sim.requests)
    assert stats.messages == int(sim.msgs.sum())
    assert stats.rounds == sim.rounds
    sizes = stats.write_sizes if writing else stats.read_sizes
    np.testing.assert_array_equal(sizes, histogram(sim.requests))
    if writing:
        assert stats.write_ops == len(sim.requests) and stats.read_ops == len(sim.hole_reads)
        assert stats.bytes_written == int(sim.requests.sum())


def _preads(lengths: np.ndarray) -> bool:
    """A rank's mapped read of runs ``lengths`` is done with pread (few small runs)."""
    return preads(len(lengths), int(lengths.sum()))


@pytest.mark.mpi
@pytest.mark.parametrize(("pattern", "size", "hints"), CASES)
def test_simulated_counts_equal_real_stats(comm, mpi_tmp_path, pattern, size, hints):
    work = make_workload(
        pattern, comm.size, size=size, block_size=1000, transfer=500, segments=16, cyclic_block=4
    )
    path = str(mpi_tmp_path / f"{pattern}.bin")
    local = on_local_fs(mpi_tmp_path)
    # a write; a read as the hints choose (mapped on a local file system); a read that
    # keeps the shuffle
    for writing, more in ((True, {}), (False, {}), (False, {"mapped_reads": "disable"})):
        h = {**hints, **more}
        cfg = SimConfig(hints=Hints.coerce(h), ppn=comm.size, writing=writing, local_fs=local)
        sim = simulate(work, cfg)
        locals_, stats = _real(comm, path, work, h, writing)
        mapped = not writing and local and not more and "romio_cb_read" not in hints
        if mapped:
            assert sim.direct  # (the patterns' runs are all copyable)
            # every rank copied its own from the map, but a rank with a few small runs,
            # which it preads (PosixBackend.read_runs)
            mine = [np.asarray(d["requests"]) for d in locals_]
            copied = sum(int(r.sum()) for r in mine if not _preads(r))
            assert stats.bytes_read > 0 and stats.mapped_bytes == copied
        if sim.direct:
            assert all(d.get("direct") for d in locals_), locals_
            real = np.sort([r for d in locals_ for r in d["requests"]])
            want = np.sort(np.repeat(sim.requests, sim.req_count))
            if mapped and len(real) < len(want):
                # a block-cyclic rank's last run of a row and first of the next touch in
                # file and memory when it holds both edge blocks: the engine merges them,
                # the simulator counts its layout's runs
                assert real.sum() == want.sum() == stats.bytes_read
            else:
                np.testing.assert_array_equal(real, want)
            assert stats.messages == 0
        else:
            _check_two_phase(sim, locals_, stats, writing)
            assert stats.last_call["window"] == sim.window  # the same round size
    comm.Barrier()


@pytest.mark.mpi
def test_direct_choice_matches(comm, mpi_tmp_path):
    """Row blocks go direct on the real engine exactly when the simulator says so."""
    work = make_workload("rowblock", comm.size, size="32x64")
    sim = simulate(work, SimConfig(ppn=comm.size))
    path = str(mpi_tmp_path / "rows.bin")
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(work.data(comm.rank), work.layout(comm.rank))
        direct = f.stats.direct_calls == 1
    assert sim.direct and direct
    assert MPI.COMM_WORLD.allreduce(1) == comm.size


def _batch_of_rows(work, rank):
    """This rank's runs of ``work`` (a ``colblock`` pattern), each as one item of a batch:
    item k is row k of the global array, the rank's columns of it."""
    runs = work.layout(rank).runs()
    data = np.ascontiguousarray(work.data(rank)).view(np.uint8).reshape(len(runs.file), -1)
    return [
        (data[k], layouts.Segments([int(runs.file[k])], [int(runs.length[k])]))
        for k in range(len(runs.file))
    ]


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("size", "want"),
    # runs of 64 KiB at 4 ranks (of more at 3, of less at 8), interleaved: the ranks compare
    # them and go direct; runs just too short at 4 ranks keep the shuffle
    [("12x32768", "direct"), ("12x32000", None)],
)
def test_a_batch_of_rows_is_simulated_as_its_pattern(comm, mpi_tmp_path, size, want):
    """A batch whose item k is row k of a column-block matrix makes the runs the simulator
    plans for the one call of that matrix: the same path, and the same counts."""
    work = make_workload("colblock", comm.size, size=size)
    items = _batch_of_rows(work, comm.rank)
    path = str(mpi_tmp_path / "batch.bin")
    local = on_local_fs(mpi_tmp_path)
    for writing, more in ((True, {}), (False, {}), (False, {"mapped_reads": "disable"})):
        cfg = SimConfig(hints=Hints.coerce(more), ppn=comm.size, writing=writing, local_fs=local)
        sim = simulate(work, cfg)
        if writing:
            with collio.open(path, "w", comm=comm, hints=more) as f:
                f.write_all_many(items)
                stats = f.stats
        else:
            with collio.open(path, "r", comm=comm, hints=more) as f:
                got = f.read_all_many([lay for _, lay in items])
                stats = f.stats
            for (data, _), g in zip(items, got, strict=True):
                np.testing.assert_array_equal(g, data)
        locals_ = comm.allgather(stats.local)
        assert stats.last_call["path"] == sim.path.value, (writing, more)
        if want is not None and 1 < comm.size <= 4 and (writing or more):
            assert sim.path.value == want
        if sim.direct:
            assert all(d.get("direct") for d in locals_), locals_
            real = np.sort([r for d in locals_ for r in d["requests"]])
            want_sizes = np.sort(np.repeat(sim.requests, sim.req_count))
            np.testing.assert_array_equal(real, want_sizes)
            assert stats.messages == 0
        else:
            _check_two_phase(sim, locals_, stats, writing)
            assert stats.last_call["window"] == sim.window
    comm.Barrier()
    # the file holds what the one call of the matrix writes (its bytes, in C order)
    with collio.open(path, "r", comm=comm) as f:
        whole = f.read_all(work.layout(comm.rank))
    np.testing.assert_array_equal(whole, work.data(comm.rank))
