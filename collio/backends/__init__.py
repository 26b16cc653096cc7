"""Backends by name, imported only when used (``import collio`` imports none of them).

The registry (:mod:`collio.backends.registry`) is lazy, as fsspec's: an entry is
``"module:Class"``, and a missing dependency becomes an install hint.  Third-party
backends register through the ``collio.backends`` entry-point group
(``name = "package.module:Class"``), as xarray finds its engines.
"""

from __future__ import annotations

from typing import Any

from ..errors import BackendUnavailableError, ModeError
from .base import Backend
from .registry import Entry, Registry, install_hint

__all__ = [
    "BACKENDS",
    "Backend",
    "get_backend",
    "infer_backend",
    "known_backends",
    "register_backend",
]


def _unknown(name: str, known: list[str]) -> Exception:
    return ModeError(f"unknown backend {name!r}; known: {', '.join(known)}")


def _missing(name: str, module: str, extra: str | None) -> Exception:
    return BackendUnavailableError(
        f"backend {name!r} needs a missing package ({module}): {install_hint(extra)}"
    )


#: Every backend ``collio.open`` knows.
BACKENDS: Registry[Backend] = Registry(
    "collio.backends",
    {
        "posix": Entry("collio.backends.posix:PosixBackend"),
        "memory": Entry("collio.backends.memory:MemoryBackend"),
        "mpiio": Entry("collio.backends.mpiio:MpiioBackend"),
        "zarr": Entry("collio.backends.zarr.backend:ZarrBackend", "zarr"),
        "s3": Entry("collio.backends.s3.backend:S3Backend", "s3"),
        "hdf5": Entry("collio.backends.hdf5.dataset:Hdf5Backend", "hdf5"),
    },
    unknown=_unknown,
    missing=_missing,
)


def register_backend(name: str, path: str | type[Backend], extra: str | None = None) -> None:
    """Make a backend known by name (a class, or "module:Class" imported when used)."""
    BACKENDS.register(name, path, extra)


def known_backends() -> list[str]:
    return BACKENDS.names()


def get_backend(name: str) -> type[Backend]:
    """The backend class called ``name``; a missing dependency says what to install."""
    return BACKENDS.get(name)


def infer_backend(target: Any) -> str:
    """Guess the backend from the target: ``s3://`` -> s3, ``mem://`` -> memory, else posix."""
    if isinstance(target, str):
        if target.startswith("s3://"):
            return "s3"
        if target.startswith("mem://"):
            return "memory"
        if target.rstrip("/").endswith(".zarr"):
            return "zarr"
        return "posix"
    module = type(target).__module__
    if module.startswith("zarr"):
        return "zarr"
    return "posix"
