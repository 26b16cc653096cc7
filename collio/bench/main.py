"""The MPI side of ``collio-bench``: run, then print IOR's summary on rank 0."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from ..aggregators.nodes import ENV_RANKS_PER_NODE
from ..errors import CollioError
from ..redact import redact_url
from .machine import CMA_CVAR, command, describe, single_copy
from .patterns import human
from .report import (
    MiB,
    format_hints,
    format_rss,
    format_summary,
    memory_check,
    plot,
    summarize,
    write_json,
)
from .run import BenchConfig, Runner, balanced_orders, run_bench

__all__ = [
    "bench",
    "copies_text",
    "emitter",
    "failed",
    "machine_facts",
    "mpi_line",
    "single_copies",
]


def _apis(args: argparse.Namespace, default: str) -> tuple[str, ...]:
    if args.compare:
        names = [a.strip() for a in args.compare.split(",") if a.strip()]
    elif args.api:
        names = [args.api]
    else:
        names = default.split(",")
    return tuple(dict.fromkeys(names))


def _config(
    args: argparse.Namespace,
    workload: Callable[[argparse.Namespace, int], Any],
    hints: list[tuple[str, str]],
    default_apis: str,
    nranks: int,
) -> BenchConfig:
    """The run's configuration; raises ValueError for a bad pattern, size, API or option.

    Pure and the same on every rank: APIs refuse a run (``Api.check``) before any I/O,
    and APIs that cannot run here (``Api.unavailable``) are left out with the reason.
    """
    from .apis import get_api

    work = workload(args, nranks)
    names = _apis(args, default_apis)
    write, read = (args.write or not args.read), (args.read or not args.write)
    options = dict(args.options)
    if getattr(args, "s3_endpoint", None) and "endpoint" not in options:
        options["endpoint"] = args.s3_endpoint
    classes = {name: get_api(name) for name in names}
    known = {k for cls in classes.values() for k in cls.option_help}
    unknown = sorted(set(options) - known)
    if unknown:
        given = "endpoint (--s3-endpoint)" if unknown == ["endpoint"] else ", ".join(unknown)
        raise ValueError(
            f"option {given} is not used by any of the APIs {', '.join(names)}"
            + (f"; theirs: {', '.join(sorted(known))}" if known else "")
        )
    skipped = {name: why for name, cls in classes.items() if (why := cls.unavailable())}
    run = tuple(name for name in names if name not in skipped)
    if not run:
        raise ValueError("; ".join(f"{n} is unavailable: {why}" for n, why in skipped.items()))
    for name in run:
        classes[name].check(work, options, write)
    cycle = len(balanced_orders(len(run)))  # every API follows every other equally often
    iterations = args.iterations or cycle * -(-5 // cycle)
    if iterations < 1:
        raise ValueError(f"-i {iterations}: at least one iteration")
    return BenchConfig(
        work, run, iterations, write, read, args.fsync is not False, args.check_write,
        args.check_read,
        args.test_file, tuple(hints), args.keep_file, tuple(options.items()),
        tuple(skipped.items()),
    )  # fmt: skip


def bench(
    args: argparse.Namespace,
    workload: Callable[[argparse.Namespace, int], Any],
    hints: list[tuple[str, str]],
    default_apis: str,
) -> int:
    """Collective over ``MPI.COMM_WORLD``: the benchmark; rank 0 prints and saves."""
    comm = MPI.COMM_WORLD
    rank0 = comm.rank == 0
    emit = emitter(comm)
    try:
        cfg = _config(args, workload, hints, default_apis, comm.size)
    except ValueError as exc:
        return failed(comm, exc, 2)
    work, names = cfg.work, cfg.apis
    copies = single_copies(comm)
    emit(
        f"collio-bench: {work.describe()}, {human(work.nbytes)}, {comm.size} ranks, "
        f"{cfg.iterations} iterations, fsync {'on' if cfg.fsync else 'off'}; "
        f"APIs: {', '.join(names)}"
    )
    emit(mpi_line(copies))
    for name, why in cfg.skipped:
        emit(f"# {name}: not run: {why}")
    cycle = len(balanced_orders(len(names)))
    if cfg.iterations % cycle:
        emit(
            f"# note: the orders balance over multiples of {cycle} iterations; with "
            f"{cfg.iterations} some APIs follow others more often"
        )
    if not cfg.fsync and any(n.startswith("collio") for n in names):
        emit("# note: collio's close always syncs (its durability contract), fsync off or not")
    opts = _shown(dict(cfg.options))
    if opts:
        emit("# options: " + ", ".join(f"{k}={v}" for k, v in opts.items()))
    t0 = time.perf_counter()
    try:
        runner, _, facts = run_bench(comm, cfg, emit)
    except CollioError as exc:  # raised alike on every rank
        return failed(comm, exc, 1)
    facts["peak_rss"] = comm.gather(runner.rss, root=0)
    facts["extra_rss"] = comm.gather(runner.extra, root=0)
    facts["data_bytes"] = comm.gather(facts["data_bytes"], root=0)
    facts["machine"] = machine_facts(comm, facts["path"], copies)
    if rank0:
        _finish(args, cfg, runner, facts, time.perf_counter() - t0, comm.size)
    # verification errors are summed over ranks: every rank returns the same status
    return 1 if any(row.errors > 0 for row in runner.rows) else 0


def _finish(
    args: argparse.Namespace,
    cfg: BenchConfig,
    runner: Runner,
    facts: dict[str, Any],
    seconds: float,
    nranks: int,
) -> None:
    """On rank 0: the summary tables, then the JSON file and the plot."""
    names, work = list(cfg.apis), cfg.work
    summary = summarize(runner.rows, names)
    print(format_summary(summary, names[0]))
    print(format_rss(facts, runner.aggregators, names))
    checks = {}
    for name in names:
        if not name.startswith("collio"):
            continue
        cb = int(runner.hints_used.get(name, {}).get("cb_buffer_size", 16 * MiB))
        aggs = runner.aggregators_of.get(name, runner.aggregators)
        checks[name] = check = memory_check(facts, aggs, cb, name)
        print(
            f"{name} aggregators' RSS growth: at most {check['max_growth'] / MiB:.1f} MiB; "
            f"bound 2 x cb_buffer_size + 100 MiB = {check['limit'] / MiB:.0f} MiB: "
            f"{'within' if check['ok'] else 'EXCEEDED'}"
        )
    if "collio" in checks:
        facts["memory_check"] = checks["collio"]
    facts["memory_checks"] = checks
    print(format_hints(runner.hints_used))
    print(f"\ntest file {facts['path']} ({'kept' if cfg.keep else 'removed'}); {seconds:.1f} s")
    doc = {
        "command": command(), "nranks": nranks, "pattern": work.pattern,
        "shape": list(work.shape), "dtype": work.dtype, "grid": list(work.grid),
        "bytes": work.nbytes, "iterations": cfg.iterations, "fsync": cfg.fsync, "apis": names,
        "hints_given": dict(cfg.hints), "hints_used": runner.hints_used,
        "options": _shown(dict(cfg.options)), "unavailable": dict(cfg.skipped),
        "rows": [dataclasses.asdict(r) for r in runner.rows], "summary": summary,
        "collio_aggregators": runner.aggregators, "seconds": seconds,
        "errors": sum(s["errors"] or 0 for s in summary), **facts,
    }  # fmt: skip
    if args.json:
        write_json(args.json, doc)
    if args.plot:
        plot(args.plot, summary, f"{work.describe()}, {nranks} ranks")


def emitter(comm: MPI.Intracomm) -> Callable[[str], None]:
    """A function that prints a line on rank 0 (and nothing on the others)."""

    def emit(line: str) -> None:
        if comm.rank == 0:
            print(line, flush=True)

    return emit


def failed(comm: MPI.Intracomm, exc: Exception, status: int) -> int:
    """``status``, after rank 0 printed ``exc`` (an error every rank has alike)."""
    if comm.rank == 0:
        print(f"collio-bench: error: {exc}", file=sys.stderr, flush=True)
    return status


def single_copies(comm: MPI.Intracomm) -> bool | str | None:
    """Collective: MPICH's single-copy setting on every rank, or "mixed" when ranks differ."""
    values = set(comm.allgather(single_copy()))
    return values.pop() if len(values) == 1 else "mixed"


def machine_facts(comm: MPI.Intracomm, path: str, copies: bool | str | None) -> dict[str, Any]:
    """Collective: the machine as saved with a result (on rank 0; empty elsewhere)."""
    nodes = len(set(comm.allgather(MPI.Get_processor_name())))
    if comm.rank != 0:
        return {}
    # nodes as collio saw them when consecutive ranks were made nodes (tests, emulation)
    return {
        **describe(path), "single_copy": copies, "nodes": nodes,
        "ranks_per_node_env": os.environ.get(ENV_RANKS_PER_NODE),
    }  # fmt: skip


def mpi_line(copies: bool | str | None) -> str:
    """The header's line on MPI: the library and its single-copy setting."""
    return f"# MPI: {MPI.Get_library_version().splitlines()[0].strip()}; {copies_text(copies)}"


def copies_text(copies: bool | str | None) -> str:
    if copies is None:
        return "single-copy setting: not MPICH"
    state = copies if isinstance(copies, str) else ("on" if copies else "off")
    return f"MPICH single-copy messages ({CMA_CVAR}): {state}"


def _shown(options: dict[str, str]) -> dict[str, str]:
    """Options as printed and saved: an endpoint without any ``user:password@`` part."""
    out = dict(options)
    if out.get("endpoint"):
        out["endpoint"] = redact_url(out["endpoint"])
    return out
