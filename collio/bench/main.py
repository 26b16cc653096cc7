"""The MPI side of ``collio-bench``: run, then print IOR's summary on rank 0."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from .report import format_hints, format_rss, format_summary, plot, summarize, write_json
from .run import BenchConfig, run_bench
from .simreport import human

__all__ = ["bench"]


def _apis(args: argparse.Namespace, default: str) -> tuple[str, ...]:
    if args.compare:
        names = [a.strip() for a in args.compare.split(",") if a.strip()]
    elif args.api:
        names = [args.api]
    else:
        names = default.split(",")
    return tuple(dict.fromkeys(names))


def bench(
    args: argparse.Namespace,
    workload: Callable[[argparse.Namespace, int], Any],
    hints: list[tuple[str, str]],
    default_apis: str,
) -> int:
    """Collective over ``MPI.COMM_WORLD``: the benchmark; rank 0 prints and saves."""
    comm = MPI.COMM_WORLD
    rank0 = comm.rank == 0

    def emit(line: str) -> None:
        if rank0:
            print(line, flush=True)

    try:
        work = workload(args, comm.size)
        from .apis import get_api

        names = _apis(args, default_apis)
        for name in names:
            get_api(name)
    except ValueError as exc:
        if rank0:
            print(f"collio-bench: error: {exc}", file=sys.stderr)
        return 2
    write, read = (args.write or not args.read), (args.read or not args.write)
    cfg = BenchConfig(
        work, names, args.iterations, write, read, args.fsync, args.check_write, args.check_read,
        args.test_file, tuple(hints), args.keep_file,
    )  # fmt: skip
    emit(
        f"collio-bench: {work.describe()}, {human(work.nbytes)}, {comm.size} ranks, "
        f"{cfg.iterations} iterations, fsync {'on' if cfg.fsync else 'off'}; APIs: {', '.join(names)}"
    )
    t0 = time.perf_counter()
    runner, job, facts = run_bench(comm, cfg, emit)
    rss = comm.gather(runner.rss, root=0)
    data = comm.gather(facts["data_bytes"], root=0)
    if not rank0:
        return 0
    assert rss is not None and data is not None
    summary = summarize(runner.rows, list(names))
    print(format_summary(summary, names[0]))
    print(format_rss(rss, data, runner.aggregators, list(names)))
    print(format_hints(runner.hints_used))
    print(f"\ntest file {facts['path']} ({'kept' if cfg.keep else 'removed'}); "
          f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
    doc = {
        "command": sys.argv, "nranks": comm.size, "pattern": work.pattern,
        "shape": list(work.shape), "dtype": work.dtype, "grid": list(work.grid),
        "bytes": work.nbytes, "transfers": facts["transfers"], "iterations": cfg.iterations,
        "fsync": cfg.fsync, "apis": list(names), "hints_given": dict(hints),
        "hints_used": runner.hints_used, "rows": [dataclasses.asdict(r) for r in runner.rows],
        "summary": summary, "peak_rss": rss, "data_bytes": data,
        "collio_aggregators": runner.aggregators, "errors": sum(
            s["errors"] or 0 for s in summary),
    }  # fmt: skip
    if args.json:
        write_json(args.json, doc)
    if args.plot:
        plot(args.plot, summary, f"{work.describe()}, {comm.size} ranks")
    return 0
