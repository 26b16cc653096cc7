"""MPI's access modes (``amode``) as collio's open modes, and the rules MPI gives them.

Pure: no MPI calls, no files.  :func:`parse` checks an ``amode`` the way
``MPI_File_open`` does and says what collio does with it:

============================  =====================================================
``MODE_RDONLY``               open ``'r'``; writes raise ``ERR_READ_ONLY``
``MODE_WRONLY``               open ``'r+'`` (collio's rounds read the holes they keep);
                              reads raise ``ERR_ACCESS``
``MODE_RDWR``                 open ``'r+'``
``MODE_CREATE``               rank 0 creates a missing file first; never truncates
``MODE_EXCL``                 with ``CREATE``: ``ERR_FILE_EXISTS`` if the file exists
``MODE_DELETE_ON_CLOSE``      rank 0 removes the file once every rank has closed it
``MODE_APPEND``               both file pointers start at the end of the file
``MODE_SEQUENTIAL``           only shared-pointer calls; the rest raise
                              ``ERR_UNSUPPORTED_OPERATION``
``MODE_UNIQUE_OPEN``          accepted (a promise to MPI; collio needs none)
============================  =====================================================

Exactly one of ``RDONLY``, ``WRONLY``, ``RDWR``; ``CREATE`` or ``EXCL`` with ``RDONLY``,
``SEQUENTIAL`` with ``RDWR``, and unknown bits are ``ERR_AMODE``, as in MPI.
"""

from __future__ import annotations

import dataclasses

from mpi4py import MPI

from .errors import ErrAccess, ErrAmode, ErrReadOnly, ErrUnsupportedOperation, FileError

__all__ = ["Amode", "parse"]

_ACCESS = MPI.MODE_RDONLY | MPI.MODE_WRONLY | MPI.MODE_RDWR
_ALL = (
    _ACCESS | MPI.MODE_CREATE | MPI.MODE_EXCL | MPI.MODE_DELETE_ON_CLOSE
    | MPI.MODE_UNIQUE_OPEN | MPI.MODE_SEQUENTIAL | MPI.MODE_APPEND
)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Amode:
    """An ``amode`` MPI accepts, and what it means for collio."""

    bits: int

    def has(self, flag: int) -> bool:
        return bool(self.bits & flag)

    @property
    def mode(self) -> str:
        """collio's open mode: ``'r'``, or ``'r+'`` for any mode that writes."""
        return "r" if self.has(MPI.MODE_RDONLY) else "r+"

    @property
    def readable(self) -> bool:
        return not self.has(MPI.MODE_WRONLY)

    @property
    def writable(self) -> bool:
        return not self.has(MPI.MODE_RDONLY)

    @property
    def sequential(self) -> bool:
        return self.has(MPI.MODE_SEQUENTIAL)

    def refuse(self, call: str, *, writing: bool | None, shared: bool = False) -> FileError | None:
        """Why ``call`` is not allowed in this mode (the error MPI raises), or None.

        ``writing``: the call writes (True), reads (False) or neither (None); ``shared``:
        it uses the shared file pointer, the only kind a sequential file allows.
        """
        if self.sequential and not shared:
            return ErrUnsupportedOperation(
                f"{call} cannot be used on a file opened with MPI.MODE_SEQUENTIAL"
            )
        if writing and not self.writable:
            return ErrReadOnly(f"{call}: cannot write to a file opened with MPI.MODE_RDONLY")
        if writing is False and not self.readable:
            return ErrAccess(f"{call}: cannot read from a file opened with MPI.MODE_WRONLY")
        return None


def parse(amode: object) -> Amode:
    """Check ``amode`` as ``MPI_File_open`` does; raise :class:`ErrAmode` if it is invalid."""
    if isinstance(amode, bool) or not isinstance(amode, int):
        raise ErrAmode(f"amode must be an int of MPI.MODE_* flags, not {amode!r}")
    access = amode & _ACCESS
    if amode & ~_ALL:
        raise ErrAmode(f"amode {amode} has bits that are no MPI.MODE_* flag: {amode & ~_ALL}")
    if access not in (MPI.MODE_RDONLY, MPI.MODE_WRONLY, MPI.MODE_RDWR):
        raise ErrAmode(
            f"amode {amode} must have exactly one of MPI.MODE_RDONLY, MODE_WRONLY and MODE_RDWR"
        )
    if access == MPI.MODE_RDONLY and amode & (MPI.MODE_CREATE | MPI.MODE_EXCL):
        raise ErrAmode(f"amode {amode}: MPI.MODE_RDONLY cannot go with MODE_CREATE or MODE_EXCL")
    if access == MPI.MODE_RDWR and amode & MPI.MODE_SEQUENTIAL:
        raise ErrAmode(f"amode {amode}: MPI.MODE_SEQUENTIAL cannot go with MODE_RDWR")
    return Amode(int(amode))
