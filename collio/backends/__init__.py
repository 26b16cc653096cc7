"""Backends by name, imported only when used (``import collio`` imports none of them).

Third-party backends register through the ``collio.backends`` entry-point group
(``name = "package.module:Class"``), as xarray finds its engines.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

from ..errors import BackendUnavailableError, ModeError
from .base import Backend

__all__ = ["Backend", "get_backend", "infer_backend", "known_backends", "register_backend"]

#: name -> ("module:Class", extra that installs its dependencies)
_KNOWN: dict[str, tuple[str, str | None]] = {
    "posix": ("collio.backends.posix:PosixBackend", None),
    "memory": ("collio.backends.memory:MemoryBackend", None),
    "zarr": ("collio.backends.zarr:ZarrBackend", "zarr"),
    "mpiio": ("collio.backends.mpiio:MpiioBackend", None),
    "s3": ("collio.backends.s3.backend:S3Backend", "s3"),
}
_LOADED: dict[str, type[Backend]] = {}


def register_backend(name: str, path: str | type[Backend], extra: str | None = None) -> None:
    """Make a backend known by name (a class, or "module:Class" imported when used)."""
    if isinstance(path, str):
        _KNOWN[name] = (path, extra)
        _LOADED.pop(name, None)
    else:
        _LOADED[name] = path


def known_backends() -> list[str]:
    names = set(_KNOWN) | set(_LOADED)
    try:
        names |= {ep.name for ep in metadata.entry_points(group="collio.backends")}
    except Exception:  # noqa: BLE001 - broken metadata must not break collio
        pass
    return sorted(names)


def get_backend(name: str) -> type[Backend]:
    """The backend class called ``name``; a missing dependency says what to install."""
    if name in _LOADED:
        return _LOADED[name]
    spec = _KNOWN.get(name)
    if spec is None:
        for ep in metadata.entry_points(group="collio.backends"):
            if ep.name == name:
                spec = (ep.value, None)
                break
    if spec is None:
        raise ModeError(f"unknown backend {name!r}; known: {', '.join(known_backends())}")
    path, extra = spec
    module, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        hint = f"pip install 'collio[{extra}]'" if extra else "install its dependencies"
        raise BackendUnavailableError(
            f"backend {name!r} needs a missing package ({exc.name or exc}): {hint}"
        ) from exc
    _LOADED[name] = cls
    return cls  # type: ignore[no-any-return]


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
