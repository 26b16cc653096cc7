"""Text and JSON for the simulator, and the planning-speed measurement."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from ..aggregators import file_domains, plan_aggregator, plan_sender
from ..bench.patterns import Workload, human, make_workload
from ..layouts.strided import flatten
from ..policy import DEPTH
from .simulator import PIECE_BYTES, SimResult

__all__ = ["format_sim", "sim_json", "plan_speed"]


def _mmm(values: np.ndarray[Any, Any], fmt: Any = str) -> str:
    if not len(values):
        return "-"
    return f"min {fmt(values.min())}   mean {fmt(values.mean())}   max {fmt(values.max())}"


def _extremes(values: np.ndarray[Any, Any]) -> str:
    if not len(values):
        return "none"
    return f"largest {human(values.max())}, smallest {human(values.min())}"


def _header(work: Workload, res: SimResult, ppn: int) -> list[str]:
    h = res.hints
    naggs = "n/a (direct)" if res.direct else h.get("cb_nodes")
    return [
        f"collio-bench --simulate: {work.describe()}, {human(res.nbytes)}, "
        f"{work.nranks} virtual ranks ({ppn} per node)",
        f"hints: cb_nodes={naggs} cb_buffer_size={human(h['cb_buffer_size'])} "
        f"cb_config_list={h.get('cb_config_list') or '*:*'} "
        f"striping_unit={h.get('striping_unit') or 'none'} "
        f"backend alignment={h['backend_alignment']} romio_cb_write={h['romio_cb_write']} "
        f"romio_cb_read={h['romio_cb_read']}",
    ]


def _busiest(res: SimResult) -> np.ndarray[Any, Any]:
    """The most messages in one round, per aggregator with rounds."""
    has = np.flatnonzero(res.agg_rounds > 0)
    if not len(has):
        return np.zeros(0, np.int64)
    return np.maximum.reduceat(res.msgs, res.rstart[has])


def _total_messages(res: SimResult) -> str:
    if not res.sampled:
        return f"{int(res.msgs.sum()):.4g}"
    mean = float(res.msgs.mean()) if len(res.msgs) else 0.0
    return f"~{mean * int(res.agg_rounds.sum()):.4g} estimated"


def _two_phase_lines(res: SimResult) -> list[str]:
    def one(v: float) -> str:
        return f"{v:.1f}"

    return [
        f"path: two-phase, {res.naggs} aggregators, domains of "
        f"{human(np.diff(res.bounds).max())}, window {human(res.window)}",
        f"per-aggregator bytes      {_mmm(res.agg_bytes, human)}",
        f"rounds per aggregator     {_mmm(res.agg_rounds, one)}   (the call: {res.rounds})",
        f"messages per round        {_mmm(res.msgs, one)}   "
        f"(per aggregator and round; total {_total_messages(res)})",
        f"busiest round per agg.    {_mmm(_busiest(res), one)}",
        f"backend requests          {len(res.requests)}: {_extremes(res.requests)}; "
        f"read-modify-write reads: {len(res.hole_reads)}",
        f"predicted memory per agg. {_mmm(res.memory(), human)}   ({DEPTH} x window round "
        f"buffers + ~{PIECE_BYTES} B of planner metadata per piece received)",
        f"per rank                  at most {res.rank_runs_max} runs before cutting",
    ]


def format_sim(work: Workload, res: SimResult, ppn: int) -> str:
    """The simulator's report (every figure the real engine's stats would show)."""
    lines = _header(work, res, ppn)
    if res.direct:
        why = (
            "a read of a file on a local file system: each rank copies its own runs from "
            "the mapped file, hint mapped_reads"
            if res.mapped
            else "rank extents do not interleave and runs are large"
        )
        # (distinct sizes and their counts: 2*10^9 requests are not listed)
        sizes = res.requests[res.req_count > 0]
        lines += [
            f"path: direct ({why}: no shuffle)",
            f"backend requests          {int(res.req_count.sum())}: {_extremes(sizes)}; "
            f"at most {res.rank_runs_max} per rank",
        ]
    else:
        lines += _two_phase_lines(res)
        if res.sampled:
            lines.append(
                f"SAMPLED: messages per round come from {res.windows_evaluated} of "
                f"{res.windows_total} windows (evenly spaced); bytes and rounds are exact"
                + ("" if len(res.requests) == res.windows_total else ", requests sampled too")
            )
        else:
            lines.append(f"exact ({res.method} method, {res.windows_total} windows)")
    lines.append(f"time {res.seconds:.1f} s ({res.cpu_seconds:.1f} s CPU)")
    return "\n".join(lines)


def sim_json(work: Workload, res: SimResult) -> dict[str, Any]:
    """Every figure of the simulation (arrays as lists)."""
    return {
        "pattern": work.pattern, "shape": list(work.shape), "dtype": work.dtype,
        "grid": list(work.grid), "nranks": work.nranks, "bytes": res.nbytes,
        "direct": res.direct, "mapped": res.mapped, "aggregators": res.naggs, "window": res.window,
        "bounds": res.bounds.tolist(), "agg_bytes": res.agg_bytes.tolist(),
        "agg_rounds": res.agg_rounds.tolist(), "rounds": res.rounds,
        "messages_per_round": res.msgs.tolist(), "round_start": res.rstart.tolist(),
        "requests": res.requests.tolist(), "request_counts": res.req_count.tolist(),
        "hole_reads": res.hole_reads.tolist(), "memory": res.memory().tolist(),
        "agg_pieces": res.agg_pieces.tolist(), "windows": res.windows.tolist(),
        "method": res.method, "sampled": res.sampled, "windows_total": res.windows_total,
        "windows_evaluated": res.windows_evaluated, "seconds": res.seconds,
        "cpu_seconds": res.cpu_seconds, "hints": res.hints,
    }  # fmt: skip


def plan_speed(nruns: int = 10**6, repeat: int = 3) -> dict[str, float]:
    """Seconds to plan ``nruns`` runs on one rank (medians of ``repeat``).

    A (nruns x 16) float64 matrix in column blocks over 4 ranks gives rank 0
    ``nruns`` runs of 32 bytes: flatten them, cut them at 4 domains and 16 MiB
    windows (``plan_sender``), and group the ``nruns`` pieces aggregator 0 gets
    from the 4 ranks (``plan_aggregator``).
    """
    work = make_workload("colblock", 4, size=f"{nruns}x16")
    lays = [work.layout(r) for r in range(4)]
    bounds = file_domains(0, work.nbytes, 4, 1)
    window = 16 << 20
    times: dict[str, list[float]] = {"flatten": [], "plan_sender": [], "plan_aggregator": []}
    for _ in range(repeat):
        t = time.perf_counter()
        runs = [lay.blocks() for lay in lays]
        flat = [flatten(b) for b in runs]
        times["flatten"].append((time.perf_counter() - t) / 4)
        t = time.perf_counter()
        senders = [plan_sender(r, bounds, window) for r in flat]
        times["plan_sender"].append((time.perf_counter() - t) / 4)
        mine = [sp.pieces.take(slice(0, int(sp.per_dom[0]))) for sp in senders]
        file = np.concatenate([m.file for m in mine])
        length = np.concatenate([m.length for m in mine])
        src = np.repeat(np.arange(4, dtype=np.int64), [len(m) for m in mine])
        t = time.perf_counter()
        plan_aggregator(file, length, src, 0, window)
        times["plan_aggregator"].append(time.perf_counter() - t)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["runs"] = float(len(flat[0]))
    out["pieces_at_aggregator"] = float(len(file))
    out["total"] = out["flatten"] + out["plan_sender"] + out["plan_aggregator"]
    return out
