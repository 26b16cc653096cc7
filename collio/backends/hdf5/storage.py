"""An HDF5 file open on every rank: rank 0's real file, the replicas, and its raw bytes.

:func:`open_file` (collective) makes the file on rank 0 (or checks it), opens it on
every rank and gives each a :class:`~collio.backends.hdf5.vfile.VFile` that h5py's
``fileobj`` driver reads and writes, with the :class:`~.replica.Replica` that agrees
on the metadata.  A :class:`FileBackend` over it is what the engine and the file core
see: POSIX ``pwrite``/``preadv`` on that descriptor, shifted to a contiguous
dataset's offset while a call on it runs (:meth:`FileBackend.bind`); its ``sync``
makes both the metadata rank 0 published and the raw data durable, its ``close``
publishes what is left and closes the descriptor.
"""

from __future__ import annotations

import errno
import fcntl
import os
import weakref
from typing import Any, ClassVar

from mpi4py import MPI

from ...collective import Attempt, agree, bcast_outcome
from ...errors import BackendError, LayoutError
from ...layouts import ArrayLayout
from ...runs import Runs
from ..filereads import maps_for
from ..localfile import check_target, open_regular, truncate_opened
from ..posix import PosixBackend
from .replica import Replica
from .vfile import VFile

__all__ = ["FileBackend", "check_dataset_layout", "open_file"]


def check_dataset_layout(dset: Any, layout: Any) -> None:
    """Raise :class:`LayoutError` unless ``layout`` describes a piece of ``dset``."""
    if not isinstance(layout, ArrayLayout):
        raise LayoutError(f"a dataset needs an array layout, not {type(layout).__name__}")
    if layout.global_shape != tuple(dset.shape):
        raise LayoutError(
            f"layout global shape {layout.global_shape} differs from dataset "
            f"{dset.name!r} shape {tuple(dset.shape)}"
        )
    if layout.dtype != dset.dtype:
        raise LayoutError(f"layout dtype {layout.dtype} differs from dataset dtype {dset.dtype}")
    if layout.order != "C" or layout.offset != 0:
        raise LayoutError(
            f"dataset layouts are C order from offset 0 (got order {layout.order!r}, "
            f"offset {layout.offset})"
        )


class FileBackend(PosixBackend):
    """The file's bytes on the VFile's descriptor; a contiguous dataset is them shifted."""

    name: ClassVar[str] = "hdf5-contiguous"
    local_sync: ClassVar[bool] = False  # (its sync publishes rank 0's metadata)

    def __init__(self, vf: VFile, mode: str, hints: Any) -> None:
        super().__init__(vf.path, vf.fd, "r" if mode == "r" else "r+", None, True)
        self._vfile = weakref.ref(vf)  # (HDF5 owns the VFile; it owns this backend's core)
        self.replica: Replica = vf.replica
        self.dset: Any = None
        self.offset = 0
        self.maps = maps_for(hints, vf.fd)  # reads copy from the mapped file (mapped_reads)
        if self.writable and self.writeback and bool(getattr(hints, "early_flush", True)):
            self.flusher = vf.early_flush()  # (the VFile's: it waits for it before closing)

    def bind(self, dset: Any, offset: int) -> None:
        """A call on the contiguous dataset ``dset``, stored from byte ``offset``, starts."""
        self.dset, self.offset = dset, offset

    def unbind(self) -> None:
        """The call is over: a dataset held between calls would keep HDF5's file open after
        the user drops it, until HDF5's exit handler calls into a finalized Python."""
        self.dset = None

    def check_layout(self, layout: Any) -> None:
        if self.dset is not None:  # (None: a batch's items are checked against their own)
            check_dataset_layout(self.dset, layout)

    def runs_for(self, layout: Any) -> Runs:
        r: Runs = layout.runs()
        return Runs(r.file + self.offset, r.length, r.mem)

    def clean(self) -> bool:
        """Never: the sync publishes and fsyncs rank 0's metadata, which this backend does
        not track."""
        return False

    def sync(self) -> None:
        """fsync rank 0's published metadata and chunks, then the raw data (early flush)."""
        self.replica.vfile.sync()
        super().sync()

    def close(self) -> None:
        """Publish what is left (rank 0), make it durable, close the descriptor (the VFile
        owns it; h5py closing the file may have done all of this already)."""
        self.dset = None
        self.fd = -1
        vf = self._vfile()
        if vf is not None:
            vf.release()


def open_file(comm: MPI.Comm, path: str, mode: str) -> VFile:
    """Collective over `comm`: rank 0 creates or checks ``path`` (h5py's ``mode``), every
    rank opens it, rank 0 locks it; then, once every rank's open succeeded, rank 0
    truncates it where the mode says so (a failed open leaves the file as it was).  Each
    step is agreed, so a failure is raised on every rank.  The caller keeps the VFile
    alive until HDF5 holds it (its backend refers to it weakly)."""
    step = Attempt()
    found = None
    if comm.Get_rank() == 0:
        with step:
            found = _prepare(path, mode)
    size, emptied = bcast_outcome(comm, found, step.error, what=f"open {path!r}")
    step = Attempt()
    fd = -1
    with step:
        fd = open_regular(path, os.O_RDONLY if mode == "r" else os.O_RDWR)
        if comm.Get_rank() == 0:
            _lock(fd, path, mode)
    try:
        agree(comm, step.error, what=f"open {path!r}")
        if emptied:
            truncate_opened(comm, fd, size, path)
            size = 0
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    vf = VFile(path, fd, int(size), root=comm.Get_rank() == 0)
    vf.replica = Replica(vf)
    return vf


def _lock(fd: int, path: str, mode: str) -> None:
    """On rank 0: HDF5's file lock, which h5py's file-object driver does not take
    (``flock``, shared to read, exclusive to write, never waiting), so that another
    program's HDF5 does not open for writing a file collio has open, nor collio one that
    program has open; the descriptor's close lets go of it.  ``HDF5_USE_FILE_LOCKING``
    as HDF5 reads it: ``FALSE`` takes none, and a file system without locks is let be."""
    use = os.environ.get("HDF5_USE_FILE_LOCKING", "TRUE").strip().upper()
    if use in ("FALSE", "0"):
        return
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if mode == "r" else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP):
            return
        raise BackendError(
            f"unable to lock {path!r} (HDF5's file lock: another program has it open"
            f"{' for writing' if mode == 'r' else ''}; HDF5_USE_FILE_LOCKING=FALSE "
            "opens it anyway)",
            errno=exc.errno,
        ) from exc


def _prepare(path: str, mode: str) -> tuple[int, bool]:
    """On rank 0: create or check the file (a regular one: never a FIFO, whose open would
    block); its size, and whether the mode empties it (after the ranks' opens and the
    lock: :func:`~collio.backends.localfile.truncate_opened`)."""
    before = check_target(path, "r" if mode in ("r", "r+") else "w")
    if mode in ("w-", "x") and before is not None:
        raise FileExistsError(17, "file exists", path)
    if mode in ("w", "w-", "x") or (mode == "a" and before is None):
        if before is None:
            os.close(open_regular(path, os.O_CREAT | os.O_RDWR))
        return (0 if before is None else before.st_size), True
    return os.path.getsize(path), False
