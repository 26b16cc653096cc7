"""A time series of small collective calls: per-call time of collio beside MPI.File.

Every rank writes (then reads back) ``--size`` bytes per call at a new offset each
call, in a file kept open, contiguous (one run per rank) or strided (``--runs`` runs
per rank, interleaved with the other ranks').  Prints the median and best per-call
time of ``write_at_all`` and ``read_at_all`` for collio and for ROMIO (mpi4py's
``MPI.File``), and checks that both files hold the same bytes.

    mpiexec -n 4 python examples/small_calls.py --size 4096 --calls 2000
"""

from __future__ import annotations

import argparse
import builtins
import os
import tempfile
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import collio


def _view(f: Any, comm: MPI.Intracomm, size: int, runs: int, strided: bool) -> None:
    """Strided: each rank's view holds ``runs`` blocks of each step, interleaved with the
    other ranks' (contiguous: the default view, one run per rank at its offset)."""
    if not strided:
        return
    block, p = size // runs, comm.Get_size()
    vec = MPI.BYTE.Create_vector(runs, block, block * p)
    ft = vec.Create_resized(0, size * p)
    ft.Commit()
    if isinstance(f, MPI.File):
        f.Set_view(comm.Get_rank() * block, MPI.BYTE, ft)
    else:
        f.set_view(comm.Get_rank() * block, MPI.BYTE, ft)
    ft.Free()
    vec.Free()


def _offset(step: int, comm: MPI.Intracomm, size: int, strided: bool) -> int:
    """The call's offset in etypes (bytes) of the view."""
    if strided:
        return step * size
    return (step * comm.Get_size() + comm.Get_rank()) * size


def main(
    comm: MPI.Intracomm | None = None,
    directory: str | None = None,
    *,
    size: int = 4096,
    calls: int = 200,
    runs: int = 64,
    strided: bool = False,
) -> None:
    """Time ``calls`` writes then reads of each library; raise if a read or the files
    differ from what was written; rank 0 prints the table."""
    comm = MPI.COMM_WORLD if comm is None else comm
    rank = comm.Get_rank()
    base = comm.bcast(tempfile.mkdtemp(dir=directory) if rank == 0 else None)
    data = [np.full(size, (rank * 31 + k) % 251, np.uint8) for k in range(8)]
    out = np.empty(size, np.uint8)
    times: dict[str, list[float]] = {}
    paths = {"collio": os.path.join(base, "collio.bin"), "MPI.File": os.path.join(base, "mpi.bin")}
    for name, path in paths.items():
        if name == "collio":
            f = collio.open(path, "w", comm=comm)
            write, read, close = f.write_at_all, f.read_at_all, f.close
        else:
            f = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR)
            write, read, close = f.Write_at_all, f.Read_at_all, f.Close
        _view(f, comm, size, runs, strided)
        for kind in ("write", "read"):
            call = write if kind == "write" else read
            got = times.setdefault(f"{kind} {name}", [])
            comm.Barrier()
            for step in range(calls):
                off = _offset(step, comm, size, strided)
                buf = data[step % 8] if kind == "write" else out
                t = time.perf_counter()
                call(off, buf)
                got.append(time.perf_counter() - t)
                if kind == "read" and not np.array_equal(out, data[step % 8]):
                    raise AssertionError(f"rank {rank}: {name} read wrong bytes at step {step}")
        close()
    comm.Barrier()
    same = None
    if rank == 0:
        with builtins.open(paths["collio"], "rb") as x, builtins.open(paths["MPI.File"], "rb") as y:
            same = x.read() == y.read()
        shape = f"{runs} runs" if strided else "contiguous"
        print(f"{comm.Get_size()} ranks, {size} B per rank per call ({shape}), {calls} calls")
        print(f"{'call':<18}{'median us':>12}{'best us':>10}{'p90 us':>10}")
        for key, t in times.items():
            us = np.array(t) * 1e6
            print(f"{key:<18}{np.median(us):>12.1f}{us.min():>10.1f}{np.percentile(us, 90):>10.1f}")
        print("files identical" if same else "FILES DIFFER")
        for p in paths.values():
            os.remove(p)
        os.rmdir(base)
    if not comm.bcast(same):
        raise AssertionError("collio's file differs from MPI.File's")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="bytes per rank per call")
    ap.add_argument("--calls", type=int, default=2000, help="calls of each kind")
    ap.add_argument("--runs", type=int, default=64, help="runs per rank (--strided)")
    ap.add_argument("--strided", action="store_true", help="interleaved runs, through a view")
    ap.add_argument("--dir", default=None, help="directory of the files (default: a temp dir)")
    a = ap.parse_args()
    main(directory=a.dir, size=a.size, calls=a.calls, runs=a.runs, strided=a.strided)
