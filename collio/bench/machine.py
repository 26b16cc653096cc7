"""What a benchmark ran on: CPUs, memory, the file system and disk, MPI and its settings.

Saved with every ``--json`` result so that a table made from it can say which machine it
describes without anyone copying that by hand.  Everything here is read, nothing is set:
MPI's start-up settings belong to the user (``import collio`` changes no environment).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from typing import Any

__all__ = ["command", "describe", "single_copy", "storage"]

#: MPICH's switch for single-copy messages between ranks of one node (CMA,
#: ``process_vm_readv``); without it a large message is copied twice through shared memory.
CMA_CVAR = "MPIR_CVAR_CH4_CMA_ENABLE"


def command() -> list[str]:
    """This run's command line as a user types it: the program's name, not where it lives."""
    return ["collio-bench", *sys.argv[1:]]


def single_copy() -> bool | None:
    """Whether MPICH sends large intra-node messages with one copy, as MPI itself holds it.

    Read through the MPI tool interface (``MPI_T_cvar_read`` of :data:`CMA_CVAR`), so it
    is MPICH's own value whichever of its spellings (``MPIR_CVAR_``, ``MPIR_PARAM_``,
    ``MPICH_``) set it, or its built-in default when none did.  None when the MPI library
    is not MPICH (it has no such variable) or cannot be asked (not Linux, no MPI_T).
    """
    lib = _libmpi()
    if lib is None:
        return None
    from mpi4py import MPI

    provided, index = ctypes.c_int(), ctypes.c_int()
    if lib.MPI_T_init_thread(MPI.THREAD_SINGLE, ctypes.byref(provided)) != 0:
        return None
    try:
        if lib.MPI_T_cvar_get_index(CMA_CVAR.encode(), ctypes.byref(index)) != 0:
            return None
        handle, count = ctypes.c_void_p(), ctypes.c_int()
        alloc = lib.MPI_T_cvar_handle_alloc
        alloc.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        if alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) != 0:
            return None
        value = (ctypes.c_int * max(count.value, 1))()
        lib.MPI_T_cvar_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        ok = lib.MPI_T_cvar_read(handle, value) == 0
        lib.MPI_T_cvar_handle_free(ctypes.byref(handle))
        return bool(value[0]) if ok else None
    finally:
        lib.MPI_T_finalize()


def _libmpi() -> ctypes.CDLL | None:
    """The MPI library mpi4py loaded into this process (mpi4py does not export its symbols)."""
    from mpi4py import MPI

    if not MPI.Get_library_version().startswith("MPICH"):
        return None
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "/libmpi" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "MPI_T_cvar_read"):
            return lib
    return None


def storage(path: str) -> dict[str, Any]:
    """The file system holding ``path`` and the block device under it, from /proc and /sys."""
    path = os.path.realpath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    best: list[str] = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                f = line.split()
                point = f[4]
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[4] if best else ""):
                    best = f
    except OSError:
        return {}
    if not best:
        return {}
    sep = best.index("-")
    fstype, source, options = best[sep + 1], best[sep + 2], best[sep + 3].split(",")
    out: dict[str, Any] = {"fs": fstype, "device": source, "discard": "discard" in options}
    sysdev = f"/sys/dev/block/{best[2]}"
    for dev in (f"{sysdev}/device", f"{sysdev}/../device"):  # a disk, or a partition's disk
        if os.path.exists(f"{dev}/driver"):
            out["driver"] = os.path.basename(os.path.realpath(f"{dev}/driver"))
            break
    try:
        with open(f"{sysdev}/queue/rotational") as fh:
            out["rotational"] = fh.read().strip() == "1"
    except OSError:
        pass
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            kib = int(next(line for line in fh if line.startswith("MemTotal:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return None
    return round(kib / (1 << 20), 1)


def describe(path: str, *, mpi: bool = True) -> dict[str, Any]:
    """The machine: CPUs, memory, ``path``'s storage, software versions and, with ``mpi``, MPI.

    Local (no communication): the caller adds what the ranks must agree on, such as
    :func:`single_copy` on every rank.
    """
    import numpy

    from .._version import __version__

    out: dict[str, Any] = {
        "cpus": os.cpu_count(), "cpu_model": _cpu_model(), "memory_gib": _memory_gib(),
        "kernel": platform.release(), "storage": storage(path),
        "python": platform.python_version(), "numpy": numpy.__version__,
        "collio": __version__, "platform": sys.platform,
    }  # fmt: skip
    if mpi:
        import mpi4py
        from mpi4py import MPI

        out["mpi4py"] = mpi4py.__version__
        out["mpi_library"] = " ".join(MPI.Get_library_version().splitlines()[0].split())
    return out
