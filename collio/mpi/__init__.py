"""mpi4py's MPI-IO on collio: :class:`File` is ``MPI.File`` with collio's collective path.

A program written for mpi4py's ``MPI.File`` moves with one line::

    from collio.mpi import MPI      # was: from mpi4py import MPI

:data:`MPI` is mpi4py's module with ``MPI.File`` replaced by :class:`File`; everything
else (communicators, datatypes, ``MPI.Request.Waitall``, the constants) is mpi4py's
own.  Or keep mpi4py's ``MPI`` and call ``collio.mpi.File.Open(...)`` where the program
called ``MPI.File.Open(...)``.  Errors are :class:`FileError`: an ``MPI.Exception`` with
MPI's error class and a :class:`collio.CollioError`.
"""

from __future__ import annotations

import types
from typing import Any

from mpi4py import MPI as _MPI

from .errors import CLASSES, FileError
from .file import File
from .requests import Request

__all__ = ["CLASSES", "File", "FileError", "MPI", "Request"]


class _Module(types.ModuleType):
    """mpi4py's ``MPI`` but for ``File``: every other name is looked up in mpi4py's."""

    File = File

    def __getattr__(self, name: str) -> Any:
        return getattr(_MPI, name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(_MPI)))


#: ``from collio.mpi import MPI``: mpi4py's ``MPI`` with :class:`File` as ``MPI.File``.
MPI: Any = _Module("collio.mpi.MPI", _MPI.__doc__)
