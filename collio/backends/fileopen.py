"""Opening a file on every rank for the posix backend: its options, rank 0's create,
truncate or temporary, every rank's descriptor, and what the hints add."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from ..collective import Attempt, agree, any_flag, bcast_outcome, digest
from ..errors import ModeError
from .directio import open_direct
from .filereads import maps_for
from .fsync import EarlyFlush
from .localfile import Prepared, check_target, open_regular, prepare, truncate_opened
from .mapped import fs_name

if TYPE_CHECKING:
    from .posix import PosixBackend

__all__ = ["Early", "check_options", "early_open", "open_file"]

_O_BINARY = getattr(os, "O_BINARY", 0)
#: (int64 maxima: a value and its negation agree when every rank passed the same)
_I64 = np.dtype(np.int64)


#: The one value of the private option ``_spare``, which only the checkpoint writer holds:
#: a spare it reuses is written where the writer zeroes every byte it leaves unwritten
#: (a user's ``_spare=True`` would reuse one whose old bytes nothing zeroes)
SPARE = object()


def check_options(mode: str, options: dict[str, Any]) -> None:
    """The posix backend's options, checked (``collio.open`` agrees on them first)."""
    holes = options.get("holes", "auto")
    if holes not in ("auto", "rmw", "runs"):
        raise ModeError(f"posix backend: holes={holes!r} must be auto, rmw or runs")
    writeback = options.get("writeback", True)
    if not isinstance(writeback, (bool, np.bool_)) and writeback not in (0, 1):
        raise ModeError(f"posix backend: writeback={writeback!r} must be True or False")
    if options.get("create", False) not in (False, True, "exclusive"):
        raise ModeError(f"posix backend: create={options['create']!r} must be a bool or exclusive")
    unknown = sorted(set(options) - {"writeback", "holes", "create", "_spare"})
    if options.get("_spare", SPARE) is not SPARE:
        unknown.append("_spare")
    if unknown:
        raise ModeError(f"posix backend: unknown options {unknown}")


def _makes_nothing(mode: str, hints: Any, options: dict[str, Any]) -> bool:
    """Whether an open in ``mode`` makes nothing first (no create, truncate or temporary)."""
    create = options.get("create", False) if mode == "r+" else False
    atomic = bool(getattr(hints, "atomic_commit", False)) and mode != "r"
    return mode in ("r", "r+") and not create and not atomic


@dataclasses.dataclass(slots=True)
class Early:
    """An open that makes nothing, done by every rank before the open's head, which
    agrees on it (:meth:`slots`) together with the open's arguments: rank 0 checks the
    target while every rank opens the same name, as :func:`_open_existing` does, but
    with no agreement of its own.

    Opened before the head, a rank may open the file before another rank entered the
    open, so before what that rank did to it just before: the ranks compare the file
    they opened (its device and inode, not only its name: a file replaced meanwhile is
    another), and only on a file system whose page cache is the file (one node's,
    :data:`~collio.backends.mapped.LOCAL_FS`), where every byte another rank wrote
    before its open is in it.  Elsewhere (a parallel or network file system, where an
    open is what makes another client's writes visible) the early open is declined
    and, when every rank declined, the file is opened after the head
    (:func:`_open_existing`).  A failure anywhere, files that differ, or some ranks
    declining: every rank closes its descriptor and goes the general way, which checks
    and opens again and raises what it finds.  :attr:`route` says which, the same on
    every rank."""

    fd: int = -1
    made: Prepared = dataclasses.field(default_factory=lambda: Prepared("", -1, None))
    name: str = ""
    size: int = -1  # rank 0's; -1 elsewhere until agreed
    code: int = 0  # digest of the name, device and inode opened
    failed: bool = False
    declined: bool = False  # not a local file system: opened after the head
    route: str = ""  # "early", "existing" (after the head) or "general", once agreed

    def slots(self) -> tuple[int, ...]:
        """This rank's facts for the head (:data:`~collio.backends.base.EARLY_SLOTS`):
        failed, the file's digest and its negation, the size, declined and its negation
        (a rank with no early open sends :data:`~collio.backends.base.NO_EARLY`: its
        zeros keep the others from agreeing that every rank declined)."""
        code = 0 if self.failed or self.declined else self.code
        d = 1 if self.declined else 0
        return (1 if self.failed else 0), code, -code, self.size, d, -d

    def agreed(self, out: Any) -> None:
        """Local: the head's maxima of :meth:`slots` on every rank, the same route on
        every rank; a descriptor it will not use is closed."""
        if out[4] == 1 and out[5] == -1:  # (every rank declined)
            self.route = "existing"
        elif not out[0] and not out[4] and out[1] == -out[2]:
            self.route, self.size = "early", int(out[3])
        else:
            self.route = "general"
        if self.route != "early":
            self.drop()

    def drop(self) -> None:
        """Local: close the descriptor, once (nothing was written through it)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def early_open(
    target: Any, mode: str, rank: int, hints: Any, options: dict[str, Any]
) -> Early | None:
    """Local: the open's part that needs no other rank (:class:`Early`), before the
    open's head, when it makes nothing; None otherwise.  Raises nothing but what stops
    the program (a failure to open is the early open's ``failed``)."""
    if not _makes_nothing(mode, hints, options):
        return None
    e = Early()
    try:
        e.name = name = os.fspath(target)
        e.fd, e.made = _open_name(name, mode, rank == 0)
        if fs_name(e.fd) is None:
            e.declined = True
            e.drop()
            return e
        st = os.fstat(e.fd)
        e.code = digest((name, st.st_dev, st.st_ino))
        if rank == 0:  # (the size of the file opened)
            e.size = st.st_size
    except Exception:  # noqa: BLE001 - the general way raises it, agreed
        e.failed = True
        e.drop()
    return e


def _flags(mode: str) -> int:
    return (os.O_RDONLY if mode == "r" else os.O_RDWR) | _O_BINARY


def _open_name(name: str, mode: str, rank0: bool) -> tuple[int, Prepared]:
    """Local, for an open that makes nothing: rank 0 checks the target (:func:`prepare`,
    which then only reads its ``stat``) while every rank opens ``name``; the descriptor
    and rank 0's check."""
    made = Prepared("", -1, None)
    if rank0:
        made = prepare(name, mode, False)
    else:  # (as rank 0: a FIFO or a device is judged by its stat, never opened)
        check_target(name, mode)
    return open_regular(name, _flags(mode)), made


def open_file(
    cls: type[PosixBackend],
    target: Any,
    mode: str,
    comm: Any,
    hints: Any,
    options: dict[str, Any],
    early: Early | None = None,
) -> PosixBackend:
    """Collective over `comm`: rank 0 creates (or checks) the file and broadcasts its
    name, then every rank opens that name and one allreduce agrees; in 'w' rank 0 then
    empties a file that was not (:func:`~collio.backends.localfile.truncate_opened`).

    Every rank uses rank 0's path, and other ranks open only a file rank 0 has
    made (a node-local path fails on the other nodes instead of making one file
    per node).  ``collio.open`` agreed on :meth:`check_options` before, so bad
    options on any rank never reach the file (:func:`check_options`).  An open that
    makes nothing needs no broadcast first (:func:`_open_existing`), and none of its
    own when every rank opened before the open's head, which agreed on it (``early``).
    """
    writeback = bool(options.get("writeback", True))
    holes = str(options.get("holes", "auto"))
    create = options.get("create", False) if mode == "r+" else False
    atomic = bool(getattr(hints, "atomic_commit", False)) and mode != "r"
    # (``_spare``: a checkpoint save with free_replaced=reuse, whose writer zeroes every
    # byte it leaves unwritten in a reused spare; a plain write could not say which)
    reuse = atomic and options.get("_spare") is SPARE
    flags = _flags(mode)
    made = Prepared("", -1, None)  # rank 0's: the temporary's lock, the target's stat
    opened = None
    if early is not None:  # (its route agreed in the open's head: the same on every rank)
        if early.route == "early":
            opened = early.fd, early.made, early.name, early.size
            early.fd = -1  # (the backend's now)
        elif early.route == "existing":
            opened = _open_existing(target, mode, comm)
    elif _makes_nothing(mode, hints, options):
        opened = _open_existing(target, mode, comm)
    if opened is not None:
        fd, made, name, size = opened
        path = name
    else:
        step = Attempt()
        shared = None
        if comm.Get_rank() == 0:
            with step:
                path = os.fspath(target)
                if atomic and os.path.islink(path):
                    # (the file the link names is replaced, beside itself, and the link
                    # stays: a rename over the link would replace the link)
                    path = os.path.realpath(path)
                made = prepare(path, mode, atomic, create, reuse)
                size = made.before.st_size if made.before is not None else 0
                shared = (made.name, path, size)
        name, path, size = bcast_outcome(comm, shared, step.error, what="open")
        step = Attempt()
        fd = -1
        with step:
            fd = open_regular(name, flags)
        try:
            agree(comm, step.error, what=f"open {path!r}")
            if mode == "w" and not atomic:  # (every rank opened it: now it may be emptied)
                truncate_opened(comm, fd, size, path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            made.drop(atomic)
            raise
    self = cls(name, fd, mode, path if atomic else None, writeback, holes)
    self.made = made
    self.free_now = atomic and getattr(hints, "free_replaced", "background") == "commit"
    self.keep = reuse
    self.opened_size = int(size)
    self.stored = 0 if mode == "w" else int(size)
    try:
        if mode != "r" and bool(getattr(hints, "direct_write", False)):
            # (mode and hints were settled equal at open: every rank makes this
            # allreduce, whatever open_direct did)
            try:
                self.dfd = open_direct(name)
            except Exception:
                self.dfd = -1
            if any_flag(comm, self.dfd < 0):  # all or none: the stats agree
                if self.dfd >= 0:
                    os.close(self.dfd)
                self.dfd = -1
        if mode != "r" and self.writeback and bool(getattr(hints, "early_flush", True)):
            self.flusher = EarlyFlush(fd, self.final or name)
        self.maps = maps_for(hints, fd)
    except BaseException:
        # (the temporary first: the backend's close lets go of its lock, after which
        # drop would not remove it)
        made.drop(atomic)
        self.close()  # (no descriptor left behind)
        raise
    return self


def _open_existing(target: Any, mode: str, comm: Any) -> tuple[int, Prepared, str, int] | None:
    """Collective over `comm`: an open that makes nothing ('r', or 'r+' without
    ``create``, not atomic) in one agreement instead of a broadcast and an agreement:
    rank 0 checks the target (:func:`prepare`, which then only reads its ``stat``) while
    every rank opens the same name, and one allreduce agrees that nothing failed, that
    every rank's name is rank 0's, and on rank 0's size.  The descriptor, rank 0's
    check, the name and the size; None (every rank alike, nothing left open): not so,
    and the open goes the general way, which checks and opens again and raises what it
    finds, as it would have."""
    step = Attempt()
    fd, made, name, size = -1, Prepared("", -1, None), "", -1
    with step:
        name = os.fspath(target)
        rank0 = comm.Get_rank() == 0
        fd, made = _open_name(name, mode, rank0)
        if rank0:
            size = made.before.st_size if made.before is not None else 0
    code = digest(name) if step.error is None else 0
    vec = np.array([1 if step.error is not None else 0, code, -code, size], _I64)
    out = np.empty_like(vec)
    comm.Iallreduce([vec, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX).Wait()  # (as the heads)
    if out[0] or out[1] != -out[2]:
        if fd >= 0:
            os.close(fd)
        return None
    return fd, made, name, int(out[3])
