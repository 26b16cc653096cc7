"""``collio-bench --calibrate``: the cost model's terms measured here, and checked.

Run under mpiexec (4 ranks; 8 ranks with ``COLLIO_RANKS_PER_NODE=4`` for two nodes).
In one job it

1. measures the terms the model needs of this machine: a core's memory copy
   bandwidth while every rank copies (as a round's copies run); MPI's bandwidth, one
   message's cost and one run's in a message of many, between two ranks (the other
   ranks sleep, so that these are a core's figures); the time all ranks take to meet
   (each sends every other a tiny message, all polling: a round's synchronisation,
   which ranks sharing cores pay in turns on a core); a round's exchange with every
   rank polling, of large messages (the bytes' bandwidth) and of 64 KiB ones (what a
   rendezvous waits); the cores per node;
2. runs real calls of column blocks and block-cyclic, collio in one level (and in two
   when there is more than one node) next to the ceiling, and the same APIs on a tiny
   array (:data:`TINY`), whose medians are each call's fixed cost (opening, planning,
   agreeing, syncing, closing), on that array cut into :data:`ROUNDS` rounds (a
   round's own cost, :func:`step_seconds`) and on an array of few bytes in as many runs
   as the block-cyclic calls (:data:`RUNS`: planning's cost per run,
   :func:`plan_run_seconds`); the ceiling's medians less its fixed cost give the
   storage's write and read bandwidth (a read's: the page cache's copy);
3. plans each call with the simulator (the hints each call used) and prices it with
   :func:`collio.sim.cost.predict` on the cluster those figures describe, and prints
   predicted against measured (medians) with their ratio; ``--json`` has every figure.

It is its own mode, not ``--simulate --check``: the simulator runs without MPI for
virtual ranks, this runs real calls under mpiexec.  The cluster description is derived
at run time, because every figure of it is measured by the same job whose calls it
predicts.  On one machine emulated nodes share its memory, so the inter-node link is
the same copy and messages: a node's cores move its bytes and messages in parallel.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from ..hints import KNOWN, Hints
from .main import emitter, failed, machine_facts, single_copies
from .report import write_json
from .run import BenchConfig, balanced_orders, run_bench
from .terms import SINGLE_COPY_BYTES, measure_terms, median_terms

__all__ = [
    "PATTERNS",
    "ROUNDS",
    "RUNS",
    "TINY",
    "TOLERANCE",
    "calibrate",
    "cluster_for",
    "measure_terms",
    "median_terms",
    "plan_run_seconds",
    "step_seconds",
]

#: The decompositions checked: few large runs per rank, and many small ones.
PATTERNS = ("colblock", "cyclic")
#: The model is checked to within this share of the measured time.
TOLERANCE = 0.30
#: The tiny array whose calls are all fixed cost: a few KiB per rank.
TINY = "64"
#: Its calls are run in as many rounds as the checked calls' (``min_rounds``' default)
#: too, for the cost of a round without bytes (:func:`step_seconds`).
ROUNDS = 8
#: An array of few bytes, in blocks of one element: as many runs a rank as the
#: block-cyclic calls, for planning's cost per run (:func:`plan_run_seconds`).
RUNS = "512"
#: A kind of run's calls: its workload, the hints each API used, and medians by (API, op).
Calls = dict[str, tuple[Any, dict[str, Any], dict[tuple[str, str], float]]]


def cluster_for(
    terms: dict[str, float], ppn: int, storage_bandwidth: float, call_seconds: float
) -> Any:
    """The cost model's cluster for this machine: its nodes' link is its memory.

    A node moves a round's bytes at ``node_exchange_bandwidth`` (all its ranks
    exchanging at once, as in a round: each of its cores a share), whether they stay on
    it or not, and a process pays ``message_seconds`` per message; a round's ranks
    take ``round_seconds`` to meet (measured with all of them polling); storage is one
    target of ``storage_bandwidth``, which one aggregator alone can reach as well, its
    page cache copying at ``copy_bandwidth`` per core (a read's packing too); a call
    costs ``call_seconds`` besides.
    """
    from ..sim import Cluster

    cores = int(terms["cores_per_node"])
    node = terms["node_exchange_bandwidth"]
    return Cluster(
        ppn=ppn, node_bandwidth=node, message_seconds=terms["message_seconds"] / cores,
        target_bandwidth=storage_bandwidth, targets=1, aggregator_bandwidth=storage_bandwidth,
        intra_message_seconds=terms["message_seconds"], intra_bandwidth=node / cores,
        cores=cores, call_seconds=call_seconds, round_seconds=terms["round_seconds"],
        run_seconds=terms["run_seconds"], copy_bandwidth=terms["copy_bandwidth"],
        handshake_seconds=terms["handshake_seconds"], handshake_bytes=SINGLE_COPY_BYTES,
    )  # fmt: skip


def _sim_hints(used: dict[str, Any]) -> Hints:
    """The hints a real call used, as the simulator takes them (its choices made explicit)."""
    keep = {k: v for k, v in used.items() if k in KNOWN and v is not None}
    if not keep.get("cb_local_aggregators"):
        keep.pop("cb_local_aggregators", None)
    return Hints.coerce({k: str(v) for k, v in keep.items()}, warn=False)


def predict_case(work: Any, used: dict[str, Any], op: str, cl: Any) -> Any:
    """The simulator's plan of one real call, priced on cluster ``cl``."""
    from ..sim import SimConfig, predict, simulate

    cfg = SimConfig(hints=_sim_hints(used), ppn=cl.ppn, writing=op == "write", local_fs=True)
    res = simulate(work, cfg)
    return res, predict(res, cl, str(used.get("cb_two_level", "")))


#: Fewest iterations of each API and pattern when ``-i`` is not given.
MIN_ITERATIONS = 11


def calibrate(args: argparse.Namespace, workload: Any) -> int:
    """Collective over ``MPI.COMM_WORLD``: measure, run, predict; rank 0 prints and saves.

    The tiny calls run first and last, the terms are measured before each run, and the
    medians of all are used (:func:`median_terms`).
    """
    from ..aggregators.nodes import ranks_per_node_from_env

    comm = MPI.COMM_WORLD
    emit = emitter(comm)
    try:
        k = ranks_per_node_from_env()
    except ValueError as exc:
        return failed(comm, exc, 2)
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ppn = min(k or shared.size, comm.size)
    shared.Free()
    nnodes = -(-comm.size // ppn)
    apis: tuple[str, ...] = ("collio-one-level", "collio-two-level", "ceiling")
    if nnodes == 1:
        apis = ("collio-one-level", "ceiling")
    cycle = len(balanced_orders(len(apis)))
    # (at least 11 a call: the first iterations on a new file can be several times as
    # slow as the rest, and with 5 or 6 iterations they can make the median)
    iterations = args.iterations or cycle * -(-MIN_ITERATIONS // cycle)
    copies = single_copies(comm)
    t0 = time.perf_counter()
    samples: list[dict[str, float]] = []
    runs: dict[str, Any] = {}
    size = args.size
    # the terms and the fixed costs are sampled before each pattern's calls and after the
    # last, their medians used: a shared machine's load changes during the job
    for pattern in ("tiny", *PATTERNS, "tiny"):
        samples.append(measure_terms(comm, nnodes))
        for name in ("tiny", "rounds", "runs") if pattern == "tiny" else (pattern,):
            try:
                work = _workload_of(name, args, workload, comm.size, size)
            except ValueError as exc:
                return failed(comm, exc, 2)
            hints = tuple(args.hints) + (_round_hints(work) if name == "rounds" else ())
            cfg = BenchConfig(work, apis, iterations, hints=hints)
            what = {"tiny": "fixed costs: ", "rounds": f"{ROUNDS} rounds' costs: ",
                    "runs": "planning's costs: "}.get(name, "")  # fmt: skip
            emit(f"== {what}{work.describe()}: {', '.join(apis)}, {iterations} iterations")
            runner, _, _ = run_bench(comm, cfg, emit)
            rows = [dataclasses.asdict(r) for r in runner.rows]
            runs[name] = {"describe": work.describe(), "bytes": work.nbytes, "work": work,
                          "rows": runs.get(name, {}).get("rows", []) + rows,
                          "hints_used": runner.hints_used}  # fmt: skip
            runs[name]["medians"] = _medians(runs[name]["rows"], apis)
    terms = median_terms(samples)
    emit(_describe_terms(terms, comm.size, nnodes, ppn))
    facts = machine_facts(comm, ".", copies)
    if comm.rank == 0:
        fixed = runs["tiny"]["medians"]
        tiny = {name: (runs[name]["work"], runs[name]["hints_used"], runs[name]["medians"])
                for name in ("tiny", "rounds", "runs")}  # fmt: skip
        cases = []
        for pattern in PATTERNS:
            r = runs[pattern]
            cases += _cases(pattern, r["work"], r["medians"], tiny, r["hints_used"],
                            terms, ppn, apis)  # fmt: skip
        for r in runs.values():
            del r["work"], r["medians"]
        print(format_cases(cases))
        if args.json:
            from .machine import command

            write_json(args.json, {
                "command": command(), "nranks": comm.size, "nodes": nnodes, "ppn": ppn,
                "iterations": iterations, "tolerance": TOLERANCE, "terms": terms,
                "term_samples": samples,
                "fixed_seconds": {f"{a} {op}": v for (a, op), v in fixed.items()},
                "cases": cases, "runs": runs, "machine": facts,
                "seconds": time.perf_counter() - t0,
            })  # fmt: skip
    return 0


def _describe_terms(terms: dict[str, float], nranks: int, nnodes: int, ppn: int) -> str:
    return (
        f"collio-bench --calibrate: {nranks} ranks as {nnodes} node(s) of {ppn}, "
        f"{int(terms['cores_per_node'])} core(s) per node; a core copies at "
        f"{terms['copy_bandwidth'] / 1e9:.2f} GB/s with every rank copying, MPI moves "
        f"{terms['message_bandwidth'] / 1e9:.2f} GB/s between two and "
        f"{terms['node_exchange_bandwidth'] / 1e9:.2f} GB/s per node in a round, a message costs "
        f"{terms['message_seconds'] * 1e6:.2f} us, a run in a round "
        f"{terms['run_seconds'] * 1e9:.0f} ns a core, a rendezvous waits "
        f"{terms['handshake_seconds'] * 1e6:.0f} us, ranks meet in "
        f"{terms['round_seconds'] * 1e3:.2f} ms (medians of {len(PATTERNS) + 2} samples)"
    )


def _cases(
    pattern: str,
    work: Any,
    medians: dict[tuple[str, str], float],
    tiny: Calls,
    hints_used: dict[str, Any],
    terms: dict[str, float],
    ppn: int,
    apis: tuple[str, ...],
) -> list[dict[str, Any]]:
    """Predicted against measured for one pattern's calls (``apis`` less the ceiling).

    Storage: the ceiling's bandwidth beyond its fixed cost, a write's (the device
    syncing) and a read's (the page cache's copy into memory past the caches, as a
    call's reads land: the aggregators' round buffers, then the ranks' arrays, sweep
    the caches of the window the aggregator reads into).
    A round's own cost (:func:`step_seconds`) comes from the tiny array's calls in one
    round and in :data:`ROUNDS`; a call's fixed cost is its tiny call's time less what
    the model prices in that call (its one round), which the call's own rounds pay again.
    """
    out = []
    fixed = tiny["tiny"][2]
    for op in ("write", "read"):
        ceiling = medians[("ceiling", op)]
        # the ceiling's own fixed cost is no part of the storage's bandwidth
        moving = max(ceiling - fixed[("ceiling", op)], 1e-3 * ceiling)
        storage = work.nbytes / moving
        for api in apis[:-1]:
            # a round's meetings are the engine's own, in its step: measured whole
            bare = dataclasses.replace(cluster_for(terms, ppn, storage, 0.0), round_seconds=0.0)
            bare = dataclasses.replace(bare, step_seconds=step_seconds(tiny, api, op, bare))
            bare = dataclasses.replace(bare, plan_run_seconds=plan_run_seconds(tiny, api, op, bare))
            own = predict_case(tiny["tiny"][0], tiny["tiny"][1][api], op, bare)[1]
            call = max(fixed[(api, op)] - own.predicted_seconds, 0.0)
            cl = dataclasses.replace(bare, call_seconds=call)
            res, p = predict_case(work, hints_used[api], op, cl)
            measured = medians[(api, op)]
            ratio = p.predicted_seconds / measured
            out.append({
                "pattern": pattern, "api": api, "op": op, "measured_seconds": measured,
                "predicted_seconds": p.predicted_seconds, "ratio": ratio,
                "within": abs(ratio - 1.0) <= TOLERANCE, "two_level": res.two_level,
                "aggregators": res.naggs, "terms": p.as_dict(), "cluster": cl.as_dict(),
                "ceiling_seconds": ceiling, "ceiling_fixed_seconds": fixed[("ceiling", op)],
                "tiny_predicted_seconds": own.predicted_seconds,
            })  # fmt: skip
    return out


def step_seconds(tiny: Calls, api: str, op: str, cl: Any) -> float:
    """A round's own cost to ``api``'s ``op`` (seconds): what the tiny array's calls in
    :data:`ROUNDS` rounds take beyond its calls in one, less what the model prices for
    their extra rounds on ``cl``, per extra round.

    A round's bytes are nothing there; what is left is each rank's work for a round
    (its posting, its agreement, a two-level group's handoffs) and its waits for the
    ranks it needs, which ranks sharing a core pay in turns: the meetings the model
    prices by ``round_seconds`` (a tiny message from every rank to every other) as the
    engine has them, so ``cl`` should price none.
    """
    return _beyond(tiny, "rounds", api, op, cl, lambda res: res.rounds)


def plan_run_seconds(tiny: Calls, api: str, op: str, cl: Any) -> float:
    """Planning's cost per run to ``api``'s ``op`` (seconds): what the calls of
    :data:`RUNS` (as many runs as the block-cyclic calls, few bytes) take beyond the
    tiny array's, less what the model prices for them on ``cl``, per run more that the
    busiest process plans (:func:`~collio.sim.cost.planned_runs`); every rank plans at
    once, so ranks sharing a core plan in turns."""
    from ..sim.cost import planned_runs

    return _beyond(tiny, "runs", api, op, cl, planned_runs)


def _beyond(
    tiny: Calls, name: str, api: str, op: str, cl: Any, count: Callable[[Any], int]
) -> float:
    """What calls ``name`` took beyond the tiny array's and beyond what ``cl`` prices
    for them, per unit of ``count`` more (never below 0)."""
    work0, used0, med0 = tiny["tiny"]
    work1, used1, med1 = tiny[name]
    res0, p0 = predict_case(work0, used0[api], op, cl)
    res1, p1 = predict_case(work1, used1[api], op, cl)
    more = count(res1) - count(res0)
    if more <= 0:
        return 0.0
    took = med1[(api, op)] - med0[(api, op)] - float(p1.predicted_seconds - p0.predicted_seconds)
    return max(took, 0.0) / more


def _workload_of(name: str, args: argparse.Namespace, workload: Any, nranks: int,
                 size: str) -> Any:  # fmt: skip
    """The workload of a run: a checked pattern's, or a tiny array's (:data:`RUNS` is
    block-cyclic in blocks of one element)."""
    block = args.cyclic_block
    args.pattern, args.size = {"tiny": ("colblock", TINY), "rounds": ("colblock", TINY),
                               "runs": ("cyclic", RUNS)}.get(name, (name, size))  # fmt: skip
    if name == "runs":
        args.cyclic_block = 1
    try:
        return workload(args, nranks)
    finally:
        args.cyclic_block = block


def _round_hints(work: Any) -> tuple[tuple[str, str], ...]:
    """Hints that cut the tiny array's file domains (one an aggregator) into
    :data:`ROUNDS` windows, two levels too (whose windows keep a large message from each
    local aggregator otherwise), every aggregator taking a domain (the tiny array is far
    below ``cb_min_domain`` per aggregator)."""
    window = max(work.nbytes // work.nranks // ROUNDS, 1)
    return (("cb_buffer_size", str(window)), ("cb_min_message", "1"), ("cb_min_domain", "0"))


def _medians(rows: list[dict[str, Any]], apis: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """Median barrier-to-barrier time by (API, operation)."""
    return {
        (api, op): statistics.median(r["total"] for r in rows if (r["api"], r["op"]) == (api, op))
        for api in apis for op in ("write", "read")
    }  # fmt: skip


def format_cases(cases: list[dict[str, Any]]) -> str:
    """Predicted against measured, one line per pattern, API and operation."""
    lines = [
        f"{'pattern':<9} {'API':<17} {'op':<5} {'measured':>9} {'fixed':>7} {'predicted':>9} "
        f"{'ratio':>6}  within +-{TOLERANCE:.0%}"
    ]
    for c in cases:
        lines.append(
            f"{c['pattern']:<9} {c['api']:<17} {c['op']:<5} {c['measured_seconds']:>8.3f}s "
            f"{c['terms']['call']:>6.3f}s {c['predicted_seconds']:>8.3f}s {c['ratio']:>6.2f}  "
            f"{'yes' if c['within'] else 'no'}"
        )
    return "\n".join(lines)
