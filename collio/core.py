"""The collective-file core under :class:`collio.File` and :mod:`collio.h5`.

An open file is one :class:`FileCore` on every rank: collio's private duplicate of
the user's communicator, the file's serial number on it, its hints, aggregators and
statistics (an engine :class:`~collio.context.Context`), and the backend that makes
it durable.  The front ends adapt arguments and call the core: the open agreement,
the head of every call, ``sync`` and ``close``, what every rank does after a call
mismatch, the atomic commit or abort, and the release of the communicator are
written once, here, so a fix in one front end is a fix in both.

A front end that agrees on more than the call at ``sync`` and ``close`` (collio.h5
compares the metadata every rank's HDF5 library wrote) passes a :class:`Rider`: its
slots travel in the call's head and it settles what they say right after.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from . import keptcall
from .backends.base import EARLY_SLOTS, NO_EARLY, Backend
from .collective import Attempt, any_flag, call_head, raise_agreed, same_slots, settle_same
from .comms import Lane, Private
from .context import Context
from .errors import CommitError, MismatchError, ModeError
from .hints import DEFAULT_HINTS, Hints
from .redact import redact_text, shown
from .stats import Stats, print_at_close
from .twolevel import local_aggregators

__all__ = ["FileCore", "Rider"]

I64 = npt.NDArray[np.int64]
T = TypeVar("T")


class Rider(Protocol):
    """A front end's own agreement riding on the head of ``sync`` and ``close``."""

    def prepare(self) -> tuple[BaseException | None, Sequence[int]]:
        """Local, changes nothing others could see: this rank's error and head slots."""

    def settle(
        self, call: str, failed: bool, error: BaseException | None, out: Sequence[int]
    ) -> None:
        """Collective: act on the head's maxima (``failed``: some rank's prepare failed)."""

    def release(self) -> None:
        """Local: let go of what the front end holds, before the backend closes."""


class FileCore:
    """One file open on every rank of a communicator (see the module docstring)."""

    __slots__ = ("ctx", "priv", "lane", "left", "gone")

    def __init__(self, ctx: Context, priv: Private, lane: Lane | None = None) -> None:
        self.ctx = ctx
        self.priv: Private | None = priv  # None once released
        self.lane = lane  # the communicator of the file's own (open's ``lane``), or None
        #: what this rank's ``with`` block raised (:meth:`block_failed`), as text: the
        #: error itself would hold the block's frames, the file among them (a cycle)
        self.left: str | None = None
        #: the maxima of every rank's (left, -left) in the close's head: (1, -1) every
        #: rank's block raised, (1, 0) only some ranks' (agreed)
        self.gone: tuple[int, int] = (0, 0)

    # -- open -----------------------------------------------------------------
    @classmethod
    def open(
        cls,
        priv: Private,
        target: Any,
        mode: str,
        hints: Any,
        *,
        modes: Sequence[str],
        check: Callable[[Hints], tuple[tuple[Any, ...], T]],
        opener: Callable[[MPI.Intracomm, Hints, T], Backend],
        engine_mode: str | None = None,
        label: str = "open arguments",
        lane: bool = False,
        early: Callable[[Hints, T], Any] | None = None,
    ) -> FileCore:
        """Collective over ``priv.comm``: agree on the arguments, open, choose aggregators.

        ``check`` (local, inside the first agreement) validates the front end's own
        arguments and returns what every rank must pass alike and what ``opener``
        needs; ``opener`` (collective) opens the backend.  One allreduce agrees on
        errors and on equal arguments; it is the head of an ``open`` call, so a rank
        opening beside the others' calls on an open file raises as they do.

        ``lane``: the file's calls run on a communicator of its own, with kept plans of
        its own (as ``MPI_File_open`` duplicates its communicator), for a front end that
        runs some collective calls of a file on a thread of their own (MPI's nonblocking
        collectives): those must share neither a communicator nor kept plans with the
        calls the main thread makes on other files meanwhile.  It is a
        :class:`~collio.comms.Lane` of ``priv``, lent again once the file is closed, so
        only the first open (and one beside each file still open) duplicates; which
        lane rides in this agreement.  The front end gives it back after ``release``.

        ``early`` (local, never raises; given the parsed hints and ``check``'s payload):
        the backend's part of the open that needs no other rank
        (:meth:`~collio.backends.base.Backend.open_early`), done before the agreement,
        which then agrees on its facts too, so that ``opener`` needs no agreement of its
        own; it learns the maxima before ``opener`` runs, and is dropped if the open fails.
        """
        comm = priv.comm
        step = Attempt()
        parsed = DEFAULT_HINTS
        mine: tuple[Any, ...] | None = None
        payload: Any = None
        ahead: Any = None
        with step:
            if mode not in modes:
                raise ModeError(f"mode must be one of {', '.join(modes)}, not {mode!r}")
            parsed = Hints.coerce(hints, warn=comm.Get_rank() == 0)
            compared, payload = check(parsed)
            mine = (mode, parsed, *compared)
            if early is not None:
                ahead = early(parsed, payload)
        file = (priv.files + 1, shown(target))
        k = priv.reserve() if lane else -1
        try:
            facts: tuple[int, ...] = ()
            if early is not None:  # (as many slots on every rank: the same front end)
                facts = NO_EARLY if ahead is None else tuple(ahead.slots())
                assert len(facts) == EARLY_SLOTS, facts
            own = (*same_slots(mine), k, -k, *facts)
            failed, out = call_head(comm, "open", file, step.error is not None, own)
            if failed:
                raise_agreed(comm, step.error, what="open")
            settle_same(
                comm, mine, out, what="open",
                describe=lambda v: redact_text(f"{label} {_brief(v)!r}", target),
            )  # fmt: skip
            if ahead is not None:
                ahead.agreed(out[len(own) - len(facts) :])
            be = opener(comm, parsed, payload)
        except BaseException:
            if lane:
                priv.unreserve(k)
            raise
        finally:
            if ahead is not None:  # (unless the backend took its descriptor)
                ahead.drop()
        ctx = _context(priv, be, parsed, engine_mode or mode, file)
        lent = None
        if lane:  # (every rank reserved the same lane when the maxima of k and -k agree)
            lent = priv.lend(k, bool(out[2] == -out[3]))
            ctx.comm, ctx.plans = lent.comm, lent.plans
        priv.acquire()
        priv.files = file[0]
        return cls(ctx, priv, lent)

    # -- state ------------------------------------------------------------------
    @property
    def comm(self) -> MPI.Comm:
        return self.ctx.comm

    @property
    def closed(self) -> bool:
        return self.ctx.mode == "closed"

    def check_open(self, name: Any) -> None:
        """Local: ``close`` is collective, so every rank sees the same state."""
        if self.ctx.mode == "closed":  # (closed, inline: every call asks)
            raise ModeError(f"{shown(name)} is closed")

    def context(self, backend: Backend) -> Context:
        """A call's context for another backend of this file (an HDF5 dataset's)."""
        c = self.ctx
        return Context(c.comm, backend, c.hints, c.aggregators, c.stats, c.mode, file=c.file)

    def retune(self, hints: Hints) -> None:
        """Local (alike on every rank given equal ``hints``): plan later calls with
        ``hints`` (``MPI_File_set_info``): aggregators are chosen anew, the statistics say so.
        What the backend settled at open (``direct_write``, ``mapped_reads``) stays."""
        assert self.priv is not None, "retune an open file"
        ctx = self.ctx
        new = _context(self.priv, ctx.backend, hints, ctx.mode, ctx.file)
        ctx.hints, ctx.aggregators, ctx.read_aggregators = (
            hints,
            new.aggregators,
            new.read_aggregators,
        )
        ctx.stats.aggregators, ctx.stats.hints = new.stats.aggregators, new.stats.hints

    def atomic(self) -> bool:
        """All-or-nothing writes: the ``atomic_commit`` hint, or an ``atomic`` backend."""
        c = self.ctx
        return bool(c.hints.atomic_commit or c.backend.atomic) and c.mode in ("w", "r+")

    def abort(self) -> None:
        """Local (the same on every rank): drop the writes; ``close`` will not commit them.

        Later writes are refused (``ModeError`` on every rank); ``close`` calls
        ``commit(ok=False)``.  Nothing collective, so a rank may abort whatever call
        the others were in.
        """
        self.ctx.aborted = True

    def block_failed(self, exc: BaseException) -> None:
        """Local: this rank's ``with`` block raised ``exc``, the close comes next; the
        other ranks' blocks may have ended normally.  An atomic target's writes are
        dropped, but not here, on this rank alone (its commit would then be decided by
        some ranks' ``ok``): the close's head carries the fact, and every rank drops the
        commit.  Where only some ranks' blocks raised, every rank's close raises the same
        :class:`~collio.errors.CommitError` naming them, so no rank takes the close for
        a commit (the raising ranks raise their own error, the close's riding on it).
        After an agreed failure that aborted already, and on a target that is not
        atomic (what was written stays whatever the block did), nothing changes."""
        if self.atomic() and not self.ctx.aborted:
            text = f"{type(exc).__name__}: {exc}"
            self.left = text if len(text) <= 200 else text[:197] + "..."

    def _left_slots(self) -> tuple[int, int]:
        """This rank's slots in the close's head: whether its ``with`` block raised, negated
        too (the maxima say whether some rank's did and whether every rank's did)."""
        flag = 0 if self.left is None else 1
        return flag, -flag

    # -- calls ------------------------------------------------------------------
    def head(
        self,
        call: str,
        *,
        failed: bool = False,
        own: Sequence[int] = (),
        subject: str | None = None,
        rider: Rider | None = None,
        patient: bool = False,
        first: Callable[[], None] | None = None,
    ) -> tuple[bool, tuple[int, ...]]:
        """Collective over ``comm``: the first agreement of a call on this file
        (:func:`~collio.collective.call_head`); a mismatch is handled by :meth:`failed`,
        after ``first`` (local) where given."""
        try:
            return call_head(
                self.comm, call, self.ctx.file, failed, own, subject=subject, patient=patient
            )
        except BaseException as exc:
            if first is not None:
                first()
            self.failed(exc, rider=rider)
            raise

    def failed(
        self, exc: BaseException, *, writing: bool = False, rider: Rider | None = None
    ) -> None:
        """Collective over ``comm``: what every rank that raised the agreed ``exc`` does next.

        The same on every rank, whichever call it was in: a failed write to an atomic
        target is aborted, and so is any call mismatch on this file.  When some rank
        called ``close`` the file is closed on every rank, its commit dropped: that
        rank will not call again.  After calls on different files (or an ``open``)
        nothing is done: the ranks do not share this file.
        """
        if isinstance(exc, MismatchError) and exc.call_mismatch:
            if not exc.one_file:
                return
            if "close" in exc.calls:
                self._close_after(exc, rider)
                return
        elif not writing:
            return
        if self.atomic():
            self.abort()

    def sync(self, call: str = "sync", *, rider: Rider | None = None) -> None:
        """Collective over ``comm``: the head, the rider's settling, then the backend's
        sync on every rank and one agreement on its errors.  When no rank has anything
        to make durable (``Backend.clean``: nothing written since its last sync, no early
        flush running or failed), the head says so and the call ends there: every
        written byte is durable already, and nothing could fail to agree on.  The head
        is made even then: it is how a rank syncing beside another call learns of it (a
        rank that skipped it would leave the others waiting in their call's head).
        Where the backend's sync is local (:attr:`~collio.backends.base.Backend.local_sync`:
        an fsync) and there is no rider, each rank syncs first and the head agrees on the
        call and on every rank's error at once (:meth:`_synced_first`)."""
        if rider is None and _local_sync(self.ctx.backend):
            failed, error = self._synced_first(call)
        elif self._agreed_head(call, rider):
            return
        else:
            failed, error = self._synced()
        if failed:
            if self.atomic():
                # a failed fsync (or early flush) may have lost written pages, and the
                # kernel reports it once: the close's fsync would succeed and commit them
                self.abort()
            raise_agreed(self.comm, error, what=call)

    def close(self, *, rider: Rider | None = None) -> None:
        """Collective over ``comm``: as :meth:`sync`, then commit (atomic targets) and
        release.  Idempotent.  Always agrees, even with nothing written: a rank
        closing alone would leave the others waiting in their next call."""
        if self.closed:
            return
        try:
            if rider is None and _local_sync(self.ctx.backend):  # (as sync: one agreement)
                self._finish(*self._synced_first("close"), rider)
                return
            clean = self._agreed_head("close", rider)  # (a call mismatch: failed() closed it)
            self._finish(*((False, None) if clean else self._synced()), rider)
        except BaseException as exc:
            if not isinstance(exc, Exception) and not self.closed:
                self.interrupted(rider)
            raise

    def interrupted(self, rider: Rider | None) -> None:
        """Local: a close that an interrupt (KeyboardInterrupt, SystemExit) ended before its
        commit: nothing can be agreed any more, so nothing is committed; this rank drops
        its part of the write (rank 0 the temporary of an atomic target) and lets go of
        the file, whose descriptors and temporary would otherwise stay while the process
        goes on."""
        self.abort()
        try:
            self.ctx.backend.discard()
        finally:
            self.release(rider)

    def release(self, rider: Rider | None = None) -> None:
        """Local: close the backend and let go of the communicator (idempotent)."""
        ctx = self.ctx
        rank = ctx.comm.Get_rank()  # (the rider's release may free a duplicate the user let go of)
        try:
            if rider is not None:
                rider.release()
            if ctx.mode != "closed":
                ctx.backend.close()
                ctx.mode = "closed"
                print_at_close(ctx.stats, ctx.file[1], rank)
        finally:
            try:
                keptcall.drop(ctx)  # (the kept lane's hvectors)
            finally:
                self.let_go()

    def let_go(self) -> None:
        """Local: release the communicator's duplicate once (freed if the user's is gone)."""
        priv, self.priv = self.priv, None
        if priv is not None:
            priv.release()

    # -- completion ---------------------------------------------------------------
    def _agreed_head(self, call: str, rider: Rider | None) -> bool:
        """Collective: the head of ``sync``/``close``, before the backend's sync (which may
        be collective, ``MPI_File_sync``: no rank may enter it while another is in a
        different call).  A rider's failure after the head closes the file on this
        rank when the call is ``close`` (every rank raises it alike).

        Returns (alike on every rank) whether the backend's sync may be skipped: without
        a rider, every rank's backend is :meth:`~collio.backends.base.Backend.clean`.
        The head carries :meth:`_left_slots` too (their maxima in :attr:`gone`)."""
        if rider is None:  # (a slot: some rank has something to make durable)
            dirty = 0 if self.ctx.backend.clean() else 1
            _, out = self.head(call, own=(dirty, *self._left_slots()))
            self.gone = (int(out[1]), int(out[2]))
            return int(out[0]) == 0
        error, own = rider.prepare()
        n = len(own)
        failed, out = self.head(
            call, failed=error is not None, own=(*own, *self._left_slots()), rider=rider
        )
        self.gone = (int(out[n]), int(out[n + 1]))
        try:
            rider.settle(call, failed, error, out[:n])
        except BaseException:
            if call == "close":
                self.release(rider)
            raise
        return False

    def _synced_first(self, call: str) -> tuple[bool, BaseException | None]:
        """Collective: the backend's local sync, then the call's head, which agrees on the
        call and on every rank's sync error (sleeping: fsync takes each rank its own
        time); whether any rank failed, and this rank's error.  A rank that synced beside
        another call made its bytes durable early, which changes nothing else; the head's
        mismatch is then handled as any (:meth:`failed`: a ``close`` beside it closes).
        The head carries :meth:`_left_slots` too (their maxima in :attr:`gone`)."""
        step = Attempt()
        be = self.ctx.backend
        with step:
            if not be.clean():  # (every written byte durable already: nothing to run)
                be.sync()
        error = step.error
        # (a mismatch is raised, not this sync's error, which the kernel and the early
        # flush report once: kept for the next sync to raise, before a close beside this
        # call makes one, in failed())
        keep = None if error is None else functools.partial(be.unsynced, error)
        failed, out = self.head(
            call, failed=error is not None, own=self._left_slots(), patient=True, first=keep
        )
        self.gone = (int(out[0]), int(out[1]))
        return failed, error

    def _synced(self) -> tuple[bool, BaseException | None]:
        """Collective: the backend's sync on every rank, then an agreement on its errors
        (sleeping: fsync takes each rank its own time); whether any rank failed, and
        this rank's error."""
        step = Attempt()
        with step:
            self.ctx.backend.sync()
        return any_flag(self.comm, step.error is not None, patient=True), step.error

    def _finish(self, failed: bool, error: BaseException | None, rider: Rider | None) -> None:
        """Collective: commit (dropped if anything failed or was aborted, or some rank's
        ``with`` block raised: :attr:`gone`, agreed), then release.  Where only some
        ranks' blocks raised, every rank raises the same error naming them."""
        ctx = self.ctx
        some, every = self.gone[0] == 1, self.gone[1] == -1
        try:
            if some:
                self.abort()
            ctx.backend.commit(ctx.comm, not (failed or ctx.aborted))
            if failed:
                raise_agreed(ctx.comm, error, what="close")
            if some and not every:
                raise_agreed(ctx.comm, self._left_error(), what="close, nothing committed")
        finally:
            self.release(rider)

    def _left_error(self) -> CommitError | None:
        """This rank's part of the error that tells every rank which ``with`` blocks raised."""
        if self.left is None:
            return None
        return CommitError(f"its with block raised {self.left}", errno=errno.ECANCELED)

    def _close_after(self, exc: MismatchError, rider: Rider | None) -> None:
        """Collective: close as :meth:`close` does after a call mismatch with a ``close``
        (every rank is in this close now), the commit dropped, so what earlier calls
        wrote is as durable as after a normal close.  Every rank still raises ``exc``;
        a failure of this close (agreed) goes into ``exc.close_error``."""
        self.abort()
        try:
            if rider is not None:  # (its agreement; a plain close has nothing more to agree)
                error, own = rider.prepare()
                failed, out = call_head(self.comm, "close", self.ctx.file, error is not None, own)
                rider.settle("close", failed, error, out)
            self._finish(*self._synced(), rider)
        except Exception as later:  # exc is the error every rank raises
            exc.close_error = later
        finally:
            self.release(rider)


def _brief(value: Any) -> Any:
    """An open's compared arguments as a message shows them: hints as the ones given
    other values than the defaults (their full form, every hint, twice per rank, made
    a mismatch's message pages long)."""
    if not isinstance(value, tuple):
        return value
    base = DEFAULT_HINTS.as_dict()
    return tuple(
        {k: v for k, v in x.as_dict().items() if base.get(k, v) != v or k not in base}
        if isinstance(x, Hints) else x
        for x in value
    )  # fmt: skip


def _local_sync(be: Backend) -> bool:
    """Whether ``be``'s sync runs before the head (:meth:`FileCore._synced_first`): it says
    its sync is local and keeps an error that no call reported (``unsynced``); one that
    says the first without the second agrees first, as every other backend does, rather
    than lose that error or raise on one rank what the others do not."""
    return be.local_sync and type(be).unsynced is not Backend.unsynced


def _context(priv: Private, be: Backend, hints: Hints, mode: str, file: tuple[int, str]) -> Context:
    """The file's engine context: aggregators (the backend's own for reads, when it has
    them and the hints choose none) and the statistics' record of what was used."""
    aggs = priv.choose(hints.cb_nodes, hints.per_node(), hints.striping_factor)
    be.aggregators = aggs
    stats = Stats(aggregators=tuple(aggs.tolist()))
    stats.hints = _used_hints(hints, aggs)
    local = local_aggregators(priv.nodes, hints, stats.hints, priv.node_shape())
    read_aggs = None
    if be.read_per_node is not None and hints.cb_nodes is None and not hints.cb_config_list:
        read_aggs = priv.choose(None, be.read_per_node)
        stats.hints["read_aggregator_ranks"] = read_aggs.tolist()
    stats.backend = be.describe()
    # O_DIRECT where the backend uses it (agreed at its open; never in 'r')
    stats.hints["direct_write"] = hints.direct_write and bool(
        stats.backend.get("direct_write", False)
    )
    ctx = Context(priv.comm, be, hints, aggs, stats, mode, priv.plans, read_aggs, file)
    ctx.local, ctx.nodes = local
    return ctx


def _used_hints(hints: Hints, aggs: I64) -> dict[str, Any]:
    used = hints.as_dict()
    used["cb_nodes"] = len(aggs)
    used["cb_config_list"] = hints.cb_config_list or "*:*"
    used["aggregator_ranks"] = aggs.tolist()
    return used
