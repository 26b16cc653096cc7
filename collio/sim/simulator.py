"""The planner for virtual ranks: what a collective write would do, without MPI or files.

``collio-bench --simulate --ranks 65536 --pattern colblock --size 1TiB --cb-nodes 512``
reproduces the semantics of :mod:`collio.aggregators.plan` (domains, windows,
rounds = non-empty windows, one message per rank with bytes in a window, one
backend request per window's data extent) from the layouts' structure alone:
every figure comes from :func:`~collio.layouts.count_below` arithmetic over
(box, domain) or (box, window) pairs, vectorised and chunked (see
:mod:`collio.sim.windows`).  When even that is too much work, messages per
round are computed on an even sample of windows and the output says so.

The path, the window and the round buffers are the engine's own choices: the
simulator computes the facts the engine's ranks agree on (their extents, runs and
bytes) for every virtual rank at once, and asks :mod:`collio.policy` as the engine
does.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import policy
from ..aggregators import call_domains, choose_aggregators
from ..aggregators.nodes import consecutive_nodes, local_groups, node_shape
from ..bench.patterns import Workload
from ..layouts.strided import Blocks
from ..policy import Path, PathFacts
from .batch import batched_blocks, explode_levels, squeeze
from .result import PIECE_BYTES, SimConfig, SimResult
from .windows import Grid, WindowCounts, explicit, exploded_intervals, intervals

__all__ = ["PIECE_BYTES", "SimConfig", "SimResult", "simulate"]

I64 = npt.NDArray[np.int64]
_MAX_WINDOWS = 1 << 24


def _per_rank(values: I64, owner: I64, nranks: int) -> I64:
    return np.bincount(owner, weights=values, minlength=nranks).astype(np.int64)


@dataclasses.dataclass(frozen=True, slots=True)
class _Facts:
    agreed: PathFacts  # as the engine's ranks agree on them
    rlo: I64  # each rank's extent
    rhi: I64
    nruns: I64  # each rank's runs (its layout's, before merging)


def _facts(blocks: Blocks, owner: I64, work: Workload, cfg: SimConfig) -> _Facts:
    """What the engine's ranks contribute to its choice of path, for every virtual rank.

    Run lengths are counted per box, before runs merge (a rank's distinct lengths for
    a mapped read), and the file is taken to hold every byte read (the engine also
    shuffles a read past the file's end).
    """
    h, n = cfg.hints, work.nranks
    nruns = _per_rank(blocks.nruns(), owner, n)
    nbytes = _per_rank(blocks.nbytes(), owner, n)
    lo, hi = blocks.extent()
    rlo = np.full(n, np.iinfo(np.int64).max, np.int64)
    rhi = np.zeros(n, np.int64)
    np.minimum.at(rlo, owner, lo)
    np.maximum.at(rhi, owner, hi)
    mapped = policy.may_map(h, writing=cfg.writing)
    mapped = mapped and policy.maps_file(h.mapped_reads, local_fs=cfg.local_fs)
    if mapped:
        pairs = np.unique(np.stack([owner, blocks.runlen]), axis=1)
        lengths = np.bincount(pairs[0], minlength=n)
        mapped = bool(policy.copyable(nruns, lengths).all())
    shortest = np.full(n, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(shortest, owner, blocks.runlen)
    agreed = PathFacts(
        lo=int(rlo.min(initial=np.iinfo(np.int64).max)), hi=int(rhi.max(initial=0)),
        small=bool(policy.many_small_runs(nruns, nbytes, h.direct_threshold).any()),
        mapped=mapped, checked=int(policy.checked_runs(nruns, shortest).max(initial=0)),
    )  # fmt: skip
    return _Facts(agreed, rlo, rhi, nruns)


def _path(facts: _Facts, cfg: SimConfig) -> Path:
    """The engine's path (:func:`collio.policy.choose_path`) on a posix-like backend."""
    h = cfg.hints
    return policy.choose_path(
        facts.agreed,
        mode=h.romio_cb_write if cfg.writing else h.romio_cb_read,
        independent=True,
        disjoint=lambda: policy.extents_disjoint(facts.rlo, facts.rhi),
        split=lambda: None,  # (asked only of backends that are not independent)
        # a pattern gives every byte of its global array to one rank: no two ranks' runs
        # overlap, which the engine's ranks find by comparing them
        runs_disjoint=lambda: True,
    )


def simulate(work: Workload, cfg: SimConfig) -> SimResult:
    """Plan one collective write (or read) of ``work`` for its virtual ranks.

    Pure: no MPI, no files, no list of runs.

    Parameters
    ----------
    work
        The pattern, global array and number of virtual ranks.
    cfg
        Hints, backend alignment and capabilities, ranks per node, evaluation budget.

    Returns
    -------
    SimResult
        What the real engine's ``Stats`` / ``Stats.local`` would report: the path
        (direct or two-phase), per-aggregator bytes and rounds, messages of every
        round, backend request sizes, predicted memory, and how it was computed.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    blocks, owner = batched_blocks(work)
    blocks = squeeze(blocks)
    lo_b, hi_b = blocks.extent()
    lo, hi = int(lo_b.min(initial=0)), int(hi_b.max(initial=0))
    total = int(blocks.nbytes().sum())
    facts = _facts(blocks, owner, work, cfg)
    path = _path(facts, cfg)
    if path.direct:
        res = _direct_result(blocks, work, (lo, hi), total, facts.nruns)
        res.mapped = path is Path.MAPPED
    else:
        res = _two_phase(blocks, owner, work, cfg, (lo, hi), total)
        res.rank_runs_max = int(facts.nruns.max(initial=0))
    res.writing = cfg.writing
    res.seconds = time.perf_counter() - t0
    res.cpu_seconds = time.process_time() - c0
    res.hints = _used(cfg, res)
    return res


def _used(cfg: SimConfig, res: SimResult) -> dict[str, Any]:
    used = cfg.hints.as_dict()
    used["cb_nodes"] = res.naggs
    used["backend_alignment"] = cfg.backend_alignment
    used["backend_min_window"] = cfg.backend_min_window
    used["window"] = res.window
    used["nodes"] = res.nnodes
    used["cb_local_aggregators"] = res.local_per_node
    return used


def _direct_result(
    blocks: Blocks, work: Workload, ext: tuple[int, int], total: int, rank_runs: I64
) -> SimResult:
    sizes, inv = np.unique(blocks.runlen, return_inverse=True)
    counts = np.bincount(inv.reshape(-1), weights=blocks.nruns()).astype(np.int64)
    z = np.zeros(0, np.int64)
    return SimResult(
        work.nranks, total, ext, True, 0, 0, z, z, z, np.zeros(1, np.int64), z,
        sizes.astype(np.int64), counts, z, z, int(rank_runs.max(initial=0)), "direct", 0, 0,
    )  # fmt: skip


def _two_phase(
    blocks: Blocks, owner: I64, work: Workload, cfg: SimConfig, ext: tuple[int, int], total: int
) -> SimResult:
    h = cfg.hints
    nodes = consecutive_nodes(work.nranks, cfg.ppn or work.nranks)
    aggs = choose_aggregators(
        nodes, cb_nodes=h.cb_nodes, per_node=h.per_node(), stripes=h.striping_factor
    )
    naggs = len(aggs)
    nnodes, fullest = node_shape(nodes)
    per = policy.two_level(h, nranks=work.nranks, nnodes=nnodes, fullest=fullest)
    groups = local_groups(nodes, per) if per else None
    align = policy.domain_alignment(cfg.backend_alignment, h)
    bounds, _ = call_domains(ext[0], ext[1], naggs, align, h.cb_min_domain)
    window = policy.round_window(
        h, bounds, align=align, nranks=work.nranks, floor=cfg.backend_min_window,
        sources=groups.ngroups if groups is not None else 0, writing=cfg.writing,
    )  # fmt: skip
    nwin = int((-(-np.diff(bounds) // window)).sum())
    if nwin > _MAX_WINDOWS:
        raise ValueError(
            f"{nwin} windows of {window} bytes: too many to simulate (at most {_MAX_WINDOWS}); "
            "use a larger cb_buffer_size"
        )
    grid = Grid.build(bounds, window)
    tiled = total == ext[1] - ext[0]
    # two levels: an aggregator hears from local aggregators, each sending its group's
    # pieces of a window as the group's ranks' union (a rank's pieces for its own group's
    # aggregators go between it and them, a read's as a write's: ``near``)
    sources = groups.group[owner] if groups is not None else owner
    near = None
    if groups is not None:
        near = (owner, (groups.group, groups.group[aggs]))
    counts, method, evaluated = _evaluate(
        blocks, sources, grid, cfg, tiled, groups is not None, near
    )
    res = _assemble(work, cfg, grid, counts, method, evaluated, tiled, total, ext)
    res.nnodes, res.local_per_node, res.agg_nodes = nnodes, per, nodes[aggs]
    res.rank_round_bytes = counts.rank_round if groups is None else 0
    res.group_round_bytes = counts.rank_round if groups is not None else 0
    if groups is not None:
        res.group_ranks = np.bincount(groups.group, minlength=groups.ngroups).astype(np.int64)
        res.group_bytes = np.bincount(
            sources, weights=blocks.nbytes(), minlength=groups.ngroups
        ).astype(np.int64)
        res.group_runs = np.bincount(
            sources, weights=blocks.nruns(), minlength=groups.ngroups
        ).astype(np.int64)
        if near is not None:  # (a group stages only the pieces for the others' aggregators)
            res.group_bytes, res.staged_runs = _staged(counts, res, groups.group[aggs])
    return res


def _staged(counts: WindowCounts, res: SimResult, agg_group: I64) -> tuple[I64, I64]:
    """A two-level call's bytes and runs each group stages: its bytes counted pair by
    pair, else its ranks' spread evenly over the domains (those of its own aggregators
    go direct); its runs in the same share of its ranks' runs."""
    if counts.staged is not None:
        away = counts.staged / np.maximum(res.group_bytes, 1)
    else:
        ngroups = len(res.group_bytes)
        own = np.bincount(agg_group, weights=np.diff(res.bounds), minlength=ngroups)
        away = 1.0 - own / max(float(np.diff(res.bounds).sum()), 1.0)
    return (np.round(res.group_bytes * away).astype(np.int64),
            np.round(res.group_runs * away).astype(np.int64))  # fmt: skip


def _evaluate(
    blocks: Blocks, owner: I64, grid: Grid, cfg: SimConfig, tiled: bool, grouped: bool,
    near: tuple[I64, tuple[I64, I64]] | None = None,
) -> tuple[WindowCounts, str, I64]:  # fmt: skip
    """Choose the exact method that fits the budget, else sample windows (a read's
    busiest rank of a round too, or with ``grouped`` owners, local groups, the busiest
    group's of a round, where every pair fits the budget).  ``near``: a two-level
    call's ranks and :func:`~collio.sim.windows.explicit`'s ``near``, counted pair by
    pair where they fit the budget (intervals count every piece its group's)."""
    budget, force = cfg.budget, cfg.method
    nw = grid.nwindows
    every = np.arange(nw, dtype=np.int64)
    b0, b1 = blocks.extent()
    spanned = np.searchsorted(grid.start, b1, "left") - np.searchsorted(grid.end, b0, "right")
    explicit_cost = int(np.maximum(spanned, 0).sum())
    if near is not None and (force == "explicit" or (force == "auto" and explicit_cost <= budget)):
        return explicit(blocks, near[0], grid, every, near[1]), "explicit", every
    levels, interval_cost, cut = _interval_plan(blocks, grid, tiled)
    # intervals give no request extents for layouts with holes: explicit or sampled then
    cheaper = tiled and interval_cost < explicit_cost
    if force == "interval" or (force == "auto" and cheaper and interval_cost <= budget):
        # a rank counts once per window: merge its intervals when it has several boxes,
        # or sub-boxes cut at gaps shorter than a window (they may share one)
        multi = bool((np.bincount(owner) > 1).any()) or (cut < grid.window and bool(levels.any()))
        counts = exploded_intervals(blocks, owner, grid, levels, dedupe=multi, tiled=tiled)
        if (grouped or not cfg.writing) and explicit_cost <= budget:  # (no rank's known)
            counts.rank_round = explicit(blocks, owner, grid, every).rank_round
        return counts, "interval", every
    if force == "explicit" or (force == "auto" and explicit_cost <= budget):
        return explicit(blocks, owner, grid, every), "explicit", every
    # sampled: exact domain sums, messages on an even sample of windows
    per_window = max(1, explicit_cost // max(nw, 1))
    take = int(min(nw, max(64, budget // per_window)))
    sample = np.unique(np.linspace(0, nw - 1, take).astype(np.int64))
    counts = explicit(blocks, owner, grid, sample)
    counts.rank_round = 0  # (a sample holds parts of rounds)
    if tiled:  # every byte of a domain is written: its bytes are its size
        counts.dom_bytes = np.diff(grid.bounds).astype(np.int64)
        counts.dom_runs = _scaled_runs(grid, sample, counts.runs)
    else:
        doms = intervals(blocks, owner, grid, dedupe=False, windows=False)
        counts.dom_bytes, counts.dom_runs = doms.dom_bytes, doms.dom_runs
    return counts, "sampled", sample


def _interval_plan(
    blocks: Blocks, grid: Grid, tiled: bool
) -> tuple[npt.NDArray[np.bool_], int, int]:
    """Levels to explode for :func:`intervals`, the cost in explicit-pair units, the cut.

    Levels whose gap is at least the cut are exploded.

    Cutting at gaps of a window leaves sub-boxes that cost one ``count_below`` per
    domain bound they span (a quarter of an explicit pair); without holes, cutting
    at gaps of the shortest window instead leaves sub-boxes that cost nothing but
    their own listing (about half).  The cheaper of the two wins.
    """
    b0, b1 = blocks.extent()
    levels = explode_levels(blocks, grid.window)
    nsub = np.prod(np.where(levels, blocks.counts, 1), axis=1)
    ndom = np.searchsorted(grid.bounds, b1, "left") - np.searchsorted(grid.bounds, b0, "right")
    cost = (int(nsub.sum()) + int(np.maximum(ndom + 2, 2).sum())) // 4
    shortest = int((grid.end - grid.start).min()) if grid.nwindows else 0
    if tiled and shortest > 0:
        quick = explode_levels(blocks, shortest)
        # a through sub-box needs no count_below, but listing it costs about half an
        # explicit pair
        qcost = int(np.prod(np.where(quick, blocks.counts, 1), axis=1).sum()) // 2
        if qcost < cost:
            return quick, qcost, shortest
    return levels, cost, grid.window


def _scaled_runs(grid: Grid, sample: I64, runs: I64) -> I64:
    """Runs per domain estimated from sampled windows (the domain's mean, else the global)."""
    naggs = len(grid.bounds) - 1
    dom = grid.dom[sample]
    seen = np.bincount(dom, minlength=naggs)
    total = np.bincount(dom, weights=runs, minlength=naggs)
    mean = np.where(seen > 0, total / np.maximum(seen, 1), runs.mean() if len(runs) else 0.0)
    nwin = np.diff(grid.first)
    out: I64 = np.ceil(mean * nwin).astype(np.int64)
    return out


def _assemble(
    work: Workload,
    cfg: SimConfig,
    grid: Grid,
    c: WindowCounts,
    method: str,
    evaluated: I64,
    tiled: bool,
    total: int,
    ext: tuple[int, int],
) -> SimResult:
    """Rounds, messages and requests per aggregator from per-window counts."""
    naggs = len(grid.bounds) - 1
    wlen = (grid.end - grid.start)[evaluated]
    if tiled:  # every byte of the extent is written: every window is full of data
        busy = wlen > 0
        extent = wlen
        covered = wlen
    else:
        busy = c.ranks > 0
        extent = np.where(busy, c.rhi - c.rlo, 0) if cfg.partial_write else wlen
        covered = c.nbytes
    dom = grid.dom[evaluated][busy]
    msgs = c.ranks[busy]
    requests = extent[busy]
    holes = requests[covered[busy] < requests]
    seen = np.bincount(dom, minlength=naggs).astype(np.int64)
    agg_rounds = seen
    if method == "sampled" and tiled:  # every window is busy: rounds and requests are exact
        every = grid.end > grid.start
        agg_rounds = np.bincount(grid.dom[every], minlength=naggs).astype(np.int64)
        requests = (grid.end - grid.start)[every]
    rstart = np.concatenate(([0], np.cumsum(seen))).astype(np.int64)
    # messages per domain (scaled up from the sample: the domain's mean, else the global one)
    per_dom = np.bincount(dom, weights=msgs, minlength=naggs)
    mean = np.where(seen > 0, per_dom / np.maximum(seen, 1), msgs.mean() if len(msgs) else 0.0)
    pieces = c.dom_runs + np.ceil(mean * agg_rounds).astype(np.int64)
    return SimResult(
        work.nranks, total, ext, False, naggs, grid.window, grid.bounds, c.dom_bytes, agg_rounds,
        rstart, msgs, requests, np.ones(len(requests), np.int64), holes, pieces, 0, method,
        grid.nwindows, len(evaluated), evaluated[busy],
    )  # fmt: skip
