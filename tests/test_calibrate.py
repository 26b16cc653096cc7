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

from collio.bench.calibrate import (
    PATTERNS,
    ROUNDS,
    RUNS,
    TINY,
    TOLERANCE,
    plan_run_seconds,
    predict_case,
    step_seconds,
)
from collio.bench.patterns import make_workload
from collio.hints import Hints
from collio.sim import Cluster, SimConfig, predict, simulate
from collio.sim.cost import planned_runs
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
    """A two-level call's group waits for its ranks' copies every round; one level's
    exchange (a write's sends posted rounds ahead, a read's status agreed once, at its
    completion) does not: ``round_seconds`` once per round for each of those waits."""
    from collio.sim.cost import meetings

    work = make_workload("cyclic", 8, size="512", cyclic_block=8)
    hints = Hints(cb_buffer_size=65536, cb_two_level="enable" if two_level else "disable")
    cl = Cluster(ppn=4, cores=1)
    for writing, waits in ((True, int(two_level)), (False, int(two_level))):
        res = simulate(work, SimConfig(hints=hints, ppn=4, writing=writing))
        assert res.two_level == two_level and meetings(res) == waits
        a = predict(res, cl, "x")
        met = predict(res, dataclasses.replace(cl, round_seconds=0.01), "x")
        assert met.intra == pytest.approx(a.intra + 0.01 * res.rounds * waits)


def _per_round(res):
    """Each aggregator's mean sources and bytes per round, as the cost model takes them."""
    has = res.agg_rounds > 0
    m = np.zeros(res.naggs)
    m[has] = np.add.reduceat(res.msgs, res.rstart[:-1][has]) / np.diff(res.rstart)[has]
    return m, res.agg_bytes / res.agg_rounds.clip(1)


@pytest.mark.parametrize("two_level", [False, True], ids=["one-level", "two-level"])
def test_a_rendezvous_message_costs_its_busiest_rank_turns(two_level):
    """Messages of ``handshake_bytes`` or more (MPICH's single-copy protocol) cost the
    busiest rank ``handshake_seconds`` each per round, already in turns (measured with
    every rank polling: not scaled by the ranks sharing a core); smaller messages
    (eager) and the default cluster cost nothing."""
    from collio.sim.cost import handshakes

    assert Cluster().handshake_seconds == 0.0 == Cluster().step_seconds
    big = make_workload("colblock", 8, size="1024")  # 1 KiB rows of a rank
    small = make_workload("cyclic", 8, size="512", cyclic_block=8)
    hints = Hints(cb_buffer_size=1 << 20, cb_two_level="enable" if two_level else "disable")
    cl = Cluster(ppn=4, cores=1)
    shaking = dataclasses.replace(cl, handshake_seconds=1e-3, handshake_bytes=16384)
    for writing in (True, False):
        res = simulate(big, SimConfig(hints=hints, ppn=4, writing=writing))
        assert res.two_level == two_level and not res.direct
        m, b = _per_round(res)
        # (a two-level call's ranks exchange their own group's pieces themselves, a
        # read's as a write's: every rank sends, or receives)
        senders = res.nranks
        count = handshakes(m, b, senders, 16384)
        # every message of a round is at least 16 KiB here: the busiest aggregator's
        # sources, or a sender's share of all of them
        assert count == max(m.max(), m.sum() / senders) > 0
        a, h = predict(res, cl, "x"), predict(res, shaking, "x")
        assert h.intra == pytest.approx(a.intra + 1e-3 * count * res.rounds)
        assert (h.messages, h.injection, h.storage) == (a.messages, a.injection, a.storage)
        # a message under the threshold is eager: no rendezvous
        eager = dataclasses.replace(shaking, handshake_bytes=int(b.max()) + 1)
        assert predict(res, eager, "x").intra == pytest.approx(a.intra)
    res = simulate(small, SimConfig(hints=Hints(cb_buffer_size=16384), ppn=4))
    m, b = _per_round(res)
    assert res.rounds > 1 and float((b / m.clip(1)).max()) < 16384
    assert predict(res, shaking, "x").intra == pytest.approx(predict(res, cl, "x").intra)


def test_a_round_costs_its_own_step_in_turns_already():
    """``step_seconds`` (a round's cost beyond its terms, measured whole from calls
    whose rounds carry no bytes) once per round, not scaled by the ranks sharing a core."""
    work = make_workload("cyclic", 8, size="512", cyclic_block=8)
    for two_level in ("disable", "enable"):
        hints = Hints(cb_buffer_size=65536, cb_two_level=two_level)
        res = simulate(work, SimConfig(hints=hints, ppn=4, writing=False))
        assert res.rounds > 1
        cl = Cluster(ppn=4, cores=1)
        a, b = predict(res, cl, "x"), predict(res, dataclasses.replace(cl, step_seconds=2e-3), "x")
        assert b.intra == pytest.approx(a.intra + 2e-3 * res.rounds)
        assert b.predicted_seconds == pytest.approx(a.predicted_seconds + 2e-3 * res.rounds)


@pytest.mark.parametrize("nranks", [4, 8])
def test_a_rounds_step_is_what_the_tiny_arrays_extra_rounds_take_beyond_their_terms(nranks):
    """The tiny array's calls cut into ``ROUNDS`` rounds (both levels), and the step:
    their time beyond the one-round calls', less what the model prices for the extra
    rounds, per extra round; never below 0."""
    from collio.bench.calibrate import _round_hints

    small = make_workload("colblock", nranks, size=TINY)
    cl = Cluster(ppn=4, cores=2 if nranks == 4 else 1, round_seconds=0.0)
    used = {}
    for name, extra in (("tiny", ()), ("rounds", _round_hints(small))):
        given = {"mapped_reads": "disable", **dict(extra)}
        used[name] = {api: {**given, "cb_two_level": lvl}
                      for api, lvl in (("one", "disable"), ("two", "enable"))}  # fmt: skip
    for api in ("one", "two"):
        for op in ("write", "read"):
            one, p1 = predict_case(small, used["tiny"][api], op, cl)
            many, pr = predict_case(small, used["rounds"][api], op, cl)
            assert (one.rounds, many.rounds) == (1, ROUNDS)
            assert many.two_level == one.two_level == (api == "two" and nranks == 8)
            priced = pr.predicted_seconds - p1.predicted_seconds
            for took in (0.5, 0.0):  # seconds the extra rounds took beyond one round's call
                med1 = {(api, op): 0.01}
                med_r = {(api, op): 0.01 + took}
                tiny = {
                    "tiny": (small, used["tiny"], med1),
                    "rounds": (small, used["rounds"], med_r),
                }
                want = max(took - priced, 0.0) / (ROUNDS - 1)
                assert step_seconds(tiny, api, op, cl) == pytest.approx(want)
            assert step_seconds(tiny, api, op, cl) == 0.0


@pytest.mark.parametrize("nranks", [4, 8])
def test_planning_costs_each_run_of_the_process_that_plans_the_most(nranks):
    """``plan_run_seconds`` once per run that the busiest planner plans: a rank its own
    runs, a two-level group's local aggregator its group's; and the figure is what the
    calls of ``RUNS`` (as many runs a rank as the block-cyclic calls) took beyond the
    tiny array's and beyond their priced terms, per run more."""
    big = make_workload("cyclic", nranks, size="4096", cyclic_block=64)
    many = make_workload("cyclic", nranks, size=RUNS, cyclic_block=1)
    small = make_workload("colblock", nranks, size=TINY)
    cl = Cluster(ppn=4, cores=2 if nranks == 4 else 1)
    used = {"one": {"cb_two_level": "disable", "mapped_reads": "disable"},
            "two": {"cb_two_level": "enable", "mapped_reads": "disable"}}  # fmt: skip
    for api, hints in used.items():
        res, p = predict_case(big, hints, "write", cl)
        two = api == "two" and nranks == 8
        assert res.two_level == two
        runs = int(res.group_runs.max()) if two else res.rank_runs_max
        assert planned_runs(res) == runs == (4 if two else 1) * 4096**2 // 64 // nranks
        planned = predict(res, dataclasses.replace(cl, plan_run_seconds=1e-7), "x")
        assert planned.plan == pytest.approx(1e-7 * runs)
        assert planned.predicted_seconds == pytest.approx(p.predicted_seconds + 1e-7 * runs)
        assert planned.intra == p.intra and p.plan == 0.0
        # the planning call: as many runs as the block-cyclic call's, few bytes
        assert planned_runs(predict_case(many, hints, "write", cl)[0]) == runs
        for op in ("write", "read"):
            r0, p0 = predict_case(small, hints, op, cl)
            r1, p1 = predict_case(many, hints, op, cl)
            priced = p1.predicted_seconds - p0.predicted_seconds
            calls = {"tiny": (small, {api: hints}, {(api, op): 0.01}),
                     "runs": (many, {api: hints}, {(api, op): 0.01 + priced + 0.02})}  # fmt: skip
            more = planned_runs(r1) - planned_runs(r0)
            assert plan_run_seconds(calls, api, op, cl) == pytest.approx(0.02 / more)
            calls["runs"] = (many, {api: hints}, {(api, op): 0.01})
            assert plan_run_seconds(calls, api, op, cl) == 0.0


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
    # (a write's group stages its runs for the other group's aggregators: half of them)
    assert res.staged_runs.tolist() == (res.group_runs // 2).tolist()
    stage = float((res.staged_runs / res.group_ranks).max()) / res.rounds
    assert b.intra == pytest.approx(a.intra + 1e-6 * (per_round + stage) * res.rounds)
    # and its bytes at one process's copy bandwidth where it is given
    copy = predict(res, dataclasses.replace(own, copy_bandwidth=1e9), "x")
    per_rank = float((res.group_bytes / res.group_ranks).max()) / res.rounds
    slower = per_rank / 1e9 - per_rank / own.intra_bandwidth
    assert copy.intra == pytest.approx(a.intra + slower * res.rounds)


def test_page_cache_copies_and_a_reads_packing_take_the_ranks_cores():
    """With every core busy (as many polling ranks as cores), the page cache's copy of a
    round's bytes adds to the exchange instead of hiding behind it (a read's storage is
    that copy alone: none of it hides), and a read's
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
            # a read from the page cache is its copy alone: all of it takes the cores
            cpu = min(store, node / (2e9 * busy.cores)) if writing else store
            want = x + (res.rounds - 1) * max(x + cpu, store) + store + b.call
            if not writing:  # (no round's read hides behind another's exchange)
                assert b.overlapped == pytest.approx(0.0, abs=1e-12)
                assert b.predicted_seconds == pytest.approx(res.rounds * (x + store) + b.call)
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
    assert terms["handshake_seconds"] >= 0 and "read_bandwidth" not in terms
    # sampled before each run (the tiny calls first and last): each term their median
    samples = doc["term_samples"]
    assert len(samples) == len(PATTERNS) + 2
    assert terms == {k: statistics.median(t[k] for t in samples) for k in terms}
    cores = len(os.sched_getaffinity(0))
    assert terms["cores_per_node"] == max(1, cores // nodes)
    assert set(doc["runs"]) == {"tiny", "rounds", "runs", *PATTERNS}
    assert doc["runs"]["tiny"]["bytes"] == doc["runs"]["rounds"]["bytes"] == int(TINY) ** 2 * 8
    assert doc["runs"]["runs"]["bytes"] == int(RUNS) ** 2 * 8
    small = make_workload("colblock", nranks, size=TINY)
    many = make_workload("cyclic", nranks, size=RUNS, cyclic_block=1)
    calls = {}
    for name in ("tiny", "rounds", "runs"):
        run = doc["runs"][name]
        if name == "rounds":  # each aggregator's domain (one a rank) cut in ROUNDS windows
            for api in apis:
                want = int(TINY) ** 2 * 8 // nranks // ROUNDS
                assert int(run["hints_used"][api]["cb_buffer_size"]) == want
        by = {(r["api"], r["op"]): [] for r in run["rows"]}
        for r in run["rows"]:
            by[(r["api"], r["op"])].append(r["total"])
        work = many if name == "runs" else small
        calls[name] = (work, run["hints_used"], {k: statistics.median(v) for k, v in by.items()})
    for c in doc["cases"]:
        cl = c["cluster"]
        assert cl["ppn"] == 4 and cl["cores"] == terms["cores_per_node"] and cl["targets"] == 1
        # a node's round moves its bytes on all its cores at once
        assert cl["node_bandwidth"] == terms["node_exchange_bandwidth"]
        assert cl["intra_bandwidth"] == terms["node_exchange_bandwidth"] / cl["cores"]
        assert cl["intra_message_seconds"] == terms["message_seconds"]
        assert cl["run_seconds"] == terms["run_seconds"]
        assert cl["handshake_seconds"] == terms["handshake_seconds"]
        # a round's meetings are in its step, measured whole from the tiny calls
        assert cl["round_seconds"] == 0.0
        plain = dataclasses.replace(
            Cluster(**cl), step_seconds=0.0, call_seconds=0.0, plan_run_seconds=0.0
        )
        assert cl["step_seconds"] == step_seconds(calls, c["api"], c["op"], plain) >= 0
        stepped = dataclasses.replace(plain, step_seconds=cl["step_seconds"])
        assert cl["plan_run_seconds"] == plan_run_seconds(calls, c["api"], c["op"], stepped) >= 0
        assert c["terms"]["plan"] == pytest.approx(
            cl["plan_run_seconds"] * planned_runs(
                predict_case(make_workload(c["pattern"], nranks, size="256", cyclic_block=64),
                             doc["runs"][c["pattern"]]["hints_used"][c["api"]], c["op"],
                             Cluster(**cl))[0]))  # fmt: skip
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
        # storage: the ceiling's (its write or read) beyond its fixed cost
        moving = c["ceiling_seconds"] - c["ceiling_fixed_seconds"]
        want = run["bytes"] / max(moving, 1e-3 * c["ceiling_seconds"])
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
    hints = Hints(cb_buffer_size=16384, cb_two_level="disable", min_rounds=1, cb_min_domain=0)
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


def test_a_two_level_stage_copies_its_busiest_round():
    """A two-level group's ranks copy its round into (out of) the staging, and a read's
    holders receive it: the busiest group's round sets those on-node terms where rounds
    are not alike (block-cyclic at 8 ranks as 2 nodes: each round in one group), not the
    group's bytes spread over every round."""
    work = make_workload("cyclic", 8, size="256", cyclic_block=8)
    hints = Hints(
        cb_buffer_size=16384, cb_two_level="enable", cb_min_message=0, min_rounds=1, cb_min_domain=0
    )
    cl = Cluster(ppn=4, intra_bandwidth=1e9, copy_bandwidth=2e9)
    for writing in (True, False):
        res = simulate(work, SimConfig(hints=hints, ppn=4, writing=writing))
        mean = float(res.group_bytes.max()) / 4 / res.rounds
        busiest = res.group_round_bytes / 4
        assert busiest == 2 * mean > 0
        unknown = dataclasses.replace(res, group_round_bytes=0)
        extra = predict(res, cl, "x").intra - predict(unknown, cl, "x").intra
        b = float((res.agg_bytes / res.agg_rounds).max())
        recv = 0.0 if writing else (max(busiest, b) - b) / res.nnodes / 1e9
        assert extra == pytest.approx(((busiest - mean) / 2e9 + recv) * res.rounds)
