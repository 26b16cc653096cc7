"""HDF5 writes of one matrix in column blocks: collio.h5 beside h5py after a gather.

    mpiexec -n 4 python examples/bench_hdf5.py [--size 4096] [--repeat 5] [--dir DIR]

Each iteration runs every method once, in an order that alternates between
iterations: ``collio`` (contiguous dataset, two-phase write), ``collio-gzip``
(chunked + gzip level 1: aggregators compress, every rank allocates the chunks,
aggregators write them), ``gather-h5py`` (the baseline: Gatherv to rank 0, which
writes the whole dataset with serial h5py) and, only where h5py was built with MPI,
``h5py-mpio`` (``driver="mpio"`` and ``dset.collective``).  Every timing runs from
open to a durable close (fsync included) and is the slowest rank's.  Medians and
ratios to the baseline are printed on rank 0; the files are verified with h5py.

The functions (``run_collio``, ``run_gather``, ``run_mpio``, ``bench``) take plain
arguments so that a ``collio-bench hdf5`` command can call them.
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

import h5py
import numpy as np

import collio  # first: it turns on MPICH's single-copy messages before mpi4py starts MPI

# isort: split
from mpi4py import MPI

import collio.h5
from collio import layouts


def column_piece(n: int, comm: MPI.Comm) -> tuple[layouts.Subarray, np.ndarray]:
    """This rank's column block of the n x n matrix whose element (i, j) is i*n + j."""
    lay = layouts.block((n, n), "<f8", comm=comm, grid=(1, comm.size))
    cols = np.arange(lay.start[1], lay.start[1] + lay.shape[1], dtype="<f8")
    return lay, np.ascontiguousarray(np.add.outer(np.arange(n, dtype="<f8") * n, cols))


def run_collio(path: str, lay: Any, local: np.ndarray, comm: MPI.Comm, **opts: Any) -> dict:
    """Collective: create, write_all, collective close (agree, metadata, fsync)."""
    with collio.h5.File(path, "w", comm=comm) as f:
        d = collio.h5.create_dataset(f, "m", lay.global_shape, "<f8", **opts)
        collio.h5.write_all(d, local, lay)
        timings = dict(collio.h5.session.session_of(f).timings)
    return timings


def run_gather(path: str, lay: Any, local: np.ndarray, comm: MPI.Comm, **opts: Any) -> dict:
    """Collective: Gatherv of the column blocks to rank 0, which writes with serial h5py."""
    n = lay.global_shape[0]
    counts = np.array(comm.allgather(local.size), np.int64)
    whole = np.empty((comm.size, 0)) if comm.rank else np.empty(int(counts.sum()), "<f8")
    comm.Gatherv(local.reshape(-1), [whole, counts, None, MPI.DOUBLE] if comm.rank == 0 else None)
    if comm.rank == 0:
        starts = np.concatenate(([0], np.cumsum(counts)))
        blocks = [whole[a:b].reshape(n, -1) for a, b in zip(starts[:-1], starts[1:], strict=True)]
        matrix = np.concatenate(blocks, axis=1)
        with h5py.File(path, "w") as f:
            f.create_dataset("m", data=matrix, **opts)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return {}


def run_mpio(path: str, lay: Any, local: np.ndarray, comm: MPI.Comm, **opts: Any) -> dict:
    """Collective: parallel h5py (only where h5py was built with MPI)."""
    with h5py.File(path, "w", driver="mpio", comm=comm) as f:
        d = f.create_dataset("m", lay.global_shape, "<f8", **opts)
        with d.collective:
            d[lay.slices] = local
        f.flush()
    return {}


def bench(n: int, repeat: int, directory: str, comm: MPI.Comm) -> dict[str, Any]:
    """Collective: alternate the methods ``repeat`` times; return per-method seconds."""
    lay, local = column_piece(n, comm)
    gz = {"chunks": (256, 256), "compression": "gzip", "compression_opts": 1}
    methods: dict[str, tuple[Callable[..., dict], dict]] = {
        "collio": (run_collio, {}),
        "collio-gzip": (run_collio, gz),
        "gather-h5py": (run_gather, {}),
    }
    if h5py.get_config().mpi:
        methods["h5py-mpio"] = (run_mpio, {})
    times: dict[str, list[float]] = {m: [] for m in methods}
    extra: dict[str, list[float]] = {"allocate_chunks": [], "write_chunks": []}
    names = list(methods)
    for i in range(repeat):
        for name in names if i % 2 == 0 else names[::-1]:
            fn, opts = methods[name]
            path = os.path.join(directory, f"{name}.h5")
            if comm.rank == 0 and os.path.exists(path):
                os.unlink(path)
            comm.Barrier()
            t = time.perf_counter()
            info = fn(path, lay, local, comm, **opts)
            comm.Barrier()
            times[name].append(comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
            for k in extra:
                if k in info and opts:
                    extra[k].append(comm.allreduce(info[k], op=MPI.MAX))
    if comm.rank == 0:
        expect = np.arange(n * n, dtype="<f8").reshape(n, n)
        for name in methods:
            with h5py.File(os.path.join(directory, f"{name}.h5"), "r") as f:
                assert np.array_equal(f["m"][...], expect), f"{name} wrote wrong data"
    return {"times": times, "extra": extra, "nbytes": n * n * 8}


def report(result: dict[str, Any], comm: MPI.Comm) -> str:
    """The summary table (rank 0's view)."""
    mib = result["nbytes"] / 2**20
    base = statistics.median(result["times"]["gather-h5py"])
    lines = [
        f"{mib:.0f} MiB float64 in column blocks, {comm.size} ranks, "
        f"h5py {h5py.version.version} / HDF5 {h5py.version.hdf5_version}, "
        f"h5py MPI build: {bool(h5py.get_config().mpi)}",
        f"{'method':<14}{'median s':>10}{'MiB/s':>10}{'min MiB/s':>11}{'max MiB/s':>11}"
        f"{'vs gather':>11}",
    ]
    for name, ts in result["times"].items():
        med = statistics.median(ts)
        lines.append(
            f"{name:<14}{med:>10.3f}{mib / med:>10.0f}{mib / max(ts):>11.0f}"
            f"{mib / min(ts):>11.0f}{base / med:>10.2f}x"
        )
    if not h5py.get_config().mpi:
        lines.append("h5py-mpio      not run: this h5py is the serial wheel (no MPI build)")
    for k, v in result["extra"].items():
        if v:
            lines.append(f"collio-gzip {k}: median {statistics.median(v) * 1e3:.1f} ms")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="matrix is SIZE x SIZE float64")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    tmp = tempfile.mkdtemp(prefix="collio-h5bench-", dir=args.dir) if comm.rank == 0 else None
    tmp = comm.bcast(tmp, root=0)
    try:
        result = bench(args.size, args.repeat, tmp, comm)
        if comm.rank == 0:
            print(report(result, comm), flush=True)
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
