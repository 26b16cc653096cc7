"""What two-phase writing can reach on this machine, without collio: the bare pipeline.

    mpiexec -n 4 python examples/bare_pipeline.py [--size 4096] [--window 4] [-i 12]
    mpiexec -n 4 python examples/bare_pipeline.py --with-collio -i 40

An N x N float64 matrix in column blocks is written by raw mpi4py and os calls only:
each rank is the aggregator of a contiguous quarter of the file; in each round every
rank sends each aggregator its runs of that aggregator's window (``Isend`` from a
contiguous slice, ``Irecv`` with an hindexed type into the round buffer), and an I/O
thread writes the window (``pwrite`` + ``sync_file_range``) while the next round is
exchanged (two buffers); then ``fsync``.  No checks, no agreement, no planning, no
error handling: a floor for any two-phase library's overhead, measured in the same
job as the ceiling (each rank's share as one ``pwrite`` + ``fsync``), alternating.
The file is checked against the matrix once at the end.

``--with-collio`` adds collio's ``open`` / ``write_all`` / ``sync`` / ``close`` of the
same matrix to the job (the three run in balanced orders, as ``collio-bench`` does) and
prints the medians of each phase, the slowest rank's: where collio's time goes beyond
the bare pipeline's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import collio  # first: it turns on MPICH's single-copy messages before mpi4py starts MPI

# isort: split
from mpi4py import MPI

import collio.layouts
from collio.backends.fsync import SYNC_FILE_RANGE_WRITE, sync_file_range
from collio.bench.run import balanced_orders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="N of the N x N float64 matrix")
    ap.add_argument("--window", type=int, default=4, help="MiB per aggregator per round")
    ap.add_argument("-i", "--iterations", type=int, default=12)
    ap.add_argument("-o", "--path", default=None, help="test file (default: a temporary)")
    ap.add_argument("--with-collio", action="store_true", help="run collio in the same job")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    r, p, n = comm.rank, comm.size, a.size
    row, run = n * 8, n * 8 // p  # bytes of a file row, of one rank's piece of it
    share = n * row // p  # bytes each aggregator's domain holds
    window = a.window << 20
    if n % p or share % window or window % row:
        raise SystemExit("--size must split evenly: N % ranks, domain % window, window % row")
    cols = slice(r * n // p, (r + 1) * n // p)
    glob_rows = np.arange(n, dtype=np.float64)[:, None] * n
    local = np.ascontiguousarray(glob_rows + np.arange(n, dtype=np.float64)[None, cols])
    data = local.view(np.uint8).reshape(-1)  # rank r's rows of its column block
    rows_per_win = window // row
    types = [
        MPI.BYTE.Create_hindexed_block(
            run, (np.arange(rows_per_win) * row + s * run).tolist()
        ).Commit()
        for s in range(p)
    ]
    bufs = [np.empty(window, np.uint8) for _ in range(2)]
    pool = ThreadPoolExecutor(1)
    tmp = None
    if a.path is None:
        tmp = comm.bcast(tempfile.mkdtemp(prefix="bare-") if r == 0 else None)
    path = a.path or os.path.join(tmp, "matrix.bin")

    def write_window(fd: int, buf: np.ndarray, off: int) -> None:
        os.pwrite(fd, buf, off)
        if sync_file_range is not None:
            sync_file_range(fd, off, len(buf), SYNC_FILE_RANGE_WRITE)

    def fresh() -> float:
        if r == 0 and os.path.exists(path):
            os.unlink(path)
        comm.Barrier()
        return time.perf_counter()

    def pipeline() -> float:
        t0 = fresh()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        pending = [None, None]
        for k in range(share // window):
            b = k % 2
            if pending[b] is not None:
                pending[b].result()
            reqs = [comm.Irecv([bufs[b], 1, types[s]], s, 7) for s in range(p)]
            for agg in range(p):  # my rows of aggregator agg's k-th window
                first = (agg * share + k * window) // row
                piece = data[first * run : (first + rows_per_win) * run]
                reqs.append(comm.Isend([piece, MPI.BYTE], agg, 7))
            MPI.Request.Waitall(reqs)
            pending[b] = pool.submit(write_window, fd, bufs[b], r * share + k * window)
        for f in pending:
            if f is not None:
                f.result()
        os.fsync(fd)
        os.close(fd)
        comm.Barrier()
        return time.perf_counter() - t0

    whole = None

    def ceiling() -> float:
        nonlocal whole
        if whole is None:  # the same bytes, rank r's 1/p share of the file
            whole = (
                np.ascontiguousarray(
                    glob_rows[r * n // p : (r + 1) * n // p] + np.arange(n)[None, :]
                )
                .view(np.uint8)
                .reshape(-1)
            )
        t0 = fresh()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        os.pwrite(fd, whole, r * share)
        os.fsync(fd)
        os.close(fd)
        comm.Barrier()
        return time.perf_counter() - t0

    phases: list[list[float]] = []  # collio: open, write_all, sync, close + barrier

    def with_collio() -> float:
        lay = collio.layouts.block((n, n), "<f8", comm=comm, grid=(1, p))
        t0 = fresh()
        f = collio.open(path, "w", comm=comm)
        t1 = time.perf_counter()
        f.write_all(local, lay)
        t2 = time.perf_counter()
        f.sync()
        t3 = time.perf_counter()
        f.close()
        comm.Barrier()
        t4 = time.perf_counter()
        phases.append([t1 - t0, t2 - t1, t3 - t2, t4 - t3])
        return t4 - t0

    runs = {"bare pipeline": pipeline, "ceiling": ceiling}
    if a.with_collio:
        runs["collio"] = with_collio
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    orders = balanced_orders(len(names))
    for it in range(a.iterations):
        for i in orders[it % len(orders)]:
            times[names[i]].append(runs[names[i]]())
    slowest = np.max(comm.gather(np.array(phases), root=0) or [np.zeros((0, 4))], axis=0)
    pipeline()  # leave the pipeline's file, then check it
    ok = True
    if r == 0:
        got = np.fromfile(path, np.float64)
        ok = bool(np.array_equal(got, np.arange(n * n, dtype=np.float64)))
    ok = comm.bcast(ok)
    if r == 0:
        mib = n * n * 8 / 2**20
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(
            f"{n}x{n} float64 in column blocks, {p} ranks, windows of {a.window} MiB, "
            f"medians of {a.iterations}, fsync included"
        )
        for k, v in med.items():
            print(f"{k:<14} {1e3 * v:7.1f} ms  {mib / v:7.0f} MiB/s")
        ratio = med["ceiling"] / med["bare pipeline"]
        print(f"bare pipeline / ceiling: {ratio:.2f}  file ok: {ok}")
        if a.with_collio:
            print(f"collio / ceiling: {med['ceiling'] / med['collio']:.2f}")
            o, w, y, c = (1e3 * np.median(slowest, axis=0)).tolist()
            print(
                f"collio phases, slowest rank, ms: open {o:.1f}  write_all {w:.1f}  "
                f"sync {y:.1f}  close+barrier {c:.1f}"
            )
        if tmp:
            os.unlink(path)
            os.rmdir(tmp)
    for t in types:
        t.Free()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
