"""Opening and creating zarr arrays for :mod:`collio.backends.zarr` (per rank, no MPI).

The collective choreography (rank 0 creates, everyone agrees, then everyone
opens) lives in :meth:`ZarrBackend.open`; this module holds the local steps,
each of which raises a collio error with the values in its message.
"""

from __future__ import annotations

import dataclasses
import errno
import json
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.storage import MemoryStore, StorePath

from ...collective import digest
from ...errors import BackendError, MismatchError, ModeError
from ...redact import redact_text, redact_url, secrets_in

__all__ = ["ArrayFacts", "OpenSpec", "array_facts"]

#: Options that shape a new array (mode 'w' with a path or store).
CREATE = frozenset(
    {
        "shape",
        "dtype",
        "chunks",
        "shards",
        "compressors",
        "filters",
        "serializer",
        "fill_value",
        "attributes",
        "dimension_names",
        "chunk_key_encoding",
        "zarr_format",
        "config",
    }
)
#: Creation options that an existing array is checked against in every mode.
EXPECT = ("shape", "dtype", "chunks", "shards")
#: A chunk (shard) is assembled whole in one round buffer, and rounds stay <= 1 GiB.
MAX_UNIT_NBYTES = 1 << 30
#: Options for finding the array.
WHERE = frozenset({"path", "storage_options"})
#: Creation options whose None means something to ``zarr.create_array`` other than its
#: default ("auto" codecs; a v2 null fill value): passed on as given.
NONE_MEANS = frozenset({"compressors", "filters", "fill_value"})
#: Options the backend itself takes (:meth:`ZarrBackend.open`), shown with the others.
OWN = frozenset({"fsync"})


@dataclasses.dataclass(frozen=True, slots=True)
class ArrayFacts:
    """What every rank's array must share."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None

    def key(self) -> tuple[Any, ...]:
        return (self.shape, self.dtype.str, self.chunks, self.shards)

    def get(self, name: str) -> Any:
        value = getattr(self, name)
        return _plain_dtype(value) if name == "dtype" else value


def array_facts(array: Any) -> ArrayFacts:
    """Shape, dtype, (inner) chunk shape and shard shape of a ``zarr.Array``."""
    shards = getattr(array, "shards", None)
    return ArrayFacts(
        tuple(int(s) for s in array.shape),
        np.dtype(array.dtype),
        tuple(int(c) for c in array.chunks),
        tuple(int(s) for s in shards) if shards else None,
    )


def _plain_dtype(value: Any) -> str:
    """A dtype without its byte order: zarr v3 keeps that in the codecs (an array created
    with ``dtype=">i2"`` reports ``int16``)."""
    return str(np.dtype(value).newbyteorder("=").str)


def _normal(name: str, value: Any) -> Any:
    """A comparable form of an expected value; None when it cannot be checked ("auto")."""
    try:
        if name == "dtype":
            return _plain_dtype(value)
        if isinstance(value, (int, np.integer)):
            return int(value)
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        return None


def _canonical(value: Any) -> str:
    """A creation option as ranks compare it: a codec by its own JSON form, keys sorted
    (a codec's repr may hold a set, whose order follows the process's hash seed)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_canonical(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted((str(k), _canonical(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in items) + "}"
    for form in ("to_dict", "get_config"):  # zarr's codecs; numcodecs'
        method = getattr(value, form, None)
        if callable(method):
            try:
                config = json.dumps(method(), sort_keys=True, default=str)
            except (TypeError, ValueError):
                continue
            return f"{type(value).__name__}({config})"
    return repr(value)


def _store_of(target: Any) -> Any:
    if isinstance(target, zarr.Array):
        return target.store
    if isinstance(target, StorePath):
        return target.store
    return target


@dataclasses.dataclass(slots=True)
class OpenSpec:
    """One rank's view of what ``collio.open(..., backend="zarr")`` was asked to do."""

    target: Any
    mode: str
    create_options: dict[str, Any]
    expect: dict[str, Any]
    path: str
    storage_options: dict[str, Any] | None
    in_memory: bool

    @classmethod
    def parse(
        cls, target: Any, mode: str, options: dict[str, Any], *, nranks: int, hints: Any = None
    ) -> OpenSpec:
        """Check the options (locally); raise :class:`ModeError` & co. on bad ones."""
        if getattr(hints, "atomic_commit", False) and mode != "r":
            raise ModeError(
                "the zarr backend stores chunks in place: atomic_commit is not supported"
            )
        unknown = sorted(set(options) - CREATE - WHERE)
        if unknown:
            raise ModeError(
                f"zarr backend: unknown options {unknown}; known: {sorted(CREATE | WHERE | OWN)}"
            )
        given = {k: v for k, v in options.items() if v is not None}
        create = {
            k: v for k, v in options.items() if k in CREATE and (k in given or k in NONE_MEANS)
        }
        is_array = isinstance(target, zarr.Array)
        if is_array and set(given) & WHERE:
            raise ModeError("path and storage_options do not apply to a zarr.Array target")
        extra = sorted(set(create) & set(given) - set(EXPECT))
        if is_array and extra:
            raise ModeError(f"creation options {extra} do not apply to an existing zarr.Array")
        if mode == "w" and not is_array and ("shape" not in create or "dtype" not in create):
            raise ModeError("mode 'w' creates the zarr array: give shape= and dtype=")
        store = _store_of(target)
        if mode != "r" and isinstance(store, Store) and store.read_only:
            raise BackendError(
                f"the zarr store {store} is read-only; open it with mode 'r'", errno=errno.EROFS
            )
        in_memory = isinstance(store, (MemoryStore, dict))
        if in_memory and nranks > 1:
            raise BackendError(
                f"a zarr MemoryStore lives in one process; with {nranks} ranks use a "
                f"directory or an object store"
            )
        expect = {k: _normal(k, create[k]) for k in EXPECT if k in create}
        expect = {k: v for k, v in expect.items() if v is not None}
        return cls(
            target,
            mode,
            create if mode == "w" and not is_array else {},
            expect,
            str(given.get("path", "")),
            given.get("storage_options"),
            in_memory,
        )

    @property
    def creates(self) -> bool:
        return bool(self.create_options)

    def identity(self) -> tuple[Any, ...]:
        """What must be the same on every rank: where the array is, how it is created and
        what it is expected to be (storage options, and a URL holding credentials, only
        as a digest)."""
        secret = secrets_in(self.target)
        hidden = (self.storage_options, str(self.target)) if secret else self.storage_options
        where = digest(hidden) if hidden else None
        made = tuple(sorted((k, _canonical(v)) for k, v in self.create_options.items()))
        return (self.label, made, tuple(sorted(self.expect.items())), where)

    @property
    def label(self) -> str:
        """The array as messages name it (a URL without its credentials)."""
        if isinstance(self.target, zarr.Array):
            return redact_text(f"{self.target.store}/{self.target.path}".rstrip("/"))
        if isinstance(self.target, str):
            where = str(redact_url(self.target))
        elif isinstance(self.target, (Store, StorePath)):
            where = redact_text(str(self.target))
        else:
            where = "target"
        return f"{where} path {self.path!r}" if self.path else where

    def create(self) -> None:
        """On one rank: create (overwrite) the array's metadata."""
        opts = dict(self.create_options)
        opts.setdefault("zarr_format", 3)
        zarr.create_array(
            self.target,
            name=self.path or None,
            overwrite=True,
            storage_options=self.storage_options,
            **opts,
        )

    def open(self) -> Any:
        """On every rank: the ``zarr.Array`` (checked against the expectations)."""
        if isinstance(self.target, zarr.Array):
            array = self.target
        else:
            try:
                array = zarr.open_array(
                    self.target,
                    mode="r" if self.mode == "r" else "r+",
                    path=self.path,
                    storage_options=self.storage_options,
                )
            except FileNotFoundError as exc:
                raise BackendError(f"no zarr array at {self.label}", errno=errno.ENOENT) from exc
        if self.mode != "r" and array.store.read_only:
            raise BackendError(
                f"the zarr store of {self.label} is read-only; open it with mode 'r'",
                errno=errno.EROFS,
            )
        facts = array_facts(array)
        if facts.dtype.hasobject or facts.dtype.itemsize == 0:
            raise BackendError(
                f"the zarr array at {self.label} has variable-size elements ({array.dtype}); "
                f"collio writes fixed-size dtypes"
            )
        unit = facts.shards or facts.chunks
        nbytes = int(np.prod(unit, dtype=np.int64)) * facts.dtype.itemsize
        if nbytes > MAX_UNIT_NBYTES:
            kind = "shards" if facts.shards else "chunks"
            raise BackendError(
                f"the zarr array at {self.label} has {kind} {unit} of {nbytes} bytes; an "
                f"aggregator assembles a whole one per round, at most {MAX_UNIT_NBYTES}"
            )
        for name, want in self.expect.items():
            have = facts.get(name)
            if isinstance(want, int) and isinstance(have, tuple):
                want = (want,) * len(have)
            if want != have:
                raise MismatchError(
                    f"the zarr array at {self.label} has {name} {have}, but {name}={want} was given"
                )
        return array
