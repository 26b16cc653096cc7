"""HDF5 datasets: how collio creates them, tells their storage, and opens one as a collio file.

``collio.open(path, mode, backend="hdf5", dataset="x", shape=..., dtype=..., **create)``
opens (``'w'``: creates) the HDF5 file on every rank and gives the engine one dataset:
contiguous ones through :class:`~.storage.FileBackend` at the dataset's offset, chunked
ones (``chunks=``, ``compression=``, ...) as whole encoded chunks.  The file is
readable by stock h5py once closed; :mod:`collio.h5` offers the whole h5py API instead.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import h5py
import numpy as np

from ...collective import Attempt, agree_same
from ...errors import LayoutError, MismatchError, ModeError
from ..base import Backend
from .chunked import ChunkedBackend
from .storage import FileBackend, open_file
from .vfile import VFile

__all__ = [
    "CHUNKED",
    "Hdf5Backend",
    "allocate_contiguous",
    "create",
    "refuse_atomic",
    "storage_kind",
]

#: ``create_dataset`` keywords that make a dataset chunked.
CHUNKED = ("chunks", "compression", "compression_opts", "shuffle", "fletcher32", "maxshape",
           "scaleoffset")  # fmt: skip
#: Options of ``collio.open(..., backend="hdf5")`` that shape a new dataset.
_CREATE = frozenset({"shape", "dtype", "fillvalue", "fill_time", *CHUNKED})
#: Creation options an existing dataset is checked against in every mode.
_EXPECT = ("shape", "dtype", "chunks")


def create(
    parent: Any, name: str, shape: Any, dtype: Any, *, vf: VFile | None = None, **kwargs: Any
) -> Any:
    """A dataset ready for collective writes (every rank, the same call).

    Without chunking options it is contiguous and allocated at creation, so its address
    is known at once.  Where HDF5 would fill it (a ``fillvalue`` with ``fill_time``
    ``'ifset'``, its default, or ``fill_time='alloc'``), rank 0 writes the fill to the
    file itself (:meth:`VFile.fill`; ``vf`` is the file's), a step of bounded size at a
    time: every rank's library would write it into its copy of the file's new bytes,
    held in memory until rank 0 wrote them out.  The dataset's creation property then
    says ``fill_time='never'``; its ``fillvalue`` is kept.  HDF5 still fills what only it
    can: elements that are references or of variable length, scalar datasets and
    external storage.  With chunking options it is h5py's own ``create_dataset``.
    """
    if any(kwargs.get(k) not in (None, False) for k in CHUNKED):
        return parent.create_dataset(name, shape, dtype, **kwargs)
    when = kwargs.pop("fill_time", None)
    if when not in (None, "ifset", "alloc", "never"):
        raise LayoutError(
            f"dataset {name!r}: fill_time {when!r} is not one of 'ifset', 'alloc', 'never'"
        )
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    hdf5_fills = (
        np.dtype(dtype).hasobject or shape in ((), None) or kwargs.get("external") is not None
    )
    if hdf5_fills:  # (HDF5's own fill of a few bytes, or of what numpy holds as objects)
        if when is not None:
            kwargs["fill_time"] = when
        return parent.create_dataset(name, shape, dtype, dcpl=dcpl, **kwargs)
    dset = parent.create_dataset(name, shape, dtype, dcpl=dcpl, fill_time="never", **kwargs)
    filled = when == "alloc" or (when != "never" and kwargs.get("fillvalue") is not None)
    if filled and dset.size:  # (no element: no storage, no offset)
        offset = dset.id.get_offset()
        size = dset.dtype.itemsize
        if offset is None or dset.id.get_type().get_size() != size:
            raise LayoutError(
                f"dataset {name!r}: collio cannot write the fill of its storage "
                f"(offset {offset}, {dset.id.get_type().get_size()}-byte elements in the file, "
                f"{size} in memory): create it with fill_time='never', or chunks=..."
            )
        if vf is None:  # pragma: no cover - every caller in collio passes its file's
            raise LayoutError(f"dataset {name!r}: a fill needs the file's collio VFile")
        value = np.zeros((), dset.dtype)
        if dset.fillvalue is not None:
            value[...] = dset.fillvalue
        vf.fill(int(offset), int(dset.id.get_storage_size()), value.tobytes())
    return dset


def storage_kind(dset: Any) -> str:
    """``"contiguous"`` or ``"chunked"``; other storage raises :class:`LayoutError`."""
    plist = dset.id.get_create_plist()
    layout = plist.get_layout()
    if layout == h5py.h5d.CHUNKED:
        return "chunked"
    if layout == h5py.h5d.CONTIGUOUS and plist.get_external_count() == 0:
        return "contiguous"
    names = {h5py.h5d.COMPACT: "compact", h5py.h5d.CONTIGUOUS: "external"}
    raise LayoutError(
        f"dataset {dset.name!r}: {names.get(layout, 'virtual')} storage is not supported; "
        "use contiguous or chunked datasets"
    )


def allocate_contiguous(dset: Any) -> None:
    """Every rank: write the fill value at element 0, so HDF5 allocates the storage."""
    nd = len(dset.shape)
    if dset.size == 0:
        return
    fspace = dset.id.get_space()
    fspace.select_hyperslab((0,) * nd, (1,) * nd)
    value = np.zeros((1,) * nd, dset.dtype)
    if dset.fillvalue is not None:
        value[...] = dset.fillvalue
    dset.id.write(h5py.h5s.create_simple((1,) * nd), fspace, value)


class Hdf5Backend(Backend):
    """The ``hdf5`` backend: one dataset of an HDF5 file, opened on every rank.

    :meth:`open` returns the dataset's own backend (contiguous or chunked storage).

    Options: ``dataset`` (its name in the file, required); in mode ``'w'`` (which
    creates the file) ``shape`` and ``dtype`` (required) and h5py's ``fillvalue``, ``fill_time``,
    ``chunks``, ``compression``, ``compression_opts``, ``shuffle``, ``fletcher32``,
    ``maxshape``, ``scaleoffset``.  In ``'r'``/``'r+'`` the dataset must exist;
    ``shape``, ``dtype`` and ``chunks``, when given, are checked against it.
    """

    name: ClassVar[str] = "hdf5"
    collective_open: ClassVar[bool] = True  # every rank's library makes the same calls

    @classmethod
    def check_options(cls, mode: str, options: dict[str, Any]) -> None:
        unknown = sorted(set(options) - _CREATE - {"dataset"})
        if unknown:
            raise ModeError(f"hdf5 backend: unknown options {unknown}")
        if not isinstance(options.get("dataset"), str):
            raise ModeError("hdf5 backend: dataset= (its name in the file) is required")
        if mode == "w" and not {"shape", "dtype"} <= set(options):
            raise ModeError("hdf5 backend: mode 'w' creates the dataset: give shape= and dtype=")

    @classmethod
    def open(cls, target: Any, mode: str, *, comm: Any, hints: Any, **options: Any) -> Backend:
        """Collective over `comm`: open the file (rank 0 creates it in 'w'), make the same
        h5py calls on every rank, agree that their metadata is equal, publish it."""
        path = os.fspath(target)
        refuse_atomic(hints, mode)  # (hints are agreed: every rank raises alike)
        vf = open_file(comm, path, mode)
        step = Attempt()
        h5file: Any = None
        dset: Any = None
        mine = None
        with step:
            h5file = h5py.File(vf, mode)  # (h5py's fileobj driver: this rank's replica)
            dset = _dataset(h5file, mode, options, vf)
            if vf.error is not None:  # (rank 0's fill of a new dataset: agreed below)
                raise vf.error
            vf.replica.flush_library(h5file)
            mine = vf.epoch_digest()
        try:
            agree_same(comm, step.error, mine, what=f"open {path!r}", describe=lambda v: "metadata")
            vf.replica.settle(comm, h5file, "open", Attempt(), (), False, False)
            return _backend_for(vf, h5file, dset, mode, hints)
        except BaseException:
            if h5file is not None:
                h5file.close()
            vf.release()
            raise


def refuse_atomic(hints: Any, mode: str) -> None:
    """Local: the hint ``atomic_commit`` cannot be kept (HDF5 files are written in place)."""
    if getattr(hints, "atomic_commit", False) and mode != "r":
        raise ModeError("the hdf5 backend writes files in place: atomic_commit is not supported")


def _dataset(f: Any, mode: str, options: dict[str, Any], vf: VFile) -> Any:
    """Local, the same calls on every rank: create (``'w'``) or find and check the dataset."""
    name = options["dataset"]
    if mode == "w":
        kw = {k: v for k, v in options.items() if k in _CREATE and k not in ("shape", "dtype")}
        return create(f, name, tuple(options["shape"]), options["dtype"], vf=vf, **kw)
    if name not in f:
        raise FileNotFoundError(2, f"no dataset {name!r} in the file", f"{name}")
    dset = f[name]
    have = {"shape": tuple(dset.shape), "dtype": dset.dtype, "chunks": dset.chunks}
    for k in _EXPECT:
        if k in options:
            want = np.dtype(options[k]) if k == "dtype" else options[k]
            want = tuple(want) if k != "dtype" and want is not None else want
            if want != have[k]:
                raise MismatchError(f"dataset {name!r} has {k} {have[k]}, not {want}")
    storage_kind(dset)
    return dset


def _backend_for(vf: VFile, h5file: Any, dset: Any, mode: str, hints: Any) -> Backend:
    if storage_kind(dset) == "contiguous":
        be: Backend = _Contiguous(vf, mode, hints, h5file, dset)
    else:
        be = _Chunked(vf, dset, "r" if mode == "r" else "r+", h5file)
    return be


class _Contiguous(FileBackend):
    """A contiguous dataset of a file this backend owns (it closes the h5py file)."""

    def __init__(self, vf: VFile, mode: str, hints: Any, h5file: Any, dset: Any) -> None:
        super().__init__(vf, mode, hints)
        self.h5file = h5file
        self.bind(dset, int(dset.id.get_offset() or 0))

    def sync(self) -> None:
        """Rank 0 publishes the metadata its library holds, then fsync (FileBackend.sync)."""
        h5py.h5f.flush(self.h5file.id)
        super().sync()

    def close(self) -> None:
        self.dset = None
        self.h5file.close()  # (HDF5 lets go of the VFile: rank 0 publishes, all close)
        super().close()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "backend": "hdf5", "storage": "contiguous"}


class _Chunked(ChunkedBackend):
    """A chunked dataset of a file this backend owns, its chunk index read at every call."""

    def __init__(self, vf: VFile, dset: Any, mode: str, h5file: Any) -> None:
        super().__init__(vf, dset, mode)
        self.h5file = h5file
        self.alignment = self.nbytes  # one chunk: every chunk has one aggregator

    def check_layout(self, layout: Any) -> None:
        if self.vf.replica.diverged is not None:  # a failed chunk write: refused alike
            raise self.vf.replica.refusal("a call on its dataset")
        super().check_layout(layout)
        self.load_table()

    def sync(self) -> None:
        h5py.h5f.flush(self.h5file.id)  # (rank 0 publishes the chunk index)
        super().sync()
        self.vf.sync()

    def close(self) -> None:
        super().close()
        self.dset = None
        self.h5file.close()
        self.vf.release()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "backend": "hdf5", "storage": "chunked"}
