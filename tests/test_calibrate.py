"""``collio-bench --calibrate``: the cost model's terms measured here and checked on real
calls.  What is tested is that the mode runs and that its figures agree with each other
(every prediction is the simulator's plan of the call priced on the cluster it saved, every
measured time the median of the saved rows), not how close the model comes: that is the
benchmark's result, in docs/benchmarks.md."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys

import numpy as np
import pytest

from collio.bench.calibrate import PATTERNS, TINY, TOLERANCE, predict_case
from collio.bench.patterns import make_workload
from collio.hints import Hints
from collio.sim import Cluster, SimConfig, predict, simulate
from collio.testing.jobs import MPIEXEC, mpiexec

BENCH = [sys.executable, "-m", "collio.bench"]


def test_ranks_sharing_cores_scale_the_on_node_terms_alone():
    """A node of 8 ranks on 2 cores does its processes' copies and messages in turns:
    the on-node term 4 times a core per rank's, the network's and storage's unchanged."""
    work = make_workload("cyclic", 8, size="512", cyclic_block=8)
    res = simulate(work, SimConfig(hints=Hints(cb_buffer_size=65536), ppn=4))
    own, shared = Cluster(ppn=4), Cluster(ppn=4, cores=1)
    assert own.oversubscribed == 1.0 and shared.oversubscribed == 4.0
    assert Cluster(ppn=4, cores=8).oversubscribed == 1.0
    a, b = predict(res, own, "x"), predict(res, shared, "x")
    assert a.intra > 0 and b.intra == pytest.approx(4 * a.intra)
    assert (b.messages, b.injection, b.storage) == (a.messages, a.injection, a.storage)
    assert Cluster.parse("cores=2,ppn=4").oversubscribed == 2.0
    # every run of an aggregator's datatype costs it (a rank's part of a window is one
    # run of its buffer): the busiest aggregator sets the time
    runs = predict(res, dataclasses.replace(own, run_seconds=1e-6), "x")
    per_round = (res.agg_pieces / res.agg_rounds.clip(1)).max()
    assert per_round > 1
    assert runs.intra == pytest.approx(a.intra + 1e-6 * per_round * res.rounds)


@pytest.mark.parametrize("two_level", [False, True], ids=["one-level", "two-level"])
def test_ranks_meet_every_round_where_the_call_waits_for_them(two_level):
    """A read agrees on its status every round and a two-level call's group waits for
    its ranks' copies every round; a write's exchange (sends posted rounds ahead) does
    not: ``round_seconds`` once per round for each of those waits."""
    from collio.sim.cost import meetings

    work = make_workload("cyclic", 8, size="512", cyclic_block=8)
    hints = Hints(cb_buffer_size=65536, cb_two_level="enable" if two_level else "disable")
    cl = Cluster(ppn=4, cores=1)
    for writing, waits in ((True, int(two_level)), (False, 1 + int(two_level))):
        res = simulate(work, SimConfig(hints=hints, ppn=4, writing=writing))
        assert res.two_level == two_level and meetings(res) == waits
        a = predict(res, cl, "x")
        met = predict(res, dataclasses.replace(cl, round_seconds=0.01), "x")
        assert met.intra == pytest.approx(a.intra + 0.01 * res.rounds * waits)


def test_the_local_stage_pays_for_every_run_its_ranks_copy():
    """Two levels: each rank copies its pieces into (or out of) its group's shared
    staging, ``run_seconds`` a piece, the group's ranks at once: the busiest group's runs
    per rank."""
    work = make_workload("cyclic", 8, size="512", cyclic_block=8)
    hints = Hints(cb_buffer_size=65536, cb_two_level="enable")
    res = simulate(work, SimConfig(hints=hints, ppn=4))
    assert res.two_level and len(res.group_runs) == len(res.group_ranks)
    # every run of a group's ranks, before merging: 8 x 8 blocks of 8 rows of 64 bytes
    assert int(res.group_runs.sum()) == 512 * 512 // 8
    own = Cluster(ppn=4)
    a = predict(res, own, "x")
    b = predict(res, dataclasses.replace(own, run_seconds=1e-6), "x")
    per_round = (res.agg_pieces / res.agg_rounds.clip(1)).max()
    stage = float((res.group_runs / res.group_ranks).max()) / res.rounds
    assert b.intra == pytest.approx(a.intra + 1e-6 * (per_round + stage) * res.rounds)
    # and its bytes at one process's copy bandwidth where it is given
    copy = predict(res, dataclasses.replace(own, copy_bandwidth=1e9), "x")
    per_rank = float((res.group_bytes / res.group_ranks).max()) / res.rounds
    slower = per_rank / 1e9 - per_rank / own.intra_bandwidth
    assert copy.intra == pytest.approx(a.intra + slower * res.rounds)


def test_page_cache_copies_and_a_reads_packing_take_the_ranks_cores():
    """With every core busy (as many polling ranks as cores), the page cache's copy of a
    round's bytes adds to the exchange instead of hiding behind it, and a read's
    aggregator sends messages of several runs packed (by collio or by MPI: one more
    copy); with a core per rank, or no copy bandwidth given (a cluster's network
    storage), neither counts."""
    small = make_workload("cyclic", 8, size="512", cyclic_block=8)  # runs of 64 bytes
    big = make_workload("colblock", 4, size="4096")  # rows of 8 KiB
    rows = make_workload("rowblock", 4, size="4096")  # one run a message
    hints = Hints(cb_buffer_size=65536, cb_two_level="disable", romio_cb_write="enable",
                  romio_cb_read="enable")  # fmt: skip
    busy = Cluster(ppn=4, cores=2, target_bandwidth=1e9, aggregator_bandwidth=1e9, targets=1)
    copying = dataclasses.replace(busy, copy_bandwidth=2e9)
    assert busy.busy_cores and not Cluster(ppn=4).busy_cores
    assert not Cluster(ppn=4, cores=8).busy_cores
    for work, packs in ((small, True), (big, True), (rows, False)):
        for writing in (True, False):
            res = simulate(work, SimConfig(hints=hints, ppn=4, writing=writing))
            assert not res.direct and res.rounds > 1
            a, b = predict(res, busy, "x"), predict(res, copying, "x")
            b_max = float((res.agg_bytes / res.agg_rounds.clip(1)).max())
            pack = b_max / 2e9 * busy.oversubscribed if packs and not writing else 0.0
            assert b.intra == pytest.approx(a.intra + res.rounds * pack)
            # every run an aggregator takes or sends costs it, packed or through a datatype
            runs = predict(res, dataclasses.replace(busy, run_seconds=1e-6), "x")
            per_round = float((res.agg_pieces / res.agg_rounds.clip(1)).max())
            extra = 1e-6 * per_round * busy.oversubscribed * res.rounds
            assert runs.intra == pytest.approx(a.intra + extra)
            x = (b.messages + b.injection + b.intra) / res.rounds
            store = b.storage / res.rounds
            per_round = res.agg_bytes / res.agg_rounds.clip(1)
            node = float(np.bincount(res.agg_nodes, weights=per_round).max())
            cpu = min(store, node / (2e9 * busy.cores))
            want = x + (res.rounds - 1) * max(x + cpu, store) + store + b.call
            assert b.predicted_seconds == pytest.approx(want)
            # no copy bandwidth: storage hides behind the exchange as before
            x0 = (a.messages + a.injection + a.intra) / res.rounds
            assert a.predicted_seconds == pytest.approx(
                x0 + (res.rounds - 1) * max(x0, store) + store + a.call
            )


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
@pytest.mark.parametrize("nranks", [4, 8], ids=["4ranks", "8ranks-2nodes"])
def test_calibrate_runs_and_its_figures_agree(tmp_path, nranks):
    out = tmp_path / "cal.json"
    env = {"COLLIO_RANKS_PER_NODE": "4"} if nranks == 8 else {}
    args = ["-n", str(nranks), *BENCH, "--calibrate", "--size", "256", "-i", "2"]
    proc = mpiexec([*args, "--json", str(out)], timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    nodes = 2 if nranks == 8 else 1
    assert doc["nranks"] == nranks and doc["nodes"] == nodes and doc["ppn"] == 4
    assert doc["tolerance"] == TOLERANCE and doc["iterations"] == 2
    apis = ["collio-one-level", "collio-two-level"][:nodes]
    want = [(p, a, op) for p in PATTERNS for op in ("write", "read") for a in apis]
    assert [(c["pattern"], c["api"], c["op"]) for c in doc["cases"]] == want
    terms = doc["terms"]
    assert terms["copy_bandwidth"] > 0 and terms["message_bandwidth"] > 0
    assert terms["message_seconds"] > 0 and terms["node_exchange_bandwidth"] > 0
    assert terms["round_seconds"] > 0 and terms["run_seconds"] >= 0
    assert terms["read_bandwidth"] > 0
    # sampled before each run (the tiny calls first and last): each term their median
    samples = doc["term_samples"]
    assert len(samples) == len(PATTERNS) + 2
    assert terms == {k: statistics.median(t[k] for t in samples) for k in terms}
    cores = len(os.sched_getaffinity(0))
    assert terms["cores_per_node"] == max(1, cores // nodes)
    assert set(doc["runs"]) == {"tiny", *PATTERNS}
    assert doc["runs"]["tiny"]["bytes"] == int(TINY) ** 2 * 8
    for c in doc["cases"]:
        cl = c["cluster"]
        assert cl["ppn"] == 4 and cl["cores"] == terms["cores_per_node"] and cl["targets"] == 1
        # a node's round moves its bytes on all its cores at once
        assert cl["node_bandwidth"] == terms["node_exchange_bandwidth"]
        assert cl["intra_bandwidth"] == terms["node_exchange_bandwidth"] / cl["cores"]
        assert cl["intra_message_seconds"] == terms["message_seconds"]
        assert cl["round_seconds"] == terms["round_seconds"]
        assert cl["run_seconds"] == terms["run_seconds"]
        # the fixed costs are the medians of the tiny calls; a call's own, less what
        # the model prices in its tiny call (that round the call's rounds pay again)
        tiny = doc["runs"]["tiny"]["rows"]
        for api in (c["api"], "ceiling"):
            mine = [r["total"] for r in tiny if (r["api"], r["op"]) == (api, c["op"])]
            assert len(mine) == 2 * 2  # two iterations, first and last
            assert doc["fixed_seconds"][f"{api} {c['op']}"] == statistics.median(mine)
        fixed = doc["fixed_seconds"][f"{c['api']} {c['op']}"]
        bare = dataclasses.replace(Cluster(**cl), call_seconds=0.0)
        small = make_workload("colblock", nranks, size=TINY)
        tiny_used = doc["runs"]["tiny"]["hints_used"][c["api"]]
        own = predict_case(small, tiny_used, c["op"], bare)[1].predicted_seconds
        assert c["tiny_predicted_seconds"] == own > 0
        assert cl["call_seconds"] == max(fixed - own, 0.0) == c["terms"]["call"]
        run = doc["runs"][c["pattern"]]
        rows = [r["total"] for r in run["rows"] if (r["api"], r["op"]) == (c["api"], c["op"])]
        assert len(rows) == 2 and c["measured_seconds"] == statistics.median(rows)
        ceiling = [r["total"] for r in run["rows"] if (r["api"], r["op"]) == ("ceiling", c["op"])]
        assert c["ceiling_seconds"] == statistics.median(ceiling)
        cl = Cluster(**c["cluster"])
        # storage: a write's the ceiling's beyond its fixed cost, a read's the page
        # cache's for a round's requests
        moving = c["ceiling_seconds"] - c["ceiling_fixed_seconds"]
        written = run["bytes"] / max(moving, 1e-3 * c["ceiling_seconds"])
        want = written if c["op"] == "write" else terms["read_bandwidth"]
        assert cl.target_bandwidth == cl.aggregator_bandwidth == want
        work = make_workload(c["pattern"], nranks, size="256", cyclic_block=64)
        assert work.nbytes == run["bytes"]
        used = run["hints_used"][c["api"]]
        assert used["cb_two_level"] == ("enable" if c["api"].endswith("two-level") else "disable")
        res, p = predict_case(work, used, c["op"], cl)
        assert res.two_level == c["two_level"] == (c["api"] == "collio-two-level")
        assert dataclasses.asdict(p) == c["terms"]
        assert c["predicted_seconds"] == p.predicted_seconds > 0
        assert c["ratio"] == c["predicted_seconds"] / c["measured_seconds"]
        assert c["within"] == (abs(c["ratio"] - 1) <= TOLERANCE)
        line = f"{c['pattern']:<9} {c['api']:<17} {c['op']:<5}"
        assert any(ln.startswith(line) and ln.endswith("yes" if c["within"] else "no")
                   for ln in proc.stdout.splitlines()), line  # fmt: skip


def test_a_reads_receiver_copies_its_round_from_every_aggregator():
    """A read's bytes are copied by the rank that receives them: when a layout sends a
    round's windows to a few ranks, the busiest of them sets the on-node copy, not an
    aggregator's share; a write's aggregator receives (and copies) its window."""
    work = make_workload("cyclic", 8, size="256", cyclic_block=8)
    hints = Hints(cb_buffer_size=16384, cb_two_level="disable", min_rounds=1)
    cl = Cluster(ppn=8, intra_bandwidth=1e9)
    read = simulate(work, SimConfig(hints=hints, writing=False))
    b = float((read.agg_bytes / read.agg_rounds).max())
    assert read.rank_round_bytes > b
    for writing in (True, False):
        res = dataclasses.replace(read, writing=writing)
        unknown = dataclasses.replace(res, rank_round_bytes=0)
        extra = predict(res, cl, "x").intra - predict(unknown, cl, "x").intra
        want = 0.0 if writing else (res.rank_round_bytes - b) / 1e9 * res.rounds
        assert extra == pytest.approx(want)
