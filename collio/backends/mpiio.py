"""MPI-IO pass-through: aggregators hand their large requests to ``MPI.File`` (ROMIO).

collio still plans and shuffles; only the final contiguous requests go through
``MPI.File.Write_at``/``Read_at`` (independent calls) on a file opened
collectively on the file's communicator.  File systems that ROMIO drives
natively (Lustre, GPFS, DAOS, ``ufs:``/``lustre:``/``daos:`` prefixes) thus get
collio's aggregation with ROMIO's driver underneath.  Hints pass through to
ROMIO as an ``MPI.Info`` (``striping_unit``, ``striping_factor``,
``romio_*`` ...).  Requests run in collio's I/O thread, so MPI must provide
``MPI_THREAD_MULTIPLE`` (mpi4py's default).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..collective import Attempt, agree
from ..errors import BackendError, HintError, ModeError
from ..hints import is_romio_hint
from .base import Backend
from .fsync import SYNC_FILE_RANGE_WRITE, EarlyFlush, sync_file_range
from .localfile import check_target

__all__ = ["MpiioBackend", "info_from_hints", "info_items"]

_POSIX_PREFIX = re.compile(r"^(ufs|nfs|lustre|gpfs|xfs|panfs|testfs):")
#: ROMIO drivers whose names are no local paths (checked by the driver itself).
_OTHER_PREFIX = re.compile(r"^(?!(ufs|nfs|lustre|gpfs|xfs|panfs|testfs):)[a-z0-9]+:")
#: collio's own hints, not ROMIO's: kept out of the MPI.Info.
_COLLIO_ONLY = (
    "atomic_commit", "checkpoint_map", "direct_threshold", "direct_write", "early_flush",
    "free_replaced", "mapped_reads", "min_rounds",
)  # fmt: skip


def info_items(extra: Any) -> dict[str, str]:
    """The ``info=`` option's hints as strings: a mapping or an ``MPI.Info`` (else a
    :class:`HintError`)."""
    if extra is None:
        return {}
    if isinstance(extra, MPI.Info):
        keys = [extra.Get_nthkey(i) for i in range(extra.Get_nkeys())]
        return {k: str(extra.Get(k)) for k in keys}
    if not isinstance(extra, Mapping):
        raise HintError(
            f"mpiio backend: info= takes a dict or an MPI.Info, not {type(extra).__name__}"
        )
    return {str(k): str(v) for k, v in extra.items()}


def info_from_hints(hints: Any, extra: Any = None) -> MPI.Info:
    """An ``MPI.Info`` with every hint ROMIO may use (the caller frees it): the hints'
    names that ROMIO knows (a misspelt or unknown name, already reported as a
    ``HintWarning``, is not passed on), then the ``info=`` option's, all of them."""
    items: dict[str, str] = {}
    if hints is not None:
        for key, value in hints.as_dict().items():
            if key in _COLLIO_ONLY or value is None or not is_romio_hint(key):
                continue
            items[key] = str(value)
    items.update(info_items(extra))
    info = MPI.Info.Create()
    for key, value in sorted(items.items()):
        info.Set(key, value)
    return info


def _mpi_error(exc: MPI.Exception, what: str) -> BackendError:
    """An MPI error as a BackendError with the closest errno."""
    cls = exc.Get_error_class()
    codes = {
        MPI.ERR_NO_SUCH_FILE: errno.ENOENT,
        MPI.ERR_ACCESS: errno.EACCES,
        MPI.ERR_NO_SPACE: errno.ENOSPC,
        MPI.ERR_QUOTA: errno.EDQUOT,
        MPI.ERR_READ_ONLY: errno.EROFS,
        MPI.ERR_FILE_EXISTS: errno.EEXIST,
        MPI.ERR_BAD_FILE: errno.EINVAL,
    }
    head = MPI.Get_error_string(cls).strip()
    lines = exc.Get_error_string().strip().splitlines()
    # ROMIO's stack ends with the most precise line: "ADIOI_UFS_OPEN(37)....: File x ..."
    detail = re.sub(r"^\S+\(\d+\)\.*:\s*", "", lines[-1]).strip() if len(lines) > 1 else ""
    text = head[:1].lower() + head[1:]
    if detail.lower().startswith(head.lower()):  # ("Other I/O error No space left ...")
        detail = detail[len(head) :].strip()
    if detail:
        text += f" ({detail[:1].lower() + detail[1:]})"
    code = codes.get(cls) or _errno_in(" ".join(lines)) or errno.EIO
    return BackendError(f"{what}: {text}", errno=code)


def _errno_in(text: str) -> int | None:
    """The errno whose ``strerror`` ROMIO quoted in its message, if any (it reports an
    ``ERR_IO`` with the system's text, e.g. "No space left on device")."""
    low = text.lower()
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EIO):
        if os.strerror(code).lower() in low:
            return code
    return None


def _mpi_call(fn: Any, what: str) -> Any:
    """``fn()``, an MPI error raised as a :class:`BackendError` (never a bare
    ``MPI.Exception``, which would reach the user as an unexplained ``CollioError``)."""
    try:
        return fn()
    except MPI.Exception as exc:
        raise _mpi_error(exc, what) from None


def _local_fd(path: str) -> int:
    """A read-only descriptor of ``path`` if it is a POSIX-visible file (ROMIO's driver
    prefix such as ``ufs:`` or ``lustre:`` stripped), for writeback hints only; else -1."""
    if sync_file_range is None:
        return -1
    local = _POSIX_PREFIX.sub("", path)
    try:
        return os.open(local, os.O_RDONLY)
    except OSError:
        return -1


class MpiioBackend(Backend):
    """A file opened with ``MPI.File.Open`` on every rank; aggregators call ``Write_at``.

    Options
    -------
    info : dict or MPI.Info
        Extra ROMIO hints, on top of the ``hints`` given to :func:`collio.open`.
    writeback : bool
        When the file is also reachable as a local path, start the kernel's
        writeback of each written round at once (``sync_file_range`` on a
        read-only descriptor of the same file), as the posix backend does, so
        that ``sync()`` has less left to flush.  The data itself still goes
        through ``MPI.File``; with the hint ``early_flush`` (default true) that
        descriptor is also flushed in the background while the call goes on, as
        the posix backend does.  Default True where Linux offers it.
    """

    name: ClassVar[str] = "mpiio"
    max_request: ClassVar[int] = 1 << 30

    def __init__(self, fh: MPI.File, path: str, mode: str, writeback: bool, early: bool) -> None:
        self.fh = fh
        self.path = path
        self.mode = mode
        self.readable = True
        self.writable = mode != "r"
        self.wb_fd = _local_fd(path) if writeback and self.writable else -1
        self.flusher = EarlyFlush(self.wb_fd, path) if early and self.wb_fd >= 0 else None

    @classmethod
    def check_options(cls, mode: str, options: dict[str, Any]) -> None:
        info_items(options.get("info"))

    @classmethod
    def compared_options(cls, mode: str, options: dict[str, Any]) -> tuple[Any, ...]:
        """``info=``: ROMIO's hints, which collio compares across ranks as it compares its
        own (ROMIO would run with each rank's own ``cb_buffer_size``, say)."""
        items = info_items(options.get("info"))
        return (("info", tuple(sorted(items.items()))),) if items else ()

    @classmethod
    def open(cls, target: Any, mode: str, *, comm: Any, hints: Any, **options: Any) -> MpiioBackend:
        """Collective over `comm`: ``MPI.File.Open``; in 'w' the file is created and emptied."""
        extra = options.pop("info", None)
        writeback = bool(options.pop("writeback", True))
        path = os.fspath(target)
        info: MPI.Info | None = None
        step = Attempt()
        with step:
            if options:
                raise ModeError(f"mpiio backend: unknown options {sorted(options)}")
            if comm.Get_rank() == 0 and not _OTHER_PREFIX.match(path):
                # (a FIFO would block ROMIO's open on every rank; devices take no pwrite)
                check_target(_POSIX_PREFIX.sub("", path), mode)
            if getattr(hints, "atomic_commit", False) and mode != "r":
                raise ModeError("mpiio backend: atomic_commit is not supported")
            if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
                raise BackendError("mpiio backend needs MPI initialised with THREAD_MULTIPLE")
            info = info_from_hints(hints, extra)  # info= may be bad on one rank only
        if step.error is not None and info is not None:
            info.Free()
        agree(comm, step.error, what=f"open {path!r}")
        assert info is not None
        amode = {
            "r": MPI.MODE_RDONLY,
            "r+": MPI.MODE_RDWR,
            "w": MPI.MODE_RDWR | MPI.MODE_CREATE,
        }[mode]
        step = Attempt()
        fh = MPI.FILE_NULL
        try:
            with step:
                try:
                    fh = MPI.File.Open(comm, path, amode, info)
                except MPI.Exception as exc:
                    raise _mpi_error(exc, "MPI.File.Open") from None
        finally:
            info.Free()
        # ROMIO's open is collective and agrees on its errors; agree anyway
        failed = comm.allreduce(1 if step.error else 0, op=MPI.SUM)
        if failed:
            if fh != MPI.FILE_NULL:  # pragma: no cover - ROMIO fails everywhere or nowhere
                fh.Close()
            agree(comm, step.error, what=f"open {path!r}")
        be = cls(fh, path, mode, writeback, bool(getattr(hints, "early_flush", True)))
        if mode == "w":
            step = Attempt()
            with step:  # collective: the file starts empty, as with O_TRUNC
                _mpi_call(lambda: fh.Set_size(0), f"truncating {path!r}")
            try:
                agree(comm, step.error, what=f"open {path!r}")
            except BaseException:
                be.close()  # collective, and every rank is here
                raise
        return be

    # -- data ---------------------------------------------------------------
    def write_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        for s in range(0, len(buf), self.max_request):
            part = buf[s : s + self.max_request]
            try:
                self.fh.Write_at(offset + s, [part, MPI.BYTE])
            except MPI.Exception as exc:
                raise _mpi_error(exc, f"write at {offset + s} of {self.path!r}") from None
        if self.wb_fd >= 0 and len(buf) >= (1 << 20) and self.more_rounds:
            sync_file_range(self.wb_fd, offset, len(buf), SYNC_FILE_RANGE_WRITE)
            if self.flusher is not None:
                self.flusher.kick(len(buf))

    def read_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        status = MPI.Status()
        for s in range(0, len(buf), self.max_request):
            part = buf[s : s + self.max_request]
            try:
                self.fh.Read_at(offset + s, [part, MPI.BYTE], status)
            except MPI.Exception as exc:
                raise _mpi_error(exc, f"read at {offset + s} of {self.path!r}") from None
            got = status.Get_count(MPI.BYTE)
            if got < len(part):  # end of file: the rest reads as zeros
                buf[s + got :] = 0
                return

    def size(self) -> int:
        return int(_mpi_call(self.fh.Get_size, f"size of {self.path!r}"))

    def sync(self) -> None:
        """Collective (``MPI_File_sync``): every rank calls it, as ``File.sync``/``close`` do."""
        early = self.flusher.wait() if self.flusher is not None else None
        if self.fh != MPI.FILE_NULL and self.mode != "r":
            _mpi_call(self.fh.Sync, f"MPI.File.Sync of {self.path!r}")
        if early is not None:
            raise early

    def close(self) -> None:
        """Collective (``MPI_File_close``)."""
        if self.flusher is not None:  # (it must not outlive the descriptor)
            self.flusher.wait()  # (its error: sync() before close reported it)
        if self.wb_fd >= 0:
            os.close(self.wb_fd)
            self.wb_fd = -1
        if self.fh != MPI.FILE_NULL:
            _mpi_call(self.fh.Close, f"MPI.File.Close of {self.path!r}")

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["path"] = self.path
        if self.fh != MPI.FILE_NULL:
            info = self.fh.Get_info()
            try:
                out["romio"] = {k: info.Get(k) for k in ("cb_buffer_size", "striping_unit")}
            finally:
                info.Free()
        return out
