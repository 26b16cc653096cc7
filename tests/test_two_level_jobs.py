"""Two-level aggregation in jobs of their own: 8 ranks as 2 and 4 emulated nodes, and a
local aggregator whose writes fail mid-call (``ulimit -f`` on its rank, before MPI starts).

The suite's own ranks (4, 1, 3) run mpi_tests/test_two_level.py with nodes emulated
inside the job; 8 ranks need a job started here.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import numpy as np
import pytest

from collio.testing.jobs import MPIEXEC, mpiexec

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("per_node", [4, 2])
def test_eight_ranks_on_emulated_nodes(per_node):
    test = os.path.join(ROOT, "mpi_tests", "test_two_level.py")
    args = ["-n", "8", sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi", test, "-q"]
    args += ["-p", "no:randomly"]
    proc = mpiexec(args, timeout=300, env={"COLLIO_RANKS_PER_NODE": str(per_node)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "21 passed" in proc.stdout and "skipped" not in proc.stdout


FAILING_JOB = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from mpi4py import MPI
    import collio
    from collio import layouts
    comm = MPI.COMM_WORLD
    d = sys.argv[1]
    lay = layouts.block((1024, 4096), "<f8", comm=comm, grid=(1, comm.size))
    hints = {"cb_two_level": "enable", "cb_min_message": 0, "cb_buffer_size": 1 << 20}
    out = {}
    with collio.open(os.path.join(d, "f.bin"), "w", comm=comm, hints=hints) as f:
        try:
            f.write_all(np.full(lay.shape, comm.rank, "<f8"), lay)
        except collio.CollioError as exc:
            out = {"cls": type(exc).__name__, "msg": str(exc),
                   "errno": getattr(exc, "errno", None), "ranks": list(exc.ranks)}
        out["local"] = f.stats.hints["local_aggregator_ranks"]
        out["two_level"] = f.stats.hints["cb_local_aggregators"]
    small = layouts.block((64, 64), "<f8", comm=comm)
    with collio.open(os.path.join(d, "small.bin"), "w", comm=comm, hints=hints) as f:
        f.write_all(np.full(small.shape, comm.rank, "<f8"), small)
        out["continued"] = bool((f.read_all(small) == comm.rank).all())
    with open(os.path.join(d, f"result-{comm.rank}.json"), "w") as fh:
        json.dump(out, fh)
    """
)


def test_local_aggregator_failing_mid_call_is_agreed(tmp_path):
    """Rank 2 is the second node's local aggregator and a file-domain aggregator (domain:
    the file's third quarter, 8 MiB from 16 MiB, in 8 rounds); it cannot write past
    20,000 KiB (MPI itself needs a little less to start), so its fourth round fails:
    every rank raises the same error naming it, nothing hangs, the job goes on."""
    script = tmp_path / "job.py"
    script.write_text(FAILING_JOB)
    py = sys.executable
    limited = f"ulimit -f 20000; exec {py} {script} {tmp_path}"
    args = [
        "-n", "2", py, str(script), str(tmp_path), ":", "-n", "1", "bash", "-c", limited, ":",
        "-n", "1", py, str(script), str(tmp_path),
    ]  # fmt: skip
    proc = mpiexec(args, timeout=120, env={"COLLIO_RANKS_PER_NODE": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(4)]
    assert all(r == results[0] for r in results), results
    r = results[0]
    assert r["local"] == [0, 2] and r["two_level"] == 1
    assert r["cls"] == "BackendError" and r["errno"] == 27  # EFBIG
    assert r["ranks"] == [2] and "rank 2: file too large" in r["msg"]
    assert r["continued"] is True
    # the three rounds before the failure were written: rows 512.. of column blocks
    with open(tmp_path / "f.bin", "rb") as fh:
        fh.seek(16 << 20)
        got = np.frombuffer(fh.read(3 << 20), "<f8")
    want = np.broadcast_to(np.arange(4096) // 1024, (96, 4096)).ravel()
    np.testing.assert_array_equal(got, want)
