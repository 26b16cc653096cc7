"""``collio.mpi.File``: mpi4py's ``MPI.File``, method for method, over collio's file core.

A driver configures, the core acts: this class adapts MPI's arguments and rules and calls
:class:`~collio.core.FileCore` (open agreement, call heads, sync, close, what ranks do
after a mismatch), collio's engine (collective data calls) and the posix backend
(independent ones, sizes, locks).  Every call that communicates is collective over the
file's group, as in MPI; every error is a :class:`~collio.mpi.errors.FileError`, raised
through the file's error handler, the same on every rank for collective calls.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..collective import Attempt, bcast_outcome, raise_agreed, same_slots, settle_same
from ..comms import exclusive
from ..errors import add_later
from ..view import DEFAULT_VIEW
from . import errors
from .access import DataAccess
from .errors import ErrArg, ErrFile, ErrIo, ErrReadOnly, FileError, as_file_error
from .info import hints_info, retuned
from .opening import Opened, delete, open_file, remove_at_close
from .requests import Worker
from .viewing import Views

__all__ = ["File"]

I64 = npt.NDArray[np.int64]


class File(DataAccess, Views):
    """A file open on every rank of a communicator, as mpi4py's ``MPI.File``.

    Made by :meth:`Open` (collective); the data access calls are :class:`DataAccess`'s, the view
    and pointer calls :class:`~collio.mpi.viewing.Views`'.
    """

    def __init__(self, opened: Opened, errhandler: MPI.Errhandler) -> None:
        self._core = opened.core
        self._comm = opened.comm  # the file's own communicator (given back at close)
        self._lanes = opened.lanes
        self._shared = opened.shared
        self._amode = opened.amode
        self._path = opened.path
        self._view = DEFAULT_VIEW
        self._types: tuple[int, MPI.Datatype, MPI.Datatype] = (0, MPI.BYTE, MPI.BYTE)
        self._pos = opened.start
        self._atomic = False
        self._errhandler = errhandler
        self._worker = Worker(f"collio.mpi {opened.path}")
        self._split = None
        self._released = False

    # -- open, close, delete --------------------------------------------------------
    @classmethod
    def Open(
        cls,
        comm: MPI.Intracomm,
        filename: Any,
        amode: int = MPI.MODE_RDONLY,
        info: MPI.Info = MPI.INFO_NULL,
    ) -> File:
        """Collective over `comm`: open ``filename`` (``MPI_File_open``).

        ``amode`` is MPI's (:mod:`collio.mpi.amode` says what each flag does); ``info``
        holds ROMIO's hint names and collio's own.  Errors go to the handler of
        ``MPI.FILE_NULL`` (``ERRORS_RETURN``: raised), the same on every rank.
        """
        default = MPI.FILE_NULL.Get_errhandler()
        try:
            return cls(open_file(comm, filename, amode, info), default)
        except (KeyboardInterrupt, SystemExit, TypeError):
            raise
        except BaseException as exc:
            error = as_file_error(exc)
            errors.handle(default, None, error, comm)
            try:
                raise error from None  # (no file to return, whatever the handler did)
            finally:  # (the traceback holds this frame: a cycle through ``error``)
                del error

    def Close(self) -> None:
        """Collective: sync, release, give back the file's communicator (``MPI_File_close``)."""
        with self._errors():
            self._check_open()
            self._drain()
            try:
                with self._exclusive("Close"):
                    self._core.close()
            finally:
                self._settle()

    @staticmethod
    def Delete(filename: Any, info: MPI.Info = MPI.INFO_NULL) -> None:
        """Local: remove ``filename`` (``MPI_File_delete``)."""
        try:
            delete(filename)
        except FileError as exc:
            errors.handle(MPI.FILE_NULL.Get_errhandler(), None, exc, MPI.COMM_SELF)

    def free(self) -> None:
        """``Close`` an open file, as mpi4py's ``free``; nothing for a closed one."""
        if not self._core.closed:
            self.Close()

    # -- sizes, hints, atomicity, sync -----------------------------------------------
    def Get_size(self) -> int:
        """Local: the file's size in bytes."""
        with self._errors():
            self._check_open()
            return int(self._core.ctx.backend.size())

    def Set_size(self, size: int) -> None:
        """Collective: truncate or extend the file to ``size`` bytes (rank 0 does it)."""
        self._resize("Set_size", size, lambda be: be.set_size(int(size)))

    def Preallocate(self, size: int) -> None:
        """Collective: storage for the first ``size`` bytes; the file grows, never shrinks."""
        self._resize("Preallocate", size, lambda be: be.preallocate(int(size)))

    def _resize(self, call: str, size: Any, action: Any) -> None:
        with self._errors():
            self._check_open()
            refusal = self._amode.refuse(call, writing=True, shared=call == "Preallocate")
            if call == "Preallocate" and isinstance(refusal, ErrReadOnly):
                refusal = ErrIo(str(refusal))  # (ROMIO's class: its fallocate fails)
            if refusal is None and (not isinstance(size, (int, np.integer)) or size < 0):
                refusal = ErrArg(f"{call}: invalid size argument {size!r}")
            value = int(size) if refusal is None else 0
            out = self._agreed(call, refusal, [value, -value])
            if out[0] != -out[1]:
                raise ErrArg(
                    f"{call}: inconsistent arguments to collective routine: sizes from "
                    f"{int(-out[1])} to {int(out[0])} bytes"
                )
            self._by_rank0(call, lambda: action(self._core.ctx.backend))

    def Get_amode(self) -> int:
        with self._errors():
            self._check_open()
            return self._amode.bits

    def Get_group(self) -> MPI.Group:
        """Local: the file's group (a new ``MPI.Group``, the caller frees it)."""
        with self._errors():
            self._check_open()
            return self._comm.Get_group()

    def Get_info(self) -> MPI.Info:
        """Local: the hints in use, ROMIO's names and collio's own (a new ``MPI.Info``)."""
        with self._errors():
            self._check_open()
            return hints_info(self._core.ctx.hints, self._core.ctx.stats.hints)

    def Set_info(self, info: MPI.Info) -> None:
        """Collective: new planning hints for later calls (``cb_buffer_size``, ``cb_nodes``,
        ``cb_config_list``, ``romio_cb_read``/``write``, collio's own); the rest is kept."""
        with self._errors():
            self._check_open()
            step = Attempt()
            new = None
            with step:
                new = retuned(self._core.ctx.hints, info, warn=self._comm.Get_rank() == 0)
            out = self._agreed("Set_info", step.error, same_slots(new))
            settle_same(self._comm, new, out, what="Set_info")
            assert new is not None
            self._core.retune(new)

    def Get_atomicity(self) -> bool:
        with self._errors():
            self._check_open()
            return self._atomic

    def Set_atomicity(self, flag: bool) -> None:
        """Collective: atomic mode makes each rank's independent calls lock the bytes they
        touch (``fcntl``, as ROMIO does); collective calls take none: collio refuses
        ranks writing the same bytes in one call, and its aggregators own disjoint bytes."""
        with self._errors():
            self._check_open()
            self._agreed("Set_atomicity", None)
            self._atomic = bool(flag)

    def Sync(self) -> None:
        """Collective: every rank's writes reach storage (fsync), as ``MPI_File_sync``."""
        with self._errors():
            self._check_open()
            if not self._amode.writable:  # (ROMIO's error for it)
                self._agreed("Sync", ErrReadOnly("Sync: the file was opened with MODE_RDONLY"))
            self._drain()
            with self._exclusive("Sync"):
                self._core.sync()

    # -- error handlers --------------------------------------------------------------
    def Get_errhandler(self) -> MPI.Errhandler:
        return self._errhandler

    def Set_errhandler(self, errhandler: MPI.Errhandler) -> None:
        """Local: ``MPI.ERRORS_RETURN`` (raise, the default), ``ERRORS_ARE_FATAL``,
        ``ERRORS_ABORT``, or one made by :meth:`Create_errhandler`."""
        self._errhandler = errhandler

    def Call_errhandler(self, errorcode: int) -> None:
        errors.call(self._errhandler, self, int(errorcode), self._comm)

    @staticmethod
    def Create_errhandler(errhandler_fn: Any) -> MPI.Errhandler:
        """A handler that calls ``errhandler_fn(file, error_code)`` (the caller frees it)."""
        return errors.user_handler(errhandler_fn)

    # -- Python properties and protocols ----------------------------------------------
    size = property(lambda self: self.Get_size(), doc="The file's size in bytes.")
    amode = property(lambda self: self.Get_amode(), doc="The access mode.")
    atomicity = property(lambda self: self.Get_atomicity(), doc="Atomic mode or not.")
    group = property(lambda self: self.Get_group(), doc="The file's group.")
    info = property(lambda self: self.Get_info(), doc="The hints in use.")

    @property
    def group_size(self) -> int:
        with self._errors():
            self._check_open()
            return int(self._comm.Get_size())

    @property
    def group_rank(self) -> int:
        with self._errors():
            self._check_open()
            return int(self._comm.Get_rank())

    def __bool__(self) -> bool:
        return not self._core.closed

    def __eq__(self, other: object) -> bool:
        """A closed file equals ``MPI.FILE_NULL``, as mpi4py's does after ``Close``."""
        if isinstance(other, MPI.File):
            return self._core.closed and other == MPI.FILE_NULL
        return self is other

    __hash__ = None  # type: ignore[assignment]  # (as mpi4py's File)

    def __reduce__(self) -> NoReturn:
        raise ValueError(f"cannot serialize '{type(self).__module__}.File' instance")

    def __enter__(self) -> File:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        if self._core.closed:
            return
        if exc is None:
            self.Close()
            return
        try:
            self.Close()
        except Exception as later:  # (the block's error is the news; the close rides on it)
            add_later(exc, later)

    def __repr__(self) -> str:
        state = "closed" if self._core.closed else f"amode={self._amode.bits}"
        return f"<collio.mpi.File {self._path!r} {state}>"

    # -- helpers ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._core.closed:
            raise ErrFile("invalid file handle: the file is closed")

    def _exclusive(self, call: str) -> contextlib.AbstractContextManager[None]:
        return exclusive(self._comm, call)

    def _agreed(
        self, call: str, refusal: BaseException | None, own: Sequence[int] = ()
    ) -> tuple[int, ...]:
        """Collective: a call's head on the file (after the worker's calls), with this
        rank's refusal agreed; returns the maxima of ``own``."""
        self._drain()
        with self._exclusive(call):
            failed, out = self._core.head("sync", failed=refusal is not None, own=own, subject=call)
            if failed:
                raise_agreed(self._comm, refusal, what=call)
        return out

    def _by_rank0(self, call: str, action: Any) -> Any:
        """Collective: rank 0 acts (after the head), the others wait for its outcome."""
        step = Attempt()
        result = None
        if self._comm.Get_rank() == 0:
            with step:
                result = action()
        return bcast_outcome(self._comm, result, step.error, what=call)

    def _settle(self) -> None:
        """Collective, once the core is closed (by ``Close``, or by a call mismatch with a
        rank's ``Close``): delete on close, free the shared pointer, give back the communicator."""
        if self._released or not self._core.closed:
            return
        self._released = True
        try:
            if self._amode.has(MPI.MODE_DELETE_ON_CLOSE):
                remove_at_close(self._comm, self._path)
        finally:
            self._shared.close(remove=self._comm.Get_rank() == 0)
            self._free_types()
            self._worker.stop()
            assert self._core.lane is not None
            self._lanes.give_back(self._core.lane)  # (every call on it completed)

    def _convert(self, exc: BaseException) -> FileError:
        """An error of a call as MPI's, after what every rank does after it (collective
        when the call was)."""
        self._settle()
        return as_file_error(exc)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Every error of a call goes through the file's error handler, once (after a
        user's handler the call returns, as MPICH's do)."""
        try:
            yield
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            if getattr(exc, "_handled", False):
                raise
            self._raise(self._convert(exc))

    def _raise(self, exc: FileError) -> None:
        exc._handled = True  # type: ignore[attr-defined]
        errors.handle(self._errhandler, self, exc, MPI.COMM_WORLD if self._released else self._comm)
