"""Zarr arrays (v3, sharded or not) where every chunk or shard has exactly one writer.

The engine sees the array as a chunk-major byte space
(:class:`~collio.backends.chunkspace.ChunkSpace`): unit ``u`` (a chunk, or a
whole shard when sharding is on) is bytes ``[u*U, (u+1)*U)``.  The backend's
alignment is ``U``, so file domains are made of whole units and each unit is
assembled and stored by the one aggregator that owns it, through zarr's own API
and codec pipeline (``AsyncArray.setitem`` of the unit's region; zarr encodes,
compresses and, for shards, builds the index).  Units nobody touched are never
written; units partly covered by a call are read, merged and rewritten by their
owner.  Reads decode each needed unit once, on its owner, and the engine
redistributes the bytes.  Units that one rank alone touches may skip the shuffle
(:meth:`ZarrBackend.own_runs`): that rank stores or decodes them itself, as plain
zarr would, unless the decomposition is so skewed that the aggregators' even
shares are worth the exchange.

Threads: windows are written in collio's I/O thread while the main thread may
read the next window's partial units; both submit coroutines to zarr's own event
loop (``zarr.core.sync.sync``, thread-safe) and never touch the same unit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import zarr
from mpi4py import MPI

from ...errors import BackendError, LayoutError
from ...layouts.arrays import ArrayLayout
from ...redact import redact_text
from ...runs import Runs
from ..base import Backend
from ..chunkspace import ChunkSpace
from ..fsync import fsync_files, start_writeback
from .opening import open_array
from .regions import load_regions, store_regions
from .shares import keep_own
from .spec import array_facts

__all__ = ["ZarrBackend"]

I64 = npt.NDArray[np.int64]
#: Above this many units the count of ranks per unit (one int32 each, allreduced) is skipped.
MAX_DIRECT_UNITS = 1 << 18


class ZarrBackend(Backend):
    """A zarr array open on every rank; aggregators store whole chunks (or shards).

    Open with ``collio.open(target, mode, backend="zarr", ...)`` where ``target``
    is a path or URL, a zarr store, or a ``zarr.Array``.  Options (mode ``'w'``
    creates the array on rank 0, overwriting what is there): ``shape``,
    ``dtype``, ``chunks``, ``shards``, ``compressors``, ``filters``,
    ``serializer``, ``fill_value``, ``attributes``, ``dimension_names``,
    ``chunk_key_encoding``, ``zarr_format`` (3), ``config``; in every mode
    ``path`` (the array inside the store), ``storage_options`` (fsspec URLs) and
    ``fsync`` (default True: ``sync()``/``close()`` fsync the chunk files this
    rank stored, on local directories).
    In every mode ``shape``, ``dtype``, ``chunks`` and ``shards``, when given, are
    checked against the array; in ``'r'``/``'r+'`` the other creation options are
    ignored, so one set of options serves writing and reading.
    """

    name: ClassVar[str] = "zarr"
    partial_write: ClassVar[bool] = False  # whole chunks only; holes filled per chunk
    independent: ClassVar[bool] = False  # ranks sharing a chunk would lose data
    sparse: ClassVar[bool] = False  # untouched elements read as the fill value

    def __init__(self, array: Any, mode: str, *, copy_values: bool, fsync: bool = True) -> None:
        self.array = array
        self.mode = mode
        self.readable = True
        self.writable = mode != "r"
        facts = array_facts(array)
        #: the array's dtype; :attr:`dtype` is the byte order of the call's layout
        self.stored_dtype: np.dtype[Any] = facts.dtype
        self.dtype: np.dtype[Any] = facts.dtype
        self.unit_kind = "shard" if facts.shards else "chunk"
        unit = facts.shards or facts.chunks
        self.space = ChunkSpace(facts.shape, unit, self.dtype.itemsize, "C")
        self.alignment = max(1, self.space.unit_nbytes)  # type: ignore[misc]  # per array
        self._copy = copy_values
        self._fsync = fsync
        self._written: set[tuple[int, ...]] = set()  # grid coordinates of stored units
        self._layout: ArrayLayout | None = None  # this call's, set by check_layout
        self._shared: npt.NDArray[np.bool_] | None = None  # units that aggregators store
        self._shares: npt.NDArray[np.float64] | None = None  # per domain (keep_own)
        self._naggs: int | None = None  # the cb_nodes hint
        self._limit = max(1, int(zarr.config.get("async.concurrency") or 10))
        self._info: dict[str, Any] = {
            "backend": self.name,
            "partial_write": self.partial_write,
            "alignment": self.alignment,
            "min_request": self.min_request,
            "max_request": self.max_request,
            "store": redact_text(str(array.store)),
            "path": str(array.path),
            "shape": list(facts.shape),
            "dtype": self.dtype.str,
            "chunks": list(facts.chunks),
            "shards": list(facts.shards) if facts.shards else None,
            "unit": self.unit_kind,
            "unit_nbytes": self.space.unit_nbytes,
            "units": self.space.nunits,
            "domains": [],
        }

    # -- open -----------------------------------------------------------------
    @classmethod
    def open(cls, target: Any, mode: str, *, comm: Any, hints: Any, **options: Any) -> ZarrBackend:
        """Collective over `comm`: create (rank 0, mode 'w') or find the array, open it everywhere.

        Every failure (bad options, a missing array, a read-only store, ranks
        opening different arrays) raises the same error on every rank.
        """
        fsync = bool(options.pop("fsync", True))
        array, spec = open_array(target, mode, comm=comm, hints=hints, options=options)
        be = cls(array, mode, copy_values=spec.in_memory, fsync=fsync)
        be._naggs = getattr(hints, "cb_nodes", None)
        return be

    # -- layouts ----------------------------------------------------------------
    def check_layout(self, layout: Any) -> None:
        """The layout must describe this array: same global shape and dtype, no offset."""
        if not isinstance(layout, ArrayLayout):
            raise LayoutError(
                f"the zarr backend needs an array layout (Subarray, block, block_cyclic), "
                f"not {type(layout).__name__}"
            )
        shape = self.space.shape
        if layout.global_shape != shape:
            raise LayoutError(
                f"layout global shape {layout.global_shape} does not match the zarr array's "
                f"shape {shape}"
            )
        if layout.dtype.newbyteorder("=") != self.stored_dtype.newbyteorder("="):
            raise LayoutError(
                f"layout dtype {layout.dtype} does not match the zarr array's dtype "
                f"{self.stored_dtype}"
            )
        # (either byte order: zarr converts a unit as it stores or reads it, and v3 reports
        # its own native order whatever the array was created with)
        self.dtype = layout.dtype
        if layout.offset:
            raise LayoutError(f"a zarr layout has no byte offset (got {layout.offset})")
        if not shape:
            raise LayoutError("0-d zarr arrays are not supported")
        if self.space.order != layout.order:
            self.space = ChunkSpace(shape, self.space.unit, self.space.itemsize, layout.order)
        self._layout = layout
        self._shared = None
        self._shares = None
        self._info["last_call"] = None

    def check_batch(self, layouts: Sequence[Any]) -> None:
        """One memory order and one dtype for all items (their runs are counted in one chunk
        space, whose bytes follow the order and are viewed as the dtype); and no layout of
        the call: a batch's runs are no one layout's box, so none of its units is stored
        directly by its rank (:meth:`own_runs`)."""
        orders = sorted({lay.order for lay in layouts})
        if len(orders) > 1:
            raise LayoutError(
                f"the items of a zarr batch must share one order, not {' and '.join(orders)}"
            )
        dtypes = sorted({lay.dtype.str for lay in layouts})
        if len(dtypes) > 1:  # (one dtype views every unit of the call)
            raise LayoutError(
                f"the items of a zarr batch must share one byte order, not {' and '.join(dtypes)}"
            )
        self._layout = None

    def runs_for(self, layout: Any) -> Runs:
        """This rank's runs in chunk-major space (call after :meth:`check_layout`)."""
        return self.space.runs(layout.dims)

    def domain_extent(self, lo: int, hi: int) -> tuple[int, int]:
        return self.space.extent(lo, hi)

    def own_runs(
        self, comm: Any, runs: Runs, *, writing: bool
    ) -> tuple[npt.NDArray[np.bool_], bool] | None:
        """Collective over `comm`: keep the runs of units that no other rank touches.

        One allreduce counts the ranks meeting each unit.  A unit met by one rank
        only, as one box of its elements, is stored (or decoded) by that rank
        directly, as plain zarr would, and still has exactly one writer; shared
        units go through their aggregator.  A chunk-aligned decomposition thus
        needs no shuffle at all, a misaligned one shuffles only its border units,
        unless keeping would leave one rank far more work than an even share
        (:func:`~collio.backends.zarr.shares.keep_own`; one allgather decides), when
        every unit goes through the aggregators, which balance them.  Kept, the
        shared units go mostly to aggregators with little of their own to store.
        """
        if self.space.nunits > MAX_DIRECT_UNITS:
            return None
        ids, _ = self.space.touched(runs)
        lay = self._layout
        box = self.space.box_flags(lay.dims, ids) if lay is not None else np.zeros(len(ids), bool)
        counts = np.zeros(self.space.nunits, np.int32)
        counts[ids] = np.where(box, 1, 2)  # a unit this rank cannot store as a box is "shared"
        comm.Allreduce(MPI.IN_PLACE, [counts, MPI.INT32_T], op=MPI.SUM)
        alone = counts == 1
        keep = alone[runs.file // self.space.unit_nbytes] if len(runs) else np.zeros(0, bool)
        mine = np.array([runs.length[keep].sum(), runs.nbytes], np.int64)
        every = np.empty(2 * comm.Get_size(), np.int64)
        comm.Allgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
        own = every[0::2]
        aggs = self.aggregators
        naggs = len(aggs) if aggs is not None else min(self._naggs or comm.size, comm.size)
        agg_own = own[aggs] if aggs is not None else None
        self._shares = keep_own(own, int(every[1::2].sum()), naggs, agg_own=agg_own)
        self._info["kept"] = own.tolist() if self._shares is not None else [0] * len(own)
        if self._shares is None:
            self._shared = counts >= 1  # every touched unit goes through an aggregator
            return None
        self._shared = counts >= 2
        direct = not bool(self._shared.any())
        self._info["last_call"] = "direct" if direct else "mixed"
        if direct:
            self._info["domains"] = []
        return keep, direct

    def domain_bounds(self, lo: int, hi: int, naggs: int, align: int) -> I64:
        """Whole units, cut for even shares of the real bytes the aggregators store.

        When :meth:`own_runs` counted the ranks per unit, only the units that go
        through the aggregators weigh; the assignment is recorded for statistics.
        """
        shares = self._shares if self._shares is not None and len(self._shares) == naggs else None
        bounds = self.space.domain_bounds(lo, hi, naggs, align, self._shared, shares)
        if self._info.get("last_call") != "mixed":
            self._info["last_call"] = "two-phase"
        self._info["order"] = self.space.order
        self._info["domains"] = self.space.assignment(bounds, self._shared)
        return bounds

    # -- windows (I/O thread and main thread) -----------------------------------
    def write_window(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        """Store every unit of the window that some rank wrote (whole units, zarr codecs)."""
        ids, got = self.space.unit_bytes(offset, len(buf), cover)
        ids = ids[got > 0]
        if not len(ids):
            return []
        values = [self._unit(buf, offset, u) for u in ids.tolist()]
        if self._copy:
            values = [v.copy() for v in values]
        store_regions(self.array, [self.space.region(u) for u in ids.tolist()], values, self._limit)
        self._stored(ids)
        return self.space.valid_nbytes(ids).tolist()  # type: ignore[no-any-return]

    def fill_holes(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        """Read the units this round covers only in part (their owner merges and rewrites)."""
        ids, got = self.space.unit_bytes(offset, len(buf), cover)
        valid = self.space.valid_nbytes(ids)
        part = (got > 0) & (got < valid)
        return self._load_into(buf, offset, ids[part])

    def read_window(self, offset: int, buf: npt.NDArray[np.uint8], need: Runs) -> list[int]:
        """Decode each unit some rank needs, once."""
        ids, got = self.space.unit_bytes(offset, len(buf), need)
        return self._load_into(buf, offset, ids[got > 0])

    def _stored(self, ids: I64) -> None:
        """Remember the grid coordinates of stored units (for :meth:`sync`), start writeback.

        In a local directory each stored chunk file starts going to disk at once
        (``sync_file_range``), as the posix backend does with its rounds: the disk
        works while this rank goes on, and ``sync`` has little left to do.
        """
        if not self._fsync or not len(ids):
            return
        coords = list(map(tuple, np.stack(self.space.coords(ids), axis=1).tolist()))
        self._written.update(coords)
        root = self._root()
        if root is not None:
            for c in coords:
                start_writeback(self._unit_path(root, c))

    def _root(self) -> str | None:
        """The local directory of the store, or None (memory, object stores)."""
        root = getattr(self.array.store, "root", None)
        return os.fspath(root) if isinstance(root, os.PathLike) else None

    def _unit_path(self, root: str, coords: tuple[int, ...]) -> str:
        key = self.array.metadata.encode_chunk_key(coords)
        return os.path.join(root, str(self.array.path), key)

    def _unit(self, buf: npt.NDArray[np.uint8], offset: int, uid: int) -> np.ndarray[Any, Any]:
        ub = self.space.unit_nbytes
        start = uid * ub - offset
        return self.space.view(buf[start : start + ub], self.dtype, uid)

    def _load_into(self, buf: npt.NDArray[np.uint8], offset: int, ids: I64) -> list[int]:
        if not len(ids):
            return []
        dests = [self._unit(buf, offset, u) for u in ids.tolist()]
        load_regions(self.array, [self.space.region(u) for u in ids.tolist()], dests, self._limit)
        return self.space.valid_nbytes(ids).tolist()  # type: ignore[no-any-return]

    # -- the direct path: units this rank alone touches (after own_runs) ----------
    def write_runs(self, runs: Runs, data: npt.NDArray[np.uint8]) -> list[int]:
        """Store the units only this rank touches, each as one region (zarr merges partial ones).

        Returns the bytes stored per unit (one request each).
        """
        ids, boxes, local = self._own(runs, data)
        whole = self._whole(runs, local)
        if whole is not None:  # every unit of the rank's box is its own: as plain zarr does
            value = local.copy() if self._copy else local
            store_regions(self.array, [whole], [value], self._limit)
            self._stored(ids)
            return [local[ls].nbytes for _, ls in boxes]
        values = [local[ls] for _, ls in boxes]
        if self._copy:
            values = [v.copy() for v in values]
        store_regions(self.array, [gs for gs, _ in boxes], values, self._limit)
        self._stored(ids)
        return [v.nbytes for v in values]

    def read_runs(self, runs: Runs, out: npt.NDArray[np.uint8]) -> list[int]:
        """Decode the units only this rank needs, straight into its output (one request each)."""
        _, boxes, local = self._own(runs, out)
        whole = self._whole(runs, local)
        if whole is not None:
            load_regions(self.array, [whole], [local], self._limit)
            return [local[ls].nbytes for _, ls in boxes]
        dests = [local[ls] for _, ls in boxes]
        load_regions(self.array, [gs for gs, _ in boxes], dests, self._limit)
        return [d.nbytes for d in dests]

    def _whole(self, runs: Runs, local: np.ndarray[Any, Any]) -> tuple[slice, ...] | None:
        """The rank's whole box, when the runs kept are all of it (one zarr request)."""
        box = getattr(self._layout, "slices", None)
        if box is None or runs.nbytes != local.nbytes:
            return None
        return tuple(box)

    def _own(
        self, runs: Runs, data: npt.NDArray[np.uint8]
    ) -> tuple[I64, list[tuple[tuple[slice, ...], tuple[slice, ...]]], np.ndarray[Any, Any]]:
        lay = self._layout
        if lay is None:
            raise BackendError("the zarr backend's direct path needs the call's layout")
        ids, _ = self.space.touched(runs)
        boxes = self.space.boxes(lay.dims, ids)
        if boxes is None:
            raise BackendError("a rank's elements in a chunk are not one box")
        shape = lay.local_shape
        flat = data.view(self.dtype)
        local = flat.reshape(shape[::-1]).T if lay.order == "F" else flat.reshape(shape)
        return ids, boxes, local

    # -- byte access (not used by the two-phase engine: windows are whole units) --
    def write_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        ub = self.space.unit_nbytes
        if offset % ub or len(buf) % ub:
            raise BackendError(
                f"the zarr backend writes whole {self.unit_kind}s of {ub} bytes, "
                f"not [{offset}, {offset + len(buf)})"
            )
        self.write_window(offset, buf, _one_run(offset, len(buf)))

    def read_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        lo, hi = self.space.extent(offset, offset + len(buf))
        hi = min(hi, self.space.nbytes)
        tmp = np.zeros(max(hi - lo, 0), np.uint8)
        if len(tmp):
            self.read_window(lo, tmp, _one_run(lo, len(tmp)))
        n = max(0, min(len(buf), hi - offset))
        buf[:n] = tmp[offset - lo : offset - lo + n]
        buf[n:] = 0

    # -- completion ---------------------------------------------------------------
    def size(self) -> int:
        return self.space.nbytes

    def sync(self) -> None:
        """Make the chunk files this rank stored durable (local directories: fsync)."""
        written, self._written = self._written, set()
        root = self._root()
        if not written or not self._fsync or root is None:
            return
        fsync_files(self._unit_path(root, c) for c in sorted(written))

    def close(self) -> None:
        self._written = set()

    def describe(self) -> dict[str, Any]:
        """Capabilities and geometry; ``domains`` is updated by every collective call.

        The same dict object is returned each time (``File.stats.backend`` keeps it),
        so the last call's assignment of units to aggregators shows there.
        """
        return self._info


def _one_run(offset: int, nbytes: int) -> Runs:
    z = np.zeros(1, np.int64)
    return Runs(z + offset, z + nbytes, z)
