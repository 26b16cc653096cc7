"""Opening, closing and deleting files the MPI way, on collio's file core.

``MPI_File_open`` is :meth:`~collio.core.FileCore.open` with MPI's rules: the amode is
checked inside the open's first agreement (so a bad or different amode raises the same
error on every rank), ``MODE_CREATE`` makes a missing file on rank 0 without truncating
an existing one, ``MODE_EXCL`` refuses an existing one (the posix backend's ``create``
option), and ``MODE_APPEND`` starts the pointers at the size rank 0 saw when it opened
the file, which every rank learns with the open's outcome, before any rank can write.
The file then runs on a communicator of its own, as ROMIO's does (a lane of collio's
duplicate, :class:`~collio.comms.Lane`: one ``MPI_Comm_dup`` at the first open, lent
again to later opens, with the plans it kept), and gets its shared file pointer, which
costs no message until it is used.
Paths are MPI's: ROMIO's prefixes of POSIX-visible file systems (``ufs:``, ``nfs:``,
``lustre:``, ...) are accepted and dropped.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from mpi4py import MPI

from ..backends import get_backend
from ..backends.base import Backend
from ..backends.mpiio import _POSIX_PREFIX
from ..collective import Attempt, bcast_outcome
from ..comms import Private, exclusive, private
from ..core import FileCore
from ..hints import Hints
from .amode import Amode, parse
from .errors import ErrBadFile, error, error_class
from .positions import SharedPointer, pointer_file

__all__ = ["Opened", "delete", "open_file", "path_of", "remove_at_close"]


@dataclasses.dataclass(slots=True)
class Opened:
    """What ``MPI_File_open`` made: the core on the file's own communicator (a lane of
    ``lanes``, given back after close), its shared pointer, the amode and where the
    pointers start."""

    core: FileCore
    comm: MPI.Intracomm
    lanes: Private
    shared: SharedPointer
    amode: Amode
    path: str
    start: int


def path_of(filename: Any) -> str:
    """The local path of an MPI file name (``str``, ``bytes`` or path-like)."""
    try:
        name = os.fsdecode(os.fspath(filename))
    except TypeError:
        raise ErrBadFile(f"file name must be a str, bytes or path, not {filename!r}") from None
    return _POSIX_PREFIX.sub("", name)


def open_file(comm: MPI.Intracomm, filename: Any, amode: Any, info: Any) -> Opened:
    """Collective over `comm`: open ``filename`` with MPI's ``amode`` and ``info`` hints."""
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"Open needs an intracommunicator, not {comm!r}")  # (as mpi4py)
    priv = private(comm)
    path = path_of(filename)
    hints = None if info is None or info == MPI.INFO_NULL else info
    bits = amode if isinstance(amode, int) else 0

    def check(parsed: Hints) -> tuple[tuple[Any, ...], Amode]:
        parsed_amode = parse(amode)  # (inside the agreement: ERR_AMODE on every rank)
        return (parsed_amode.bits, path), parsed_amode

    ahead: list[Any] = []  # (the early open, where the open makes nothing)

    def created(am: Amode) -> bool | str:
        return am.has(MPI.MODE_CREATE) and ("exclusive" if am.has(MPI.MODE_EXCL) else True)

    def early(parsed: Hints, am: Amode) -> Any:
        if am.has(MPI.MODE_APPEND):  # (the pointers start at the size every rank wrote
            return None  # before its open: read after the head, not before)
        options = {"create": created(am)}
        got = get_backend("posix").open_early(path, am.mode, priv.comm.Get_rank(), parsed, options)
        if got is not None:
            ahead.append(got)
        return got

    def opener(comm: MPI.Intracomm, parsed: Hints, am: Amode) -> Backend:
        extra = {"_early": ahead[0]} if ahead else {}
        return get_backend("posix").open(
            path, am.mode, comm=comm, hints=parsed, create=created(am), **extra
        )

    mode = "r" if bits & MPI.MODE_RDONLY else "r+"
    with exclusive(priv.comm, "Open"):
        core = FileCore.open(
            priv, path, mode, hints, modes=("r", "r+"), check=check, opener=opener,
            engine_mode="r+", label="Open arguments (amode, file name)", lane=True, early=early,
        )  # fmt: skip
    assert core.lane is not None
    own = core.lane.comm
    assert isinstance(own, MPI.Intracomm)  # (a duplicate of the intracommunicator)
    am = parse(amode)
    start = int(getattr(core.ctx.backend, "opened_size", 0)) if am.has(MPI.MODE_APPEND) else 0
    shared = SharedPointer(pointer_file(path, priv.token, core.ctx.file[0]), start)
    return Opened(core, own, priv, shared, am, path, start)


def remove_at_close(comm: MPI.Intracomm, path: str) -> None:
    """Collective over `comm` (``MODE_DELETE_ON_CLOSE``): rank 0 removes the file once
    every rank has closed it; its error is raised on every rank."""
    step = Attempt()
    if comm.Get_rank() == 0:
        with step:
            os.unlink(path)
    bcast_outcome(comm, None, step.error, what=f"Close {path!r} (MODE_DELETE_ON_CLOSE)")


def delete(filename: Any) -> None:
    """``MPI_File_delete``: local; MPI's error class for what the system said."""
    path = path_of(filename)
    try:
        os.unlink(path)
    except OSError as exc:
        text = f"Delete {path!r}: {(exc.strerror or str(exc)).lower()}"
        raise error(error_class(exc), text) from None
