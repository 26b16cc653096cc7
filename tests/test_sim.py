"""The simulator against the real pure planner (plan_sender / plan_aggregator) on explicit
runs, its command line, and what it may import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from collio.aggregators import (
    call_domains,
    choose_aggregators,
    file_domains,
    plan_aggregator,
    plan_sender,
    window_size,
)
from collio.aggregators.domains import alignment
from collio.bench.patterns import make_workload
from collio.hints import Hints
from collio.layouts import count_below
from collio.layouts.strided import Blocks, flatten
from collio.runs import Runs
from collio.sim import SimConfig, plan_speed, simulate
from collio.sim import simulator as simulate_module
from collio.sim.batch import batched_blocks, select
from collio.sim.cost import STRATEGIES, Cluster, strategies
from collio.testing.jobs import MPIEXEC, mpiexec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = [sys.executable, "-m", "collio.bench"]
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")


def reference(work, hints, backend_alignment=1, partial_write=True, idle=()):
    """Per-aggregator figures from the real planner on every rank's listed runs."""
    runs = [Runs.empty() if r in idle else work.layout(r).runs() for r in range(work.nranks)]
    lo = min(int(r.file[0]) for r in runs if len(r))
    hi = max(int((r.file + r.length).max()) for r in runs if len(r))
    aggs = choose_aggregators(np.zeros(work.nranks), cb_nodes=hints.cb_nodes)
    align = alignment(backend_alignment, hints.striping_unit)
    bounds, _ = call_domains(lo, hi, len(aggs), align, hints.cb_min_domain)
    largest = int(np.diff(bounds).max())
    window = window_size(hints.cb_buffer_size, align, largest, hints.min_rounds, work.nranks)
    senders = [plan_sender(r, bounds, window) for r in runs]
    out = {"bytes": [], "rounds": [], "msgs": [], "requests": [], "holes": []}
    for d in range(len(aggs)):
        parts = [(sp.pieces.take(np.flatnonzero(
            np.searchsorted(bounds[1:-1], sp.pieces.file, side="right") == d)), r)
            for r, sp in enumerate(senders)]  # fmt: skip
        file = np.concatenate([p.file for p, _ in parts])
        length = np.concatenate([p.length for p, _ in parts])
        src = np.concatenate([np.full(len(p), r, np.int64) for p, r in parts])
        ap, _ = plan_aggregator(file, length, src, int(bounds[d]), window)
        out["bytes"].append(int(length.sum()))
        out["rounds"].append(ap.nrounds)
        out["msgs"] += np.diff(ap.rstart).tolist()
        if partial_write:
            req = ap.rhi - ap.rlo
        else:
            start = bounds[d] + ap.rwin * window
            req = np.minimum(start + window, bounds[d + 1]) - start
        out["requests"] += req.tolist()
        out["holes"] += req[ap.rcovered < req].tolist()
    return {k: np.array(v, np.int64) for k, v in out.items()}


CASES = [
    ("colblock", 4, "64x40", {"cb_buffer_size": 1000}),
    ("colblock", 3, "50", {"cb_nodes": 2, "cb_buffer_size": 777}),
    ("rowblock", 4, "30", {"cb_nodes": 3, "cb_buffer_size": 512}),
    ("block2d", 6, "45", {"cb_nodes": 4, "cb_buffer_size": 900, "striping_unit": 256}),
    ("cyclic", 4, "70", {"cb_buffer_size": 2048}),
    ("cyclic", 8, "100x90", {"cb_nodes": 3, "cb_buffer_size": 3000, "striping_unit": 512}),
    ("cube", 8, "14", {"cb_nodes": 5, "cb_buffer_size": 1500}),
    ("ior", 4, None, {"cb_buffer_size": 700}),
    ("ior", 5, None, {"cb_nodes": 2, "cb_buffer_size": 5000, "striping_unit": 1024}),
    ("colblock", 4, "48x50", {"striping_unit": 4096, "cb_buffer_size": 1000, "cb_nodes": 8}),
    ("cyclic", 4, "48x50", {"striping_unit": 16384, "cb_buffer_size": 5000}),
    # a call smaller than its aggregators' minimum domains: 2 of 4, 2 of 3 take domains
    ("colblock", 4, "64x40", {"cb_buffer_size": 1000, "cb_min_domain": 8192}),
    ("cyclic", 8, "100x90", {"cb_nodes": 3, "cb_buffer_size": 3000, "cb_min_domain": 30000}),
]


@pytest.mark.parametrize("method", ["explicit", "interval"])
@pytest.mark.parametrize(("pattern", "p", "size", "hints"), CASES)
def test_simulator_equals_planner(pattern, p, size, hints, method):
    work = make_workload(
        pattern, p, size=size, block_size=96, transfer=32, segments=7, cyclic_block=4
    )
    h = Hints(romio_cb_write="enable", **{"cb_min_domain": 0, **hints})
    ref = reference(work, h)
    sim = simulate(work, SimConfig(hints=h, method=method))
    assert not sim.direct and sim.method == method
    np.testing.assert_array_equal(sim.agg_bytes, ref["bytes"])
    np.testing.assert_array_equal(sim.agg_rounds, ref["rounds"])
    np.testing.assert_array_equal(sim.msgs, ref["msgs"])
    np.testing.assert_array_equal(sim.requests, ref["requests"])
    np.testing.assert_array_equal(sim.hole_reads, ref["holes"])
    assert sim.nbytes == work.nbytes == sum(ref["bytes"])


@pytest.mark.parametrize("p", [1, 2, 3, 6])
def test_batched_blocks_hold_each_rank_runs(p):
    """Same bytes as every rank's layout, and as many runs as collio lists after merging."""
    for pattern in ("ior", "colblock", "rowblock", "block2d", "cyclic", "cube"):
        work = make_workload(pattern, p, size="23", block_size=64, transfer=16, segments=3,
                             cyclic_block=3)  # fmt: skip
        blocks, owner = batched_blocks(work)
        for r in range(work.nranks):
            ref = work.layout(r).runs()
            mine = np.flatnonzero(owner == r)
            sub = Blocks(*(getattr(blocks, f)[mine] for f in Blocks.__slots__))
            got = flatten(sub)
            np.testing.assert_array_equal(got.file, ref.file)
            np.testing.assert_array_equal(got.length, ref.length)
            np.testing.assert_array_equal(got.mem, ref.mem)
            assert int(sub.nruns().sum()) == len(ref), (pattern, p, r)


def test_batched_blocks_equal_layout_boxes_on_full_grids():
    work = make_workload("cyclic", 6, size="23", cyclic_block=3)
    blocks, owner = batched_blocks(work)
    for r in range(work.nranks):
        ref = work.layout(r).blocks()
        for field in ("base", "mem", "counts", "strides", "mstrides", "runlen"):
            np.testing.assert_array_equal(getattr(blocks, field)[owner == r], getattr(ref, field))


def test_select_inverts_count_below():
    work = make_workload("cyclic", 4, size="37", cyclic_block=5)
    blocks, _ = batched_blocks(work)
    which = np.repeat(np.arange(len(blocks)), 50)
    k = np.concatenate([np.linspace(0, n - 1, 50).astype(np.int64) for n in blocks.nbytes()])
    off = select(blocks, which, k)
    np.testing.assert_array_equal(count_below(blocks, which, off), k)
    np.testing.assert_array_equal(count_below(blocks, which, off + 1), k + 1)


@pytest.mark.parametrize("partial_write", [True, False])
@pytest.mark.parametrize(
    ("pattern", "size"), [("colblock", "40x64"), ("cyclic", "50"), ("ior", None)]
)
def test_layouts_with_holes(monkeypatch, pattern, size, partial_write):
    """Idle ranks leave holes: request extents, hole reads and messages still match."""
    work = make_workload(pattern, 4, size=size, block_size=100, transfer=50, segments=6,
                         cyclic_block=4)  # fmt: skip
    idle = (1, 2)
    real = simulate_module.batched_blocks

    def some_ranks(w):
        blocks, owner = real(w)
        keep = np.flatnonzero(~np.isin(owner, idle))
        sub = Blocks(*(getattr(blocks, f)[keep] for f in Blocks.__slots__))
        return sub, owner[keep]

    monkeypatch.setattr(simulate_module, "batched_blocks", some_ranks)
    h = Hints(romio_cb_write="enable", cb_nodes=3, cb_buffer_size=640, cb_min_domain=0)
    ref = reference(work, h, partial_write=partial_write, idle=idle)
    cfg = SimConfig(hints=h, partial_write=partial_write)
    sim = simulate(work, cfg)
    assert sim.method == "explicit" and len(ref["holes"]) > 0
    np.testing.assert_array_equal(sim.agg_bytes, ref["bytes"])
    np.testing.assert_array_equal(sim.agg_rounds, ref["rounds"])
    np.testing.assert_array_equal(sim.msgs, ref["msgs"])
    np.testing.assert_array_equal(sim.requests, ref["requests"])
    np.testing.assert_array_equal(sim.hole_reads, ref["holes"])
    sampled = simulate(work, SimConfig(hints=h, partial_write=partial_write, method="sampled",
                                       budget=10))  # fmt: skip
    assert sampled.sampled  # at least 64 windows are taken: here all of them
    np.testing.assert_array_equal(sampled.agg_bytes, ref["bytes"])
    np.testing.assert_array_equal(sampled.windows, sim.windows)
    np.testing.assert_array_equal(sampled.requests, sim.requests)


@pytest.mark.parametrize("pattern", ["colblock", "block2d", "cyclic", "cube", "ior"])
def test_interval_method_equals_explicit_for_many_windows(pattern):
    """Through boxes (no pairs), cut boxes and several boxes per rank, against explicit."""
    work = make_workload(
        pattern, 6, size="30", block_size=200, transfer=100, segments=9, cyclic_block=3
    )
    for cb in (40, 100, 333, 1000, 4096):
        for naggs in (1, 4, 7):
            h = Hints(romio_cb_write="enable", cb_nodes=naggs, cb_buffer_size=cb)
            a = simulate(work, SimConfig(hints=h, method="explicit"))
            b = simulate(work, SimConfig(hints=h, method="interval"))
            np.testing.assert_array_equal(a.msgs, b.msgs)
            np.testing.assert_array_equal(a.agg_bytes, b.agg_bytes)
            np.testing.assert_array_equal(a.requests, b.requests)
            assert (b.agg_pieces >= 0).all()


@pytest.mark.parametrize("pattern", ["colblock", "cyclic", "cube"])
def test_mapped_reads_follow_the_file_system_and_the_hints(pattern):
    """A read of a local file goes direct, mapped (each rank's own runs, no aggregator);
    a write, a read on a parallel file system, or hints that keep the shuffle do not."""
    from collio.sim import format_sim

    work = make_workload(pattern, 8, size="64" if pattern != "colblock" else "64x80")
    runs = [work.layout(r).runs() for r in range(8)]

    def sim(writing=False, local=True, **hints):
        return simulate(work, SimConfig(hints=Hints(**hints), writing=writing, local_fs=local))

    res = sim()
    assert res.direct and res.mapped and res.naggs == 0
    want = np.sort(np.concatenate([r.length for r in runs]))
    assert int(res.req_count.sum()) >= len(want)  # (the layout's runs, before merging)
    assert int((res.requests * res.req_count).sum()) == int(want.sum())
    assert "copies its own runs from the mapped file" in format_sim(work, res, 64)
    # otherwise the extents decide, for reads as for writes
    extents = sim(writing=True).direct
    for other in (sim(local=False), sim(mapped_reads="disable")):
        assert not other.mapped and other.direct is extents
    assert not sim(romio_cb_read="enable").direct
    assert sim(local=False, mapped_reads="enable").mapped


@needs_mpiexec
def test_simulator_equals_real_stats_at_8_ranks():
    test = os.path.join(ROOT, "mpi_tests", "test_sim_stats.py")
    args = ["-n", "8", sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi", test, "-q"]
    proc = mpiexec(args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # every case ran on all 8 ranks (none skipped): the CASES, the direct-path test and the
    # two batches of rows
    sys.path.insert(0, os.path.join(ROOT, "mpi_tests"))
    try:
        import test_sim_stats as cases
    finally:
        sys.path.pop(0)
    assert f"{len(cases.CASES) + 3} passed" in proc.stdout


@pytest.mark.parametrize("pattern", ["colblock", "cyclic"])
def test_default_hints_at_65536_ranks_meet_a_cluster(pattern):
    """65,536 ranks, 64 per node, 1 TiB, default hints: two levels, at most 4,096
    messages per aggregator and round (one level: 61,788 for column blocks), inter-node
    messages of 64 KiB or more, and on the cost model's cluster at most half the
    predicted time of one-level collio and of ROMIO's strategy for column blocks; for
    block-cyclic, whose one-level messages are already large, every strategy is bound by
    the storage targets' aggregate and two levels cost nothing."""
    work = make_workload(pattern, 65536, size="1TiB")
    rows = strategies(work, SimConfig(hints=Hints(), ppn=64), Cluster())
    (two, p2), (one, p1), (_, pr) = rows
    assert two.two_level and not one.two_level and two.naggs == 1024 == two.nnodes
    assert p2.max_sources <= 4096 and int(two.msgs.max()) <= 4096
    assert p2.min_message >= 64 << 10
    best_other = min(p1.predicted_seconds, pr.predicted_seconds)
    assert all(res.seconds < 60 for res, _ in rows)
    if pattern == "colblock":
        assert p1.max_sources == 61788 and 2 * p2.predicted_seconds <= best_other
    else:
        targets = work.nbytes / (Cluster().targets * Cluster().target_bandwidth)
        assert p2.predicted_seconds <= 1.01 * best_other <= 1.06 * targets


def test_simulate_command_line(tmp_path):
    out = tmp_path / "sim.json"
    args = ["--simulate", "--ranks", "4096", "--pattern", "cyclic", "--size", "256MiB"]
    args += ["--cb-nodes", "60", "--cb-buffer-size", "1m", "--json", str(out)]
    args += ["--hints", "cb_two_level=disable"]  # (two levels may grow the window)
    proc = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "per-aggregator bytes" in proc.stdout and "4096 virtual ranks" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["aggregators"] == 60 and sum(doc["agg_bytes"]) == doc["bytes"]
    assert doc["shape"] == [5792, 5792] and doc["bytes"] == 5792 * 5792 * 8
    assert len(doc["messages_per_round"]) == len(doc["requests"]) == sum(doc["agg_rounds"])
    assert not doc["sampled"] and max(doc["requests"]) == 1 << 20
    pred = doc["prediction"]
    assert [s["strategy"] for s in pred["strategies"]] == list(STRATEGIES)
    assert set(pred["predicted_seconds"]) == set(STRATEGIES)
    assert all(v > 0 for v in pred["predicted_seconds"].values())
    assert "predicted on 64 nodes of 64 ranks" in proc.stdout


def test_simulate_direct_path_text():
    args = ["--simulate", "--ranks", "512", "--pattern", "rowblock", "--size", "4096x512"]
    proc = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (
        "path: direct" in proc.stdout
        and "backend requests          512: largest 32.00 KiB" in proc.stdout
    )


def test_sampled_windows_agree_with_exact():
    work = make_workload("cyclic", 64, size="2000", cyclic_block=8)
    h = Hints(cb_nodes=7, cb_buffer_size=20000)
    exact = simulate(work, SimConfig(hints=h, method="explicit"))
    sampled = simulate(work, SimConfig(hints=h, budget=3_000, method="sampled"))
    assert sampled.sampled and 0 < sampled.windows_evaluated < sampled.windows_total
    np.testing.assert_array_equal(sampled.agg_bytes, exact.agg_bytes)
    np.testing.assert_array_equal(sampled.agg_rounds, exact.agg_rounds)
    np.testing.assert_array_equal(exact.windows, np.arange(exact.windows_total))
    np.testing.assert_array_equal(sampled.msgs, exact.msgs[sampled.windows])
    np.testing.assert_array_equal(sampled.requests, exact.requests)  # no holes: exact


def test_plan_speed_counts():
    t = plan_speed(nruns=20_000, repeat=1)
    assert t["runs"] == 20_000 and t["pieces_at_aggregator"] == 20_000
    assert t["total"] == pytest.approx(t["flatten"] + t["plan_sender"] + t["plan_aggregator"])
    assert all(t[k] > 0 for k in ("flatten", "plan_sender", "plan_aggregator"))  # measured


#: Loads collio.sim with collio's own __init__ skipped (it imports the whole library) and
#: prints every collio and MPI module that came with it.
_LOAD_SIM = """
import os, sys, types
pkg = types.ModuleType("collio")
pkg.__path__ = [os.path.join(sys.argv[1], "collio")]
sys.modules["collio"] = pkg
import collio.sim
print(" ".join(sorted(m for m in sys.modules if m.startswith(("collio.", "mpi4py")))))
"""
#: Pure modules the simulator may bring in: the planner, the policy, hints, layouts, runs,
#: the errors and their redaction of URLs.
PURE = ("collio.aggregators", "collio.bench", "collio.errors", "collio.facts", "collio.hints",
        "collio.layouts", "collio.policy", "collio.redact", "collio.runs",
        "collio.sim")  # fmt: skip


def test_simulator_imports_no_engine_internals():
    """The simulator decides through collio.policy, not a copy of the engine: neither the
    engine, the rounds, a backend nor MPI is imported with it."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_SIM, ROOT], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.split()
    assert "collio.sim.simulator" in loaded and "collio.policy" in loaded
    assert [m for m in loaded if not m.startswith(PURE)] == []
    assert "collio.bench.cli" in loaded  # (the package's __init__: argparse only)
    assert not [m for m in loaded if m.startswith(("collio.bench.run", "collio.bench.apis"))]


@pytest.mark.parametrize(
    ("pattern", "nranks", "method"),
    [("cyclic", 8, "explicit"), ("cyclic", 8, "auto"), ("colblock", 4, "auto"),
     ("block2d", 6, "explicit")],
)  # fmt: skip
def test_a_reads_busiest_rank_of_a_round_is_the_real_plans(pattern, nranks, method):
    """The most bytes one rank has in one round (the k-th windows of every domain), from
    the real sender plans of every rank's listed runs: a block-cyclic read of 8 ranks
    sends each round's windows to the 2 ranks of one grid row."""
    # (block-cyclic: a domain of 4 block rows, a window of one)
    work = make_workload(pattern, nranks, size="256", cyclic_block=8)
    hints = Hints(cb_buffer_size=16384, cb_two_level="disable", min_rounds=1, cb_min_domain=0)
    res = simulate(work, SimConfig(hints=hints, writing=False, method=method))
    runs = [work.layout(r).runs() for r in range(nranks)]
    lo = min(int(r.file[0]) for r in runs)
    hi = max(int((r.file + r.length).max()) for r in runs)
    bounds = file_domains(lo, hi, res.naggs, 1)
    assert np.array_equal(bounds, res.bounds)
    most = 0
    for r in runs:
        sp = plan_sender(r, bounds, res.window)
        dom = np.searchsorted(bounds[1:-1], sp.pieces.file, side="right")
        rnd = (sp.pieces.file - bounds[dom]) // res.window
        most = max(most, int(np.bincount(rnd, weights=sp.pieces.length).max()))
    assert res.rank_round_bytes == most > 0
    if pattern == "cyclic":  # a whole round's windows to one grid row's 2 ranks
        per_agg = int((res.agg_bytes / res.agg_rounds).max())
        assert most == res.naggs * per_agg // 2
    # a sample of windows holds parts of rounds: not known then
    sampled = simulate(work, SimConfig(hints=hints, writing=False, method="sampled"))
    assert sampled.rank_round_bytes == 0


@pytest.mark.parametrize("writing", [True, False])
@pytest.mark.parametrize("pattern", ["cyclic", "colblock"])
def test_a_two_level_groups_busiest_round_is_the_real_plans(pattern, writing):
    """The most bytes one local group has in one round, from the real sender plans of its
    ranks' listed runs: a block-cyclic call of 8 ranks as 2 nodes has each round's
    windows in one grid row, whose ranks are on one node.  A group stages only its
    pieces for the other group's aggregators (its own a write sends straight, a read
    receives straight)."""
    work = make_workload(pattern, 8, size="256", cyclic_block=8)
    hints = Hints(
        cb_buffer_size=16384, cb_two_level="enable", cb_min_message=0, min_rounds=1, cb_min_domain=0
    )
    res = simulate(work, SimConfig(hints=hints, ppn=4, writing=writing))
    assert res.two_level and res.group_ranks.tolist() == [4, 4]
    group = np.zeros((2, 64), np.int64)
    for r in range(8):
        sp = plan_sender(work.layout(r).runs(), res.bounds, res.window)
        dom = np.searchsorted(res.bounds[1:-1], sp.pieces.file, side="right")
        rnd = (sp.pieces.file - res.bounds[dom]) // res.window
        staged = sp.pieces.length * (dom // 4 != r // 4)  # (aggs 0..7)
        group[r // 4] += np.bincount(rnd, weights=staged, minlength=64)[:64].astype(int)
    assert res.group_round_bytes == int(group.max()) > 0
    per_agg = int((res.agg_bytes / res.agg_rounds).max())
    half = 2  # (a group stages half the domains' pieces: the other group's)
    if pattern == "cyclic":  # (a whole round's windows in one group)
        assert res.group_round_bytes == res.naggs * per_agg // half
    else:  # (every group has its ranks' columns of every window)
        assert res.group_round_bytes == res.naggs * per_agg // 2 // half
