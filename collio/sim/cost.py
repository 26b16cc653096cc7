"""A cost model: the time of a collective write predicted from its simulated plan.

Rounds are taken alike (each aggregator's bytes and messages spread evenly over the
call's rounds); a round costs

* ``messages``: every inter-node message costs ``message_seconds`` at the NIC of the
  node that sends it and at the one that receives it; the busiest node sets the time;
* ``injection``: the busiest node's inter-node bytes in or out over ``node_bandwidth``;
* ``intra-node``: every message costs its receiving (and sending) process
  ``intra_message_seconds``, and bytes that stay on a node are copied by their
  receiver at ``intra_bandwidth`` (a write's aggregator; a read's busiest rank, which
  may take a round's bytes from every aggregator), and every run (a piece of contiguous bytes) an
  aggregator takes or sends ``run_seconds`` (a datatype's block, or a run its read
  packs; a rank's part of a window is one run of its buffer); two-level calls add
  the local stage (each rank copies its pieces of the round into, or out of, its
  group's shared staging (only its pieces for other groups' aggregators: the others
  it sends, or receives, itself) at ``copy_bandwidth``, or
  ``intra_bandwidth`` where that is not counted, and ``run_seconds`` a piece; the
  ranks of a group copy at once, their share of the busiest group's round where the
  simulator knows it: rounds are not alike when a layout puts a round in a few groups,
  whose ranks then also receive all of a read's round);
* ``storage``: the slowest aggregator at ``aggregator_bandwidth``, or all of them at
  ``targets`` x ``target_bandwidth``, whichever is slower.

A call also costs ``call_seconds`` whatever its size (opening, planning, agreeing,
syncing and closing; 0 on the default cluster, where a call's data dominates).

Every round also costs ``round_seconds`` per time its ranks wait for each other
(:func:`meetings`: a two-level call's staging; one level's exchange agrees on nothing
per round), the time for ranks to meet: on a cluster the
message terms hold it (0), but ranks that outnumber their cores and poll for messages
wait for each other's turns on a core.

A message of at least ``handshake_bytes`` is a rendezvous (MPICH's single-copy
protocol above its threshold): its receiver and its sender each wait for the other to
answer before the bytes move, so where ranks outnumber cores and poll, each such
message costs the busiest rank ``handshake_seconds`` of turns on its core besides its
processing (0 on a cluster, where ``message_seconds`` holds a message's latency and no
rank waits for a core).

Every round also costs ``step_seconds`` beyond what the terms above price (0 on the
default cluster: a round's bytes and messages dominate there): each rank's own work for
a round (posting its messages, its part of the agreement, a two-level group's
handoffs) and its waits for the ranks it needs, which ranks sharing a core pay in
turns; measured whole, from calls whose rounds carry no bytes.

A call also plans its runs: ``plan_run_seconds`` for each run of the process that plans
the most (:func:`planned_runs`; numpy's passes over them, a few per run, and a two-level
group's merge), measured with every rank planning at once as in a call, so in turns
where ranks share cores (0 on the default cluster: the simulator times its own
planning, ``plan_seconds``, for the plan's scale).

A node with fewer ``cores`` than ranks runs its processes in turns: the intra-node
terms, which a process's CPU does, take ``ppn / cores`` times as long (the NIC's and
the storage's do not).

collio overlaps a round's storage with the next round's exchange (two round buffers);
ROMIO's strategy does one after the other.  A local file system's page cache copies the
round's bytes on the node's cores (at ``copy_bandwidth`` per core; 0 on the default
cluster, whose storage is across the network): when the node's ranks keep every core
busy (as many ranks as cores or more, polling while they wait) that copy cannot hide
behind the exchange, only the device's part of the storage can; a read from the page
cache is that copy alone, so none of it hides.  A read's aggregator
sends a message of several runs packed, by collio (small runs) or by MPI (a sender's
datatype is packed before it moves): one more copy of its round's bytes at
``copy_bandwidth``, an on-node term.  Sources of an aggregator are taken spread
evenly over the nodes.  The defaults describe a typical cluster (see :class:`Cluster`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from ..aggregators.select import AGGREGATOR_BANDWIDTH, STORAGE_TARGETS, TARGET_BANDWIDTH
from ..bench.patterns import Workload, human
from .simulator import SimConfig, SimResult, simulate

__all__ = [
    "STRATEGIES",
    "Cluster",
    "Prediction",
    "format_predictions",
    "handshakes",
    "meetings",
    "planned_runs",
    "predict",
    "predictions_json",
    "strategies",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Cluster:
    """What the cost model knows of a machine.

    Defaults: 64 ranks per node; 25 GB/s per node (one 200 Gb/s InfiniBand HDR or
    Slingshot port); 2 us per inter-node message (an MPI message's latency and software
    cost on such networks); the storage collio's default aggregator count is made for
    (:data:`~collio.aggregators.select.STORAGE_TARGETS` and its neighbours: 64 Lustre
    OSTs of 4 GB/s, 2 GB/s per client process); on a node 5 us per message and 4 GB/s
    per process copying while every core copies (MPICH's shared-memory transport; not
    calibrated: see docs/design.md).  ``cores`` per node (0: one per rank, as on a
    cluster) scales the CPU-bound intra-node terms when ranks outnumber cores;
    ``copy_bandwidth`` (0: not counted) is a core's memory copy while every core copies
    (the page cache's, a read's packing, a two-level group's staging: a round's copies
    run on every core at once and share the memory).  Where ranks share cores (0 on a
    cluster): ``handshake_seconds`` is what a rendezvous message of ``handshake_bytes``
    or more (MPICH's single-copy threshold) costs a rank in waits for its peer's turn,
    ``step_seconds`` a round's cost beyond its terms, ``plan_run_seconds`` planning's
    cost per run.
    ``collio-bench --calibrate`` measures every figure of this machine.
    """

    ppn: int = 64
    node_bandwidth: float = 25e9
    message_seconds: float = 2e-6
    target_bandwidth: float = TARGET_BANDWIDTH
    targets: int = STORAGE_TARGETS
    aggregator_bandwidth: float = AGGREGATOR_BANDWIDTH
    intra_message_seconds: float = 5e-6
    intra_bandwidth: float = 4e9
    cores: int = 0
    call_seconds: float = 0.0
    round_seconds: float = 0.0
    run_seconds: float = 0.0
    copy_bandwidth: float = 0.0
    handshake_seconds: float = 0.0
    handshake_bytes: int = 16384
    step_seconds: float = 0.0
    plan_run_seconds: float = 0.0

    @property
    def busy_cores(self) -> bool:
        """Whether a node's ranks keep all its cores busy (as many ranks as cores or more,
        polling while they wait): work besides theirs, as the page cache's copies, then
        takes their turns."""
        return 0 < self.cores <= self.ppn

    @property
    def oversubscribed(self) -> float:
        """How many of a node's ranks share one core (at least 1)."""
        return max(1.0, self.ppn / self.cores) if self.cores > 0 else 1.0

    @classmethod
    def parse(cls, text: str | None) -> Cluster:
        """From ``k=v,k=v`` (names as the fields) or a JSON file of those names."""
        if not text:
            return cls()
        if "=" not in text:
            with open(text) as fh:
                values: dict[str, Any] = json.load(fh)
            values = values.get("cluster", values)
        else:
            values = dict(part.split("=", 1) for part in text.split(",") if part)
        names = {f.name: f.type for f in dataclasses.fields(cls)}
        bad = sorted(set(values) - set(names))
        if bad:
            raise ValueError(f"unknown cluster figures {', '.join(bad)}; known: {', '.join(names)}")
        conv: dict[str, Any] = {
            k: (int if names[k] == "int" else float)(v) for k, v in values.items()
        }
        return dataclasses.replace(cls(), **conv)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class Prediction:
    """Seconds of one call and where they go (each term summed over the rounds)."""

    strategy: str
    rounds: int
    messages: float
    injection: float
    intra: float
    storage: float
    overlapped: float  # storage hidden behind the next round's exchange
    call: float  # the call's fixed cost (``Cluster.call_seconds``)
    predicted_seconds: float
    max_sources: int  # most messages an aggregator takes in one round
    min_message: int  # smallest mean message from a source to an aggregator (bytes)
    plan: float = 0.0  # planning the runs (``Cluster.plan_run_seconds``)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _node_sum(values: np.ndarray[Any, Any], nodes: np.ndarray[Any, Any], nnodes: int) -> float:
    return float(np.bincount(nodes, weights=values, minlength=nnodes).max(initial=0.0))


def predict(res: SimResult, cl: Cluster, strategy: str, *, overlap: bool = True) -> Prediction:
    """The predicted time of the simulated call ``res`` on cluster ``cl``."""
    rounds = res.rounds
    if res.direct or not rounds:
        return _direct(res, cl, strategy)
    has = res.agg_rounds > 0
    nr = np.maximum(res.agg_rounds, 1)
    per_agg = np.add.reduceat(res.msgs, res.rstart[:-1][has]) if len(res.msgs) else res.msgs
    seen = np.diff(res.rstart)[has]
    m = np.zeros(res.naggs)
    m[has] = per_agg / np.maximum(seen, 1)  # mean sources per round
    b = res.agg_bytes / nr  # bytes per round
    n = max(res.nnodes, 1)
    away = 1.0 - 1.0 / n  # share of an aggregator's sources on other nodes
    nodes = res.agg_nodes
    sent_msgs = float((m * away).sum()) / n  # each node sends an even share
    sent_bytes = float((b * away).sum()) / n
    nic = cl.message_seconds * (_node_sum(m * away, nodes, n) + sent_msgs)
    inj = max(_node_sum(b * away, nodes, n), sent_bytes) / cl.node_bandwidth
    # (a two-level call's ranks exchange their pieces for their own group's aggregators
    # themselves, a read's as a write's: every rank is a source or destination)
    senders = np.ones(max(res.nranks, 1))
    per_sender = float(m.sum()) / len(senders)  # messages each source sends per round
    proc = max(float(m.max(initial=0)), per_sender) * cl.intra_message_seconds
    # its receiver copies a message: a write's aggregator, a read's rank (the busiest
    # rank's bytes of a round, where the simulator knows them: a layout may send a
    # round's windows to a few ranks)
    recv = float(b.max(initial=0))
    if not res.writing and res.rank_round_bytes:
        recv = max(recv, float(res.rank_round_bytes))
    # a two-level group's round is shared by its ranks: a read's holders receive it, and
    # every rank copies its part of it (rounds are not alike: a layout may give a round's
    # windows to a few groups, block-cyclic at 8 ranks to one)
    group_round = float(res.group_round_bytes) / max(int(res.group_ranks.max(initial=1)), 1)
    if res.two_level and not res.writing:
        recv = max(recv, group_round)
    proc += recv / n / cl.intra_bandwidth
    if cl.run_seconds:
        # the most runs an aggregator takes or sends in a round, through its datatype or
        # its packing (numpy's strided copy, a loop step a run as well); a rank's part of
        # a window is one run of its buffer, which holds its pieces in file order
        proc += float((res.agg_pieces / nr).max(initial=0)) * cl.run_seconds
    if res.two_level:  # the local stage: every rank copies its own pieces of the round
        # into (out of) its group's shared staging, all ranks at once
        ranks = np.maximum(res.group_ranks, 1) * rounds
        share = np.maximum(res.group_bytes / ranks, group_round)  # (the busiest round's)
        stage = share / (cl.copy_bandwidth or cl.intra_bandwidth)
        if cl.run_seconds:  # each piece a run of its copy
            staged = res.staged_runs if len(res.staged_runs) else res.group_runs
            stage = stage + staged / ranks * cl.run_seconds
        proc += float(stage.max(initial=0))
    if cl.copy_bandwidth and not res.writing:
        # a read's aggregator sends messages of several runs packed, by collio
        # (small runs) or by MPI (a sender's datatype is packed before it moves): one
        # more copy of those bytes
        several = res.agg_pieces / nr >= 2 * m  # (a window's edge splits a run in two)
        proc += float(b[several].max(initial=0)) / cl.copy_bandwidth
    proc *= cl.oversubscribed
    store = max(float(b.max(initial=0)) / cl.aggregator_bandwidth,
                float(b.sum()) / (cl.targets * cl.target_bandwidth))  # fmt: skip
    # a local file system's page cache copies the round's bytes on the node's cores: with
    # no core to spare that copy cannot hide behind the exchange (the device's part can)
    cpu = 0.0
    if cl.copy_bandwidth and cl.busy_cores:
        copy = _node_sum(b, nodes, n) / (cl.copy_bandwidth * cl.cores)
        # (a read from the page cache is that copy and nothing else: all of it)
        cpu = min(store, copy) if res.writing else store
    proc += cl.round_seconds * meetings(res)
    proc += handshakes(m, b, len(senders), cl.handshake_bytes) * cl.handshake_seconds
    proc += cl.step_seconds
    x = nic + inj + proc
    if overlap:
        total = x + (rounds - 1) * max(x + cpu, store) + store
    else:
        total = rounds * (x + store)
    hidden = rounds * (x + store) - total
    sizes = b[has] / np.maximum(m[has], 1)
    plan = planned_runs(res) * cl.plan_run_seconds
    return Prediction(
        strategy, rounds, rounds * nic, rounds * inj, rounds * proc, rounds * store, hidden,
        cl.call_seconds, total + cl.call_seconds + plan, int(res.msgs.max(initial=0)),
        int(sizes.min()) if len(sizes) else 0, plan,
    )  # fmt: skip


def planned_runs(res: SimResult) -> int:
    """The most runs one process plans in the call: a rank its own (flattened, cut at
    domains and windows, its messages' datatypes), a two-level group's local aggregator
    the runs of its whole group (merged in file order, cut again)."""
    if res.two_level and len(res.group_runs):
        return int(res.group_runs.max())
    return int(res.rank_runs_max)


def handshakes(m: np.ndarray[Any, Any], b: np.ndarray[Any, Any], senders: int,
               threshold: int) -> float:  # fmt: skip
    """Rendezvous messages (a mean size of ``threshold`` bytes or more) the busiest rank
    takes part in per round: an aggregator's ``m`` sources of ``b`` bytes, or a sender's
    share of all of them (it waits for each of its receivers as they wait for it)."""
    big = (m > 0) & (b >= threshold * np.maximum(m, 1))
    return max(float(m[big].max(initial=0)), float(m[big].sum()) / max(senders, 1))


def meetings(res: SimResult) -> int:
    """How many times per round the call's ranks wait for each other: a two-level call's
    group waits for its ranks' copies in the staging every round; one level's exchange
    agrees on nothing per round (a write's sends are posted rounds ahead, its aggregators
    receive at their own pace; a read's aggregators send every round, failed or not, and
    the call's completion agrees on its errors once)."""
    return int(res.two_level)


def _direct(res: SimResult, cl: Cluster, strategy: str) -> Prediction:
    """Each rank writes its own runs: the storage terms only."""
    per_rank = res.nbytes / max(res.nranks, 1)
    store = max(per_rank / cl.aggregator_bandwidth,
                res.nbytes / (cl.targets * cl.target_bandwidth))  # fmt: skip
    call = cl.call_seconds
    return Prediction(strategy, 0, 0.0, 0.0, 0.0, store, 0.0, call, store + call, 0, 0)


#: The strategies compared: collio in two levels, in one, and ROMIO's (one aggregator
#: per node, ``cb_buffer_size`` rounds, no overlap of storage and exchange).
STRATEGIES = ("collio two-level", "collio one-level", "ROMIO")


def strategies(work: Workload, cfg: SimConfig, cl: Cluster) -> list[tuple[SimResult, Prediction]]:
    """Simulate and predict ``work`` with :data:`STRATEGIES` (the hints of ``cfg`` otherwise)."""
    h = cfg.hints
    nnodes = -(-work.nranks // max(cfg.ppn or work.nranks, 1))
    romio = h.replace(cb_nodes=nnodes, cb_config_list="*:1", min_rounds=1, cb_two_level="disable")
    out = []
    for name, hints in zip(
        STRATEGIES,
        (h.replace(cb_two_level="enable"), h.replace(cb_two_level="disable"), romio),
        strict=True,
    ):
        res = simulate(work, dataclasses.replace(cfg, hints=hints))
        out.append((res, predict(res, cl, name, overlap=name != "ROMIO")))
    return out


def format_predictions(rows: list[tuple[SimResult, Prediction]], cl: Cluster) -> str:
    """Where the time goes, one line per strategy (seconds summed over the rounds)."""
    nnodes = rows[0][0].nnodes if rows else 0
    lines = [
        f"predicted on {nnodes} nodes of {cl.ppn} ranks: {cl.node_bandwidth / 1e9:g} GB/s and "
        f"{cl.message_seconds * 1e6:g} us per message per node, {cl.targets} storage targets "
        f"x {cl.target_bandwidth / 1e9:g} GB/s, {cl.aggregator_bandwidth / 1e9:g} GB/s per "
        f"aggregator; on a node {cl.intra_message_seconds * 1e6:g} us per message and "
        f"{cl.intra_bandwidth / 1e9:g} GB/s per process",
        f"{'strategy':<17} {'aggs':>6} {'local':>6} {'rounds':>6} {'msgs/rnd':>8} "
        f"{'min msg':>9} {'messages':>9} {'inject':>7} {'on-node':>8} {'storage':>8} "
        f"{'hidden':>7} {'predicted':>10}",
    ]
    for res, p in rows:
        local = res.local_per_node * res.nnodes if res.two_level else 0
        lines.append(
            f"{p.strategy:<17} {res.naggs:>6} {local:>6} {p.rounds:>6} {p.max_sources:>8} "
            f"{human(p.min_message):>9} {p.messages:>8.3f}s {p.injection:>6.3f}s "
            f"{p.intra:>7.3f}s {p.storage:>7.3f}s {p.overlapped:>6.3f}s "
            f"{p.predicted_seconds:>9.3f}s"
        )
    return "\n".join(lines)


def predictions_json(rows: list[tuple[SimResult, Prediction]], cl: Cluster) -> dict[str, Any]:
    """Every figure of the predictions: the cluster, and per strategy its plan's shape
    and its terms (``predicted_seconds`` by strategy too)."""
    out = []
    for res, p in rows:
        out.append({**p.as_dict(), "aggregators": res.naggs, "window": res.window,
                    "two_level": res.two_level, "local_per_node": res.local_per_node,
                    "nodes": res.nnodes, "plan_seconds": res.seconds})  # fmt: skip
    return {
        "cluster": cl.as_dict(),
        "strategies": out,
        "predicted_seconds": {p.strategy: p.predicted_seconds for _, p in rows},
    }
