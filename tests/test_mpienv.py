"""collio turns on MPICH's single-copy messages (CMA) only before MPI starts, if allowed."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from collio._mpienv import cma_usable

VAR = "MPIR_CVAR_CH4_CMA_ENABLE"
SPELLINGS = (VAR, "MPIR_PARAM_CH4_CMA_ENABLE", "MPICH_CH4_CMA_ENABLE")
SHOW = f"import os; print(os.environ.get({VAR!r}, '-'))"


def _run(code: str, **env: str) -> str:
    e = {k: v for k, v in os.environ.items() if k not in SPELLINGS + ("COLLIO_MPI_CMA",)}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _read_parent() -> bool:
    """A child process reads a marker out of this one with process_vm_readv, as MPICH's CMA
    does between ranks (not a descendant reading: Yama's scope 1 forbids this, as for ranks)."""
    marker = ctypes.create_string_buffer(b"sibling!", 8)
    code = (
        "import ctypes, os, sys\n"
        "from collio._mpienv import _IOVec\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.process_vm_readv.restype = ctypes.c_ssize_t\n"
        "dst = ctypes.create_string_buffer(8)\n"
        "local, remote = _IOVec(ctypes.addressof(dst), 8), _IOVec(int(sys.argv[1]), 8)\n"
        "n = libc.process_vm_readv(\n"
        "    os.getppid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)\n"
        "print(int(n == 8 and dst.raw == b'sibling!'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLLIO_MPI_CMA"}
    env["COLLIO_MPI_CMA"] = "0"  # the child imports collio: keep its probe out of the way
    out = subprocess.run(
        [sys.executable, "-c", code, str(ctypes.addressof(marker))],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "1"


@pytest.mark.skipif(not cma_usable(), reason="the probe says no: nothing to check")
def test_cma_probe_never_claims_a_read_the_kernel_refuses() -> None:
    # the probe is conservative (containers, seccomp): it may say no where reads work,
    # never yes where they fail (MPICH would then fail on large messages)
    assert _read_parent()


def test_cma_probe_says_yes_on_a_plain_linux_host() -> None:
    if not sys.platform.startswith("linux") or not _read_parent():
        pytest.skip("this kernel forbids cross-process reads here")
    from collio import _mpienv

    if not _mpienv._initial_user_namespace() or _mpienv._seccomp_filtered():
        pytest.skip("a container: the probe declines on purpose")
    assert cma_usable()


@pytest.mark.skipif(not cma_usable(), reason="this kernel forbids process_vm_readv")
def test_import_collio_first_turns_cma_on() -> None:
    assert _run("import collio; " + SHOW) == "1"


@pytest.mark.skipif(not cma_usable(), reason="collio would not set it anyway")
def test_mpi_started_first_is_left_alone() -> None:
    assert _run("from mpi4py import MPI; import collio; " + SHOW) == "-"


def test_user_choice_wins() -> None:
    assert _run("import collio; " + SHOW, **{VAR: "0"}) == "0"
    for other in SPELLINGS[1:]:  # MPICH reads these too; collio must not override them
        assert _run("import collio; " + SHOW, **{other: "0"}) == "-"
    assert _run("import collio; " + SHOW, COLLIO_MPI_CMA="0") == "-"
