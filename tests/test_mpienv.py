"""collio turns on MPICH's single-copy messages (CMA) only before MPI starts, and only if allowed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from collio._mpienv import cma_usable

VAR = "MPIR_CVAR_CH4_CMA_ENABLE"
SHOW = f"import os; print(os.environ.get({VAR!r}, '-'))"


def _run(code: str, **env: str) -> str:
    e = {k: v for k, v in os.environ.items() if k not in (VAR, "COLLIO_MPI_CMA")}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _read_sibling() -> bool:
    """Read a marker out of another process with process_vm_readv, as MPICH's CMA does."""
    import ctypes
    import ctypes.util

    from collio._mpienv import _IOVec

    child = subprocess.Popen(
        [sys.executable, "-c", "import ctypes, sys; b = ctypes.create_string_buffer(b'sibling!', 8); "
         "print(ctypes.addressof(b), flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        addr = int(child.stdout.readline())
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        dst = ctypes.create_string_buffer(8)
        local, remote = _IOVec(ctypes.addressof(dst), 8), _IOVec(addr, 8)
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        n = libc.process_vm_readv(child.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        return bool(n == 8 and dst.raw == b"sibling!")
    finally:
        child.communicate("")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CMA is Linux only")
def test_cma_probe_agrees_with_a_real_cross_process_read() -> None:
    assert cma_usable() == _read_sibling()


@pytest.mark.skipif(not cma_usable(), reason="this kernel forbids process_vm_readv")
def test_import_collio_first_turns_cma_on() -> None:
    assert _run("import collio; " + SHOW) == "1"


def test_mpi_started_first_is_left_alone() -> None:
    assert _run("from mpi4py import MPI; import collio; " + SHOW) == "-"


def test_user_choice_wins() -> None:
    assert _run("import collio; " + SHOW, **{VAR: "0"}) == "0"
    assert _run("import collio; " + SHOW, COLLIO_MPI_CMA="0") == "-"
