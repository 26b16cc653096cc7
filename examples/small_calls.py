"""Latency of small collective calls: collio against ROMIO in the same job.

    mpiexec -n 4 python examples/small_calls.py [-i 300]

Per call, a barrier, then the call; the slowest rank's time, median over ``-i`` calls.
``write_all`` of 8 bytes and of 1 MiB per rank (contiguous, disjoint: the direct path)
alternates with ``MPI.File.Write_at_all`` of the same bytes through mpi4py (ROMIO);
then ``sync()`` with nothing written, and ``collio.open(..., "r+")`` / ``close()``.
The files are checked once at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import collio
from collio import layouts


def _median_ms(comm: MPI.Intracomm, times: list[float]) -> float:
    mine = np.array(times)
    slowest = np.empty_like(mine)
    comm.Allreduce(mine, slowest, op=MPI.MAX)
    return float(np.median(slowest)) * 1e3


def _timed(comm: MPI.Intracomm, fn: Callable[..., object], *args: object) -> float:
    comm.Barrier()
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def _append_open(box: list[collio.File], path: str, comm: MPI.Intracomm) -> None:
    box.append(collio.open(path, "r+", comm=comm))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-i", "--iterations", type=int, default=300)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    tmp = comm.bcast(tempfile.mkdtemp(prefix="collio-small-") if comm.rank == 0 else None)
    try:
        for n in (1, 1 << 17):  # float64 per rank: 8 bytes, 1 MiB
            data = np.full(n, comm.rank + 1, np.float64)
            lay = layouts.Subarray((n * comm.size,), (n * comm.rank,), (n,), "<f8")
            ours, theirs = os.path.join(tmp, "collio.bin"), os.path.join(tmp, "romio.bin")
            f = collio.open(ours, "w", comm=comm)
            fh = MPI.File.Open(comm, theirs, MPI.MODE_CREATE | MPI.MODE_RDWR)
            res: dict[str, list[float]] = {"collio": [], "romio": []}
            for i in range(args.iterations):
                for name in ("collio", "romio") if i % 2 else ("romio", "collio"):
                    if name == "collio":
                        res[name].append(_timed(comm, f.write_all, data, lay))
                    else:
                        res[name].append(_timed(comm, fh.Write_at_all, n * 8 * comm.rank, data))
            f.close()
            fh.Close()
            a, b = (_median_ms(comm, res[k]) for k in ("collio", "romio"))
            if comm.rank == 0:
                for path in (ours, theirs):
                    got = np.fromfile(path, np.float64)
                    want = np.repeat(np.arange(1, comm.size + 1, dtype=np.float64), n)
                    assert np.array_equal(got, want), path
                print(f"write_all {n * 8} B per rank: collio {a:.3f} ms, ROMIO {b:.3f} ms")
        f = collio.open(ours, "r+", comm=comm)
        t_sync = [_timed(comm, f.sync) for _ in range(args.iterations)]
        f.close()
        t_open: list[float] = []
        t_close: list[float] = []
        box: list[collio.File] = []
        for _ in range(args.iterations):
            t_open.append(_timed(comm, _append_open, box, ours, comm))
            t_close.append(_timed(comm, box.pop().close))
        figures = [(k, _median_ms(comm, v)) for k, v in (("sync()", t_sync), ("open", t_open))]
        figures.append(("close()", _median_ms(comm, t_close)))
        if comm.rank == 0:
            print(", ".join(f"{k} {v:.3f} ms" for k, v in figures) + " (nothing written)")
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
