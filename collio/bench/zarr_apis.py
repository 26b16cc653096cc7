"""zarr in ``collio-bench``: collio's zarr backend beside plain zarr, unlocked and locked.

``collio-zarr``
    ``collio.open(array, "r+" / "r", backend="zarr")`` + ``write_all`` / ``read_all``:
    every chunk (shard) has one writer, whatever the decomposition.
``zarr-plain``
    Each rank assigns its own boxes with plain zarr (``arr[box] = piece``).  Safe only
    when no chunk (shard) is shared between ranks, so the run is refused unless the
    decomposition is aligned with the chunks (zarr-python #3514: writers sharing a
    chunk lose data).
``zarr-locked``
    Each rank writes chunk by chunk with plain zarr, holding an exclusive ``flock``
    on a lock file per chunk (shard) while zarr reads, merges and writes it.
    Correct for any decomposition: the baseline for misaligned ones.

Every write goes to a fresh array that rank 0 creates before the timed phase (not
timed), so the three are timed on the same work: open, write, fsync (``-e``),
close.  Reads with ``zarr-plain`` / ``zarr-locked`` are plain zarr reads of the
rank's boxes (reads need no lock).  ``-W`` reads the array back with plain zarr.

Options (``-O key=value,...``, the same for all three so they compare alike):
``chunks`` (an edge or ``AxB``; 512 in 2-D, 64 in 3-D), ``shards`` (0: none),
``codec`` (``none``, ``zstd``, ``blosc``, ``gzip``), ``level`` (the codec's level).
"""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import zarr
import zarr.codecs

import collio
from collio.backends.chunkspace import ChunkSpace, UnitPart
from collio.backends.fsync import fsync_files

from ..layouts import ArrayLayout
from .apis import Api, Job
from .builtin import CollioApi
from .options import ZARR, parse_shape
from .patterns import Workload

__all__ = ["CollioZarrApi", "ZarrPlainApi", "ZarrLockedApi", "array_options"]

_CODECS = ("none", "zstd", "blosc", "gzip")


def array_options(work: Workload, options: dict[str, str]) -> dict[str, Any]:
    """``zarr.create_array`` keywords from the ``-O`` options (ValueError when they are bad)."""
    nd = len(work.shape)
    chunks = parse_shape(options.get("chunks", "512" if nd == 2 else "64"), nd, "chunks")
    if 0 in chunks:
        raise ValueError(f"-O chunks={options.get('chunks')!r}: chunk edges must be >= 1")
    shards: tuple[int, ...] | None = parse_shape(options.get("shards", "0"), nd, "shards")
    if shards is not None and not any(shards):
        shards = None
    elif shards is not None and any(s % c or not s for s, c in zip(shards, chunks, strict=True)):
        raise ValueError(f"-O shards={shards} must be multiples of chunks={chunks}")
    if shards is None:  # (a shard must hold whole chunks: clip only unsharded chunks)
        chunks = tuple(min(c, n) for c, n in zip(chunks, work.shape, strict=True))
    codec = options.get("codec", "none")
    if codec not in _CODECS:
        raise ValueError(f"-O codec={codec!r}: zarr codecs are {', '.join(_CODECS)}")
    level = int(options["level"]) if "level" in options else None
    compressors: Any = None
    if codec == "zstd":
        compressors = [zarr.codecs.ZstdCodec(level=1 if level is None else level)]
    elif codec == "blosc":
        clevel = 5 if level is None else level
        compressors = [zarr.codecs.BloscCodec(cname="lz4", clevel=clevel, shuffle="shuffle")]
    elif codec == "gzip":
        compressors = [zarr.codecs.GzipCodec(level=1 if level is None else level)]
    out: dict[str, Any] = {"shape": work.shape, "dtype": work.dtype, "chunks": chunks,
                           "compressors": compressors, "fill_value": 0}  # fmt: skip
    if shards is not None:
        out["shards"] = shards
    return out


def _space(work: Workload, opts: dict[str, Any]) -> ChunkSpace:
    """The array's units (shards when sharded, else chunks) over the workload's shape."""
    unit: tuple[int, ...] = opts.get("shards") or opts["chunks"]
    return ChunkSpace(tuple(work.shape), tuple(unit), np.dtype(work.dtype).itemsize)


def boxes(lay: ArrayLayout) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]]:
    """(global box, local box) pairs that together are the rank's piece: per dimension
    the maximal runs of consecutive indices, and their products."""
    per_dim = []
    for d in lay.dims:
        idx = d.indices()
        brk = np.flatnonzero(np.diff(idx) != 1) + 1
        lo = np.concatenate(([0], brk)).astype(np.int64) if len(idx) else idx
        n = np.diff(np.concatenate((lo, [len(idx)])))
        runs = zip(idx[lo].tolist(), lo.tolist(), n.tolist(), strict=True)
        per_dim.append([(slice(a, a + k), slice(b, b + k)) for a, b, k in runs])
    return [
        (tuple(c[0] for c in combo), tuple(c[1] for c in combo))
        for combo in itertools.product(*per_dim)
    ]


class _ZarrTarget:
    """What the three APIs share: the array's options, its path, creation, cleanup, -W."""

    name: ClassVar[str]
    job: Job
    own_target: ClassVar[bool] = True
    option_help: ClassVar[dict[str, str]] = ZARR
    #: Refuse decompositions where ranks share a chunk (plain zarr would lose data).
    aligned_only: ClassVar[bool] = False

    @classmethod
    def check(cls, work: Workload, options: dict[str, str], writing: bool) -> None:
        if work.pattern == "ior":
            raise ValueError(f"{cls.name}: use an array pattern (the ior pattern is bytes)")
        opts = array_options(work, options)
        if writing and cls.aligned_only:
            shared_chunks(
                cls.name, work, _space(work, opts), "shard" if "shards" in opts else "chunk"
            )

    def setup(self) -> None:
        self.create = array_options(self.job.work, self.job.options)
        self.array_path = f"{self.job.path}.{self.name}.zarr"

    def prepare(self, writing: bool) -> None:
        """Rank 0 makes a fresh, empty array (and lock directory); not timed."""
        if writing and self.job.comm.rank == 0:
            self._remove()
            zarr.create_array(self.array_path, **self.create)
            os.makedirs(self.array_path + ".locks")

    def _remove(self) -> None:
        shutil.rmtree(self.array_path, ignore_errors=True)
        shutil.rmtree(self.array_path + ".locks", ignore_errors=True)

    def teardown(self) -> None:
        if self.job.comm.rank == 0 and not self.job.keep and hasattr(self, "target"):
            self._remove()

    def written(self) -> npt.NDArray[Any] | None:
        """The rank's piece read back with plain zarr."""
        return read_boxes(
            zarr.open_array(self.array_path, mode="r"), self.job.layout, self.job.data
        )

    def array_used(self) -> dict[str, Any]:
        c = self.create
        codec = [type(x).__name__ for x in c["compressors"] or []]
        return {"zarr_chunks": c["chunks"], "zarr_shards": c.get("shards"), "zarr_codecs": codec}


def shared_chunks(name: str, work: Workload, space: ChunkSpace, kind: str) -> None:
    """Refuse (ValueError) when some rank covers a chunk (shard) only in part."""
    for r in range(work.nranks):
        why = space.misaligned(work.layout(r).dims)
        if why is not None:
            raise ValueError(
                f"{name} refuses this decomposition: rank {r}'s piece covers a {kind} of "
                f"{space.unit} only in part ({why}), so two ranks would write that {kind} with "
                f"plain zarr and one of them would silently lose data (zarr-python #3514); "
                f"use zarr-locked or collio-zarr, or {kind}s that divide every rank's block "
                "(-O chunks=...)"
            )


def read_boxes(arr: Any, lay: Any, like: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The rank's piece of a zarr array, box by box, with plain zarr."""
    out = np.empty_like(like)
    for glob, loc in boxes(lay):
        out[loc] = arr[glob]
    return out


def fsync_units(arr: Any, root: str, units: list[tuple[int, ...]]) -> None:
    """fsync the stored chunk (shard) files and their directories (as collio's backend does)."""
    fsync_files(os.path.join(root, arr.metadata.encode_chunk_key(c)) for c in units)


class CollioZarrApi(_ZarrTarget, CollioApi):
    """collio's zarr backend: every chunk (shard) has one writer."""

    name: ClassVar[str] = "collio-zarr"
    backend: ClassVar[str | None] = "zarr"

    def target(self) -> str:
        return self.array_path

    def open(self, writing: bool) -> None:
        j = self.job
        self.f = collio.open(
            self.array_path, "r+" if writing else "r", comm=j.comm, hints=self.hints() or None,
            backend="zarr", fsync=j.fsync,
        )  # fmt: skip

    def hints_used(self) -> dict[str, Any]:
        return {**super().hints_used(), **self.array_used()}


class ZarrPlainApi(_ZarrTarget, Api):
    """Each rank assigns its own boxes with plain zarr (chunk-aligned decompositions only)."""

    name: ClassVar[str] = "zarr-plain"

    aligned_only: ClassVar[bool] = True

    arr: Any = None

    def open(self, writing: bool) -> None:
        self.arr = zarr.open_array(self.array_path, mode="r+" if writing else "r")

    def transfer(self, writing: bool) -> None:
        j = self.job
        if not writing:
            j.out[...] = read_boxes(self.arr, j.layout, j.out)
            return
        for glob, loc in boxes(j.layout):
            self.arr[glob] = j.data[loc]
        if j.fsync:
            space = _space(j.work, self.create)
            touched = np.stack(space.coords(space.touched_by(j.layout.dims)), axis=1).tolist()
            fsync_units(self.arr, self.array_path, [tuple(c) for c in touched])

    def close(self) -> None:
        self.arr = None

    def hints_used(self) -> dict[str, Any]:
        return self.array_used()


class ZarrLockedApi(ZarrPlainApi):
    """Plain zarr chunk by chunk, each under an exclusive ``flock`` (any decomposition)."""

    name: ClassVar[str] = "zarr-locked"

    aligned_only: ClassVar[bool] = False

    def transfer(self, writing: bool) -> None:
        if not writing:
            super().transfer(writing)
            return
        j = self.job
        for part in _space(j.work, self.create).parts(j.layout.dims):
            lock = os.path.join(self.array_path + ".locks", ".".join(map(str, part.coords)))
            with open(lock, "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                try:
                    self._store(part)
                    if j.fsync:
                        fsync_units(self.arr, self.array_path, [part.coords])
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)

    def _store(self, part: UnitPart) -> None:
        """One chunk: whole, one box (zarr merges it), or read, merge and write back."""
        piece = self.job.data[part.local]
        if part.full:
            self.arr[part.region] = piece
        elif part.box:
            box = tuple(
                slice(r.start + i.start, r.start + i.stop)
                for r, i in zip(part.region, part.inner, strict=True)
            )
            self.arr[box] = piece
        else:
            block = np.asarray(self.arr[part.region])
            block[np.ix_(*(_index(i) for i in part.inner))] = piece
            self.arr[part.region] = block


def _index(sel: Any) -> Any:
    return np.arange(sel.start, sel.stop) if isinstance(sel, slice) else sel
