"""Two-level aggregation on emulated nodes: the same bytes as one level and as ROMIO.

In the suite (4, 1 and 3 ranks) each test sets ``COLLIO_RANKS_PER_NODE`` on every rank
and works on a fresh duplicate of the world communicator (collio reads the node map
once per communicator): 4 ranks as 2 nodes of 2 and as 3 + 1, 3 ranks as 2 + 1.  At 8
ranks tests/test_two_level_jobs.py runs this file with the variable set to 4 and 2
(2 and 4 nodes).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
from helpers import all_layouts, file_image, local_piece, reference
from mpi4py import MPI

import collio
import collio.shmstage
from collio.aggregators.nodes import ENV_RANKS_PER_NODE
from collio.bench.patterns import make_workload
from collio.hints import Hints
from collio.sim import SimConfig, simulate
from collio.testing.romio import romio_read, romio_write

GIVEN = os.environ.get(ENV_RANKS_PER_NODE)


def _per_node(size: int) -> list[int]:
    """Ranks per emulated node for a job of ``size`` ranks (several nodes each)."""
    if GIVEN:
        return [int(GIVEN)]
    return [k for k in (2, 3) if k < size]


@pytest.fixture(params=_per_node(MPI.COMM_WORLD.size) or [0], ids=lambda k: f"ppn{k}")
def nodes(request: pytest.FixtureRequest) -> Iterator[tuple[MPI.Intracomm, int]]:
    """A fresh communicator whose ranks are ``k`` to an emulated node."""
    k = request.param
    if not k:
        pytest.skip("one rank: a single node")
    before = os.environ.get(ENV_RANKS_PER_NODE)
    os.environ[ENV_RANKS_PER_NODE] = str(k)
    comm = MPI.COMM_WORLD.Dup()
    try:
        yield comm, k
    finally:
        comm.Free()
        if before is None:
            os.environ.pop(ENV_RANKS_PER_NODE, None)
        else:
            os.environ[ENV_RANKS_PER_NODE] = before


TWO = {"cb_two_level": "enable", "cb_min_message": 0, "mapped_reads": "disable"}
HINTS = [
    {"cb_buffer_size": 2048},
    {"cb_nodes": 3, "cb_buffer_size": 1000, "cb_local_aggregators": 2},
    {"romio_cb_write": "enable", "romio_cb_read": "enable", "striping_unit": 512},
]


@pytest.mark.mpi
@pytest.mark.parametrize("hints", HINTS, ids=["small-rounds", "3aggs-2local", "enable-stripe"])
def test_every_decomposition_same_bytes_as_one_level_and_romio(nodes, mpi_tmp_path, hints):
    comm, k = nodes
    shape, dtype = (37, 45), "<f8"
    glob = reference(shape, dtype)
    base = str(mpi_tmp_path / f"k{k}")
    for name, lay in all_layouts(comm, shape, dtype):
        local = local_piece(glob, lay)
        files = {}
        for level, extra in (("two", TWO), ("one", {"cb_two_level": "disable"})):
            files[level] = f"{base}-{level}-{name}.bin"
            with collio.open(files[level], "w", comm=comm, hints={**hints, **extra}) as f:
                f.write_all(local, lay)
                wrote = dict(f.stats.last_call)
                back = f.read_all(lay)
                read = dict(f.stats.last_call)
            np.testing.assert_array_equal(back, local, err_msg=f"{name} {level}")
            assert wrote["nodes"] == read["nodes"] == -(-comm.size // k)
            if level == "two":
                for done in (wrote, read):  # (every shuffled call goes in two levels)
                    assert done["two_level"] == (done["path"] == "two-phase"), name
            else:
                assert not wrote["two_level"] and not read["two_level"]
        files["romio"] = f"{base}-romio-{name}.bin"
        romio_write(files["romio"], local, lay, comm)
        comm.Barrier()
        images = {}
        for level, path in files.items():
            with open(path, "rb") as fh:
                images[level] = fh.read()
        assert images["two"] == images["one"] == images["romio"], name
        assert images["two"] == file_image(glob, lay.order), name
        np.testing.assert_array_equal(romio_read(files["two"], lay, comm), local, err_msg=name)
        with collio.open(files["romio"], "r", comm=comm, hints={**hints, **TWO}) as f:
            np.testing.assert_array_equal(f.read_all(lay), local, err_msg=name)
            done = f.stats.last_call
            assert done["two_level"] == (done["path"] == "two-phase"), name


@pytest.mark.mpi
def test_stats_report_nodes_and_hints(nodes, mpi_tmp_path):
    comm, k = nodes
    lay = collio.layouts.block((64, 64), "<f8", comm=comm, grid=(1, comm.size))
    data = np.full(lay.shape, comm.rank, "<f8")
    with collio.open(str(mpi_tmp_path / "s.bin"), "w", comm=comm, hints=TWO) as f:
        f.write_all(data, lay)
        h = f.stats.hints
        assert h["nodes"] == -(-comm.size // k) and h["cb_two_level"] == "enable"
        assert h["cb_local_aggregators"] == 1
        # one local aggregator per node, its first rank; every rank aggregates while
        # the ranks are fewer than the storage takes (storage_aggregators)
        assert h["local_aggregator_ranks"] == list(range(0, comm.size, k))
        assert h["aggregator_ranks"] == list(range(comm.size))
        assert f.stats.last_call["two_level"] and f.stats.last_call["nodes"] == h["nodes"]
        assert not f.stats.last_call["plan_reused"]
        # the same call again: its two-level plan is kept, on a new buffer
        f.write_all(data + 1, lay)
        assert f.stats.last_call["plan_reused"] and f.stats.last_call["two_level"]
        back = f.read_all(lay)
        again = f.read_all(lay)
        assert f.stats.last_call["plan_reused"] and f.stats.last_call["two_level"]
        np.testing.assert_array_equal(back, data + 1)
        np.testing.assert_array_equal(again, data + 1)
    # automatic: too few ranks for two levels
    with collio.open(str(mpi_tmp_path / "a.bin"), "w", comm=comm) as f:
        f.write_all(data, lay)
        assert f.stats.hints["cb_local_aggregators"] == 0
        assert not f.stats.last_call["two_level"]


CASES = [
    ("colblock", "96x100", {"cb_buffer_size": 4096}),
    ("cyclic", "64", {"cb_nodes": 3, "cb_buffer_size": 2048}),
    ("block2d", "60", {"striping_unit": 1000, "cb_buffer_size": 3000}),
    ("ior", None, {"cb_nodes": 2, "cb_buffer_size": 3333, "cb_local_aggregators": 2}),
    ("colblock", "1024x1024", {"cb_min_message": 65536}),
]  # fmt: skip


@pytest.mark.mpi
@pytest.mark.parametrize(("pattern", "size", "hints"), CASES)
def test_simulated_counts_equal_real_stats(nodes, mpi_tmp_path, pattern, size, hints):
    """The simulator's two-level plan is the real one: sources per aggregator and round,
    bytes, rounds, requests and the window."""
    comm, k = nodes
    work = make_workload(
        pattern, comm.size, size=size, block_size=1000, transfer=500, segments=16, cyclic_block=4
    )
    h = {"cb_min_message": 0, **hints, "cb_two_level": "enable", "mapped_reads": "disable"}
    lay = work.layout(comm.rank)
    for writing in (True, False):
        sim = simulate(work, SimConfig(hints=Hints.coerce(h), ppn=k, writing=writing))
        path = str(mpi_tmp_path / f"{pattern}.bin")
        with collio.open(path, "w" if writing else "r", comm=comm, hints=h) as f:
            if writing:
                f.write_all(work.data(comm.rank), lay)
            else:
                assert np.array_equal(f.read_all(lay), work.data(comm.rank))
            stats = f.stats
        locals_ = comm.allgather(stats.local)
        if sim.direct:  # (large disjoint pieces: no shuffle, on one level or two)
            assert stats.last_call["path"] == "direct" and not stats.last_call["two_level"]
            continue
        assert sim.two_level and stats.last_call["two_level"]
        aggs = sorted((d for d in locals_ if d.get("domain", -1) >= 0), key=lambda d: d["domain"])
        msgs = np.array([m for d in aggs for m in d["messages"]], np.int64)
        reqs = np.array([r for d in aggs for r in d["requests"]], np.int64)
        np.testing.assert_array_equal(msgs, sim.msgs)
        np.testing.assert_array_equal(reqs, sim.requests)
        assert [d["bytes"] for d in aggs] == sim.agg_bytes.tolist()
        assert stats.messages == int(sim.msgs.sum()) and stats.rounds == sim.rounds
        assert stats.last_call["window"] == sim.window
        assert stats.hints["cb_local_aggregators"] == sim.local_per_node
        # each local aggregator's staging takes, per round, the ranks of its group with
        # bytes in it: at most its group, and some in some round
        sources = [d["local_sources"] for d in locals_ if d.get("local_sources")]
        assert len(sources) == len(sim.group_ranks)
        assert all(len(s) == sim.rounds for s in sources)
        assert max(max(s) for s in sources) <= int(sim.group_ranks.max())
        assert sum(map(sum, sources)) > 0
    comm.Barrier()


@pytest.mark.mpi
def test_own_groups_pieces_skip_the_stage(nodes, mpi_tmp_path):
    """A rank's pieces for an aggregator of its own local group move between the two
    straight, a read's as a write's: each rank copies through its group's staging
    exactly its pieces for the other groups' aggregators (from its sender plan), its
    group's total is the simulator's, and the bytes are ROMIO's and the reference's."""
    from collio.aggregators.nodes import local_groups
    from collio.aggregators.plan import plan_sender

    comm, k = nodes
    work = make_workload("colblock", comm.size, size="96x100")
    h = {**TWO, "cb_buffer_size": 4096}
    lay, data = work.layout(comm.rank), work.data(comm.rank)
    path = str(mpi_tmp_path / "own.bin")
    staged = {}
    for writing in (True, False):
        sim = simulate(work, SimConfig(hints=Hints.coerce(h), ppn=k, writing=writing))
        with collio.open(path, "w" if writing else "r", comm=comm, hints=h) as f:
            if writing:
                f.write_all(data, lay)
            else:  # (checked on every rank with the figures below)
                read_ok = bool(np.array_equal(f.read_all(lay), data))
            stats = f.stats
        last = stats.last_call
        assert last["two_level"] and last["window"] == sim.window, last
        groups = local_groups(np.arange(comm.size) // k, stats.hints["cb_local_aggregators"])
        aggs = np.array(stats.hints["aggregator_ranks"], np.int64)
        sp = plan_sender(lay.runs(), sim.bounds, sim.window)
        dom = np.repeat(sp.gdom, np.diff(sp.gstart))
        away = groups.group[aggs][dom] != groups.group[comm.rank]
        # (every rank's figures first: each rank then checks them all, so that a rank
        # that fails a check does not leave the others waiting in a collective)
        mine = (stats.local["staged_bytes"], int(sp.pieces.length[away].sum()),
                writing or read_ok)  # fmt: skip
        got, want, ok = np.array(comm.allgather(mine), np.int64).T
        assert ok.all(), f"ranks whose read differs from the data: {np.flatnonzero(ok == 0)}"
        assert got.tolist() == want.tolist(), writing
        per_group = np.bincount(groups.group, weights=got, minlength=len(groups.leaders))
        assert per_group.astype(np.int64).tolist() == sim.group_bytes.tolist()
        # some bytes of the call skip the stage (a group holds an aggregator), some not
        assert 0 < int(got.sum()) < comm.allreduce(int(sp.pieces.length.sum()))
        staged[writing] = got.tolist()
    assert staged[True] == staged[False]
    comm.Barrier()
    np.testing.assert_array_equal(romio_read(path, lay, comm), data)
    with open(path, "rb") as fh:
        image = fh.read()
    romio = str(mpi_tmp_path / "own-romio.bin")
    romio_write(romio, data, lay, comm)
    comm.Barrier()
    with open(romio, "rb") as fh:
        assert fh.read() == image


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_local_aggregator_failing_mid_read_is_agreed(nodes, mpi_tmp_path, monkeypatch):
    """A local aggregator whose copies out of its node's staging fail from the second
    round of a read on (no memory for a copy's runs): every rank raises the same error
    naming it, nobody waits for it in the rounds or the stage, and the file reads right
    after."""
    comm, k = nodes
    glob = reference((64, 96), "<f8", seed=5)
    lay = collio.layouts.block(glob.shape, "<f8", comm=comm, grid=(1, comm.size))
    hints = {**TWO, "cb_buffer_size": 4096}
    # a local aggregator with other ranks on its node (a node of one scatters nothing)
    leaders = [r for r in range(0, comm.size, k) if min(k, comm.size - r) > 1]
    if not leaders:
        pytest.skip("no node of two ranks")
    bad = leaders[-1]

    def boom(*args, **kwargs):
        raise MemoryError("no memory for a copy's runs")

    scatter = collio.shmstage.ShmStage.scatter
    rounds: list[int] = []

    def failing_scatter(self, k_round):
        rounds.append(k_round)
        if k_round < 1:
            return scatter(self, k_round)
        with monkeypatch.context() as m:
            m.setattr(collio.shmstage, "copy_runs", boom)  # (either way a round copies)
            m.setattr(collio.shmstage, "copy_blocks", boom)
            return scatter(self, k_round)

    path = str(mpi_tmp_path / "r.bin")
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        f.write_all(local_piece(glob, lay), lay)
        np.testing.assert_array_equal(f.read_all(lay), local_piece(glob, lay))
        last = f.stats.last_call
        assert last["two_level"] and last["rounds"] > 1, last
        assert bad in f.stats.hints["local_aggregator_ranks"]
        error = None
        with monkeypatch.context() as m:
            if comm.rank == bad:
                m.setattr(collio.shmstage.ShmStage, "scatter", failing_scatter)
            try:
                f.read_all(lay)
            except collio.CollioError as exc:
                error = (type(exc).__name__, str(exc), list(exc.ranks))
        errors = comm.allgather(error)
        assert all(e == errors[0] for e in errors), errors
        assert errors[0] is not None and errors[0][2] == [bad], errors
        assert "no memory for a copy" in errors[0][1] and f"rank {bad}" in errors[0][1]
        if comm.rank == bad:
            assert rounds[:2] == [0, 1], rounds  # it failed in the second round, not before
        np.testing.assert_array_equal(f.read_all(lay), local_piece(glob, lay))
        assert f.stats.last_call["two_level"]
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(glob.shape), glob)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("where", ["staging", "round_bytes"])
def test_a_rank_failing_after_the_stage_two_plan_is_agreed(nodes, mpi_tmp_path, monkeypatch, where):
    """Planning's steps after the stage-two plan (the slot's bases, the answers placing
    each piece in a round and the slot) may fail on one rank: every rank raises it, the
    target is untouched, and the same call works afterwards."""
    import collio.twoplan

    comm, k = nodes
    glob = reference((64, 96), "<f8", seed=9)
    lay = collio.layouts.block(glob.shape, "<f8", comm=comm, grid=(1, comm.size))
    path = str(mpi_tmp_path / "p.bin")
    with collio.open(path, "w", comm=comm, hints={**TWO, "cb_buffer_size": 4096}) as f:
        bad = comm.size - 1

        def boom(*args, **kwargs):
            raise MemoryError("no memory for the staging plan")

        with monkeypatch.context() as m:
            if comm.rank == bad:
                m.setattr(collio.twoplan, where, boom)
            error = None
            try:
                f.write_all(local_piece(glob, lay), lay)
            except collio.CollioError as exc:
                error = (type(exc).__name__, str(exc), list(exc.ranks))
        errors = comm.allgather(error)
        assert all(e == errors[0] for e in errors), errors
        assert errors[0] is not None and errors[0][2] == [bad], errors
        comm.Barrier()
        assert os.path.getsize(path) == 0  # (nothing written)
        f.write_all(local_piece(glob, lay), lay)
        assert f.stats.last_call["two_level"]
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(glob.shape), glob)


def _errors(comm, call):
    """Every rank's CollioError of ``call`` (type, message, ranks named; None: it
    returned), the same list on every rank."""
    error = None
    try:
        call()
    except collio.CollioError as exc:
        error = (type(exc).__name__, str(exc), list(exc.ranks))
    return comm.allgather(error)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op", ["write", "read"])
@pytest.mark.parametrize("where", ["leader_runs", "holders", "_room"])
def test_a_local_aggregator_failing_to_merge_its_groups_runs_is_agreed(
    nodes, mpi_tmp_path, monkeypatch, where, op
):
    """A local aggregator that fails merging its group's runs (or making room for their
    list, or, for a read, handing them to its group's holders) goes on planning with
    nothing; every rank then raises its error naming it, nobody hangs, the target is
    untouched, and the call works next."""
    import collio.twoplan

    comm, k = nodes
    glob = reference((64, 96), "<f8", seed=13)
    lay = collio.layouts.block(glob.shape, "<f8", comm=comm, grid=(1, comm.size))
    leaders = [r for r in range(0, comm.size, k) if min(k, comm.size - r) > 1]
    if not leaders:
        pytest.skip("no node of two ranks")
    bad = leaders[-1]
    path = str(mpi_tmp_path / "m.bin")
    hints = {**TWO, "cb_buffer_size": 4096}

    def boom(*args, **kwargs):
        raise MemoryError("no memory for the group's runs")

    with collio.open(path, "w", comm=comm, hints=hints) as f:
        if op == "read":
            f.write_all(local_piece(glob, lay), lay)
            f.sync()
        out = np.full_like(local_piece(glob, lay), -1.0)
        with monkeypatch.context() as m:
            if comm.rank == bad:
                m.setattr(collio.twoplan, where, boom)
            if op == "write":
                errors = _errors(comm, lambda: f.write_all(local_piece(glob, lay), lay))
            else:
                errors = _errors(comm, lambda: f.read_all(lay, out=out))
        if where == "holders" and op == "write":  # (a write's local aggregator holds all)
            assert errors == [None] * comm.size, errors
        else:
            assert all(e == errors[0] for e in errors), errors
            assert errors[0] is not None and errors[0][2] == [bad], errors
            assert "no memory for the group" in errors[0][1] and f"rank {bad}" in errors[0][1]
            comm.Barrier()
            if op == "write":
                assert os.path.getsize(path) == 0  # (nothing written)
            else:
                assert bool((out == -1.0).all())  # (nothing read into the array)
        if op == "write":
            f.write_all(local_piece(glob, lay), lay)
        np.testing.assert_array_equal(f.read_all(lay), local_piece(glob, lay))
        assert f.stats.last_call["two_level"]
    comm.Barrier()
    assert np.array_equal(np.fromfile(path, "<f8").reshape(glob.shape), glob)


@pytest.mark.mpi(min_size=2)
def test_a_rank_failing_to_take_its_share_of_a_read_is_agreed(nodes, mpi_tmp_path, monkeypatch):
    """A read's local aggregator hands each rank of its group a share of its runs; a rank
    that cannot make room for its share gets nothing, every rank raises its error naming
    it, nobody hangs, nothing is read into the array, and the call works next."""
    import collio.twoplan

    comm, k = nodes
    glob = reference((64, 96), "<f8", seed=17)
    lay = collio.layouts.block(glob.shape, "<f8", comm=comm, grid=(1, comm.size))
    members = [r for r in range(comm.size) if r % k]  # (ranks that are no local aggregator)
    if not members:
        pytest.skip("no node of two ranks")
    bad = members[-1]
    path = str(mpi_tmp_path / "s.bin")
    with collio.open(path, "w", comm=comm, hints={**TWO, "cb_buffer_size": 4096}) as f:
        f.write_all(local_piece(glob, lay), lay)
        f.sync()
        out = np.full_like(local_piece(glob, lay), -1.0)
        with monkeypatch.context() as m:
            if comm.rank == bad:

                def boom(n):
                    raise MemoryError(f"no room for {n} values")

                m.setattr(collio.twoplan, "_room", boom)
            errors = _errors(comm, lambda: f.read_all(lay, out=out))
        assert all(e == errors[0] for e in errors), errors
        assert errors[0] is not None and errors[0][2] == [bad], errors
        assert "no room for" in errors[0][1] and f"rank {bad}" in errors[0][1]
        assert bool((out == -1.0).all())  # (nothing read into the array)
        np.testing.assert_array_equal(f.read_all(lay), local_piece(glob, lay))
        assert f.stats.last_call["two_level"]


@pytest.mark.mpi(min_size=2)
def test_one_and_two_levels_alternating_keep_their_plans(nodes, mpi_tmp_path):
    """A job that alternates a file in two levels and one in one level (a write and a
    read of each) on one communicator plans each call once: the repeats reuse the kept
    plans, and the bytes are the same."""
    comm, k = nodes
    glob = reference((48, 64), "<f8", seed=21)
    lay = collio.layouts.block_cyclic(glob.shape, "<f8", block=(4, 4), grid=(2, comm.size // 2)
                                      if comm.size % 2 == 0 else (1, comm.size), rank=comm.rank,
                                      size=comm.size)  # fmt: skip
    piece = local_piece(glob, lay)
    paths = {two: str(mpi_tmp_path / f"alt{two}.bin") for two in (True, False)}
    hints = {True: {**TWO, "cb_buffer_size": 4096},
             False: {**TWO, "cb_two_level": "disable", "cb_buffer_size": 4096}}  # fmt: skip
    for repeat in range(2):
        for two in (True, False):
            with collio.open(paths[two], "w", comm=comm, hints=hints[two]) as f:
                f.write_all(piece, lay)
                assert f.stats.last_call["two_level"] == two
                assert f.stats.last_call["plan_reused"] == bool(repeat), (repeat, two)
            with collio.open(paths[two], "r", comm=comm, hints=hints[two]) as f:
                np.testing.assert_array_equal(f.read_all(lay), piece)
                assert f.stats.last_call["plan_reused"] == bool(repeat), (repeat, two)
    comm.Barrier()
    for two in (True, False):
        assert np.array_equal(np.fromfile(paths[two], "<f8").reshape(glob.shape), glob)
