"""Measure how a round with holes keeps old bytes: read-modify-write vs writing covered runs.

    mpiexec -n 4 python examples/holes_policy.py

Rank 0 fills a 128 MiB file with ones in a new temporary directory; then every rank writes
its share (round robin) of a strided pattern into it with ``collio.open(..., "r+")`` and
``romio_cb_write=enable``, once with ``holes="rmw"`` and once with ``holes="runs"`` per
iteration.  Two patterns: few large holes (3 MiB written, 1 MiB gap) and many small holes
(4 KiB written, 4 KiB gap).  Each write (open, write_all, sync, close) is timed between two
barriers; rank 0 prints the median bandwidth of each policy per pattern.  ``runs`` on the
many-small-holes pattern is slow, so it only runs in the first 3 of the 7 iterations.
"""

import os
import tempfile
import time

import numpy as np

import collio  # first: it turns on MPICH's single-copy messages before mpi4py starts MPI

# isort: split
from mpi4py import MPI

from collio import layouts

SIZE = 128 << 20  # bytes in the file
ITERATIONS = 7
HINTS = {"romio_cb_write": "enable"}


def pattern(comm: MPI.Comm, run: int, gap: int) -> layouts.Segments:
    """This rank's runs of ``run`` bytes every ``run + gap`` bytes, dealt round robin."""
    period = run + gap
    n = SIZE // period
    idx = np.arange(comm.rank, n, comm.size)
    return layouts.Segments(idx * period, np.full(len(idx), run))


def main() -> None:
    comm = MPI.COMM_WORLD
    path = os.path.join(comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None), "h.bin")
    if comm.rank == 0:
        with open(path, "wb") as f:
            f.write(np.ones(SIZE, np.uint8).tobytes())
    comm.Barrier()

    patterns = {
        "few large holes (3M run/1M gap)": pattern(comm, 3 << 20, 1 << 20),
        "many small holes (4K run/4K gap)": pattern(comm, 4096, 4096),
    }
    for name, lay in patterns.items():
        data = np.full(lay.nbytes, 7, np.uint8)
        times: dict[str, list[float]] = {policy: [] for policy in ("rmw", "runs")}
        for it in range(ITERATIONS):
            for policy in times:
                if policy == "runs" and "small" in name and it > 2:
                    continue
                comm.Barrier()
                t = time.perf_counter()
                with collio.open(path, "r+", holes=policy, hints=HINTS) as f:
                    f.write_all(data, lay)
                    f.sync()
                comm.Barrier()
                times[policy].append(time.perf_counter() - t)
        if comm.rank == 0:
            mib = lay.nbytes * comm.size / 2**20
            rates = (f"{policy} {mib / np.median(v):.0f} MiB/s" for policy, v in times.items())
            print(name, " ".join(rates))


if __name__ == "__main__":
    main()
