"""Errors of :mod:`collio.mpi`: each is an ``MPI.Exception`` and a :class:`~collio.CollioError`.

Code written for mpi4py catches ``MPI.Exception`` and asks ``Get_error_class()``; code
written for collio catches :class:`~collio.CollioError`.  :class:`FileError` is both,
with one subclass per MPI error class (:data:`CLASSES`), registered with collio's error
hierarchy so that an error agreed inside a collective call comes back on every rank as
the same subclass, with the same class and message.

:func:`as_file_error` names the MPI class of any error a collio call raised (an agreed
``BackendError`` by its errno, a ``MismatchError`` as ``ERR_NOT_SAME``, ...);
:func:`handle` passes it to the file's error handler, as MPI does before returning.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from ..errors import (
    BackendError,
    CollioError,
    ConcurrentCallError,
    HintError,
    LayoutError,
    MismatchError,
    OverlapError,
    register_error,
)

__all__ = [
    "CLASSES", "FileError", "as_file_error", "call", "error", "error_class", "handle",
    "user_handler", "ErrAccess", "ErrAmode", "ErrArg", "ErrBadFile", "ErrFile",
    "ErrFileExists", "ErrFileInUse", "ErrInfoValue", "ErrIo", "ErrNoSpace", "ErrNoSuchFile",
    "ErrNotSame", "ErrOther", "ErrQuota", "ErrReadOnly", "ErrType", "ErrUnsupportedDatarep",
    "ErrUnsupportedOperation",
]  # fmt: skip


class FileError(MPI.Exception, CollioError):  # type: ignore[misc]
    """An MPI-IO error of :mod:`collio.mpi`; ``Get_error_class()`` says which.

    ``str()`` is collio's message (lowercase, naming the ranks and values); the MPI
    standard's text of the class is ``Get_error_string()``.
    """

    error_class_of: int = MPI.ERR_OTHER

    def __init__(self, message: str, *, ranks: tuple[int, ...] = ()) -> None:
        CollioError.__init__(self, message, ranks=ranks)
        MPI.Exception.__init__(self, self.error_class_of)  # (its args are the error code)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


#: MPI's error class -> the FileError subclass raised for it (``ErrAmode`` for
#: ``MPI.ERR_AMODE``, and so on).
CLASSES: dict[int, type[FileError]] = {}


def _subclass(name: str) -> type[FileError]:
    code = int(getattr(MPI, name))
    camel = "Err" + "".join(part.capitalize() for part in name[4:].split("_"))
    doc = f"``MPI.{name}``: {MPI.Get_error_string(code).strip()}."
    cls = type(camel, (FileError,), {"error_class_of": code, "__doc__": doc})
    cls.__module__ = __name__
    register_error(cls)  # (rebuilt by name when agreed: collio.collective.raise_agreed)
    CLASSES[code] = cls
    return cls


ErrAccess = _subclass("ERR_ACCESS")
ErrAmode = _subclass("ERR_AMODE")
ErrArg = _subclass("ERR_ARG")
ErrBadFile = _subclass("ERR_BAD_FILE")
ErrFile = _subclass("ERR_FILE")
ErrFileExists = _subclass("ERR_FILE_EXISTS")
ErrFileInUse = _subclass("ERR_FILE_IN_USE")
ErrInfoValue = _subclass("ERR_INFO_VALUE")
ErrIo = _subclass("ERR_IO")
ErrNoSpace = _subclass("ERR_NO_SPACE")
ErrNoSuchFile = _subclass("ERR_NO_SUCH_FILE")
ErrNotSame = _subclass("ERR_NOT_SAME")
ErrOther = _subclass("ERR_OTHER")
ErrQuota = _subclass("ERR_QUOTA")
ErrReadOnly = _subclass("ERR_READ_ONLY")
ErrType = _subclass("ERR_TYPE")
ErrUnsupportedDatarep = _subclass("ERR_UNSUPPORTED_DATAREP")
ErrUnsupportedOperation = _subclass("ERR_UNSUPPORTED_OPERATION")


def error(code: int, message: str) -> FileError:
    """The :class:`FileError` of MPI error class ``code``."""
    return CLASSES.get(code, CLASSES[MPI.ERR_OTHER])(message)


#: errno -> MPI error class, for storage errors (the rest are ``ERR_IO``).
_ERRNO = {
    errno.ENOENT: MPI.ERR_NO_SUCH_FILE,
    errno.ENOTDIR: MPI.ERR_NO_SUCH_FILE,
    errno.EEXIST: MPI.ERR_FILE_EXISTS,
    errno.EACCES: MPI.ERR_ACCESS,
    errno.EPERM: MPI.ERR_ACCESS,
    errno.EROFS: MPI.ERR_READ_ONLY,
    errno.ENOSPC: MPI.ERR_NO_SPACE,
    errno.EDQUOT: MPI.ERR_QUOTA,
    errno.EISDIR: MPI.ERR_BAD_FILE,
    errno.EINVAL: MPI.ERR_BAD_FILE,
    errno.ENAMETOOLONG: MPI.ERR_BAD_FILE,
    errno.EBUSY: MPI.ERR_FILE_IN_USE,
    errno.ETXTBSY: MPI.ERR_FILE_IN_USE,
    errno.ENOTSUP: MPI.ERR_UNSUPPORTED_OPERATION,
}


def error_class(exc: BaseException) -> int:
    """The MPI error class a collio call's error stands for."""
    if isinstance(exc, FileError):
        return int(exc.error_class_of)
    if isinstance(exc, (BackendError, OSError)):
        code = getattr(exc, "errno", None)
        return _ERRNO.get(code, MPI.ERR_IO) if isinstance(code, int) else MPI.ERR_IO
    if isinstance(exc, MismatchError):  # (before LayoutError, its base)
        return MPI.ERR_NOT_SAME
    if isinstance(exc, HintError):
        return MPI.ERR_INFO_VALUE
    if isinstance(exc, (LayoutError, OverlapError, ValueError, TypeError)):
        return MPI.ERR_ARG
    if isinstance(exc, ConcurrentCallError):
        return MPI.ERR_OTHER
    return MPI.ERR_IO if isinstance(exc, CollioError) else MPI.ERR_OTHER


def as_file_error(exc: BaseException) -> FileError:
    """``exc`` as a :class:`FileError` (itself if it is one), the original as its cause.

    A pure function of the error: ranks holding the same agreed error make the same one.
    """
    if isinstance(exc, FileError):
        return exc
    message = exc.message if isinstance(exc, CollioError) else f"{type(exc).__name__}: {exc}"
    out = error(error_class(exc), message)
    out.ranks = getattr(exc, "ranks", ())
    out.close_error = getattr(exc, "close_error", None)
    out.__cause__ = exc
    return out


# ---------------------------------------------------------------- error handlers
#: Functions of handlers made by :func:`user_handler`, by the handler's MPI handle.
_USER: dict[int, Callable[[Any, int], None]] = {}


def user_handler(fn: Callable[[Any, int], None]) -> MPI.Errhandler:
    """``File.Create_errhandler``: an ``MPI.Errhandler`` (the caller frees it) that
    :mod:`collio.mpi` calls as ``fn(file, error_code)``, as MPI calls a file's handler."""
    made: MPI.Errhandler = MPI.File.Create_errhandler(fn)
    _USER[int(made.handle)] = fn
    return made


def handle(errhandler: MPI.Errhandler, file: Any, exc: FileError, comm: MPI.Comm) -> None:
    """Pass ``exc`` to ``errhandler`` as MPI does: ``ERRORS_RETURN`` (the default for
    files) raises it, as mpi4py does; ``ERRORS_ARE_FATAL`` aborts the job and
    ``ERRORS_ABORT`` the file's processes (``comm``), printing the error first; a handler of
    :func:`user_handler` is called and the call then returns, as MPICH's do."""
    code = int(exc.error_class_of)
    if errhandler == MPI.ERRORS_ARE_FATAL or errhandler == MPI.ERRORS_ABORT:
        print(f"collio.mpi: {exc.Get_error_string().strip()}: {exc}", file=sys.stderr, flush=True)
        (MPI.COMM_WORLD if errhandler == MPI.ERRORS_ARE_FATAL else comm).Abort(code)
    fn = _USER.get(int(errhandler.handle))
    if fn is None:
        raise exc
    fn(file, code)


def call(errhandler: MPI.Errhandler, file: Any, code: int, comm: MPI.Comm) -> None:
    """``File.Call_errhandler(code)``: what :func:`handle` does, but ``ERRORS_RETURN``
    returns (as ``MPI_File_call_errhandler`` does) and so does a user handler."""
    if errhandler == MPI.ERRORS_ARE_FATAL or errhandler == MPI.ERRORS_ABORT:
        text = MPI.Get_error_string(code).strip()
        print(f"collio.mpi: Call_errhandler: {text}", file=sys.stderr, flush=True)
        (MPI.COMM_WORLD if errhandler == MPI.ERRORS_ARE_FATAL else comm).Abort(code)
    fn = _USER.get(int(errhandler.handle))
    if fn is not None:
        fn(file, code)
