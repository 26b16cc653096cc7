"""Processes a test starts itself: an ``mpiexec`` job of its own, or a fresh Python.

Most MPI tests run inside the suite's ranks (``mpiexec -n N python -m mpi4py -m pytest
--with-mpi``).  Some cannot: a fault set per rank before MPI starts (``ulimit -f`` on one
rank of an MPMD job), pieces too large for every rank of the suite at once, environment
read at import, the process's exit.  They start a job with :func:`mpiexec` (from a plain
pytest process: a job cannot be started from inside another one's ranks) or a process
with :func:`python`; both run under a timeout, so a hang fails instead of blocking.

>>> proc = mpiexec([sys.executable, "job.py", out_dir], n=3)
>>> proc = mpiexec(["-n", "3", py, "x.py", ":", "-n", "1", "bash", "-c", "ulimit -f 9; ..."])
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["MPIEXEC", "child_env", "mpiexec", "python"]


def _find_mpiexec() -> str | None:
    """``$MPIEXEC``, else the one beside this Python (a virtualenv's ``mpich``), else PATH's."""
    given = os.environ.get("MPIEXEC")
    if given:
        return shutil.which(given)
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")


#: The launcher jobs use; None where there is none (tests using it then skip).
MPIEXEC = _find_mpiexec()

#: What a launcher gives each rank (MPICH: PMI_*, HYDRA_*, MPI_LOCAL*; Open MPI: PMIX_*, ...).
_LAUNCHER_VARS = ("PMI", "HYDRA_", "MPI_LOCAL", "PMIX", "OMPI_COMM_WORLD")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without the launcher's variables, plus ``extra``.

    A process started from inside a rank would otherwise find the job's PMI settings
    and try to join that job instead of starting MPI on its own.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    env.update(extra or {})
    return env


def mpiexec(
    args: Sequence[str],
    *,
    n: int | None = None,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``mpiexec [-n n] args...``; returns the finished process (output as text).

    ``n=None`` leaves the rank counts to ``args`` (MPMD: ``-n 3 a : -n 1 b``).  ``env``
    adds variables to :func:`child_env`; ``cwd`` is the job's directory (a script that
    writes relative paths, as a user's does).  Raises :class:`subprocess.TimeoutExpired`
    when the job outlives ``timeout`` seconds (the job is killed).
    """
    if MPIEXEC is None:
        raise RuntimeError("no mpiexec found (set MPIEXEC or install the 'mpich' extra)")
    cmd = [MPIEXEC, *(["-n", str(n)] if n is not None else []), *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=child_env(env), cwd=cwd
    )


def python(
    code: str,
    *args: str,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh Python process (MPI, if it starts, is a singleton there)."""
    cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(env))
