"""Negative control (run under mpiexec): ranks writing one shared shard with plain zarr.

Every rank writes its own quadrant, aligned to the inner chunks, straight into
the same shard; zarr re-encodes the whole shard on every write, so writers
overwrite each other.  The same decomposition then goes through collio.
Usage: mpiexec -n 4 python zarr_race_job.py OUTDIR
"""

import json
import os
import sys

import numpy as np
import zarr
from mpi4py import MPI

import collio
from collio import layouts

comm = MPI.COMM_WORLD
outdir = sys.argv[1]
SHAPE, CHUNKS, SHARDS = (400, 400), (50, 50), (400, 400)
glob = np.arange(SHAPE[0] * SHAPE[1], dtype="<i4").reshape(SHAPE) + 1
lay = layouts.block(SHAPE, "<i4", comm=comm)
mine = np.ascontiguousarray(glob[lay.slices])
opts = {"shape": SHAPE, "dtype": "<i4", "chunks": CHUNKS, "shards": SHARDS, "fill_value": 0}

lost, trials = False, 0
while not lost and trials < 8:
    path = os.path.join(outdir, f"plain-{trials}.zarr")
    if comm.rank == 0:
        zarr.create_array(path, overwrite=True, **opts)
    comm.Barrier()
    arr = zarr.open_array(path, mode="r+")
    comm.Barrier()
    rows = lay.slices[0]
    for r0 in range(rows.start, rows.stop, CHUNKS[0]):  # one shard rewrite per strip
        strip = slice(r0, min(r0 + CHUNKS[0], rows.stop))
        arr[strip, lay.slices[1]] = glob[strip, lay.slices[1]]
    comm.Barrier()
    lost = bool(
        comm.bcast(
            not np.array_equal(zarr.open_array(path, mode="r")[...], glob)
            if comm.rank == 0
            else None
        )
    )
    trials += 1

path = os.path.join(outdir, "collio.zarr")
with collio.open(path, "w", comm=comm, backend="zarr", **opts) as f:
    f.write_all(mine, lay)
if comm.rank == 0:
    with open(os.path.join(outdir, "race.json"), "w") as fh:
        json.dump({"lost": lost, "trials": trials, "plain": f"plain-{trials - 1}.zarr"}, fh)
