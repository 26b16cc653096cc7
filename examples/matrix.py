"""Write and read back a matrix in column blocks: collio next to ROMIO and the disk's ceiling.

    mpiexec -n 4 python examples/matrix.py [--size 4096] [--repeat 5] [--dir DIR]

Every iteration runs, in turn: collio, ROMIO with its defaults, ROMIO tuned the way
an expert would (cb_nodes = ranks, cb_config_list = *:*), and the ceiling (each rank
writes its 1/p share as one contiguous pwrite + fsync).  Writes include fsync.
Medians and same-run ratios are printed on rank 0; the data is verified.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

import collio  # first: it turns on MPICH's single-copy messages before mpi4py starts MPI

# isort: split
from mpi4py import MPI

from collio import layouts
from collio.testing.romio import filetype

comm = MPI.COMM_WORLD


def timed(fn):
    comm.Barrier()
    t = time.perf_counter()
    fn()
    comm.Barrier()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="matrix is SIZE x SIZE float64")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the test file goes (default: a temp dir)")
    args = ap.parse_args()
    n, p, r = args.size, comm.size, comm.rank
    tmp = tempfile.mkdtemp(prefix="collio-matrix-", dir=args.dir) if r == 0 else None
    path = os.path.join(comm.bcast(tmp, root=0), "matrix.bin")
    lay = layouts.block((n, n), "<f8", comm=comm, grid=(1, p))
    local = np.ascontiguousarray(
        np.add.outer(
            np.arange(n, dtype="<f8") * n, np.arange(lay.start[1], lay.start[1] + lay.shape[1])
        )
    )
    back = np.empty_like(local)
    tuned = MPI.Info.Create()
    tuned.Set("cb_nodes", str(p))
    tuned.Set("cb_config_list", "*:*")
    et, ft, _ = filetype(lay, comm)

    def fresh():
        if r == 0 and os.path.exists(path):
            os.unlink(path)
        comm.Barrier()

    def collio_write():
        with collio.open(path, "w", comm=comm) as f:
            f.write_all(local, lay)
            f.sync()

    def collio_read():
        with collio.open(path, "r", comm=comm) as f:
            f.read_all(lay, out=back)

    def romio_write(info):
        fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY, info)
        fh.Set_view(0, et, ft)
        fh.Write_all(local)
        fh.Sync()
        fh.Close()

    def romio_read(info):
        fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY, info)
        fh.Set_view(0, et, ft)
        fh.Read_all(back)
        fh.Close()

    share = n * n * 8 // p
    mine = local.tobytes()[:share] if share else b""

    def ceiling():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        os.pwrite(fd, mine, r * share)
        os.fsync(fd)
        os.close(fd)

    times: dict[str, list[float]] = {k: [] for k in (
        "collio write", "collio read", "ROMIO default write", "ROMIO default read",
        "ROMIO tuned write", "ROMIO tuned read", "ceiling write")}  # fmt: skip
    ok = True
    for i in range(args.repeat):
        fresh()
        times["collio write"].append(timed(collio_write))
        back[...] = 0
        times["collio read"].append(timed(collio_read))
        ok &= bool(np.array_equal(back, local))
        for name, info in (("default", MPI.INFO_NULL), ("tuned", tuned)):
            fresh()
            times[f"ROMIO {name} write"].append(timed(lambda info=info: romio_write(info)))
            times[f"ROMIO {name} read"].append(timed(lambda info=info: romio_read(info)))
        fresh()
        times["ceiling write"].append(timed(ceiling))
        if r == 0:
            print(f"iteration {i + 1}/{args.repeat} done", flush=True)
    ok = comm.allreduce(ok, op=MPI.LAND)
    et.Free()
    ft.Free()
    tuned.Free()
    if r == 0:
        mib = n * n * 8 / 2**20
        med = {k: mib / float(np.median(v)) for k, v in times.items()}
        print(f"\n{n} x {n} float64 ({mib:.0f} MiB) in column blocks, {p} ranks, "
              f"{args.repeat} alternating iterations, fsync included; medians:")  # fmt: skip
        for k, v in med.items():
            print(f"  {k:<20} {v:8.0f} MiB/s")
        print("ratios (same run):")
        print(f"  collio write / ceiling       {med['collio write'] / med['ceiling write']:.2f}")
        print(
            f"  collio write / ROMIO tuned   {med['collio write'] / med['ROMIO tuned write']:.2f}"
        )
        print(
            f"  collio write / ROMIO default {med['collio write'] / med['ROMIO default write']:.2f}"
        )
        print(f"  collio read  / ROMIO tuned   {med['collio read'] / med['ROMIO tuned read']:.2f}")
        print(
            f"  collio read  / ROMIO default {med['collio read'] / med['ROMIO default read']:.2f}"
        )
        print("data verified" if ok else "DATA MISMATCH")
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    if not ok:
        comm.Abort(1)


if __name__ == "__main__":
    main()
