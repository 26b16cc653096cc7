"""``collio.open`` and :class:`File`: the public face; completion and agreement live here."""

from __future__ import annotations

import os
import types
from typing import Any

import numpy as np
from mpi4py import MPI

from . import engine, view
from .backends import get_backend, infer_backend
from .backends.base import Backend
from .collective import Attempt, any_flag, call_head, raise_agreed, same_slots, settle_same
from .comms import Private, exclusive, one_thread, private
from .errors import MismatchError, ModeError, add_later
from .hints import Hints
from .layouts.base import Layout
from .stats import Stats, print_at_close

__all__ = ["File", "open"]

_MODES = ("r", "w", "r+")
#: ``write_all(buf)`` without a layout goes through the view; an explicit None stays an error
_VIEW: Any = object()


def open(  # noqa: A001 - the natural name, like io.open / h5py.File
    target: Any,
    mode: str = "r",
    *,
    comm: MPI.Intracomm | None = None,
    hints: Any = None,
    backend: str | None = None,
    **options: Any,
) -> File:
    """Collective over `comm`: open a shared target for collective I/O.

    Parameters
    ----------
    target
        A path (``posix``), ``"mem://name"`` (``memory``), or what a backend accepts.
    mode
        ``'r'`` read, ``'w'`` create or truncate (reads allowed), ``'r+'`` read and
        write an existing target.
    comm
        The ranks taking part (default ``MPI.COMM_WORLD``).  collio works on a
        private duplicate, made once per communicator and cached on it.
    hints
        A dict, an ``MPI.Info`` or :class:`collio.Hints` (ROMIO's names).
    backend
        A backend name; inferred from the target when None.
    **options
        Passed to the backend.

    Returns
    -------
    File
        A context manager; every rank must call its collective methods.
    """
    # collective before the call's first agreement (File._open), but only the first time
    # collio sees `comm`: then no file is open on it anywhere, so no rank can be in another
    # call on it for that agreement to meet (and one in a call on another communicator
    # meets no agreement on this one, whatever it is); afterwards it is local
    priv = private(MPI.COMM_WORLD if comm is None else comm)
    with exclusive(priv.comm, "open"):  # (a second thread's call raises, see comms)
        return File._open(priv, target, mode, hints, backend, options)


class File:
    """A target open on every rank of a communicator.

    ``set_view``, ``write_all``, ``read_all``, ``sync`` and ``close`` are collective:
    every rank calls them, in the same order, even with nothing to write.  Errors are
    raised on every rank alike, and the file stays usable after them.

    Each of them starts with the same operation (:func:`~collio.collective.call_head`),
    so ranks making different calls (one rank in ``sync`` or ``close`` while the others
    are in ``write_all``) all raise the same :class:`~collio.MismatchError` instead of
    hanging.  Then, on every rank alike: an atomic target is aborted (as after a failed
    write); if some rank called ``close``, the file is closed on every rank (synced as
    ``close()`` syncs), its commit dropped, since that rank will not call again (the
    others' later ``close()`` finds it closed); otherwise the file stays open and usable.
    """

    def __init__(self, ctx: engine.Context, target: Any) -> None:
        self._ctx = ctx
        self.target = target
        self._view = view.DEFAULT_VIEW
        self._position = 0  # this rank's file pointer, in etypes of the view
        self._priv: Private | None = None  # the duplicate's owner, told when we close

    @classmethod
    def _open(
        cls,
        priv: Private,
        target: Any,
        mode: str,
        hints: Any,
        backend: str | None,
        options: dict[str, Any],
    ) -> File:
        comm = priv.comm
        step = Attempt()
        parsed = Hints()
        mine = None
        with step:
            if mode not in _MODES:
                raise ModeError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
            parsed = Hints.coerce(hints, warn=comm.Get_rank() == 0)
            name = backend or infer_backend(target)
            bcls = get_backend(name)
            bcls.check_options(mode, options)
            # a path or URL must be the same on every rank (as MPI_File_open's filename)
            path = os.fspath(target) if isinstance(target, (str, os.PathLike)) else None
            mine = (mode, parsed, name, path)
        # one allreduce agrees on errors and on every rank passing the same arguments;
        # it is the first operation of a file's calls, so a rank opening a file beside
        # the others' calls on an open one raises (as they do) instead of hanging
        file = (priv.files + 1, repr(target))
        failed, out = call_head(comm, "open", file, step.error is not None, same_slots(mine))
        if failed:
            raise_agreed(comm, step.error, what="open")
        settle_same(comm, mine, out, what="open", describe=lambda v: f"open arguments {v!r}")
        be: Backend = bcls.open(target, mode, comm=comm, hints=parsed, **options)
        aggs = priv.choose(parsed.cb_nodes, parsed.per_node())
        be.aggregators = aggs
        stats = Stats(aggregators=tuple(aggs.tolist()))
        stats.hints = _used_hints(parsed, aggs)
        read_aggs = None
        if bcls.read_per_node is not None and parsed.cb_nodes is None and not parsed.cb_config_list:
            read_aggs = priv.choose(None, bcls.read_per_node)
            stats.hints["read_aggregator_ranks"] = read_aggs.tolist()
        stats.backend = be.describe()
        # O_DIRECT where the backend uses it (posix, when every rank could open the file
        # so, agreed at open; never in 'r': reads go through the page cache);
        # f.stats.direct_io_bytes counts what went that way
        stats.hints["direct_write"] = parsed.direct_write and bool(
            stats.backend.get("direct_write", False)
        )
        ctx = engine.Context(comm, be, parsed, aggs, stats, mode, priv.plans, read_aggs, file)
        f = cls(ctx, target)
        f._priv = priv
        priv.acquire()
        priv.files = file[0]
        return f

    # -- properties -----------------------------------------------------------
    @property
    def comm(self) -> MPI.Comm:
        """collio's private duplicate of the communicator."""
        return self._ctx.comm

    @property
    def mode(self) -> str:
        return self._ctx.mode

    @property
    def closed(self) -> bool:
        return self._ctx.mode == "closed"

    @property
    def hints(self) -> Hints:
        return self._ctx.hints

    @property
    def backend(self) -> Backend:
        return self._ctx.backend

    @property
    def aggregators(self) -> tuple[int, ...]:
        """Ranks (of ``comm``) that own file domains."""
        return tuple(self._ctx.aggregators.tolist())

    @property
    def stats(self) -> Stats:
        """This file's statistics, already reduced over ranks (same on every rank)."""
        return self._ctx.stats

    # -- collective I/O -------------------------------------------------------
    @one_thread
    def set_view(
        self,
        disp: int = 0,
        etype: Any = None,
        filetype: Any = None,
        datarep: str = "native",
        info: Any = None,
    ) -> None:
        """Collective over `comm`: see the file through an MPI file view (``MPI.File.Set_view``).

        ``disp`` bytes, then ``filetype`` (an mpi4py datatype, default ``etype``)
        tiled; positions are counted in etypes (default ``MPI.BYTE``) and the
        file pointer returns to 0.  Then ``write_all(buf)``/``read_all(buf)``
        take mpi4py buffers (``buf``, ``[buf, type]``, ``[buf, count, type]``).
        The types may be freed after the call.  A bad view raises the same
        :class:`~collio.LayoutError` on every rank.  ``info`` is accepted for
        ``Set_view``'s signature and ignored: hints go to :func:`collio.open`.
        """
        self._check_open()
        try:
            self._view = view.make_view(self.comm, self._ctx.file, disp, etype, filetype, datarep)
        except BaseException as exc:
            self._failed(exc)
            raise
        self._position = 0

    @property
    def position(self) -> int:
        """This rank's file pointer, in etypes of the view (``MPI.File.Get_position``)."""
        return self._position

    @one_thread
    def write_all(self, data: Any, layout: Any = _VIEW) -> None:
        """Collective over `comm`: write every rank's ``data`` where its ``layout`` says.

        Every rank calls, even with an empty piece.  Raises the same
        :class:`~collio.CollioError` on every rank if any rank fails.  With
        ``atomic_commit`` (or an ``atomic`` backend such as S3), a failure discards
        everything written since open.  Without ``layout``, ``data`` is an mpi4py
        buffer written through the view (:meth:`set_view`) from the file pointer,
        which then moves on.
        """
        self._check_open()
        lay = view.BufferLayout(self._view, self._position, data, writing=True)
        try:
            engine.write(self._ctx, data, lay if layout is _VIEW else layout)
        except BaseException as exc:
            self._failed(exc, writing=True)
            raise
        if layout is _VIEW:
            self._position += lay.etypes

    @one_thread
    def read_all(self, layout: Any = None, out: Any = None) -> Any:
        """Collective over `comm`: read this rank's piece; returns an ndarray.

        ``out`` (optional) is filled in place and returned; it must have the
        layout's shape and dtype and be contiguous in its order.  Given an
        mpi4py buffer instead of a layout, reads through the view from the
        file pointer into that buffer, in place, and returns it.
        """
        self._check_open()
        if isinstance(layout, Layout):
            return self._read(layout, out)
        lay = view.BufferLayout(self._view, self._position, layout, writing=False)
        self._read(lay, None)
        self._position += lay.etypes
        return lay.buffer

    def _read(self, layout: Any, out: Any) -> Any:
        try:
            return engine.read(self._ctx, layout, out)
        except BaseException as exc:
            self._failed(exc)  # as the ranks in write_all do, when some are (a mismatch)
            raise

    def write_at_all(self, offset: int, buf: Any) -> None:
        """Collective over `comm`: write ``buf`` through the view from etype ``offset``."""
        self.write_all(buf, view.BufferLayout(self._view, offset, buf, writing=True))

    @one_thread
    def read_at_all(self, offset: int, buf: Any) -> Any:
        """Collective over `comm`: fill ``buf`` through the view from etype ``offset``."""
        self._check_open()
        lay = view.BufferLayout(self._view, offset, buf, writing=False)
        self._read(lay, None)
        return lay.buffer

    @one_thread
    def sync(self) -> None:
        """Collective over `comm`: return once every written byte is durable (fsync)."""
        self._check_open()
        self._head("sync")
        failed, error = self._synced()
        if failed:
            raise_agreed(self.comm, error, what="sync")

    @one_thread
    def close(self) -> None:
        """Collective over `comm`: sync, commit (atomic targets), release.  Idempotent.

        Always agrees first, even with nothing written: a rank closing alone would
        leave the others waiting in their next call on the file.
        """
        if self.closed:
            return
        self._head("close")  # a mismatch: _failed closed the file
        self._finish(*self._synced())

    def _head(self, call: str) -> None:
        """Collective over `comm`: ``sync``'s or ``close``'s first agreement, before the
        backend's sync, which may be collective (``MPI_File_sync``): a rank must not
        enter it while another is in a different call.  Nothing has run yet, so it
        waits polling, as ``write_all``'s does; the agreement after the fsync waits as
        :func:`~collio.collective.sleep_until_done` does (yielding, then sleeping)."""
        try:
            call_head(self.comm, call, self._ctx.file, False)
        except BaseException as exc:
            self._failed(exc)
            raise

    def _synced(self) -> tuple[bool, BaseException | None]:
        """Collective over `comm`: the backend's sync on every rank, then an agreement on
        its errors (sleeping: fsync takes each rank its own time).  Returns whether any
        rank failed, and this rank's error."""
        step = Attempt()
        with step:
            self.backend.sync()
        return any_flag(self.comm, step.error is not None, patient=True), step.error

    def _finish(self, failed: bool, error: BaseException | None) -> None:
        """Collective over `comm`: commit (drop, if anything failed or was aborted), release."""
        ctx = self._ctx
        try:
            ctx.backend.commit(ctx.comm, not (failed or ctx.aborted))
            if failed:
                raise_agreed(ctx.comm, error, what="close")
        finally:
            self._release()

    def _failed(self, exc: BaseException, *, writing: bool = False) -> None:
        """Collective over `comm`: what every rank that raised the agreed ``exc`` does next.

        The same on every rank, whichever call it was in: a failed write to an atomic
        target is aborted, and so is any call mismatch on this file.  When some rank
        called ``close`` the file is closed on every rank, its commit dropped: that rank
        will not call again.  After calls on different files (or an ``open``) nothing
        is done: the ranks do not share this file.
        """
        if isinstance(exc, MismatchError) and exc.call_mismatch:
            if not exc.one_file:
                return
            if "close" in exc.calls:
                self._close_after(exc)
                return
        elif not writing:
            return
        if self._atomic():
            self._abort()

    def _close_after(self, exc: MismatchError) -> None:
        """Collective over `comm`: close as ``close()`` does after its agreement (sync on
        every rank, agree on it, commit, release), the commit dropped, so what earlier
        calls wrote is as durable as after a normal close.  Every rank still raises
        ``exc``; a failure of this close (agreed, so the same everywhere) goes into
        ``exc.close_error``."""
        self._abort()
        try:
            self._finish(*self._synced())
        except Exception as later:  # exc is the error every rank raises
            exc.close_error = later

    def _release(self) -> None:
        ctx = self._ctx
        try:
            ctx.backend.close()
            ctx.mode = "closed"
            print_at_close(ctx.stats, ctx.file[1], ctx.comm.Get_rank())
        finally:
            priv, self._priv = self._priv, None
            if priv is not None:
                priv.release()

    def _check_open(self) -> None:
        # close() is collective, so every rank sees the same state: no agreement needed
        if self.closed:
            raise ModeError(f"{self.target!r} is closed")

    def _atomic(self) -> bool:
        """All-or-nothing writes: the ``atomic_commit`` hint, or an ``atomic`` backend."""
        atomic = self.hints.atomic_commit or self.backend.atomic
        return atomic and self.mode in ("w", "r+")

    def _abort(self) -> None:
        """Local (the same on every rank): drop the writes; ``close`` will not commit them.

        Later writes are refused (``ModeError`` on every rank); ``close`` calls
        ``commit(ok=False)`` (the temporary goes, the previous target stays).  Nothing
        collective here, so a rank may abort whatever call the others were in.
        """
        self._ctx.aborted = True

    def __enter__(self) -> File:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        if exc is not None and not self.closed and self._atomic():
            self._abort()
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as later:  # (agreed: the same on every rank)
            add_later(exc, later)  # the block's error is raised, the close's (an abort) rides on it

    def __repr__(self) -> str:
        return f"<collio.File {self.target!r} mode={self.mode!r} backend={self.backend.name}>"


def _used_hints(hints: Hints, aggs: np.ndarray[Any, np.dtype[np.int64]]) -> dict[str, Any]:
    used = hints.as_dict()
    used["cb_nodes"] = len(aggs)
    used["cb_config_list"] = hints.cb_config_list or "*:*"
    used["aggregator_ranks"] = aggs.tolist()
    return used
