"""A checkpoint saved by a job of 4 ranks, restored by jobs of 1, 3 and 4 ranks."""

from __future__ import annotations

import glob
import os
import sys

import pytest

import collio.checkpoint as ckpt
from collio.testing import checkpoint as model
from collio.testing.jobs import MPIEXEC, mpiexec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "checkpoint_job.py")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")


def _job(
    n: int, case: str, path: str, limited: int = 0, env: dict[str, str] | None = None
) -> tuple[bool, str]:
    """Whether the job passed (exit 0, and rank 0 printed ``ok`` on a line of its own: a
    word of a traceback is no pass), and its output.  ``limited`` > 0: the job's last
    rank runs under ``ulimit -f limited`` (KiB), set before MPI starts."""
    env = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
           **(env or {})}  # fmt: skip
    if limited:
        py = f"{sys.executable} {JOB} {case} {path}"
        args = ["-n", str(n - 1), sys.executable, JOB, case, path, ":",
                "-n", "1", "bash", "-c", f"ulimit -f {limited}; exec {py}"]  # fmt: skip
        proc = mpiexec(args, timeout=180, env=env)
    else:
        proc = mpiexec([sys.executable, JOB, case, path], n=n, timeout=180, env=env)
    passed = proc.returncode == 0 and "ok" in proc.stdout.splitlines()
    return passed, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("ckpt") / "model.ckpt")
    passed, out = _job(4, "save", path)
    assert passed, out
    return path


@pytest.mark.parametrize("n", [1, 3, 4])
def test_saved_at_4_loads_at(saved: str, n: int) -> None:
    passed, out = _job(n, "load", saved)
    assert passed, out


@pytest.mark.parametrize("maps", ["enable", "disable"])
def test_one_rank_load_without_mpiexec(saved: str, maps: str) -> None:
    """A plain process (MPI's singleton) restores every array whole: mapped (holding no
    descriptor) or read."""
    spec = {name: None for name in ckpt.info(saved)}
    fds = len(os.listdir("/proc/self/fd"))
    got = ckpt.load(saved, spec, hints={"checkpoint_map": maps})
    assert len(os.listdir("/proc/self/fd")) == fds
    for name in spec:
        want = model.reference(name)
        assert got[name].dtype == want.dtype, name
        assert got[name].tobytes() == want.tobytes(), name
        # (mapped where the whole array is one range of the file: saved at 4 ranks, a
        # row-sharded array is one chunk per rank, which a one-rank load reads)
        one = model.mappable(saved, name, None)
        assert model.mapped(got[name]) == (maps == "enable" and one), name


def test_killed_save_leaves_the_previous_checkpoint(saved: str, tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "model.ckpt")
    with open(saved, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    with open(saved, "rb") as fh:
        before = fh.read()
    passed, out = _job(3, "killed", path)
    assert not passed, out
    with open(path, "rb") as fh:
        assert fh.read() == before
    passed, out = _job(3, "load", path)
    assert passed, out
    d, base = os.path.split(path)
    leftovers = glob.glob(os.path.join(d, f".{glob.escape(base)}.collio-*.tmp"))
    assert leftovers  # the killed save's temporary, never visible as the target
    passed, out = _job(3, "save", path)  # the next save reclaims what the killed one left
    assert passed, out
    assert [p for p in leftovers if os.path.exists(p)] == []


def test_rank_failing_in_its_direct_writes_keeps_the_previous_checkpoint(
    saved: str, tmp_path: os.PathLike[str]
) -> None:
    """One rank's own writes (no exchange) fail part way (EFBIG): every rank raises the
    same error, the previous checkpoint is as it was and loads, no temporary is left."""
    path = os.path.join(str(tmp_path), "model.ckpt")
    with open(saved, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    with open(saved, "rb") as fh:
        before = fh.read()
    passed, out = _job(4, "failing", path, limited=33_000)
    assert passed, out
    with open(path, "rb") as fh:
        assert fh.read() == before
    d, base = os.path.split(path)
    assert glob.glob(os.path.join(d, f".{glob.escape(base)}.collio-*.tmp")) == []
    passed, out = _job(3, "load", path)
    assert passed, out


@pytest.mark.parametrize("level", ["funneled", "single"])
def test_async_save_below_thread_multiple_is_refused_everywhere(
    tmp_path: object, level: str
) -> None:
    """A job whose MPI runs threads at a lower level than ``MPI_THREAD_MULTIPLE``:
    ``async_save`` raises the same ModeError on every rank instead of making MPI calls
    from its thread (which crashed such a job), and a blocking save of the state works."""
    passed, out = _job(3, "threads", str(tmp_path) + "/model.ckpt",
                       env={"MPI4PY_RC_THREAD_LEVEL": level})  # fmt: skip
    assert passed, out


def test_a_failed_async_save_nobody_was_told_of_is_said_at_exit(tmp_path: object) -> None:
    """An async save that fails, its handle dropped and its communicator freed before
    the job ends: every rank says so on stderr at exit, naming the target."""
    passed, out = _job(2, "untold", str(tmp_path))
    assert passed, out
    # (the ranks' lines may come through mpiexec run together: counted, not split)
    assert out.count("absent/model.ckpt failed and no wait() raised it: NotFoundError") == 2, out
