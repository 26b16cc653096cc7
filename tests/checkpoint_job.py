"""The MPI side of tests/test_checkpoint_jobs.py: save in one job, load in another.

``mpiexec -n N python tests/checkpoint_job.py CASE PATH``; prints ``ok`` on rank 0
when every rank got what it must.  Cases: ``save``; ``load`` (the test state's other
decomposition at this job's size, and the saving decomposition when the size is
the saver's); ``killed`` (save over PATH, rank 1 killed inside the write).
"""

from __future__ import annotations

import os
import signal
import sys

from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio.testing import checkpoint as model

comm = MPI.COMM_WORLD


def _check(got: dict[str, object], spec: dict[str, object]) -> None:
    for name, lay in spec.items():
        want = model.expected(name, lay)  # type: ignore[arg-type]
        arr = got[name]
        assert arr.tobytes(order="A") == want.tobytes(order="A"), (comm.rank, name)  # type: ignore[attr-defined]


def main(case: str, path: str) -> None:
    if case == "save":
        ckpt.save(path, model.save_state(comm.rank, comm.size), metadata={"ranks": comm.size})
    elif case == "load":
        saved = ckpt.info(path).metadata["ranks"]
        spec = model.load_spec(comm.rank, comm.size)
        _check(ckpt.load(path, spec), spec)
        if saved == comm.size:
            same = dict(model.save_layouts(comm.rank, comm.size))
            _check(ckpt.load(path, same), same)
    elif case == "killed":
        write_many = collio.File.write_all_many

        def dying(self: collio.File, items: object) -> None:
            if comm.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            write_many(self, items)

        collio.File.write_all_many = dying  # type: ignore[method-assign]
        ckpt.save(path, model.save_state(comm.rank, comm.size))
    comm.Barrier()
    if comm.rank == 0:
        print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
