"""Jobs that start their own processes (``collio.testing.jobs``), each under a timeout.

A rank with a file-size limit set before MPI starts (MPMD), pieces over 2 GiB, a variable
read at import, the process's exit: what the suite's own ranks cannot arrange.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from collio.testing.jobs import MPIEXEC, mpiexec, python

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")


EFBIG_JOB = textwrap.dedent(
    """
    import errno, json, os, sys
    import numpy as np
    from mpi4py import MPI
    import collio
    from collio import layouts
    comm = MPI.COMM_WORLD
    d = sys.argv[1]
    shape = (2048, 4096)  # 64 MiB; the last rank may write at most ~20 MB of file
    lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))
    glob = np.arange(shape[0] * shape[1], dtype="<f8").reshape(shape)
    out = {}
    hints = {"cb_buffer_size": 1 << 22}
    with collio.open(os.path.join(d, "big.bin"), "w", comm=comm, hints=hints) as f:
        try:
            f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        except collio.BackendError as exc:
            out = {"cls": type(exc).__name__, "errno": exc.errno, "msg": str(exc)}
            out["ranks"] = list(exc.ranks)
    small = layouts.block((64, 64), "<f8", comm=comm)
    with collio.open(os.path.join(d, "small.bin"), "w", comm=comm) as f:
        f.write_all(np.full(small.shape, comm.rank, "<f8"), small)
        out["continued"] = bool((f.read_all(small) == comm.rank).all())
    with open(os.path.join(d, f"result-{comm.rank}.json"), "w") as fh:
        json.dump(out, fh)
    """
)


def test_efbig_on_one_aggregator_raises_everywhere(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(EFBIG_JOB)
    py = sys.executable
    args = [
        "-n", "3", py, str(script), str(tmp_path), ":",
        "-n", "1", "bash", "-c", f"ulimit -f 20000; exec {py} {script} {tmp_path}",
    ]  # fmt: skip
    proc = mpiexec(args, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(4)]
    assert len(results) == 4
    assert all(r == results[0] for r in results), results
    r = results[0]
    assert r["cls"] == "BackendError" and r["errno"] == 27  # EFBIG
    assert r["ranks"] == [3] and "rank 3: file too large" in r["msg"]
    assert r["continued"] is True


OTHER_USER_JOB = textwrap.dedent(
    """
    import importlib.util, json, os, sys
    from mpi4py import MPI
    import collio
    comm = MPI.COMM_WORLD
    path = sys.argv[1]
    hows = ["posix", "mpiio"] + (["hdf5", "h5"] if importlib.util.find_spec("h5py") else [])
    old = bytes(range(256)) * 20
    out = {}
    for how in hows:
        if comm.rank == 0:
            with open(path, "wb") as fh:
                fh.write(old)
            os.chmod(path, 0o600)  # (the last rank runs as another user)
        comm.Barrier()
        try:
            if how == "h5":
                import collio.h5
                collio.h5.File(path, "w", comm=comm).close()
            else:
                opts = {"dataset": "x", "shape": (4,), "dtype": "<f8"} if how == "hdf5" else {}
                collio.open(path, "w", comm=comm, backend=how, **opts).close()
            got = "ok"
        except collio.CollioError as exc:
            got = f"{type(exc).__name__}: {exc}"
        every = comm.allgather(got)
        comm.Barrier()
        if comm.rank == 0:
            with open(path, "rb") as fh:
                out[how] = {"every": every, "kept": fh.read() == old}
    if comm.rank == 0:
        print(json.dumps(out))
    """
)


@pytest.fixture
def shared_dir():
    """A directory another user may enter (not list), outside pytest's own, which only
    its owner may enter."""
    d = tempfile.mkdtemp(prefix="collio-users-")
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_w_open_that_another_user_cannot_make_keeps_the_file(shared_dir):
    """The last rank of an MPMD job runs as another user and may not open the target
    (which it sees: its directory lets it in): 'w' raises the same error on every rank
    and leaves every byte of the file (posix, HDF5), as MPI-IO's open does."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run a rank as another user")
    path = os.path.join(shared_dir, "theirs.bin")
    py = sys.executable
    other = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", py]
    args = ["-n", "3", py, "-c", OTHER_USER_JOB, path, ":",
            "-n", "1", *other, "-c", OTHER_USER_JOB, path]  # fmt: skip
    # (ranks of two users share no memory segment: messages go through TCP)
    proc = mpiexec(args, timeout=240, env={"UCX_TLS": "tcp,self", "MPIR_CVAR_NOLOCAL": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"posix", "mpiio"} <= set(out), out
    for how, got in out.items():
        assert got["every"] == [got["every"][0]] * 4, (how, got)
        if how != "mpiio":  # (ROMIO's ranks fail together; its message is its own)
            assert "rank 3: permission denied" in got["every"][0], (how, got)
        assert got["kept"], (how, got)


BIG_JOB = textwrap.dedent(
    """
    import os, sys, hashlib
    import numpy as np
    from mpi4py import MPI
    import collio
    from collio import layouts
    comm = MPI.COMM_WORLD
    path, mode = sys.argv[1], sys.argv[2]
    n = (2 << 30) + (160 << 20) + 7  # 2.16 GiB on rank 0, a little on rank 1
    mine = n if comm.rank == 0 else 1000
    start = 0 if comm.rank == 0 else n
    data = np.resize(np.arange(251, dtype=np.uint8), mine)  # a period that no 2**k divides
    lay = layouts.Segments([start], [mine])
    hints = {"romio_cb_write": mode, "romio_cb_read": mode, "cb_buffer_size": "512m"}
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        f.write_all(data, lay)
        back = f.read_all(lay)
        direct = f.stats.direct_calls
    same = bool(np.array_equal(back, data))
    del back
    size = os.path.getsize(path)
    with open(f"{path}.{comm.rank}.txt", "w") as fh:
        fh.write(f"{comm.rank} {same} {size} {direct}")
    """
)


@pytest.mark.parametrize("mode", ["enable", "automatic"])
def test_more_than_2gib_on_one_rank(tmp_path, mode):
    script = tmp_path / "big.py"
    script.write_text(BIG_JOB)
    target = tmp_path / "big.bin"
    proc = mpiexec([sys.executable, str(script), str(target), mode], n=2, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [(tmp_path / f"big.bin.{r}.txt").read_text().split() for r in range(2)]
    n = (2 << 30) + (160 << 20) + 7
    assert lines == [
        ["0", "True", str(n + 1000), str(0 if mode == "enable" else 2)],
        ["1", "True", str(n + 1000), str(0 if mode == "enable" else 2)],
    ]
    target.unlink()


def test_collio_stats_prints_summary_at_close(tmp_path):
    code = textwrap.dedent(
        f"""
        import numpy as np, collio
        from collio import layouts
        lay = layouts.block((64, 64), "<f8")
        with collio.open({str(tmp_path / "s.bin")!r}, "w") as f:
            f.write_all(np.zeros(lay.shape), lay)
        """
    )
    proc = mpiexec([sys.executable, "-c", code], n=2, env={"COLLIO_STATS": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("collio stats")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"collio stats {str(tmp_path / 's.bin')!r}: ")  # names the file
    assert "MiB written in 2 ops" in lines[0] and "2 aggregators" in lines[0]


_LEFT_OPEN = """
import gc, sys
import numpy as np
from mpi4py import MPI
import collio.h5 as ch5
from collio import layouts
from collio.comms import private

path, how = sys.argv[1], sys.argv[2]
glob = np.arange(64.0).reshape(8, 8)
lay = layouts.block((8, 8), "<f8")
f = ch5.File(path, "w")
ds = ch5.create_dataset(f, "x", (8, 8), "<f8")
ch5.write_all(ds, glob, lay)
assert np.array_equal(ch5.read_all(ds, lay), glob)
if how == "drop":
    del f, ds
    gc.collect()
    assert private(MPI.COMM_WORLD).users == 0, "the dropped file still holds the duplicate"
print("end of script", flush=True)
"""


@pytest.mark.parametrize("how", ["open", "drop"])
def test_hdf5_file_left_open_at_exit(tmp_path, how):
    """A collio HDF5 file still open at exit (or dropped without close after I/O): the
    process exits cleanly (HDF5's exit handler must not call into a finalized Python)
    and stock h5py reads what was written."""
    h5py = pytest.importorskip("h5py")
    path = str(tmp_path / "left.h5")
    proc = python(_LEFT_OPEN, path, how)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "end of script" in proc.stdout
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["x"][...], np.arange(64.0).reshape(8, 8))
