"""Write the cases of ``zarr_cases`` through collio (run under mpiexec).

Usage: mpiexec -n 4 python zarr_job.py OUTDIR CASE...  Each rank also reads its
piece back through collio; rank 0 writes OUTDIR/results.json.
"""

import json
import os
import sys

import numpy as np
from mpi4py import MPI
from zarr_cases import BY_NAME, local, reference

import collio

comm = MPI.COMM_WORLD
outdir, names = sys.argv[1], sys.argv[2:]
results = {}
for name in names:
    case = BY_NAME[name]
    path = os.path.join(outdir, f"{name}.zarr")
    ok = True
    for mode, make, seed in case.phases:
        lay = make(comm.rank, comm.size)
        mine = local(lay, reference(case.shape, case.dtype, seed))
        opts = {"shape": case.shape, "dtype": case.dtype, **case.create()} if mode == "w" else {}
        hints = {"cb_buffer_size": 1 << 20}  # several rounds: double buffering, partial chunks
        with collio.open(path, mode, comm=comm, backend="zarr", hints=hints, **opts) as f:
            f.write_all(mine, lay)
            written = f.stats.as_dict()
            back = f.read_all(lay)
            stats = f.stats.as_dict()
        ok = ok and np.array_equal(back, mine)
    results[name] = {
        "readback": all(comm.allgather(ok)),
        "domains": stats["backend"]["domains"],
        "kept": stats["backend"].get("kept"),
        "aggregators": list(stats["aggregators"]),
        "write_ops": written["write_ops"],
        "fill_reads": written["read_ops"],
        "read_ops": stats["read_ops"] - written["read_ops"],
        "direct_calls": stats["direct_calls"],
    }
if comm.rank == 0:
    with open(os.path.join(outdir, "results.json"), "w") as fh:
        json.dump(results, fh)
