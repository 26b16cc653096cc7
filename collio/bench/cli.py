"""``collio-bench``: IOR's options for collio, ROMIO and independent I/O, and the simulator.

mpiexec -n 4 collio-bench                       # collio vs ROMIO (default, tuned) vs ceiling
mpiexec -n 4 collio-bench -a collio -w -r -e -i 5 --pattern cyclic --size 4096
mpiexec -n 4 collio-bench --pattern ior -s 4096 -b 8k -t 8k --compare collio,mpiio,mpiio-tuned
mpiexec -n 4 collio-bench --pattern block2d --compare collio-zarr,zarr-plain -O chunks=512
mpiexec -n 4 collio-bench --size 256MiB --compare collio-s3,s3-gather,s3-ceiling
mpiexec -n 4 collio-bench --compare collio-hdf5,hdf5-gather,h5py-mpio
mpiexec -n 4 collio-bench --sweep               # time per call, 8 B to 128 MiB per rank
mpiexec -n 4 collio-bench --sweep 4k,1m --sweep-patterns strided -e --batch 0
collio-bench --simulate --ranks 65536 --pattern colblock --size 1TiB --cb-nodes 512
mpiexec -n 4 collio-bench --calibrate         # the cost model's terms here, and checked
collio-bench --plan-speed
collio-bench --flatten-speed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..hints import Hints, parse_size
from .patterns import PATTERNS, make_workload

__all__ = ["main", "build_parser"]

DEFAULT_APIS = "collio,mpiio,mpiio-tuned,posix,ceiling"


def _size(text: str) -> int:
    return parse_size(text, "size")


def _hints(text: str) -> list[tuple[str, str]]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"hint {item!r} is not key=value")
        out.append((key.strip(), value.strip()))
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="collio-bench",
        description="IOR-style benchmark of collio next to ROMIO, and a planner simulator.",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _ior_options(ap.add_argument_group("IOR options"))
    _sweep_options(ap.add_argument_group("size sweep (--sweep): time per call, file kept open"))
    _sim_options(ap.add_argument_group("simulator (no MPI)"))
    return ap


def _ior_options(io: argparse._ArgumentGroup) -> None:
    io.add_argument("-a", "--api", help="one API (see --list-apis)")
    io.add_argument("--compare", help=f"several APIs, alternating (default {DEFAULT_APIS})")
    io.add_argument(
        "-b",
        "--block-size",
        type=_size,
        default=1 << 20,
        help="ior: bytes per rank per segment (1m)",
    )
    io.add_argument("-t", "--transfer-size", type=_size, default=None,
                    help="bytes per independent request (ior 256k; arrays: a run)")  # fmt: skip
    io.add_argument("-s", "--segments", type=int, default=1, help="ior: segments (1)")
    io.add_argument("-w", "--write", action="store_true", help="write (default: write and read)")
    io.add_argument("-r", "--read", action="store_true", help="read (default: write and read)")
    io.add_argument("-e", "--fsync", action="store_true", default=None,
                    help="fsync after write (on; --sweep: off, -e syncs every call)")  # fmt: skip
    io.add_argument("--no-fsync", dest="fsync", action="store_false", help="no fsync")
    io.add_argument(
        "-i", "--iterations", type=int, default=None,
        help="iterations (default: whole cycles of the balanced orders, at least 5)",
    )  # fmt: skip
    io.add_argument("-o", "--test-file", help="test file (default: in a temporary directory)")
    io.add_argument("-k", "--keep-file", action="store_true", help="keep the test file")
    io.add_argument(
        "-W", "--check-write", action="store_true", help="verify written data every iteration"
    )
    io.add_argument(
        "-R", "--check-read", action="store_true", help="verify read data every iteration"
    )
    io.add_argument(
        "--pattern",
        choices=(*PATTERNS, "checkpoint"),
        default="colblock",
        help="access pattern (colblock); checkpoint: a model state saved and loaded",
    )
    io.add_argument("--size", help="array: 4096 (edge), 4096x2048 or 128MiB; ior: total bytes")
    io.add_argument("--cyclic-block", type=int, default=64, help="cyclic: block edge (64)")
    io.add_argument("--hints", type=_hints, default=[], help="k=v,... for collio and ROMIO")
    io.add_argument(
        "-O", "--options", type=_hints, default=[],
        help="k=v,... for the zarr, S3 and HDF5 APIs (chunks, shards, codec, level, "
        "part_size, ...; see --list-apis)",
    )  # fmt: skip
    io.add_argument(
        "--s3-endpoint", default=os.environ.get("COLLIO_BENCH_S3_ENDPOINT"),
        help="S3 APIs: this store (env COLLIO_BENCH_S3_ENDPOINT; default: a local moto "
        "server started by the benchmark); credentials the usual boto3 way",
    )  # fmt: skip
    io.add_argument("--json", help="write every figure to this JSON file")
    io.add_argument("--plot", help="bandwidth (--sweep: time per call) per API as a PNG "
                    "(matplotlib)")  # fmt: skip
    io.add_argument("--list-apis", action="store_true", help="print the known APIs")


def _sweep_options(sw: argparse._ArgumentGroup) -> None:
    from .sweep.config import DEFAULT_APIS, DEFAULT_CALLS, DEFAULT_SIZES

    sw.add_argument(
        "--sweep", nargs="?", const=DEFAULT_SIZES, metavar="SIZES",
        help=f"time per call at these bytes per rank ({DEFAULT_SIZES}), each call a new step "
        f"of a time series in a file kept open; APIs {DEFAULT_APIS} unless --compare",
    )  # fmt: skip
    sw.add_argument("--sweep-patterns", default="contiguous,strided",
                    help="contiguous (one run per rank), strided (--runs runs per rank, "
                    "interleaved) (both)")  # fmt: skip
    sw.add_argument("--runs", type=int, default=64, help="strided: runs per rank (64)")
    sw.add_argument("--batch", type=int, default=200,
                    help="arrays per rank in one write_all_many against as many calls "
                    "(200; 0: no batches)")  # fmt: skip
    sw.add_argument(
        "--batch-sizes",
        metavar="SIZES",
        help="batch sizes (the sweep's whose batch is at most 256 MiB per rank)",
    )
    sw.add_argument("--calls", default=DEFAULT_CALLS,
                    help=f"file calls timed too ({DEFAULT_CALLS}; none)")  # fmt: skip
    sw.add_argument("--sweep-time", type=float, default=0.5,
                    help="seconds per API and size after which calls stop, from 5 calls "
                    "(batches 3) up to 50 (0.5; -i N: N calls)")  # fmt: skip


def _sim_options(sim: argparse._ArgumentGroup) -> None:
    sim.add_argument("--simulate", action="store_true", help="plan for virtual ranks")
    sim.add_argument("--ranks", type=int, default=65536, help="virtual ranks (65536)")
    sim.add_argument("--ppn", type=int, default=64, help="virtual ranks per node (64)")
    sim.add_argument("--cb-nodes", type=int, help="hint cb_nodes")
    sim.add_argument("--cb-buffer-size", help="hint cb_buffer_size")
    sim.add_argument("--striping-unit", help="hint striping_unit")
    sim.add_argument("--alignment", type=_size, default=1, help="backend alignment (1)")
    sim.add_argument("--min-window", type=_size, default=0,
                     help="backend's smallest round (0; S3: its parts per round)")  # fmt: skip
    sim.add_argument("--whole-windows", action="store_true",
                     help="backend cannot write partial ranges (whole windows)")  # fmt: skip
    sim.add_argument("--local-fs", action="store_true",
                     help="a posix file on a local file system: reads copy from the mapped "
                          "file (hint mapped_reads)")  # fmt: skip
    sim.add_argument("--budget", type=int, default=10_000_000, help="pairs before sampling (1e7)")
    sim.add_argument(
        "--cluster", help="cost model: k=v,... or a JSON file (names: collio.sim.Cluster)"
    )
    sim.add_argument(
        "--calibrate", action="store_true",
        help="under mpiexec: measure the cost model's terms here, run column blocks and "
        "block-cyclic in one and two levels, print predicted vs measured (--size, -i, --json)",
    )  # fmt: skip
    sim.add_argument(
        "--plan-speed", action="store_true", help="time planning 10^6 runs on one rank"
    )
    sim.add_argument(
        "--flatten-speed", action="store_true",
        help="time decoding MPI datatypes of 10^6 runs into byte runs (one process)",
    )  # fmt: skip


def _workload(args: argparse.Namespace, nranks: int) -> Any:
    ior = args.pattern == "ior"
    transfer = args.transfer_size if args.transfer_size is not None else (256 << 10 if ior else 0)
    if ior and args.transfer_size is None:
        transfer = min(transfer, args.block_size)
    return make_workload(
        args.pattern, nranks, size=args.size, block_size=args.block_size, transfer=transfer,
        segments=args.segments, cyclic_block=args.cyclic_block,
    )  # fmt: skip


def _all_hints(args: argparse.Namespace) -> list[tuple[str, str]]:
    hints = list(args.hints)
    for key in ("cb_nodes", "cb_buffer_size", "striping_unit"):
        value = getattr(args, key)
        if value is not None:
            hints.append((key, str(value)))
    return hints


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``collio-bench`` and ``python -m collio.bench``."""
    args = build_parser().parse_args(argv)
    try:
        if args.list_apis:
            print(_list_apis())
            return 0
        if args.plan_speed:
            return _plan_speed(args)
        if args.flatten_speed:
            return _flatten_speed(args)
        if args.simulate:
            return _simulate(args)
        if args.plot:
            _need_matplotlib()
    except ValueError as exc:
        print(f"collio-bench: error: {exc}", file=sys.stderr)
        return 2
    if args.calibrate:
        from .calibrate import calibrate

        return calibrate(args, _workload)
    if args.sweep is not None:
        from .sweep.main import sweep

        return sweep(args, _all_hints(args))
    if args.pattern == "checkpoint":
        from .checkpoint import run_checkpoint

        return run_checkpoint(args)
    from .main import bench

    return bench(args, _workload, _all_hints(args), DEFAULT_APIS)


def _need_matplotlib() -> None:
    """Every rank checks alike before any I/O, not after a long run: is ``--plot`` possible?"""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(
            "--plot needs matplotlib: pip install matplotlib (or pip install -e '.[bench]' in "
            "collio's checkout)"
        ) from None


def _list_apis() -> str:
    """Every known API with what it measures (imports nothing optional)."""
    from .apis import ABOUT, known_apis
    from .options import OPTION_HELP

    lines = [f"{name:<13} {ABOUT.get(name, '')}".rstrip() for name in known_apis()]
    lines += ["", "-O options ([extra] APIs):"]
    lines += [f"  {k:<15} {v}" for k, v in OPTION_HELP.items()]
    return "\n".join(lines)


def _simulate(args: argparse.Namespace) -> int:
    from ..sim import (
        Cluster,
        SimConfig,
        format_predictions,
        format_sim,
        predictions_json,
        sim_json,
        simulate,
        strategies,
    )

    if args.size is None and args.pattern != "ior":
        args.size = "1TiB"
    if args.pattern == "checkpoint":
        return _simulate_checkpoint(args)
    work = _workload(args, args.ranks)
    hints = Hints.coerce(dict(_all_hints(args)))
    cfg = SimConfig(
        hints=hints, backend_alignment=args.alignment, backend_min_window=args.min_window,
        partial_write=not args.whole_windows, ppn=args.ppn, budget=args.budget,
        writing=not (args.read and not args.write), local_fs=args.local_fs,
    )  # fmt: skip
    res = simulate(work, cfg)
    print(format_sim(work, res, args.ppn), flush=True)
    cluster = dataclasses.replace(Cluster.parse(args.cluster), ppn=args.ppn)
    rows = strategies(work, cfg, cluster)
    print(format_predictions(rows, cluster), flush=True)
    if args.json:
        from .machine import command, describe
        from .report import write_json

        doc = {**sim_json(work, res), "command": command(), "machine": describe(".", mpi=False)}
        doc["prediction"] = predictions_json(rows, cluster)
        write_json(args.json, doc)
    return 0


def _simulate_checkpoint(args: argparse.Namespace) -> int:
    """A checkpoint save of ``-s`` arrays (1000 unless given) of ``--size`` in all."""
    from ..hints import parse_size
    from ..sim import SimConfig, format_sim, sim_json, simulate
    from ..sim.checkpoint import checkpoint_plan, checkpoint_workload, format_checkpoint

    t0 = time.perf_counter()
    arrays = args.segments if args.segments > 1 else 1000
    work = checkpoint_workload(args.ranks, arrays, parse_size(args.size, "--size"))
    cfg = SimConfig(hints=Hints.coerce(dict(_all_hints(args))), ppn=args.ppn, budget=args.budget)
    res = simulate(work, cfg)
    plan = checkpoint_plan(work, args.ranks, arrays)
    print(format_sim(work, res, args.ppn), flush=True)
    print(format_checkpoint(plan))
    seconds = time.perf_counter() - t0
    print(f"checkpoint simulation: {seconds:.1f} s in all", flush=True)
    if args.json:
        from .machine import command, describe
        from .report import write_json

        doc = {**sim_json(work, res), "command": command(), "machine": describe(".", mpi=False)}
        write_json(args.json, {**doc, "seconds": seconds, "checkpoint": plan})
    return 0


def _plan_speed(args: argparse.Namespace) -> int:
    from ..sim import plan_speed

    t = plan_speed()
    print(
        f"planning {int(t['runs'])} runs on one rank (medians of 3): flatten {t['flatten']:.3f} s, "
        f"plan_sender {t['plan_sender']:.3f} s, plan_aggregator ({int(t['pieces_at_aggregator'])} "
        f"pieces) {t['plan_aggregator']:.3f} s; total {t['total']:.3f} s"
    )
    return _timings_json(args, t)


def _flatten_speed(args: argparse.Namespace) -> int:
    from .flatten import flatten_speed, format_flatten

    t = flatten_speed()
    print(format_flatten(t))
    return _timings_json(args, t)


def _timings_json(args: argparse.Namespace, t: dict[str, float]) -> int:
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(t, fh, indent=1)
    return 0
