"""`import collio` leaves MPI's start-up settings alone; collio-bench reports MPICH's own.

MPICH reads its variables when MPI starts, so a library that set one at import would make
a program's speed depend on whether it imported that library before ``from mpi4py import
MPI``.  collio sets nothing; the benchmark says what MPI itself used.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from collio.bench.machine import CMA_CVAR
from collio.testing.jobs import MPIEXEC, mpiexec, python

SPELLINGS = (CMA_CVAR, "MPIR_PARAM_CH4_CMA_ENABLE", "MPICH_CH4_CMA_ENABLE")
ASK = "from collio.bench.machine import single_copy; print(single_copy())"


def _python(code: str, **env: str) -> str:
    out = python(code, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _is_mpich() -> bool:
    return _python("from mpi4py import MPI; print(MPI.Get_library_version()[:5])") == "MPICH"


needs_mpich = pytest.mark.skipif(not _is_mpich(), reason="MPICH's variable is not there")


@pytest.mark.parametrize("first", ["import collio", "from mpi4py import MPI"])
def test_import_collio_changes_no_environment(first: str) -> None:
    code = (
        "import os; before = dict(os.environ)\n"
        f"{first}\nimport collio, collio.bench.cli, collio.bench.main\n"
        "print(dict(os.environ) == before)\n"
    )
    assert _python(code) == "True"


@needs_mpich
@pytest.mark.parametrize("setting", [None, "0", "1"])
def test_import_order_does_not_change_what_mpi_uses(setting: str | None) -> None:
    if setting is None and any(name in os.environ for name in SPELLINGS):
        pytest.skip("MPICH's default cannot be seen: this environment sets the variable")
    env = {} if setting is None else {CMA_CVAR: setting}
    a = _python("import collio; from mpi4py import MPI; " + ASK, **env)
    b = _python("from mpi4py import MPI; import collio; " + ASK, **env)
    assert a == b
    if setting is not None:
        assert a == str(setting == "1")


@needs_mpich
def test_single_copy_reads_every_spelling_mpich_reads() -> None:
    for name in SPELLINGS:
        assert _python(ASK, **{name: "0"}) == "False"
        assert _python(ASK, **{name: "1"}) == "True"


def test_single_copy_is_none_where_mpi_cannot_be_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from collio.bench import machine

    monkeypatch.setattr(machine, "_libmpi", lambda: None)
    assert machine.single_copy() is None


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
@needs_mpich
@pytest.mark.parametrize("setting", ["0", "1"])
def test_bench_reports_the_setting_it_ran_with(tmp_path, setting: str) -> None:
    out = tmp_path / "b.json"
    args = [sys.executable, "-m", "collio.bench", "-a", "collio", "--size", "64", "-i", "1"]
    args += ["-w", "--json", str(out), "-o", str(tmp_path / "f")]
    proc = mpiexec(args, n=2, timeout=240, env={CMA_CVAR: setting})
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = "on" if setting == "1" else "off"
    assert f"MPICH single-copy messages ({CMA_CVAR}): {state}" in proc.stdout
    machine = json.loads(out.read_text())["machine"]
    assert machine["single_copy"] is (setting == "1")
    assert machine["cpus"] == os.cpu_count() and machine["nodes"] == 1
    assert machine["mpi_library"].startswith("MPICH")
    assert machine["storage"]["fs"]  # the test file's file system, from /proc/self/mountinfo
