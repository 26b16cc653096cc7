"""Benchmarks of issue 7: datatype flattening, and the mpiio backend next to posix.

    python examples/bench_mpiio.py flatten [--runs 1000000]
    mpiexec -n 4 python examples/bench_mpiio.py backends [--size 4096] [--repeat 7] [--dir DIR]

``flatten`` times decoding a fresh 3-D subarray and a fresh 2-D darray of about
``--runs`` byte runs each (no cache: new types every repetition).  ``backends``
writes (fsync included) and reads a SIZE x SIZE float64 matrix in column blocks,
alternating posix and mpiio in every iteration, and prints medians and the
mpiio/posix ratio.  The functions return plain dicts, so the ``collio-bench``
CLI can call them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import collio  # first: it turns on MPICH's single-copy messages before mpi4py starts MPI

# isort: split
from mpi4py import MPI

from collio import datatypes, layouts


def _best_of(make: Callable[[], MPI.Datatype], repeat: int) -> tuple[float, int]:
    times, nruns = [], 0
    for _ in range(repeat):
        dt = make().Commit()
        try:
            t = time.perf_counter()
            nruns = datatypes.flatten(dt).nruns
            times.append(time.perf_counter() - t)
        finally:
            dt.Free()
    return statistics.median(times), nruns


def bench_flatten(runs: int = 10**6, repeat: int = 5) -> dict[str, Any]:
    """Seconds to flatten a 3-D subarray and a darray of about ``runs`` runs (medians)."""
    side = int(round(runs**0.5))
    sizes, subsizes, starts = [2 * side, 2 * side, 64], [side, side, 32], [side // 2, side // 2, 16]

    def subarray() -> MPI.Datatype:
        return MPI.DOUBLE.Create_subarray(sizes, subsizes, starts)

    # CYCLIC(4) on a 2 x 2 grid: n/2 local rows of n/8 runs each, n*n/16 runs in all
    n = 4 * int(round(runs**0.5))

    def darray() -> MPI.Datatype:
        dist = [MPI.DISTRIBUTE_CYCLIC] * 2
        return MPI.DOUBLE.Create_darray(4, 1, [n, n], dist, [4, 4], [2, 2])

    t_sub, r_sub = _best_of(subarray, repeat)
    t_dar, r_dar = _best_of(darray, repeat)
    return {
        "subarray_runs": r_sub,
        "subarray_s": t_sub,
        "darray_runs": r_dar,
        "darray_s": t_dar,
    }


def _timed(comm: MPI.Comm, fn: Callable[[], None]) -> float:
    comm.Barrier()
    t = time.perf_counter()
    fn()
    comm.Barrier()
    return time.perf_counter() - t


def bench_backends(
    comm: MPI.Intracomm,
    size: int = 4096,
    repeat: int = 7,
    directory: str | None = None,
    backends: tuple[str, ...] = ("posix", "mpiio"),
    hints: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Collective over `comm`: column-block write (with fsync) and read, backends alternating.

    Returns median MiB/s per backend and the ratio of each to the first.
    """
    tmp = tempfile.mkdtemp(prefix="collio-bench-", dir=directory) if comm.rank == 0 else None
    tmp = comm.bcast(tmp, root=0)
    lay = layouts.block((size, size), "<f8", comm=comm, grid=(1, comm.size))
    cols = np.arange(lay.start[1], lay.start[1] + lay.shape[1], dtype="<f8")
    local = np.ascontiguousarray(np.add.outer(np.arange(size, dtype="<f8") * size, cols))
    back = np.empty_like(local)
    mib = size * size * 8 / 2**20
    w: dict[str, list[float]] = {b: [] for b in backends}
    r: dict[str, list[float]] = {b: [] for b in backends}
    try:
        for it in range(repeat + 1):  # iteration 0 warms up page cache and buffers
            for be in backends:
                path = os.path.join(tmp, f"matrix-{be}.bin")
                if comm.rank == 0 and os.path.exists(path):
                    os.unlink(path)

                def write(be: str = be, path: str = path) -> None:
                    with collio.open(path, "w", comm=comm, backend=be, hints=hints) as f:
                        f.write_all(local, lay)  # close() syncs: fsync is included

                def read(be: str = be, path: str = path) -> None:
                    with collio.open(path, "r", comm=comm, backend=be, hints=hints) as f:
                        f.read_all(lay, out=back)

                tw, tr = _timed(comm, write), _timed(comm, read)
                if not np.array_equal(back, local):
                    raise AssertionError(f"{be}: data read back differs")
                if it:
                    w[be].append(mib / tw)
                    r[be].append(mib / tr)
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, Any] = {"size": size, "ranks": comm.size, "repeat": repeat}
    ref = backends[0]
    for be in backends:
        out[f"{be}_write_mibs"] = statistics.median(w[be])
        out[f"{be}_read_mibs"] = statistics.median(r[be])
        out[f"{be}_write_ratio"] = statistics.median(w[be]) / statistics.median(w[ref])
        out[f"{be}_read_ratio"] = statistics.median(r[be]) / statistics.median(r[ref])
        out[f"{be}_write_all"] = [round(x) for x in w[be]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    fl = sub.add_parser("flatten")
    fl.add_argument("--runs", type=int, default=10**6)
    bk = sub.add_parser("backends")
    bk.add_argument("--size", type=int, default=4096)
    bk.add_argument("--repeat", type=int, default=7)
    bk.add_argument("--dir", default=None)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    if args.what == "flatten":
        if comm.rank == 0:
            res = bench_flatten(args.runs)
            print(
                f"flatten: subarray {res['subarray_runs']} runs in {res['subarray_s']:.3f} s; "
                f"darray {res['darray_runs']} runs in {res['darray_s']:.3f} s"
            )
        return
    res = bench_backends(comm, args.size, args.repeat, args.dir)
    if comm.rank == 0:
        n = res["size"]
        print(f"column blocks {n} x {n} float64, {res['ranks']} ranks, fsync included, medians")
        for be in ("posix", "mpiio"):
            print(
                f"  {be:6s} write {res[f'{be}_write_mibs']:8.1f} MiB/s "
                f"(x{res[f'{be}_write_ratio']:.3f})  read {res[f'{be}_read_mibs']:8.1f} MiB/s "
                f"(x{res[f'{be}_read_ratio']:.3f})  writes: {res[f'{be}_write_all']}"
            )


if __name__ == "__main__":
    main()
