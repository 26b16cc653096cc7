"""Name-keyed, lazy registries: collio's backends and the benchmark's APIs use the same one.

As fsspec's ``known_implementations``: an entry is ``"module:Class"``, imported on first
use, and a missing optional dependency becomes an install hint naming the extra that
brings it.  Third-party entries come from an entry-point group (as xarray finds its
engines) or :meth:`Registry.register`.  Nothing here imports an optional package.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from importlib import metadata
from typing import Generic, TypeVar

__all__ = ["EXTRAS", "Entry", "Registry", "install_hint"]

T = TypeVar("T")

#: The package extra that installs each optional top-level module collio uses.
EXTRAS = {
    "zarr": "zarr",
    "s3fs": "zarr-s3",
    "h5py": "hdf5",
    "boto3": "s3",
    "botocore": "s3",
    "moto": "test",
    "matplotlib": "bench",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """A lazily imported class: where it is, the extra it needs, and one line about it."""

    path: str  # "package.module:Class"
    extra: str | None = None  # None: the extra is found from the missing module's name
    about: str = ""


def install_hint(extra: str | None) -> str:
    """How to get what an extra installs (collio is installed from its checkout:
    ``pip install -e '.[zarr]'`` there)."""
    return (f"pip install -e '.[{extra}]' in collio's checkout" if extra
            else "install its dependencies")  # fmt: skip


class Registry(Generic[T]):
    """Classes by name, imported only when asked for.

    Parameters
    ----------
    group
        The entry-point group third-party packages register in (``name = "module:Class"``).
    entries
        The built-in entries.
    unknown
        Builds the error for a name nobody registered (given the name and the known ones).
    missing
        Builds the error for an entry whose import fails for want of a package (given
        the name, the missing module and its extra), or returns None to let the
        ``ImportError`` through (a broken module is a bug, not a missing extra).
    """

    def __init__(
        self,
        group: str,
        entries: dict[str, Entry],
        *,
        unknown: Callable[[str, list[str]], Exception],
        missing: Callable[[str, str, str | None], Exception | None],
    ) -> None:
        self.group = group
        self._entries = dict(entries)
        self._loaded: dict[str, type[T]] = {}
        self._unknown = unknown
        self._missing = missing

    def register(self, name: str, path: str | type[T], extra: str | None = None) -> None:
        """Make ``name`` known: a class, or ``"module:Class"`` imported when first used."""
        if isinstance(path, str):
            self._entries[name] = Entry(path, extra, self.about(name))
            self._loaded.pop(name, None)
        else:
            self._loaded[name] = path

    def forget(self, name: str) -> None:
        """Drop the imported class of ``name`` (the next :meth:`get` imports it again)."""
        self._loaded.pop(name, None)

    def names(self) -> list[str]:
        """Every known name: built-in, registered and from the entry-point group."""
        found = set(self._entries) | set(self._loaded)
        try:
            found |= {ep.name for ep in metadata.entry_points(group=self.group)}
        except Exception:  # noqa: BLE001 - broken metadata must not break collio
            pass
        return sorted(found)

    def about(self, name: str) -> str:
        """The entry's one line (empty for classes registered without one)."""
        entry = self._entries.get(name)
        return entry.about if entry is not None else ""

    def get(self, name: str) -> type[T]:
        """The class called ``name``, imported on first use."""
        cls = self._loaded.get(name)
        if cls is not None:
            return cls
        entry = self._entries.get(name) or self._from_entry_points(name)
        if entry is None:
            raise self._unknown(name, self.names())
        module, _, attr = entry.path.partition(":")
        try:
            found = importlib.import_module(module)
        except ImportError as exc:
            top = (exc.name or "").partition(".")[0]
            err = self._missing(name, exc.name or str(exc), entry.extra or EXTRAS.get(top))
            if err is None:
                raise
            raise err from exc
        cls = getattr(found, attr)
        self._loaded[name] = cls
        return cls  # type: ignore[no-any-return]

    def _from_entry_points(self, name: str) -> Entry | None:
        try:
            eps = [ep for ep in metadata.entry_points(group=self.group) if ep.name == name]
        except Exception:  # noqa: BLE001 - broken metadata must not break collio
            return None
        return Entry(eps[0].value) if eps else None
