"""Public functions of :mod:`collio.h5`: open, create, write_all, read_all, flush, close."""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np
from mpi4py import MPI

from .. import engine
from ..backends.base import Backend
from ..backends.hdf5.chunked import chunked_backend
from ..backends.hdf5.dataset import allocate_contiguous, create, storage_kind
from ..backends.hdf5.storage import check_dataset_layout
from ..collective import Attempt, agree
from ..comms import exclusive
from ..context import Context
from ..errors import LayoutError, ModeError
from ..layouts import Layout, Subarray
from ..layouts.base import Segments
from ..stats import Stats
from .session import Session, session_of

__all__ = [
    "Collective",
    "File",
    "close",
    "collective",
    "create_dataset",
    "flush",
    "info",
    "read_all",
    "stats",
    "write_all",
]


class File(h5py.File):  # type: ignore[misc]  # h5py has no type stubs
    """Collective over `comm`: ``h5py.File`` on the ``collio`` driver, with a collective close.

    Same arguments as ``h5py.File`` plus ``comm`` (default ``MPI.COMM_WORLD``) and
    ``hints`` (ROMIO's names, as for :func:`collio.open`).  ``close()`` (and leaving
    a ``with`` block) is collective: it checks every rank made the same metadata
    calls, writes the metadata and fsyncs the file.
    """

    def __init__(
        self, name: Any, mode: str = "r", *, comm: MPI.Comm | None = None, hints: Any = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            name, mode, driver="collio", comm=comm, hints=hints, path=name, access=mode, **kwargs
        )

    def close(self) -> None:
        """Collective over `comm`: agree, write the metadata, fsync, close.  Idempotent."""
        if not self.id.valid:
            return
        session_of(self).close(self)


def create_dataset(parent: Any, name: str, shape: Any, dtype: Any, **kwargs: Any) -> Any:
    """Collective over `comm` (a metadata call): a dataset ready for collective writes.

    Without chunking options the dataset is contiguous and allocated at creation, so its
    address is known at once.  A ``fillvalue`` is written over it as h5py's default
    (``fill_time='ifset'``, or ``'alloc'``) has HDF5 write it, but by rank 0 alone, into
    the file, not into every rank's copy of its new bytes
    (:func:`collio.backends.hdf5.dataset.create`); ``fill_time='never'`` keeps it as a
    property only.
    With ``chunks``, ``compression``, ``shuffle``, ... it is h5py's own ``create_dataset``.
    """
    return create(parent, name, shape, dtype, vf=session_of(parent).vfile, **kwargs)


# ------------------------------------------------------------------ data
def _prepare(s: Session, dset: Any, *, writing: bool) -> tuple[str, int | None]:
    """Local, changes nothing: storage kind and offset (None: not allocated yet)."""
    if writing and s.mode == "r":
        raise ModeError(f"write_all on {s.path!r} opened read-only")
    kind = storage_kind(dset)
    return kind, dset.id.get_offset() if kind == "contiguous" else None


def _call(s: Session, dset: Any, what: str, writing: bool) -> tuple[str, int | None]:
    """Collective: the metadata checkpoint with the call's key (see Session.checkpoint).

    A contiguous dataset HDF5 allocates late is allocated after the call's first
    agreement, by every rank alike: before it, a rank allocating alone (its call a
    write, another rank's a flush) would change its library's metadata, and every
    later call would find the ranks' metadata different.
    """
    box: list[tuple[str, int | None]] = []

    def key() -> tuple[Any, ...]:
        box.append(_prepare(s, dset, writing=writing))
        kind, offset = box[0]
        return (kind, offset, tuple(dset.shape), dset.dtype.str)

    def allocate() -> bool:
        kind, offset = box[0]
        if not writing or kind != "contiguous" or offset is not None:
            return False
        allocate_contiguous(dset)
        offset = dset.id.get_offset()
        if offset is not None:  # the element written to allocate is not metadata
            s.vfile.forget(offset, offset + dset.dtype.itemsize)
        box[0] = kind, offset
        return True

    s.checkpoint(dset, call=what, subject=f"dataset {dset.name!r}", key=key, then=allocate)
    return box[0]


def _context(s: Session, dset: Any, kind: str, offset: int | None) -> Context:
    """The call's engine context: the file's bytes at a contiguous dataset's offset, or
    a chunked dataset's chunk space."""
    if kind == "contiguous":
        s.backend.bind(dset, int(offset or 0))
        return s.core.context(s.backend)
    cls = chunked_backend(int(np.prod(dset.chunks)) * dset.dtype.itemsize)
    be = cls(s.vfile, dset, s.mode)
    be.load_table()
    return s.core.context(be)


def _done(s: Session, be: Backend) -> None:
    """Local, after a call: a chunked dataset's backend lets go of its buffers, the file's
    bytes of the dataset they were bound to."""
    if be is s.backend:
        s.backend.unbind()
    else:
        be.close()


def write_all(dset: Any, data: Any, layout: Layout) -> None:
    """Collective over `comm`: write every rank's ``data`` into ``dset`` where ``layout`` says.

    ``layout`` is an array layout of the dataset itself (global shape = the
    dataset's shape, its dtype, C order, offset 0).  Every rank calls, an empty
    piece included.  Contiguous datasets are written at their file offset by the
    aggregators; chunked ones are assembled, encoded and written whole.
    """
    s = session_of(dset)
    with exclusive(s.comm, "write_all"):  # (a second thread's call raises, see comms)
        kind, offset = _call(s, dset, "write_all", True)
        ctx = _context(s, dset, kind, offset)
        try:
            engine.write(ctx, data, layout)
        finally:
            _done(s, ctx.backend)


def read_all(dset: Any, layout: Layout, out: Any = None) -> Any:
    """Collective over `comm`: read this rank's piece of ``dset``; returns an ndarray.

    Works on any contiguous or chunked dataset, whoever wrote the file: each chunk
    is read and decoded once, by its aggregator, and sent to the ranks that need it.
    """
    s = session_of(dset)
    with exclusive(s.comm, "read_all"):  # (a second thread's call raises, see comms)
        return _read_all(s, dset, layout, out)


def _read_all(s: Session, dset: Any, layout: Layout, out: Any) -> Any:
    """Collective over ``s.comm``: :func:`read_all`'s work."""
    kind, offset = _call(s, dset, "read_all", False)
    if kind == "contiguous" and offset is None:  # never written: the fill value
        step = Attempt()
        arr: Any = None
        with step:
            layout.validate()
            check_dataset_layout(dset, layout)
            arr, _ = layout.allocate(out)
            arr[...] = dset.fillvalue if dset.fillvalue is not None else 0
        agree(s.comm, step.error, what="read_all")
        return arr
    ctx = _context(s, dset, kind, offset)
    try:
        return engine.read(ctx, layout, out)
    finally:
        _done(s, ctx.backend)


class _Invalid(Segments):
    """A layout that fails validation inside the collective call (so all ranks raise)."""

    def __init__(self, message: str) -> None:
        super().__init__([], [])
        self.message = message

    def validate(self) -> None:
        raise LayoutError(self.message)


def _box(dset: Any, sel: Any) -> Layout:
    """The Subarray a NumPy-style selection of unit-step slices names (never raises)."""
    shape = tuple(dset.shape)
    items = sel if isinstance(sel, tuple) else (sel,)
    if any(i is Ellipsis for i in items):
        k = items.index(Ellipsis)
        items = items[:k] + (slice(None),) * (len(shape) - len(items) + 1) + items[k + 1 :]
    items = items + (slice(None),) * (len(shape) - len(items))
    if len(items) != len(shape) or not all(isinstance(i, slice) for i in items):
        return _Invalid(f"selection {sel!r}: use one slice per dimension of {shape}")
    start, count = [], []
    for i, n in zip(items, shape, strict=True):
        a, b, step = i.indices(n)
        if step != 1:
            return _Invalid(f"selection {sel!r}: slices must have step 1")
        start.append(a)
        count.append(max(0, b - a))
    return Subarray(shape, start, count, dset.dtype)


class Collective:
    """``collio.h5.collective(dset)``: h5py-style indexing that is collective.

    ``c[sel] = local`` writes and ``c[sel]`` reads this rank's box, where ``sel``
    is one unit-step slice per dimension (``...`` allowed); an empty slice is an
    empty piece.  Every rank must index, in the same order.
    """

    def __init__(self, dset: Any) -> None:
        self.dset = dset

    def __setitem__(self, sel: Any, value: Any) -> None:
        lay = _box(self.dset, sel)
        try:
            data = np.asarray(value, dtype=self.dset.dtype)
        except (TypeError, ValueError) as exc:  # raised inside write_all, on every rank
            bad = _Invalid(f"value {value!r:.60} for dtype {self.dset.dtype}: {exc}")
            write_all(self.dset, np.zeros(0, np.uint8), bad)
            return
        if isinstance(lay, Subarray) and data.shape != lay.local_shape:
            try:
                data = np.broadcast_to(data, lay.local_shape)
            except ValueError:
                pass  # the engine reports the shape mismatch on every rank
        write_all(self.dset, np.ascontiguousarray(data), lay)

    def __getitem__(self, sel: Any) -> Any:
        return read_all(self.dset, _box(self.dset, sel))

    def __enter__(self) -> Collective:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def collective(dset: Any) -> Collective:
    """Collective indexing of ``dset``: ``with collio.h5.collective(d) as c: c[sel] = x``."""
    return Collective(dset)


def flush(obj: Any) -> None:
    """Collective over `comm`: agree on the metadata, write it, fsync data and metadata."""
    session_of(obj).sync(obj)


def close(f: Any) -> None:
    """Collective over `comm`: :func:`flush`, then close the h5py file on every rank.

    Idempotent.  A rank calling it beside another call of the others (a flush, a
    write_all) makes every rank raise the same :class:`~collio.MismatchError` and
    closes the file on every rank, as this close would.
    """
    if not f.id.valid:
        return
    session_of(f).close(f)


def stats(obj: Any) -> Stats:
    """The collio statistics of the file ``obj`` lives in (same on every rank)."""
    return session_of(obj).stats


def info() -> dict[str, Any]:
    """Versions, and whether h5py was built with MPI (collio works either way)."""
    cfg = h5py.get_config()
    return {
        "h5py": h5py.version.version,
        "hdf5": h5py.version.hdf5_version,
        "h5py_mpi": bool(cfg.mpi),
        "driver": "collio (h5py fileobj driver; rank 0 writes, other ranks replicate)",
    }
