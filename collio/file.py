"""``collio.open`` and :class:`File`: the public face over :class:`~collio.core.FileCore`."""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from threading import get_ident
from time import perf_counter
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from . import engine, speculate, view
from .backends import get_backend, infer_backend
from .backends.base import Backend
from .comms import Private, _exit, exclusive, one_thread, private
from .comms import _busy as _in_call  # (the one-thread guard's record, entered inline)
from .core import FileCore
from .errors import add_later
from .hints import Hints
from .layouts.arrays import Subarray
from .layouts.base import Layout
from .redact import shown
from .stats import Stats

__all__ = ["File", "open"]

_MODES = ("r", "w", "r+")
#: ``write_all(buf)`` without a layout goes through the view; an explicit None stays an error
_VIEW: Any = object()
#: A step's route not taken (nothing done): the call goes the guarded way
_NOT: Any = object()
F = TypeVar("F", bound=Callable[..., Any])


def _guarded(name: str) -> Callable[[F], F]:
    """:func:`~collio.comms.one_thread` for the guarded way of the public method ``name``
    (the call the guard names to another thread is the public one)."""

    def guard(method: F) -> F:
        method.__name__ = name
        return one_thread(method)

    return guard


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
    # collective only the first time collio sees `comm`: no file is open on it then, so
    # no rank can be in another call on it for the open agreement to meet
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
    The agreements and the completion are :class:`~collio.core.FileCore`'s.
    """

    def __init__(self, core: FileCore, target: Any) -> None:
        self._core = core
        self._ctx = core.ctx
        self.target = target
        self._view = view.DEFAULT_VIEW
        self._position = 0  # this rank's file pointer, in etypes of the view
        # the communicator's key in the one-thread guard (comms.one_thread's), found once
        self._key = core.ctx.comm.py2f()

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
        def check(parsed: Hints) -> tuple[tuple[Any, ...], type[Backend]]:
            name = backend or infer_backend(target)
            bcls = get_backend(name)
            bcls.check_options(mode, options)
            # a path or URL must be the same on every rank (as MPI_File_open's filename)
            path = os.fspath(target) if isinstance(target, (str, os.PathLike)) else None
            return (name, path, *bcls.compared_options(mode, options)), bcls

        ahead: list[Any] = []  # (the backend's early open, where it made one)

        def early(parsed: Hints, bcls: type[Backend]) -> Any:
            got = bcls.open_early(target, mode, priv.comm.Get_rank(), parsed, options)
            if got is not None:
                ahead.append(got)
            return got

        def opener(comm: MPI.Intracomm, parsed: Hints, bcls: type[Backend]) -> Backend:
            extra = {"_early": ahead[0]} if ahead else {}
            return bcls.open(target, mode, comm=comm, hints=parsed, **extra, **options)

        core = FileCore.open(
            priv, target, mode, hints, modes=_MODES, check=check, opener=opener, early=early
        )
        return cls(core, target)

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

    def write_all(self, data: Any, layout: Any = _VIEW) -> None:
        """Collective over `comm`: write every rank's ``data`` where its ``layout`` says.

        Every rank calls, even with an empty piece.  Raises the same
        :class:`~collio.CollioError` on every rank if any rank fails.  With
        ``atomic_commit`` (or an ``atomic`` backend such as S3), a failure discards
        everything written since open.  Without ``layout``, ``data`` is an mpi4py
        buffer written through the view (:meth:`set_view`) from the file pointer,
        which then moves on.
        """
        # a repeat of the last call's step: straight to it (:meth:`_stepped`)
        ctx = self._ctx
        lane = ctx.lane
        if lane is not None and lane.step is not None and ctx.mode != "closed":
            if layout is not _VIEW and self._laned(layout, data) is not _NOT:
                return
        step = ctx.kept[True].last_step()
        # (the kept two-phase lane, ctx.lane, goes first)
        if step is not None and ctx.mode != "closed" and ctx.lane is None:
            if layout is _VIEW:
                if self._stepped(step, None, self._position, data, "write_all") is not _NOT:
                    self._position += int(data.nbytes) // self._view.etype_size
                    return
            elif layout is not None:  # (None: to _stepped, the view from etype 0)
                if self._stepped(step, layout, 0, data, "write_all") is not _NOT:
                    return
        self._write_all(data, layout)

    @_guarded("write_all")
    def _write_all(self, data: Any, layout: Any) -> None:
        """:meth:`write_all` the guarded way."""
        self._check_open()
        if layout is not _VIEW:  # (no buffer layout to build: small calls count every step)
            self._write(data, layout)
            return
        self._position += self._through_view(self._position, data, writing=True)

    def _write(self, data: Any, layout: Any) -> None:
        try:
            engine.write(self._ctx, data, layout)
        except BaseException as exc:
            self._failed(exc, writing=True)
            raise

    def _through_view(self, position: Any, data: Any, *, writing: bool) -> int:
        """Collective: write (read) ``data`` through the view from etype ``position``;
        the etypes it moved.  A call repeating the last one through the view skips the
        buffer's checks (:func:`collio.engine.again`)."""
        ctx, fview = self._ctx, self._view
        try:
            if engine.again(ctx, fview, position, data, writing=writing):
                return int(data.nbytes) // fview.etype_size
            lay = view.BufferLayout(fview, position, data, writing=writing)
            if writing:
                engine.write(ctx, data, lay)
            else:
                engine.read(ctx, lay, None)
        except BaseException as exc:
            self._failed(exc, writing=writing)
            raise
        if type(data) is np.ndarray:  # (what check.again accepts)
            speculate.note_view(ctx, fview, lay.data_bytes, writing=writing)
        return lay.etypes

    def read_all(self, layout: Any = None, out: Any = None) -> Any:
        """Collective over `comm`: read this rank's piece; returns an ndarray.

        ``out`` (optional) is filled in place and returned; it must have the
        layout's shape and dtype and be contiguous in its order.  Given an
        mpi4py buffer instead of a layout, reads through the view from the
        file pointer into that buffer, in place, and returns it.
        """
        ctx = self._ctx
        step = ctx.kept[False].last_step()
        if step is not None and ctx.mode != "closed":
            if type(layout) is np.ndarray:  # (a buffer through the view)
                got = self._stepped(step, None, self._position, layout, "read_all")
                if got is not _NOT:
                    self._position += int(layout.nbytes) // self._view.etype_size
                    return got
            elif layout is not None:  # (None: to _stepped, the view from etype 0)
                got = self._read_stepped(step, layout, out)
                if got is not _NOT:
                    return got
        return self._read_all(layout, out)

    def _read_stepped(self, step: Any, layout: Any, out: Any) -> Any:
        """:meth:`_stepped` of ``read_all(layout, out)``, a time series' read, with what
        ``_stepped`` works out from the call's name known: it reads, and it is not an
        at-call.  ``ctx.call_at`` is False while no call holds the guard (the at-calls
        set it inside it and clear it in their ``finally``), so it is left as it is."""
        key, mine = self._key, (get_ident(), "read_all", 1)
        if _in_call.setdefault(key, mine) is not mine:
            return _NOT
        ctx = self._ctx
        try:
            t0 = perf_counter()
            stepped = step(ctx, layout, out, t0)
            if stepped is None:
                return _NOT
            if stepped[0] is not True:
                engine.resume(ctx, stepped[0], layout, t0, writing=False)
            return stepped[1]
        except BaseException as exc:
            self._failed(exc)
            raise
        finally:
            _exit(key)  # (the guard's exit: also clears plans release_buffers asked for)

    @_guarded("read_all")
    def _read_all(self, layout: Any, out: Any) -> Any:
        """:meth:`read_all` the guarded way."""
        self._check_open()
        # (the common layout by its type first: an ABC's isinstance costs a repeated
        # small read a few calls)
        if type(layout) is Subarray or isinstance(layout, Layout):
            return self._read(layout, out)
        self._position += self._through_view(self._position, layout, writing=False)
        return view.BufferLayout.buffer_of(layout)

    def _read(self, layout: Any, out: Any) -> Any:
        try:
            return engine.read(self._ctx, layout, out)
        except BaseException as exc:
            self._failed(exc)  # as the ranks in write_all do, when some are (a mismatch)
            raise

    @one_thread
    def write_all_many(self, items: Any, *, _disjoint: bool = False) -> None:
        """Collective over `comm`: write many arrays in one two-phase call.

        ``items`` is a sequence of ``(data, layout)`` pairs, each what :meth:`write_all`
        takes; item ``k`` describes the same global array on every rank, and every rank
        passes the same number of items (an empty piece where it holds nothing).  The
        runs of all items are planned, exchanged and written as one call's.  Any error
        (a different count, an item that fails its checks, items that overlap) is
        raised on every rank alike, naming the item, before any byte is written.

        ``_disjoint=True`` (on every rank; internal) is the caller's word that no two
        ranks' runs overlap and that each rank's runs are few and large: then, on a
        backend whose ranks may write their own ranges, each rank writes its runs
        itself, with no exchange, however the ranks' extents interleave.  Between
        ranks nothing is checked, so it is not public: only a caller that proved it
        from every rank's pieces (collio.checkpoint's plan) passes it.
        """
        self._check_open()
        try:
            engine.write_many(self._ctx, items, disjoint=_disjoint)
        except BaseException as exc:
            self._failed(exc, writing=True)
            raise

    @one_thread
    def read_all_many(self, layouts: Any, out: Any = None, *, _disjoint: bool = False) -> list[Any]:
        """Collective over `comm`: read many arrays in one two-phase call.

        Returns a list of ndarrays, one per layout; ``out`` (optional) is a sequence
        of arrays, one per layout, filled in place (as :meth:`read_all`'s ``out``;
        no two of them may share memory).  The same rules as :meth:`write_all_many`;
        ``_disjoint=True`` (internal, as for writes): each rank reads its own runs.
        """
        self._check_open()
        try:
            return engine.read_many(self._ctx, layouts, out, disjoint=_disjoint)
        except BaseException as exc:
            self._failed(exc)
            raise

    @one_thread
    def _flush_soon(self) -> None:
        """Local (internal): from now on, start the disk on this rank's written bytes as
        soon as it has written them, where the backend can (posix: writeback of a call's
        own runs, the hint ``early_flush``); ``sync`` and ``close`` make them durable and
        report any error.  For a caller who computes after its writes
        (collio.checkpoint's checksums, made while the disk writes the data), called
        before them."""
        self._check_open()
        self._ctx.backend.flush_soon()

    def write_at_all(self, offset: int, buf: Any) -> None:
        """Collective over `comm`: write ``buf`` through the view from etype ``offset``."""
        ctx = self._ctx
        step = ctx.kept[True].last_step()
        if (
            step is not None and ctx.mode != "closed"
            and self._stepped(step, None, offset, buf, "write_at_all") is not _NOT
        ):  # fmt: skip
            return
        self._write_at_all(offset, buf)

    @_guarded("write_at_all")
    def _write_at_all(self, offset: int, buf: Any) -> None:
        """:meth:`write_at_all` the guarded way."""
        self._check_open()
        self._ctx.call_at = True  # (its head and messages name it: Context.call_at)
        try:
            self._through_view(offset, buf, writing=True)
        finally:
            self._ctx.call_at = False

    def read_at_all(self, offset: int, buf: Any) -> Any:
        """Collective over `comm`: fill ``buf`` through the view from etype ``offset``."""
        ctx = self._ctx
        step = ctx.kept[False].last_step()
        if step is not None:
            if ctx.mode != "closed":
                got = self._stepped(step, None, offset, buf, "read_at_all")
                if got is not _NOT:
                    return got
        return self._read_at_all(offset, buf)

    @_guarded("read_at_all")
    def _read_at_all(self, offset: int, buf: Any) -> Any:
        """:meth:`read_at_all` the guarded way."""
        self._check_open()
        self._ctx.call_at = True
        try:
            self._through_view(offset, buf, writing=False)
        finally:
            self._ctx.call_at = False
        return view.BufferLayout.buffer_of(buf)

    @one_thread
    def sync(self) -> None:
        """Collective over `comm`: return once every written byte is durable (fsync)."""
        self._check_open()
        self._core.sync()

    @one_thread
    def close(self) -> None:
        """Collective over `comm`: sync, commit (atomic targets), release.  Idempotent.

        Always agrees, even with nothing written: a rank closing alone would
        leave the others waiting in their next call on the file.
        """
        self._core.close()

    def _stepped(self, step: Any, layout: Any, position: int, data: Any, name: str) -> Any:
        """Collective over `comm` unless it returns ``_NOT`` (nothing done): the call
        ``name`` through ``layout`` (None: through the view from etype ``position``) as a
        repeat of the last one, by the :class:`~collio.quick.Step` that call left
        (:func:`collio.quick.layout_again` / :func:`collio.quick.again` would find it
        first too); what it read (the array, the buffer), or None for a write.

        A small call spends most of its time in Python: this route skips the layers
        between the public method and the step, doing their part inline.  The caller
        asked what ``_check_open`` asks (not closed); the one-thread guard is
        :func:`collio.comms.one_thread`'s, entered here as its first entry does, and
        only that: when another call holds the communicator (another thread's, or this
        thread's own) nothing is done here and the guarded way says what it must.
        Errors are handled as the guarded way handles them (:meth:`_failed`)."""
        key, mine = self._key, (get_ident(), name, 1)
        if _in_call.setdefault(key, mine) is not mine:
            return _NOT
        writing = name[0] == "w"
        ctx = self._ctx
        ctx.call_at = name[-7:] == "_at_all"  # (held by this call now: see the guard above)
        try:
            t0 = perf_counter()
            if layout is None:
                got = step.view(ctx, self._view, position, data, t0)
                if got is None:
                    return _NOT
                if got is not True:
                    engine.resume(ctx, got, None, t0, writing=writing)
                return None if writing else data
            stepped = step(ctx, layout, data, t0)
            if stepped is None:
                return _NOT
            if stepped[0] is not True:
                engine.resume(ctx, stepped[0], layout, t0, writing=writing)
            return None if writing else stepped[1]
        except BaseException as exc:
            self._failed(exc, writing=writing)
            raise
        finally:
            ctx.call_at = False
            _exit(key)  # (the guard's exit: also clears plans release_buffers asked for)

    def _laned(self, layout: Any, data: Any) -> Any:
        """Collective over `comm` unless it returns ``_NOT`` (nothing done): ``write_all``
        of ``data`` through ``layout`` as a repeat of the kept two-phase lane's call
        (:func:`collio.keptcall.headed`, its :class:`~collio.keptcall.Step` made), as
        :meth:`_stepped` takes a :class:`~collio.quick.Step`'s repeat: a time series'
        small strided write spends most of its Python in the layers between the public
        method and the lane, whose part is done inline here."""
        key, mine = self._key, (get_ident(), "write_all", 1)
        if _in_call.setdefault(key, mine) is not mine:
            return _NOT
        ctx = self._ctx
        try:
            t0 = perf_counter()
            got = engine.lane_headed(ctx, data, layout, t0)
            if got is None or got is False:  # (nothing done: as engine.write goes on)
                return _NOT
            if got is not True:  # (past its head: on the general way, as engine.write)
                engine.resume_lane(ctx, got, layout, t0)
            return None
        except BaseException as exc:
            self._failed(exc, writing=True)
            raise
        finally:
            _exit(key)  # (the guard's exit: also clears plans release_buffers asked for)

    def _failed(self, exc: BaseException, *, writing: bool = False) -> None:
        self._core.failed(exc, writing=writing)

    def _check_open(self) -> None:
        self._core.check_open(self.target)

    def __enter__(self) -> File:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        if isinstance(exc, KeyboardInterrupt):
            # (Ctrl-C reaches each rank at its own moment: a close, collective, would
            # wait for ranks that may never come; this rank drops its part of the write
            # and lets go of the file, as a close interrupted before its commit does)
            if not self.closed:
                self._core.interrupted(None)
            return
        if exc is not None and not self.closed:
            self._core.block_failed(exc)  # (the close tells every rank: FileCore.block_failed)
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as later:  # (agreed: the same on every rank)
            add_later(exc, later)  # the block's error is raised, the close's (an abort) rides on it

    def __repr__(self) -> str:
        return f"<collio.File {shown(self.target)} mode={self.mode!r} backend={self.backend.name}>"
