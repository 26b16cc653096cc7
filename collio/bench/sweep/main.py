"""``collio-bench --sweep``: run the sweep, then print its tables and save them on rank 0."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from typing import Any

from mpi4py import MPI

from ...errors import CollioError
from ..machine import command
from ..main import emitter, failed, machine_facts, mpi_line, single_copies
from ..patterns import human
from ..report import write_json
from ..run import _shared_path
from .config import config
from .report import format_tables, plot, summarize
from .run import Budget, SweepConfig, Sweeper
from .work import DTYPE

__all__ = ["sweep"]


def sweep(args: argparse.Namespace, hints: list[tuple[str, str]]) -> int:
    """Collective over ``MPI.COMM_WORLD``: the sweep; rank 0 prints and saves."""
    comm = MPI.COMM_WORLD
    rank0 = comm.rank == 0
    emit = emitter(comm)
    try:
        cfg, skipped = config(args, hints)
    except ValueError as exc:
        return failed(comm, exc, 2)
    copies = single_copies(comm)
    for line in header(cfg, skipped, comm.size):
        emit(line)
    emit(mpi_line(copies))
    path, tmp = _shared_path(comm, args.test_file)
    cfg = dataclasses.replace(cfg, path=path)
    sweeper = Sweeper(comm, cfg, emit)
    t0 = time.perf_counter()
    try:
        sweeper.run()
    except CollioError as exc:  # raised alike on every rank
        return failed(comm, exc, 1)
    finally:
        comm.Barrier()
        if rank0 and tmp and not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    machine = machine_facts(comm, path, copies)
    summary = summarize(sweeper.results)
    if rank0:
        print(format_tables(summary, comm.size, cfg.batch, cfg.fsync))
        doc = document(cfg, skipped, sweeper, summary, comm.size, time.perf_counter() - t0)
        doc["machine"] = machine
        if args.json:
            write_json(args.json, doc)
        if args.plot:
            plot(args.plot, summary, f"collio-bench --sweep, {comm.size} ranks")
    return 1 if any(r["errors"] for r in summary) else 0


def _budget(b: Budget) -> str:
    if b.least == b.most:
        return f"{b.most} calls"
    return f"{b.least}-{b.most} calls, stopping after {b.seconds:g} s per API"


def header(cfg: SweepConfig, skipped: dict[str, str], nranks: int) -> list[str]:
    """What the sweep will do, as its first lines."""
    shown = ", ".join(human(s).replace(".00", "") for s in cfg.sizes)
    lines = [
        f"collio-bench --sweep: {', '.join(cfg.patterns)} (strided: {cfg.runs} runs per rank), "
        f"{shown} per rank per call, {nranks} ranks; APIs: "
        f"{', '.join(cfg.call_apis or cfg.apis)}",
        f"# each API its own file, kept open; each call a new step after the last (no call "
        f"rewrites bytes); APIs alternate call by call; {_budget(cfg.budget)} per size",
        "# " + ("a sync in every call (-e)" if cfg.fsync else
                "no sync per call: the calls' own time, data left in the page cache "
                "(-e adds a sync to every call); collio's close syncs, not timed"),
    ]  # fmt: skip
    if cfg.batch and cfg.batch_sizes:
        sizes = ", ".join(human(s).replace(".00", "") for s in cfg.batch_sizes)
        lines.append(
            f"# batches: {cfg.batch} arrays per rank per call at {sizes}; APIs: "
            f"{', '.join(cfg.batch_apis)}; {_budget(cfg.batch_budget)}"
        )
    lines += [f"# {name}: not run: {why}" for name, why in skipped.items()]
    return lines


def document(
    cfg: SweepConfig, skipped: dict[str, str], sweeper: Sweeper, summary: list[dict[str, Any]],
    nranks: int, seconds: float,
) -> dict[str, Any]:  # fmt: skip
    """Every figure of the run, for ``--json``."""
    return {
        "command": command(), "mode": "sweep", "nranks": nranks, "sizes": list(cfg.sizes),
        "patterns": list(cfg.patterns), "runs": cfg.runs, "dtype": DTYPE, "fsync": cfg.fsync,
        "apis": list(cfg.apis), "call_apis": list(cfg.call_apis or cfg.apis),
        "batch": cfg.batch, "batch_sizes": list(cfg.batch_sizes),
        "batch_apis": list(cfg.batch_apis), "calls": list(cfg.calls),
        "budget": dataclasses.asdict(cfg.budget),
        "batch_budget": dataclasses.asdict(cfg.batch_budget),
        "hints_given": dict(cfg.hints), "hints_used": sweeper.used, "unavailable": skipped,
        "results": summary, "errors": sum(r["errors"] or 0 for r in summary),
        "verified": sum(r["verified"] for r in summary), "seconds": seconds, "path": cfg.path,
    }  # fmt: skip
