"""collio.mpi's nonblocking collectives in a job whose MPI allows no second thread.

Run in a job of its own: the thread level is chosen before MPI starts.  The calls then
run when they are made (no worker thread), and write what they would have written.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from collio.testing.jobs import MPIEXEC, mpiexec

JOB = """
import sys, threading
import mpi4py
mpi4py.rc.thread_level = "single"
from mpi4py import MPI
import numpy as np
from collio import mpi

comm = MPI.COMM_WORLD
assert MPI.Query_thread() == MPI.THREAD_SINGLE
fh = mpi.File.Open(comm, sys.argv[1], MPI.MODE_CREATE | MPI.MODE_WRONLY)
fh.Iwrite_at_all(8 * comm.rank, np.full(1, comm.rank, np.int64)).Wait()
fh.Set_view(0, MPI.INT64_T)
fh.Seek(comm.size + 2 * comm.rank)
req = fh.Iwrite_all(np.full(1, 10 + comm.rank, np.int64))
fh.Write_all_begin(np.full(1, 20 + comm.rank, np.int64))
fh.Write_all_end(None)
MPI.Request.Waitall([req])
assert [t for t in threading.enumerate() if t.name.startswith("collio.mpi")] == []
fh.Close()
"""


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
def test_nonblocking_collectives_without_thread_multiple(tmp_path):
    script, out = tmp_path / "job.py", tmp_path / "out.bin"
    script.write_text(JOB)
    proc = mpiexec([sys.executable, str(script), str(out)], n=3, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.fromfile(out, np.int64)
    # [0, 1, 2] at etypes 0..2, then each rank's Iwrite_all and, right after it, its
    # split collective
    want = np.array([0, 1, 2, 10, 20, 11, 21, 12, 22], np.int64)
    np.testing.assert_array_equal(got, want)
