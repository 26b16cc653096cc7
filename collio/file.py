"""``collio.open`` and :class:`File`: the public face; completion and agreement live here."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import numpy as np
from mpi4py import MPI

from . import engine, view
from .backends import get_backend, infer_backend
from .backends.base import Backend
from .collective import Attempt, agree, agree_same, any_flag, raise_agreed
from .comms import Private, private
from .errors import ModeError
from .hints import Hints
from .layouts.base import Layout
from .stats import Stats

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
    priv = private(MPI.COMM_WORLD if comm is None else comm)
    return File._open(priv, target, mode, hints, backend, options)


class File:
    """A target open on every rank of a communicator.

    ``write_all``, ``read_all``, ``sync`` and ``close`` are collective: every
    rank calls them, in the same order, even with nothing to write.  Errors are
    raised on every rank alike, and the file stays usable after them.
    """

    def __init__(self, ctx: engine.Context, target: Any) -> None:
        self._ctx = ctx
        self.target = target
        self._aborted = False
        # a write_all since the last agreed sync (collective state: the same on every rank)
        self._unsynced = False
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
        # one allreduce agrees on errors and on every rank passing the same arguments
        agree_same(comm, step.error, mine, what="open", describe=lambda v: f"open arguments {v!r}")
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
        # O_DIRECT where the backend could use it (posix on a file system that allows it)
        # O_DIRECT where this rank's backend could open it (never in 'r': reads go
        # through the page cache); f.stats.direct_io_bytes counts what went that way
        stats.hints["direct_write"] = parsed.direct_write and bool(
            stats.backend.get("direct_write", False)
        )
        ctx = engine.Context(comm, be, parsed, aggs, stats, mode, priv.plans, read_aggs)
        f = cls(ctx, target)
        f._priv = priv
        priv.acquire()
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
        self._view = view.make_view(self.comm, disp, etype, filetype, datarep)
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
        self._check_open()
        if self._aborted:
            agree(self.comm, ModeError("an earlier write failed; atomic commit was aborted"))
        lay = view.BufferLayout(self._view, self._position, data, writing=True)
        self._unsynced = True
        try:
            engine.write(self._ctx, data, lay if layout is _VIEW else layout)
        except BaseException:
            if self._atomic():
                self._abort()
            raise
        if layout is _VIEW:
            self._position += lay.etypes

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
            # failures are agreed: if some ranks called write_all meanwhile (a
            # MismatchError), they count on close() agreeing; so must this rank
            self._unsynced = True
            if getattr(exc, "call_mismatch", False) and self._atomic():
                self._abort()  # as the ranks in write_all do: the same collective calls
            raise

    def write_at_all(self, offset: int, buf: Any) -> None:
        """Collective over `comm`: write ``buf`` through the view from etype ``offset``."""
        self.write_all(buf, view.BufferLayout(self._view, offset, buf, writing=True))

    def read_at_all(self, offset: int, buf: Any) -> Any:
        """Collective over `comm`: fill ``buf`` through the view from etype ``offset``."""
        self._check_open()
        lay = view.BufferLayout(self._view, offset, buf, writing=False)
        self._read(lay, None)
        return lay.buffer

    def sync(self) -> None:
        """Collective over `comm`: return once every written byte is durable (fsync)."""
        self._check_open()
        step = Attempt()
        with step:
            self.backend.sync()
        if any_flag(self.comm, step.error is not None, patient=True):
            raise_agreed(self.comm, step.error, what="sync")
        self._unsynced = False

    def close(self) -> None:
        """Collective over `comm`: sync, commit (atomic targets), release.  Idempotent."""
        if self.closed:
            return
        ctx = self._ctx
        if not (self._unsynced or self._aborted or ctx.backend.commits):
            # nothing written since an agreed sync, nothing to commit: every rank knows
            # it (write_all and sync are collective), so no agreement is needed
            self._release()
            return
        step = Attempt()
        with step:
            ctx.backend.sync()
        # fsync takes each rank its own time: wait sleeping (see engine._complete)
        ok = not self._aborted and not any_flag(ctx.comm, step.error is not None, patient=True)
        try:
            if not self._aborted:
                ctx.backend.commit(ctx.comm, ok)
            if not ok:
                agree(ctx.comm, step.error, what="close")
        finally:
            self._release()

    def _release(self) -> None:
        ctx = self._ctx
        try:
            ctx.backend.close()
            ctx.mode = "closed"
            if os.environ.get("COLLIO_STATS") and ctx.comm.Get_rank() == 0:
                print(ctx.stats.summary(), file=sys.stderr, flush=True)
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
        """Collective: drop an atomic write (the temporary goes, the target stays)."""
        self._aborted = True
        self.backend.commit(self.comm, False)

    def __enter__(self) -> File:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        if exc is not None and not self._aborted and not self.closed and self._atomic():
            self._abort()
        self.close()

    def __repr__(self) -> str:
        return f"<collio.File {self.target!r} mode={self.mode!r} backend={self.backend.name}>"


def _used_hints(hints: Hints, aggs: np.ndarray[Any, np.dtype[np.int64]]) -> dict[str, Any]:
    used = hints.as_dict()
    used["cb_nodes"] = len(aggs)
    used["cb_config_list"] = hints.cb_config_list or "*:*"
    used["aggregator_ranks"] = aggs.tolist()
    return used
