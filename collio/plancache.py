"""Plans kept across calls: a checkpoint loop writes the same layout again and again.

Planning a call costs a metadata all-to-all and sorting every piece on the
aggregators: for a block-cyclic layout of 65,536 runs per rank, a large share of
the call.  When every rank repeats a call it made before (same runs,
same file domains and window, same aggregators, same direction), the plan is the
same, so it is kept.  So is a call whose runs are every rank's of an earlier call moved
by one common shift (a time series: the same pattern one step further on), when the
file domains move with them: its plan is the kept one with every file offset moved
(``Plan.shifted``).  A batch's plan also serves a batch of the same file runs from
other arrays (a time series whose steps are new arrays): the aggregators' side of a
plan is in file offsets only, so each rank moves its own pieces to its new buffer
offsets, locally (:func:`_remapped`).  A rank finds its own candidate locally; the
ranks then agree that they all found the entry made by the same earlier collective
call (its epoch), and only then is it used.  The agreement rides in the call's check
allreduce (:meth:`PlanCache.candidate`, :meth:`PlanCache.take`); calls whose runs a
backend splits after the check (zarr's own chunks) agree in a small allreduce of their
own (:meth:`PlanCache.lookup`).  Entries are made by collective calls in the same order
on every rank, so epochs match across ranks.

At most :data:`KEEP` plans are kept per communicator, the least recently used dropped
first (a solver writes and reads several variables per step, a benchmark alternates
layouts: each is a plan of its own), and together they hold at most :data:`MAX_BYTES`
(each plan and the snapshot of its runs) on any rank.  What an entry costs is agreed
(the most of any rank), so every rank keeps and drops the same entries: an entry only
some ranks hold could never be reused.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .runs import Runs, is_read_only

__all__ = ["PlanCache", "clear_all"]

I64 = npt.NDArray[np.int64]
KEEP = 32
_ALL: weakref.WeakSet[PlanCache] = weakref.WeakSet()  # every cache, for clear_all
_ALL_LOCK = threading.Lock()  # (a thread may make a cache while another clears them all)
MAX_BYTES = 32 << 20


@dataclasses.dataclass(slots=True)
class _Entry:
    epoch: int
    key: tuple[Any, ...]
    prekey: tuple[Any, ...]  # what decides the key besides the runs (see PlanCache.candidate)
    bounds: I64
    runs: Runs
    plan: Any
    cost: int  # agreed: the most any rank's entry holds
    source: Runs | None = None  # the caller's runs object when read-only (a layout's)
    nruns: int = 0  # len(runs): most entries a lookup passes differ in it
    # its plan serves the same file runs from other buffer offsets (_remapped)
    remap: bool = False


def _same_runs(a: Runs, b: Runs) -> bool:
    return (
        len(a) == len(b)
        and bool(np.array_equal(a.file, b.file))
        and bool(np.array_equal(a.length, b.length))
        and bool(np.array_equal(a.mem, b.mem))
    )


def _equal(a: I64, b: I64) -> bool:
    """``np.array_equal`` of two run arrays of one length, without its conversions (asked
    on every call of a time series); the same object is equal at once (a moved layout
    shares its lengths and buffer offsets with the runs it was moved from)."""
    return a is b or bool((a == b).all())


def _shift(a: Runs, b: Runs, *, any_mem: bool = False) -> int | None:
    """How far every run of ``b`` lies after (or before) its run of ``a``, the lengths and
    buffer offsets being equal (``any_mem``: whatever the buffer offsets); None when they
    are not such runs (0: the same runs)."""
    n = len(a.length)  # (not len(a): a Python call, and every call of a series asks)
    if n != len(b.length):
        return None
    if not n:
        return 0
    known = b.shift_from(a)  # (both moved from one layout's runs: no comparison)
    if known is not None:
        return known
    d = int(b.file[0]) - int(a.file[0])
    if not (_equal(a.length, b.length) and (any_mem or _equal(a.mem, b.mem))):
        return None
    same = _equal(a.file, b.file) if d == 0 else bool((a.file + d == b.file).all())
    return d if same else None


def _apart(runs: Runs) -> bool:
    """Whether the runs are in file order, each ending before the next starts: then each
    piece of a plan made from them lies in one run, found by its file offset."""
    f, n = runs.file, runs.length
    return len(f) < 2 or bool(np.logical_and.reduce(f[1:] >= f[:-1] + n[:-1]))


def _remappable(plan: Any) -> bool:
    """A one-level plan (its sender pieces and their message shapes are all that a
    rank's buffer offsets decide); a two-level one stages through offsets of its own."""
    return hasattr(plan, "sender") and hasattr(plan, "_sender_shapes")


def _remapped(plan: Any, runs: Runs) -> Any:
    """``plan``, kept for runs at ``runs``' file offsets (moved there if need be), with
    its sender's pieces at ``runs``' buffer offsets: each piece lies in one run
    (:func:`_apart`), as far from its start in the buffer as in the file.  Nothing else
    of a plan depends on where this rank's bytes are in memory (the aggregators' side
    is in file offsets and window positions), so the rest is kept and the message
    shapes are made again."""
    sp = plan.sender
    p = sp.pieces
    if not len(p.file):
        return plan
    start = runs.file
    k = np.searchsorted(start, p.file, side="right") - 1
    mem = runs.mem[k] + (p.file - start[k])
    sender = dataclasses.replace(sp, pieces=Runs(p.file, p.length, mem))
    return dataclasses.replace(plan, sender=sender, _sender_shapes=None)


def _at(entries: list[_Entry], epoch: int) -> _Entry | None:
    """The entry stored at ``epoch`` (one at most: every store advances it), searched
    from the most recently used, where a time series finds it, without a generator."""
    for e in reversed(entries):
        if e.epoch == epoch:
            return e
    return None


def _moved_by(e: _Entry, bounds: I64, shift: int) -> bool:
    """The entry's domains are ``bounds`` less ``shift``, and its plan can be moved."""
    if len(e.bounds) != len(bounds):
        return False
    if not shift:
        return _equal(e.bounds, bounds)
    # (ufunc reductions: no Python call of numpy's wrappers, every call of a time series)
    return hasattr(e.plan, "shifted") and bool(np.logical_and.reduce(e.bounds + shift == bounds))


class PlanCache:
    """Plans of earlier calls on one communicator, reused only when every rank agrees."""

    __slots__ = ("entries", "epoch", "hits", "misses", "key", "__weakref__")

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.epoch = 0  # advanced by every collective store, so equal on every rank
        self.hits = 0
        self.misses = 0
        # the handle of the communicator whose calls use it (None: not known), for
        # clear_all: a call in progress on another thread keeps its plans to its end
        self.key: int | None = None
        with _ALL_LOCK:
            _ALL.add(self)

    def lookup(self, comm: MPI.Comm, key: tuple[Any, ...], bounds: I64, runs: Runs) -> Any:
        """Collective over ``comm``: the plan every rank made in one earlier call, or None."""
        n = len(runs.file)
        found = next(
            (
                e
                for e in reversed(self.entries)
                if e.nruns == n and e.key == key and np.array_equal(e.bounds, bounds)
                and _same_runs(e.runs, runs)
            ),
            None,
        )  # fmt: skip
        mine = found.epoch if found is not None else -1
        vec = np.array([mine, -mine], np.int64)
        out = np.empty_like(vec)
        comm.Allreduce([vec, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX)
        if found is not None and out[0] == -out[1] == mine:
            self.hits += 1
            self.entries.remove(found)
            self.entries.append(found)  # most recently used last
            return found.plan
        self.misses += 1
        return None

    def candidate(self, prekey: tuple[Any, ...], runs: Runs) -> tuple[int, int]:
        """Local: the epoch of this rank's latest plan made with ``prekey`` and these runs,
        or of runs that were these less a common ``shift`` (a time series: each call
        the same pattern further on); ``(epoch, shift)``, ``(-1, 0)`` for none.

        ``prekey`` holds what the plan's key depends on besides the global extent
        (direction, aggregators, hints, the backend's units); with the same runs on
        every rank the extent is the same too, shifted alike if every rank's runs are.
        The ranks agree on the epoch and the shift inside the call's check allreduce (no
        allreduce of its own); then :meth:`take` confirms it against the call's domains
        and window.  An empty rank's shift is 0: it has nothing to compare.
        """
        n = len(runs.file)
        for e in reversed(self.entries):
            if e.nruns != n or e.prekey != prekey:
                continue
            if e.source is runs:
                return e.epoch, 0
            d = _shift(e.runs, runs)
            if d is not None:
                return e.epoch, d
        # (the same file runs from other arrays: a batch of new arrays each step, its
        # plan :func:`_remapped` to them in take)
        for e in reversed(self.entries):
            if e.remap and e.nruns == n and e.prekey == prekey:
                d = _shift(e.runs, runs, any_mem=True)
                if d is not None:
                    return e.epoch, d
        return -1, 0

    def peek(self, epoch: int) -> Any:
        """Local: the plan stored at ``epoch``, or None (nothing is counted or reordered)."""
        found = _at(self.entries, epoch)
        return None if found is None else found.plan

    def take(
        self, epoch: int, key: tuple[Any, ...], bounds: I64, shift: int = 0,
        runs: Runs | None = None,
    ) -> Any:  # fmt: skip
        """Local: the plan stored at ``epoch`` (agreed by every rank) if it was made with the
        same ``key`` and ``bounds`` (less the agreed ``shift`` of every rank's runs), else
        None; with a shift, that plan moved by it (``plan.shifted``: a plan kind without
        it is not reused).  Entries of one epoch are equal on every rank and
        ``key``/``bounds``/``shift`` come from agreed values, so the answer is too.

        A shift keeps every domain, window and round: the domains are the entry's moved
        by ``shift`` (checked), and windows, pieces and messages are placed relative to
        them, so the plan made anew would be the kept one with every file offset moved.
        ``runs`` (this rank's, as :meth:`candidate` found them) at other buffer offsets
        than the entry's: the plan with its pieces at theirs (:func:`_remapped`, a local
        change: the agreed plan is the same).
        """
        found = _at(self.entries, epoch)
        if found is None or found.key != key or not _moved_by(found, bounds, shift):
            self.misses += 1
            return None
        self.hits += 1
        self.entries.remove(found)
        self.entries.append(found)  # most recently used last
        plan = found.plan.shifted(shift) if shift else found.plan
        if (
            found.remap
            and runs is not None
            and runs is not found.source
            and len(runs.mem)
            and not _equal(runs.mem, found.runs.mem)
        ):
            plan = _remapped(plan, runs)
        return plan

    @property
    def max_bytes(self) -> int:
        """The most the kept entries may hold together: plans and snapshots of runs."""
        return MAX_BYTES

    def store(
        self,
        key: tuple[Any, ...],
        bounds: I64,
        runs: Runs,
        plan: Any,
        prekey: tuple[Any, ...] = (),
        *,
        cost: int | None,
        remap: bool = False,
    ) -> None:
        """Collective in effect: every rank stores after the same planning call.

        ``cost`` must be agreed: the most any rank's entry holds (its plan and the
        snapshot of its runs), None when some rank's would exceed :attr:`max_bytes` (an
        entry only some ranks hold can never be reused).  Entries are dropped least
        recently used first while more than :data:`KEEP` are kept or their costs
        exceed :attr:`max_bytes`: the same ones on every rank.  An older entry for the
        same runs is replaced (a repeated call that could not reuse it plans again).
        ``remap``: a batch's plan, which a batch of the same file runs from other arrays
        may take (:func:`_remapped`); a single call's layout places its bytes in its
        buffer alike at every offset, and its kept lane knows its entry as it is.
        """
        self.epoch += 1
        if cost is None:
            return
        n = len(runs.file)
        self.entries = [
            e for e in self.entries
            if not (e.nruns == n and e.prekey == prekey and _same_runs(e.runs, runs))
        ]  # fmt: skip
        if is_read_only(runs):  # a layout's own runs: kept as they are, found by identity
            kept, source = runs, runs
        else:
            kept, source = Runs(runs.file.copy(), runs.length.copy(), runs.mem.copy()), None
        entry = _Entry(
            self.epoch, key, prekey, bounds.copy(), kept, plan, cost, source, len(kept.file),
            remap and _remappable(plan) and _apart(kept),
        )  # fmt: skip
        self.entries.append(entry)
        total = sum(e.cost for e in self.entries)
        drop = 0
        while len(self.entries) - drop > KEEP or total > self.max_bytes:
            total -= self.entries[drop].cost
            drop += 1
        del self.entries[:drop]

    def clear(self) -> None:
        self.entries.clear()


def clear_all() -> None:
    """Local: drop every kept plan of this process (the next calls plan again).

    Safe on some ranks only: a plan is reused only when every rank still holds it,
    which the ranks agree on at a call's start.  So a cache whose communicator is in a
    call on another thread is cleared when that call ends (:func:`collio.comms.clear`):
    cleared under it, the call would find its agreed plan gone on this rank only and
    plan anew while the other ranks go on with it.
    """
    from .comms import clear  # (comms builds on this module)

    with _ALL_LOCK:
        caches = list(_ALL)
    for cache in caches:
        clear(cache)
