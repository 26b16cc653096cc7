"""The data access calls of :class:`collio.mpi.File`: MPI's three positionings, blocking and
nonblocking, independent and collective.

Independent calls go straight to the backend: the view's runs for the buffer, one
``pwrite``/``pread`` each (under a byte-range lock in atomic mode).  Collective calls go
through collio's two-phase engine (so ``cb_nodes`` and collio's hints apply); every check
MPI makes of them is done by every rank and travels in the engine's first agreement
(:class:`Access`), so the same error is raised on every rank.  Ordered calls take their
offsets from one ``Exscan`` of the ranks' sizes, then make one collective call.
Nonblocking and split collectives run on the file's worker thread
(:mod:`collio.mpi.requests`); the individual pointer moves when the call is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import engine
from ..collective import raise_agreed
from ..comms import exclusive
from ..runs import Runs
from ..view import BufferLayout, FileView, buffer_size
from .errors import ErrArg, ErrIo
from .requests import Outcome, Request, completed
from .state import State

__all__ = ["Access", "DataAccess"]

AT, INDIVIDUAL, SHARED, ORDERED = "at", "individual", "shared", "ordered"


class Access(BufferLayout):
    """A buffer through the view, with the error the front end's checks found (raised
    by ``validate`` inside the engine's first agreement, so agreed as the engine's are)."""

    __slots__ = ("at", "refusal")

    def __init__(self, view: FileView, position: int, spec: Any, *, writing: bool,
                 refusal: BaseException | None = None, at: bool = False) -> None:  # fmt: skip
        super().__init__(view, position, spec, writing=writing)
        self.refusal = refusal
        # (an explicit-offset call, ``Write_at_all``'s kind: its head and messages name
        # collio's ``write_at_all``, a call of its own, as MPI's are: Context.call_at)
        self.at = at

    def validate(self) -> None:
        if self.refusal is not None:
            raise self.refusal
        super().validate()


def before_eof(runs: Runs, size: int) -> int:
    """Bytes of ``runs`` (sorted by file offset, in stream order) before byte ``size``:
    what MPI's status counts for a read that reaches the end of the file."""
    if not len(runs):
        return 0
    return int(np.clip(size - runs.file, 0, runs.length).sum())


def _set_status(status: MPI.Status | None, nbytes: int) -> None:
    if status is not None:
        status.Set_elements(MPI.BYTE, nbytes)


class DataAccess(State):
    """MPI's data access calls on :class:`collio.mpi.File`'s state."""

    # -- independent, explicit offsets ------------------------------------------
    def Read_at(self, offset: int, buf: Any, status: MPI.Status | None = None) -> None:
        """Read at ``offset`` (etypes of the view)."""
        with self._errors():
            _set_status(status, self._io("Read_at", False, AT, offset, buf))

    def Write_at(self, offset: int, buf: Any, status: MPI.Status | None = None) -> None:
        """Write at ``offset`` (etypes of the view)."""
        with self._errors():
            _set_status(status, self._io("Write_at", True, AT, offset, buf))

    def Iread_at(self, offset: int, buf: Any) -> Request:
        """Nonblocking ``Read_at`` (done at once: it needs no other rank)."""
        with self._errors():
            return completed(self._raise, self._io("Iread_at", False, AT, offset, buf), None)

    def Iwrite_at(self, offset: int, buf: Any) -> Request:
        """Nonblocking ``Write_at`` (done at once)."""
        with self._errors():
            return completed(self._raise, self._io("Iwrite_at", True, AT, offset, buf), None)

    # -- independent, individual file pointer -----------------------------------
    def Read(self, buf: Any, status: MPI.Status | None = None) -> None:
        with self._errors():
            _set_status(status, self._io("Read", False, INDIVIDUAL, None, buf))

    def Write(self, buf: Any, status: MPI.Status | None = None) -> None:
        with self._errors():
            _set_status(status, self._io("Write", True, INDIVIDUAL, None, buf))

    def Iread(self, buf: Any) -> Request:
        with self._errors():
            return completed(self._raise, self._io("Iread", False, INDIVIDUAL, None, buf), None)

    def Iwrite(self, buf: Any) -> Request:
        with self._errors():
            return completed(self._raise, self._io("Iwrite", True, INDIVIDUAL, None, buf), None)

    # -- independent, shared file pointer ---------------------------------------
    def Read_shared(self, buf: Any, status: MPI.Status | None = None) -> None:
        with self._errors():
            _set_status(status, self._io("Read_shared", False, SHARED, None, buf))

    def Write_shared(self, buf: Any, status: MPI.Status | None = None) -> None:
        with self._errors():
            _set_status(status, self._io("Write_shared", True, SHARED, None, buf))

    def Iread_shared(self, buf: Any) -> Request:
        with self._errors():
            return completed(self._raise, self._io("Iread_shared", False, SHARED, None, buf), None)

    def Iwrite_shared(self, buf: Any) -> Request:
        with self._errors():
            return completed(self._raise, self._io("Iwrite_shared", True, SHARED, None, buf), None)

    # -- collective ---------------------------------------------------------------
    def Read_all(self, buf: Any, status: MPI.Status | None = None) -> None:
        """Collective: read from the individual pointer (moved once the call succeeded)."""
        with self._errors():
            _set_status(status, self._from_pointer("Read_all", False, buf))

    def Write_all(self, buf: Any, status: MPI.Status | None = None) -> None:
        """Collective: write from the individual pointer (moved once the call succeeded)."""
        with self._errors():
            _set_status(status, self._from_pointer("Write_all", True, buf))

    def Read_at_all(self, offset: int, buf: Any, status: MPI.Status | None = None) -> None:
        """Collective: read at ``offset``."""
        with self._errors():
            _set_status(status, self._now(self._prepare("Read_at_all", False, AT, offset, buf)))

    def Write_at_all(self, offset: int, buf: Any, status: MPI.Status | None = None) -> None:
        """Collective: write at ``offset``."""
        with self._errors():
            _set_status(status, self._now(self._prepare("Write_at_all", True, AT, offset, buf)))

    def Read_ordered(self, buf: Any, status: MPI.Status | None = None) -> None:
        """Collective: read from the shared pointer, rank after rank."""
        with self._errors():
            self._check_open()
            self._drain()
            _set_status(status, self._ordered("Read_ordered", False, buf))

    def Write_ordered(self, buf: Any, status: MPI.Status | None = None) -> None:
        """Collective: write from the shared pointer, rank after rank."""
        with self._errors():
            self._check_open()
            self._drain()
            _set_status(status, self._ordered("Write_ordered", True, buf))

    # -- nonblocking collective -------------------------------------------------
    def Iread_all(self, buf: Any) -> Request:
        with self._errors():
            return self._later(self._prepare("Iread_all", False, INDIVIDUAL, None, buf))

    def Iwrite_all(self, buf: Any) -> Request:
        with self._errors():
            return self._later(self._prepare("Iwrite_all", True, INDIVIDUAL, None, buf))

    def Iread_at_all(self, offset: int, buf: Any) -> Request:
        with self._errors():
            return self._later(self._prepare("Iread_at_all", False, AT, offset, buf))

    def Iwrite_at_all(self, offset: int, buf: Any) -> Request:
        with self._errors():
            return self._later(self._prepare("Iwrite_at_all", True, AT, offset, buf))

    # -- split collective ---------------------------------------------------------
    def Read_all_begin(self, buf: Any) -> None:
        with self._errors():
            self._begin(
                lambda: self._later(self._prepare("Read_all_begin", False, INDIVIDUAL, None, buf))
            )

    def Read_all_end(self, buf: Any, status: MPI.Status | None = None) -> None:
        self._end(status)

    def Write_all_begin(self, buf: Any) -> None:
        with self._errors():
            self._begin(
                lambda: self._later(self._prepare("Write_all_begin", True, INDIVIDUAL, None, buf))
            )

    def Write_all_end(self, buf: Any, status: MPI.Status | None = None) -> None:
        self._end(status)

    def Read_at_all_begin(self, offset: int, buf: Any) -> None:
        with self._errors():
            self._begin(
                lambda: self._later(self._prepare("Read_at_all_begin", False, AT, offset, buf))
            )

    def Read_at_all_end(self, buf: Any, status: MPI.Status | None = None) -> None:
        self._end(status)

    def Write_at_all_begin(self, offset: int, buf: Any) -> None:
        with self._errors():
            self._begin(
                lambda: self._later(self._prepare("Write_at_all_begin", True, AT, offset, buf))
            )

    def Write_at_all_end(self, buf: Any, status: MPI.Status | None = None) -> None:
        self._end(status)

    def Read_ordered_begin(self, buf: Any) -> None:
        with self._errors():
            self._begin(
                lambda: self._submit(lambda: self._ordered("Read_ordered_begin", False, buf))
            )

    def Read_ordered_end(self, buf: Any, status: MPI.Status | None = None) -> None:
        self._end(status)

    def Write_ordered_begin(self, buf: Any) -> None:
        with self._errors():
            self._begin(
                lambda: self._submit(lambda: self._ordered("Write_ordered_begin", True, buf))
            )

    def Write_ordered_end(self, buf: Any, status: MPI.Status | None = None) -> None:
        self._end(status)

    # -- the work -----------------------------------------------------------------
    def _etypes(self, buf: Any) -> int:
        """Local: how many etypes ``buf`` holds (``ERR_IO`` for a part of one, as ROMIO)."""
        nbytes, size = buffer_size(buf), self._view.etype_size
        if nbytes % size:
            raise ErrIo(
                f"only an integral number of etypes can be accessed: the buffer holds "
                f"{nbytes} bytes, the etype {size}"
            )
        return nbytes // size

    def _io(self, call: str, writing: bool, kind: str, offset: Any, buf: Any) -> int:
        """Local: an independent call; returns the bytes moved (for a read: before the end)."""
        self._check_open()
        refusal = self._amode.refuse(call, writing=writing, shared=kind == SHARED)
        if refusal is not None:
            raise refusal
        n = self._etypes(buf)
        if kind == AT:
            position = _offset(offset)
        elif kind == INDIVIDUAL:
            position = self._pos
        else:
            position = self._shared.take(n)
        lay = BufferLayout(self._view, position, buf, writing=writing)
        lay.validate()
        runs, mem = lay.runs(), lay.as_bytes(None)
        be = self._core.ctx.backend
        lo, hi = runs.extent() if len(runs) else (0, 0)
        with be.lock(lo, hi, write=writing) if self._atomic else contextlib.nullcontext():
            (be.write_runs if writing else be.read_runs)(runs, mem)
        if kind == INDIVIDUAL:
            self._pos = position + n
        return runs.nbytes if writing else before_eof(runs, be.size())

    def _prepare(
        self, call: str, writing: bool, kind: str, offset: Any, buf: Any, *, move: bool = True
    ) -> Access:
        """Local: a collective call's buffer through the view, and what MPI refuses of it
        (raised inside the engine's first agreement); with ``move`` the individual pointer
        moves now (a nonblocking call's: the next call starts from there)."""
        self._check_open()
        refusal: BaseException | None = self._amode.refuse(call, writing=writing)
        position = 0
        if refusal is None:
            try:
                n = self._etypes(buf)
                position = _offset(offset) if kind == AT else self._pos
                if kind == INDIVIDUAL and move:
                    self._pos += n
            except Exception as exc:
                refusal = exc
        return Access(self._view, position, buf, writing=writing, refusal=refusal, at=kind == AT)

    def _from_pointer(self, call: str, writing: bool, buf: Any) -> int:
        """Collective: a blocking call from the individual pointer, which moves once the
        call succeeded: a failure is agreed, so every rank's pointer stays where it was,
        as collio's own ``write_all`` leaves it and as an independent call here does (ROMIO
        moves it in its two-phase path whatever the outcome, but not in its contiguous
        one: a program retrying the call writes where it meant to)."""
        lay = self._prepare(call, writing, INDIVIDUAL, None, buf, move=False)
        got = self._now(lay)
        self._pos = lay.position + lay.etypes
        return got

    def _now(self, lay: Access) -> int:
        """Collective: run a collective call on this thread, after the worker's."""
        self._drain()
        return self._collective(lay)

    def _collective(self, lay: Access) -> int:
        """Collective: one engine call; the bytes moved (for a read: before the end)."""
        ctx = self._core.ctx
        with exclusive(ctx.comm, "Write_all" if lay.writing else "Read_all"):
            ctx.call_at = lay.at
            try:
                if lay.writing:
                    engine.write(ctx, None, lay)
                else:
                    engine.read(ctx, lay, None)
            except BaseException as exc:
                self._core.failed(exc, writing=lay.writing)
                raise
            finally:
                ctx.call_at = False
        if lay.writing:
            return lay.etypes * self._view.etype_size
        return before_eof(lay.runs(), ctx.backend.size())

    def _ordered(self, call: str, writing: bool, buf: Any) -> int:
        """Collective: offsets from the shared pointer and an ``Exscan`` of the sizes, the
        pointer moved on by the last rank, then one collective call."""
        refusal: BaseException | None = self._amode.refuse(call, writing=writing, shared=True)
        n = 0
        if refusal is None:
            try:
                n = self._etypes(buf)
            except Exception as exc:
                refusal = exc
        core = self._core
        comm: MPI.Intracomm = self._comm
        rank = comm.Get_rank()
        start = 0
        if refusal is None and rank == 0:
            try:  # (the pointer's file: an OSError here is agreed in the head, not raised alone)
                start = self._shared.get()
            except Exception as exc:
                refusal = exc
        failed, _ = core.head("sync", failed=refusal is not None, subject=call)
        if failed:
            try:
                raise_agreed(comm, refusal, what=call)
            except BaseException as exc:
                core.failed(exc, writing=writing)
                raise
        mine = np.array([start + n if rank == 0 else n], np.int64)
        before = np.zeros(1, np.int64)
        comm.Exscan([mine, MPI.INT64_T], [before, MPI.INT64_T], op=MPI.SUM)
        offset = start if rank == 0 else int(before[0])
        moved: BaseException | None = None
        if rank == comm.Get_size() - 1:  # (its end is the next pointer; the call's last
            try:  # agreement makes every rank wait for this)
                self._shared.set(offset + n)
            except Exception as exc:  # (refused in the call's first agreement, everywhere)
                moved = exc
        return self._collective(Access(self._view, offset, buf, writing=writing, refusal=moved))

    def _submit(self, run: Callable[[], int]) -> Request:
        """Local: a collective call for the worker, after those already given to it."""
        out = Outcome(self._raise)
        req = Request.start(out)
        self._worker.submit(run, out, self._convert)
        return req

    def _later(self, lay: Access) -> Request:
        return self._submit(lambda: self._collective(lay))

    def _drain(self) -> None:
        self._worker.drain()

    def _begin(self, start: Callable[[], Request]) -> None:
        """Local: start a split collective (one at a time per file, as MPI allows)."""
        self._check_open()
        if self._split is not None:
            raise ErrIo("only one active split collective I/O operation is allowed per file")
        self._split = start()

    def _end(self, status: MPI.Status | None) -> None:
        """Local: wait for the split collective begun last."""
        with self._errors():
            self._check_open()
            req, self._split = self._split, None
            if req is None:
                raise ErrIo("no split collective I/O operation is active")
        req.Wait(status)


def _offset(offset: Any) -> int:
    """An explicit offset (etypes): a non-negative integer (``ERR_ARG`` otherwise)."""
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise ErrArg(f"invalid offset argument: {offset!r} is not an integer")
    if offset < 0:
        raise ErrArg(f"invalid offset argument: {int(offset)} is negative")
    return int(offset)
