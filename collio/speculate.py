"""A repeated small call with one agreement: each rank does its I/O first, then the head agrees.

A call that every rank does by itself (the direct and mapped paths) costs two agreements,
its head and its completion, and on a small call they are most of its time.  When a call
repeats a call of its kind that this rank kept on the file (its last, or one period back
when the calls alternate variables: :class:`KeptCalls`; the same facts of its runs, its
extent moved by the shift on which every rank agreed then; a batch's read repeats a batch,
kept apart in ``Context.kept_many``), the head can only choose the same path.  So the
rank guesses: it does its I/O, then the head agrees on the call, its errors and whether
every rank guessed:

- every rank guessed and did its I/O: the call is done.  Its requests are the last call's
  (the same run lengths), so the statistics' sums are that call's again, and the head
  carries the times;
- some rank did not guess: the head's facts choose the path as in any call; a rank that
  wrote takes its write back unless that path is the direct one, whose I/O it has done;
- any rank failed (its checks, its I/O, a call other than this one): every rank that
  wrote takes its write back, then every rank raises the agreed error, as before.

A write is taken back from what the backend kept before it (:meth:`Backend.keep_before`:
the bytes the runs cover and the target's size; a time series' next step past the end
keeps nothing).  The ranks that guessed moved alike from extents every rank found
disjoint, so their writes are disjoint and the take-backs need no order; the target's
size before the call is the smallest size any of them found before writing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from .backends.base import Backend
from .backends.failures import storage_errors
from .collective import Attempt
from .context import Call, Context
from .errors import MismatchError
from .facts import NOT_COMPARED
from .hints import Hints
from .layouts.arrays import Subarray
from .policy import Path
from .stats import Again, Stats

__all__ = [
    "BIG",
    "Guess",
    "Kept",
    "KeptCalls",
    "candidate",
    "after_mismatch",
    "attempt",
    "complete",
    "note_layout",
    "note_view",
    "remember",
    "settle",
    "take_back",
    "times",
]

I64 = npt.NDArray[np.int64]
#: A size above every real one (what a rank that did not write contributes to the MIN).
BIG = 2**62
#: The digests' range (collio.checkfacts.placed)
_PLACED = (1 << 62) - 1
#: Most bytes a write keeps to take back: beyond it the second agreement costs less than
#: reading the old bytes first (a time series' next step past the end keeps none).
KEEP_LIMIT = 1 << 20
#: Calls of each kind kept for a repeat: a solver alternating up to this many variables
#: (layouts) repeats each one's last call.
KEPT_CALLS = 8
#: Most runs of a batch kept for a repeat (each kept call holds its run lengths until
#: the file closes; a batch of more repeats with two agreements).
KEPT_BATCH_RUNS = 1 << 16


@dataclasses.dataclass(slots=True, eq=False)
class Kept:
    """This rank's last call of one kind (write or read) on a file that every rank did by
    itself: what a repeat must match, and what it then reports."""

    hints: Hints  # (by identity: set_info makes new ones)
    backend: Backend
    facts: tuple[Any, ...]  # this rank's facts of that call (engine._Checked's own)
    shift: int  # the shift every rank agreed on then (zigzag; NOT_COMPARED: none)
    path: Path
    lengths: I64  # its run lengths
    key: tuple[Any, ...]  # its requests and backend counters (equal: equal sums)
    sums: Again  # the call's sums, as the completion agreed them
    last: tuple[Any, ...]  # the call's Stats.last_facts
    # a call through a file view: the view and the buffer's bytes (collio.check.again);
    # through a dense view, the file offset of its stream's first byte, and the head of
    # a repeat (collio.collective.KeptHead) before its own facts are patched in
    # (collio.quick)
    view: Any = None
    nbytes: int = 0
    at: int | None = None
    head: Any = None
    # its extent's width (the lane's calls move it whole)
    span: int = 0
    # a call through a Subarray: its fields but the offset (collio.quick), where its
    # first run starts less the layout's offset, and its runs when there are several
    box: tuple[Any, ...] | None = None
    base: int = 0
    runs: Any = None
    # the call's number among the completed calls of its kind (KeptCalls.serial), and
    # its key (:func:`call_key`)
    serial: int = -1
    ident: tuple[int, int] = (NOT_COMPARED, NOT_COMPARED)
    # a repeat of this one-run call in a few operations, made at its first repeat
    # (collio.quick.Step)
    step: Any = None
    # a write_at_all/read_at_all (Context.call_at): repeated only by a call of its kind,
    # whose head names the same call
    at_call: bool = False
    # a batch's (Context.kept_many): repeated only by a batch
    many: bool = False


@dataclasses.dataclass(slots=True, eq=False)
class KeptCalls:
    """This rank's kept calls of one kind, and which of them the next call may repeat.

    A guessed write is safe to take back only if every rank that guessed moved by the
    same shift from extents that every rank found disjoint: the shift agreed at the
    call it repeats.  So every rank must repeat the same earlier call, chosen without
    communicating: the one ``period`` calls back, the period with which the calls'
    keys (:func:`call_key`, agreed: the same on every rank) repeat (:func:`_period`).  A rank
    that did not keep that call, or whose call does not repeat it, does not guess.
    """

    entries: list[Kept] = dataclasses.field(default_factory=list)
    serial: int = 0  # the calls of this kind completed so far (not batches)
    period: int = 1
    # the keys of the last calls, newest last
    keys: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    # the step (collio.quick.Step) of the call the lane completed last: a series
    # repeats it, and finding it costs no search of ``entries``
    step: Any = None

    def last_step(self) -> Any:
        """The step of the call ``period`` calls back, which this call may repeat (None:
        no such step): the kept call's own rule (:meth:`candidate`), without a search."""
        step = self.step
        return step if step is not None and step.k.serial == self.serial - self.period else None

    def candidate(self) -> Kept | None:
        want = self.serial - self.period
        for k in reversed(self.entries):  # (newest first: the last call, most often)
            if k.serial == want:
                return k
        return None

    def completed(self, key: tuple[int, int], k: Kept | None) -> None:
        """Local: a call of this kind completed (on every rank alike), whose agreed key
        was ``key``; ``k``: what a repeat of it may guess from (None: nothing)."""
        s = self.serial
        self.serial = s + 1
        keys = self.keys
        keys.append(key)
        if len(keys) > KEPT_CALLS + 2:
            del keys[0]
        # (one variable: its key repeats, the period stays 1)
        self.period = 1 if len(keys) > 2 and key == keys[-2] == keys[-3] else _period(keys)
        if k is None:
            return
        new = k.serial < 0
        k.serial, k.ident = s, key
        if new:  # (a repeated call's entry is kept already; one dropped never returns)
            self.entries.append(k)
            if len(self.entries) > KEPT_CALLS:  # (the oldest call goes)
                self.entries.remove(min(self.entries, key=lambda e: e.serial))


def call_key(shift: int, sig: int | None, lo: int) -> tuple[int, int]:
    """Pure: what tells one variable of a series from another, from agreed facts: the
    shift and the global array's digest without where it starts (``sig`` less the
    extent's start, a constant of each variable's layout; NOT_COMPARED: none)."""
    if sig is None or sig < 0:
        return shift, NOT_COMPARED
    return shift, (sig - lo) & _PLACED


def _period(keys: list[tuple[int, int]]) -> int:
    """Pure: the smallest period with which the last two calls' keys repeat (a solver
    alternating A and B: 2), else 1 (one variable, or a series that began anew)."""
    n = len(keys)
    if n >= 3:
        last, before = keys[-1], keys[-2]
        for p in range(1, min(KEPT_CALLS, n - 2) + 1):
            if keys[-1 - p] == last and keys[-2 - p] == before:
                return p
    return 1


def candidate(ctx: Context, writing: bool, many: bool = False) -> Kept | None:
    """Local: the kept call that this call of its kind (``many``: a batch) may repeat
    (:class:`KeptCalls`)."""
    calls: KeptCalls = (ctx.kept_many if many else ctx.kept)[writing]
    k = calls.candidate()
    return k if k is not None and k.at_call is ctx.call_at else None


@dataclasses.dataclass(slots=True, eq=False)
class Guess:
    """What a rank that guessed did: its I/O's result, error and time, and for a write
    what it kept to take it back and the target's size before it."""

    kept: Kept
    writing: bool
    before: Any = None
    size: int = BIG
    key: tuple[Any, ...] = ()
    done: Any = None
    seconds: float = 0.0
    error: BaseException | None = None

    @property
    def wrote(self) -> bool:
        return self.writing and self.before is not None


def attempt(
    ctx: Context, runs: Any, buf: Any, facts: tuple[Any, ...], moved: dict[str, Any], *,
    writing: bool, many: bool = False,
) -> Guess | None:  # fmt: skip
    """Local: when this call (``many``: a batch) repeats the last one of its kind (see the
    module doc), do its I/O now and return what was done (its error kept, not raised);
    else None."""
    k = candidate(ctx, writing, many)
    if k is None or k.facts != facts or k.hints is not ctx.hints or k.backend is not ctx.backend:
        return None
    if not _same_lengths(runs.length, k.lengths):
        return None
    if not (writing is False and k.path is Path.MAPPED):
        # the others guess only if they moved by the same shift from disjoint extents (a
        # rank empty now as then moved by none: it writes nothing that could meet another's)
        ext, shift = ctx.extents, moved["shift"]
        if moved["moved"] or (shift != k.shift and shift != NOT_COMPARED):
            return None
        if ext is None or not ext[2]:
            return None
    g = Guess(k, writing)
    be = ctx.backend
    step = Attempt()
    t = time.perf_counter()
    with step:
        if writing:
            g.before = be.keep_before(runs, KEEP_LIMIT)
            if g.before is None:
                return None
            g.size = g.before.size
        with storage_errors(be):
            g.done = be.write_runs(runs, buf) if writing else be.read_runs(runs, buf)
        g.key = (g.done, *be.take_counts())
    g.seconds = time.perf_counter() - t
    g.error = step.error
    return g


def _same_lengths(a: Any, b: Any) -> bool:
    """Local: whether two calls' run lengths are equal (a new layout per call, as a time
    series makes, has new arrays: a few runs compare as bytes, without array_equal's
    temporaries)."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    return bool(a.tobytes() == b.tobytes()) if len(a) <= 4096 else bool(np.array_equal(a, b))


def take_back(ctx: Context, g: Guess | None, size: int) -> None:
    """Local: undo a guessed write (none: nothing) before the target's ``size`` bytes, as
    the ranks agreed it; an error doing so rides on the call's, which is raised."""
    if g is None or not g.wrote:
        return
    g.before, before = None, g.before
    try:
        ctx.backend.take_back(before, size)
    except Exception as exc:  # pragma: no cover - the disk failed twice
        g.error = g.error or exc


def after_mismatch(ctx: Context, g: Guess | None, exc: MismatchError) -> None:
    """Local: a guessed write met another call: take it back to the smallest size that
    the ranks writing this file found (each rank's ``extra`` of the head)."""
    if g is None or not g.wrote:
        return
    sizes = [s for f, s in exc.extras if f == ctx.file[0] and isinstance(s, int)]
    take_back(ctx, g, min(sizes, default=g.size))


def times(io: float, t0: float) -> tuple[int, int]:
    """The I/O's ``io`` and the call's seconds so far, in nanoseconds (int64 slots)."""
    return int(io * 1e9), int((time.perf_counter() - t0) * 1e9)


#: What :func:`settle` returns for a call complete already (``Call.settled``: the engine
#: reads nothing else of it)
SETTLED = Call(0, 0, Path.DIRECT, Stats(), settled=True)
#: (looked up once: each lookup of an enum member through its class costs a call)
_DIRECT = Path.DIRECT


def settle(ctx: Context, g: Guess, lo: int, hi: int, extent: tuple[int, int], same: bool,
           seconds: tuple[int, int]) -> Call:  # fmt: skip
    """Local: every rank guessed and did its I/O.  With ``same`` (every rank's requests as
    its last call's) the call is complete here (:data:`SETTLED`); else the completion
    reduces its counters as usual."""
    k = g.kept
    if same:
        return complete(ctx, k, lo, hi, extent, seconds, writing=g.writing)
    _keep_extent(ctx, k, extent)
    call = Call(lo, hi, k.path, Stats())
    call.early = g
    return call


def _keep_extent(ctx: Context, k: Kept, extent: tuple[int, int]) -> None:
    """Local: this rank's extent kept for the next call's ``moved`` fact, as
    :func:`collio.choose.choose` keeps it for a direct call (disjoint)."""
    if k.path is _DIRECT:
        ctx.extents = (*extent, True)


def complete(ctx: Context, k: Kept, lo: int, hi: int, extent: tuple[int, int],
             seconds: tuple[int, int], *, writing: bool) -> Call:  # fmt: skip
    """Local: :func:`settle` of a call whose every rank repeated ``k``'s requests: it is
    complete (:data:`SETTLED`), its statistics ``k``'s sums again."""
    _keep_extent(ctx, k, extent)
    if writing:
        ctx.writes += 1
    if k.many:  # (every rank repeated the same call)
        ctx.kept_many[writing].completed(k.ident, k)
    else:
        ctx.kept[writing].completed(k.ident, k)
        ctx.guesses[writing] = k
    stats = ctx.stats
    stats.add_again(k.sums, seconds[0] / 1e9, seconds[1] / 1e9)
    stats.direct_calls += 1
    last = list(k.last)
    last[5], last[-1] = [lo, hi], True  # (the extent, guessed)
    stats.last_facts = tuple(last)
    stats.local = {"domain": -1, "direct": True, "requests": k.lengths}
    return SETTLED


def remember(ctx: Context, call: Call, runs: Any, writing: bool, many: bool = False) -> None:
    """Local: keep this completed call (``many``: a batch) for a repeat to guess from
    (:class:`KeptCalls`; not kept: a repeat of this call is not guessed)."""
    k = _keepable(ctx, call, runs, writing)
    key = call_key(call.shift, call.sig, call.lo)
    if many:  # (the steps that follow a single call, ``guesses``, are not a batch's)
        if k is not None and len(runs) > KEPT_BATCH_RUNS:
            k = None
        if k is not None:
            k.many = True
        ctx.kept_many[writing].completed(key, k)
        return
    ctx.guesses[writing] = k
    ctx.kept[writing].completed(key, k)


def _keepable(ctx: Context, call: Call, runs: Any, writing: bool) -> Kept | None:
    """Local: what a repeat of this completed call may guess from, or None."""
    be, path = ctx.backend, call.path
    if call.facts is None or call.sums is None or call.own is not None or call.two_level:
        return None
    if writing:
        if path is not Path.DIRECT or not call.by_extents or not be.takes_back:
            return None
    elif not (path is Path.MAPPED or (path is Path.DIRECT and call.by_extents)):
        return None
    if not writing and ctx.hints.read_past_eof == "disable":
        return None
    c = call.counters
    key = (call.done, c.direct_io_bytes, c.early_flushes, c.mapped_bytes)
    return Kept(
        ctx.hints, be, call.facts, call.shift, path, runs.length, key, Stats.again(call.sums),
        call.last, at_call=ctx.call_at,
    )  # fmt: skip


def note_view(ctx: Context, fview: Any, nbytes: int, *, writing: bool) -> None:
    """Local: the call just completed (its kind's :class:`Kept`, if any) was ``nbytes``
    through the view ``fview``, so that a repeat may skip its checks
    (:func:`collio.check.again`; on backends that keep runs as the layout gives them)."""
    k = ctx.guesses[writing]
    if k is not None and ctx.backend.takes_back:
        k.view, k.nbytes = fview, nbytes
        ft = fview.filetype
        if ft.dense and nbytes and len(k.lengths) == 1:  # (one run: collio.quick)
            k.at, k.span = fview.disp + int(ft.off[0]), nbytes


def note_layout(ctx: Context, layout: Any, *, writing: bool) -> None:
    """Local: the call just completed (its kind's :class:`Kept`, if any) was one through
    ``layout``; a :class:`~collio.layouts.Subarray` on a backend that keeps the layout's
    runs is kept for a repeat at another offset (:func:`collio.quick.layout_again`)."""
    k = ctx.guesses[writing]
    if k is None or type(layout) is not Subarray:
        return
    be = type(ctx.backend)
    if not ctx.backend.takes_back or be.runs_for is not Backend.runs_for:
        return
    if be.check_layout is not Backend.check_layout:
        return
    runs = layout.runs()
    if not len(runs) or len(runs) != len(k.lengths):
        return
    lo, hi = runs.extent()
    k.nbytes, k.span, k.base = runs.nbytes, hi - lo, lo - layout.offset
    k.box = layout.box
    if len(runs) > 1:  # (the view lane's one run is not this call's)
        k.runs, k.at = runs, None
