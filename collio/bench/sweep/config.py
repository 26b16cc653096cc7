"""The sweep's command line as a :class:`~collio.bench.sweep.run.SweepConfig` (pure, no I/O)."""

from __future__ import annotations

import argparse
from typing import Any

from ...hints import parse_size

__all__ = ["DEFAULT_APIS", "DEFAULT_CALLS", "DEFAULT_SIZES", "BATCH_BYTES", "config"]

DEFAULT_SIZES = "8,4k,64k,1m,8m,128m"
DEFAULT_APIS = "collio,mpiio,mpiio-tuned"
DEFAULT_CALLS = "open,sync,close"
FILE_CALLS = ("open", "sync", "close")
#: The largest batch (bytes per rank) the default batch sizes make: 200 arrays of 1 MiB.
BATCH_BYTES = 256 << 20


def sizes(text: str, what: str) -> tuple[int, ...]:
    """``8,4k,1m`` as bytes, in the order given."""
    out = tuple(parse_size(t.strip(), what) for t in text.split(",") if t.strip())
    if not out:
        raise ValueError(f"{what}: give at least one size")
    return out


def _names(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"{what} {', '.join(bad)}: known: {', '.join(known)}")
    return names


def _apis(args: argparse.Namespace) -> tuple[str, ...]:
    from .callers import BATCH_API, check_api

    text = args.compare or args.api or DEFAULT_APIS
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    for name in names:
        if name == BATCH_API:
            raise ValueError(f"{BATCH_API} is the batch call: it runs in the batches (--batch)")
        check_api(name)
    if not names:
        raise ValueError("--compare: give at least one API")
    return names


def config(args: argparse.Namespace, hints: list[tuple[str, str]]) -> tuple[Any, dict[str, str]]:
    """The sweep's configuration and the APIs it leaves out (with why); ValueError for
    a bad size, pattern, API or option, the same on every rank before any I/O."""
    from .callers import BATCH_API, CEILING_API, many_unavailable
    from .run import Budget, SweepConfig
    from .work import PATTERNS, check_sizes

    if args.options:
        raise ValueError("-O: the sweep's APIs read no options")
    if args.read and not args.write:
        raise ValueError("--sweep reads the steps it wrote: give -w -r (the default) or -w")
    patterns = _names(args.sweep_patterns, PATTERNS, "--sweep-patterns")
    calls = () if args.calls.strip() == "none" else _names(args.calls, FILE_CALLS, "--calls")
    swept = sizes(args.sweep, "--sweep")
    if args.batch < 0:
        raise ValueError(f"--batch {args.batch}: 0 (no batches) or more arrays")
    if args.batch_sizes:
        batch_sizes = sizes(args.batch_sizes, "--batch-sizes")
    else:
        batch_sizes = tuple(s for s in swept if s * args.batch <= BATCH_BYTES)
    check_sizes([*swept, *batch_sizes], args.runs)
    apis = _apis(args)
    skipped = {}
    batch_apis = apis
    if args.batch:
        why = many_unavailable()
        if why:
            skipped[BATCH_API] = why
        batch_apis = (*(() if why else (BATCH_API,)), *apis, CEILING_API)
    n = args.iterations
    if n is not None and n < 1:
        raise ValueError(f"-i {n}: at least one call")
    fixed = Budget(n, n, 0.0) if n else None
    cfg = SweepConfig(
        swept, patterns, apis, args.runs, args.batch, batch_sizes if args.batch else (),
        batch_apis, calls, bool(args.fsync), not (args.write and not args.read),
        args.check_write, args.check_read, fixed or Budget(5, 50, args.sweep_time),
        fixed or Budget(3, 50, args.sweep_time), hints=tuple(hints), keep=args.keep_file,
        call_apis=(*apis, CEILING_API),
    )  # fmt: skip
    return cfg, skipped
