"""What a collective call does, decided from agreed facts: the one place for each choice.

The engine agrees on :class:`PathFacts` in a call's first allreduce and asks
:func:`choose_path`, :func:`round_window` and the rules below; the simulator
computes the same facts for its virtual ranks with numpy and asks the same
functions, so the two cannot drift apart.  Pure: no MPI, no files.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from .aggregators.domains import alignment, window_size
from .facts import Facts, How, fact, record
from .hints import Hints
from .runs import Runs

__all__ = [
    "DEPTH",
    "CHECKED_MAX_RUNS",
    "CHECKED_MIN_RUN",
    "DIRECT_MAX_RUNS",
    "FEW",
    "MAX_LENGTHS",
    "MAX_WINDOW",
    "Path",
    "PathFacts",
    "choose_path",
    "copyable",
    "copyable_lengths",
    "domain_alignment",
    "extents_disjoint",
    "checked_runs",
    "few_large_runs",
    "has_many_small_runs",
    "many_small_runs",
    "maps_file",
    "may_map",
    "round_window",
    "two_level",
    "whole_tail",
]

I64 = npt.NDArray[np.int64]

#: A rank with at most this many runs may skip the shuffle whatever their size.
DIRECT_MAX_RUNS = 16
#: A rank with at most this many runs, each at least :data:`CHECKED_MIN_RUN` long, lets
#: the ranks compare every run (one allgather of the pairs) when their extents interleave:
#: a batch of many arrays puts item k of every rank before item k+1, so the extents of
#: all ranks span the file while their runs do not meet, and each rank writing its own
#: runs costs one request per run instead of copying every byte twice.
CHECKED_MAX_RUNS = 4096
#: ... and the shortest run (bytes) for that: ROMIO's one ``Write_at_all`` per array, each
#: rank writing its own 64 KiB, beats the shuffle of the same runs in one call.  A constant,
#: not ``cb_min_message``: that hint sizes two-level messages (0 there means any size).
CHECKED_MIN_RUN = 64 << 10
#: Largest round window (bytes), whatever ``cb_buffer_size`` asks for.
MAX_WINDOW = 1 << 30
#: Round buffers per aggregator: the I/O of round k overlaps the exchange of round k+1.
DEPTH = 2
#: Runs this few are copied from a mapped file one by one (as the direct path's preads).
FEW = 16
#: Most distinct run lengths a mapped read copies group by group; more keep the shuffle.
MAX_LENGTHS = 8
#: With ``cb_two_level=automatic``, jobs of more ranks than this on several nodes aggregate
#: in two levels: beyond it the messages every aggregator takes from every rank in every
#: round cost more than one more copy on each node (the cost model's comparison,
#: docs/design.md).
TWO_LEVEL_RANKS = 256
#: Default local aggregators per node: one per this many ranks of the fullest node ...
RANKS_PER_LOCAL = 16
#: ... while the job's local aggregators (each aggregator's sources) stay at most this many.
MAX_SOURCES = 256
#: A domain's last round moving less than 1/TAIL_SHARE of a window is spread over the
#: others (:func:`whole_tail`), in windows of whole TAIL_UNIT bytes (page-friendly).
TAIL_SHARE = 2
TAIL_UNIT = 1 << 16
#: Most rounds ``min_rounds`` asks of a two-level read per domain: each of its rounds
#: ends with every rank of a group waiting for the group's whole round to arrive before
#: it copies its pieces out (a write's ranks fill slots rounds ahead instead), a
#: node-wide wait per round that larger rounds pay fewer times.  Its staging grows with
#: its rounds' size (:data:`~collio.aggregators.stage.MIN_SLOTS` of them at least), a
#: window still at most ``cb_buffer_size``.
TWO_LEVEL_READ_ROUNDS = 2


class Path(enum.Enum):
    """The way a call moves its bytes (``stats.last_call["path"]``)."""

    #: No rank has a byte to move.
    NONE = "none"
    #: Each rank does its own I/O, no shuffle (disjoint extents and large runs, or
    #: every run one the backend lets its rank keep).
    DIRECT = "direct"
    #: A read: each rank copies its own runs out of the mapped file.
    MAPPED = "mapped"
    #: Each rank does the runs the backend lets it keep, the rest go two-phase.
    OWN = "own pieces"
    #: Every byte goes through the aggregators.
    TWO_PHASE = "two-phase"

    #: No byte goes through an aggregator (a plain attribute of each member: read in
    #: every call, where an enum property costs as much as a small step of the call).
    direct: bool


for _path in Path:
    _path.direct = _path.value in ("direct", "mapped")
del _path


@record
class PathFacts(Facts):
    """What every rank contributes to the choice of path (agreed with ``MAX``)."""

    lo: int = fact(How.MIN)  # first byte any rank touches (an empty rank: a huge value)
    hi: int = fact(How.MAX)  # end of the last byte any rank touches (an empty rank: 0)
    small: bool = fact(How.ANY)  # some rank has many small runs (many_small_runs)
    mapped: bool = fact(How.ALL)  # every rank would copy its runs from the mapped file
    # the most runs of any rank when every rank's are few and large (checked_runs), else
    # above CHECKED_MAX_RUNS: the ranks may compare their runs, in blocks of that many
    checked: int = fact(How.MAX)


def many_small_runs(nruns: Any, nbytes: Any, direct_threshold: int) -> Any:
    """Whether a rank's runs are too many and too small to skip the shuffle.

    Works on ints or, elementwise, on arrays (one entry per rank).
    """
    return (nruns > DIRECT_MAX_RUNS) & (nbytes < nruns * direct_threshold)


#: The mean run (bytes) from which a rank's joined runs count as their file ranges
#: (:func:`has_many_small_runs`): runs of a few KiB back to back go faster direct than
#: shuffled, runs of tens of bytes slower.
JOINED_MIN_RUN = 1024


def has_many_small_runs(runs: Runs, direct_threshold: int, *, joined: bool = False) -> bool:
    """:func:`many_small_runs` of one rank's runs (their bytes summed only if needed).

    ``joined``: the rank would write runs that follow each other in the file with one
    request (:meth:`~collio.backends.base.Backend.joins_runs`), so what counts is the
    number of ranges they cover: a batch of a rank's arrays one after another in its
    own part of the file is one ``pwritev``, the bytes' own cost, not many small runs
    (the shuffle would copy every byte to an aggregator first).  Only where the runs
    average :data:`JOINED_MIN_RUN` bytes or more: the direct write still handles each
    run in Python, which costs more than the shuffle's numpy work for runs of tens of
    bytes (``test_tiny_items_back_to_back_keep_the_shuffle``)."""
    n = len(runs.length)
    if n <= DIRECT_MAX_RUNS or not many_small_runs(n, runs.nbytes, direct_threshold):
        return False
    if not joined or runs.nbytes < n * JOINED_MIN_RUN:
        return True
    f, length = runs.file, runs.length  # (sorted by file offset)
    return int(np.count_nonzero(f[1:] != f[:-1] + length[:-1])) + 1 > DIRECT_MAX_RUNS


def few_large_runs(nruns: Any, shortest: Any) -> Any:
    """Whether a rank's ``nruns`` runs (the shortest ``shortest`` bytes) are few and large
    enough to be compared run by run with every other rank's (:data:`CHECKED_MAX_RUNS`,
    :data:`CHECKED_MIN_RUN`).  Ints or, elementwise, arrays (one entry per rank)."""
    return (nruns == 0) | ((nruns <= CHECKED_MAX_RUNS) & (shortest >= CHECKED_MIN_RUN))


def checked_runs(nruns: Any, shortest: Any) -> Any:
    """A rank's :attr:`PathFacts.checked`: its ``nruns`` when they are few and large
    (:func:`few_large_runs`), else ``CHECKED_MAX_RUNS + 1``, so that the agreed maximum
    says both whether every rank's are and how many the most of them are.  Ints or,
    elementwise, arrays."""
    if type(nruns) is int:  # (every call asks for one rank: np.where costs more than the call)
        return nruns if few_large_runs(nruns, shortest) else CHECKED_MAX_RUNS + 1
    return np.where(few_large_runs(nruns, shortest), nruns, CHECKED_MAX_RUNS + 1)


def may_map(hints: Hints, *, writing: bool) -> bool:
    """Whether a call asks the backend if its ranks would copy from the mapped file."""
    return not writing and hints.romio_cb_read == "automatic"


def maps_file(mapped_reads: str, *, local_fs: bool) -> bool:
    """Whether reads of a file copy from a map: hint ``mapped_reads``, and for
    ``automatic`` whether the file is on a local file system (one page cache)."""
    return mapped_reads == "enable" or (mapped_reads == "automatic" and local_fs)


def copyable(nruns: Any, nlengths: Any) -> Any:
    """Whether a rank's runs (``nruns`` of ``nlengths`` distinct lengths) are copied from a
    map in a few numpy passes.  Ints or, elementwise, arrays."""
    return (nruns <= FEW) | (nlengths <= MAX_LENGTHS)


def copyable_lengths(lengths: I64) -> bool:
    """:func:`copyable` for one rank's run lengths (counting distinct ones only if needed)."""
    n = len(lengths)
    if n <= FEW or bool((lengths == lengths[0]).all()):
        return True
    return bool(copyable(n, len(np.unique(lengths))))


def extents_disjoint(lo: I64, hi: I64) -> bool:
    """Whether no two ranks' extents ``[lo[r], hi[r])`` interleave (empty ones ignored)."""
    have = hi > lo
    order = np.argsort(lo[have], kind="stable")
    a, b = lo[have][order], hi[have][order]
    return bool((a[1:] >= b[:-1]).all())


def choose_path(
    facts: PathFacts,
    *,
    mode: str,
    independent: bool,
    disjoint: Callable[[], bool],
    split: Callable[[], bool | None],
    runs_disjoint: Callable[[], bool],
    vouched: bool = False,
) -> Path:
    """The path of a call from its agreed ``facts``.

    ``mode`` is the hint ``romio_cb_write`` (or ``romio_cb_read``); ``independent``
    whether the backend lets each rank write its own runs.  The two questions that cost
    communication are asked only when the answer matters: ``disjoint()`` whether no two
    ranks' extents interleave (:func:`extents_disjoint`), ``split()`` the backend's own
    runs (None: no rank keeps any; else whether every rank keeps all of its runs).
    ``vouched``: every rank's caller said that no two ranks' runs overlap and that its
    runs are few and large (a checkpoint's row shards): direct, unless the hint forces
    the shuffle.  ``runs_disjoint()``: whether no two ranks' runs overlap, asked only
    when every rank's runs are few and large (``facts.checked``, :func:`checked_runs`)
    and the extents did not already decide (they interleave, or the runs are many):
    then each rank does its own I/O too.
    """
    if facts.hi <= facts.lo:
        return Path.NONE
    if independent:
        if facts.mapped:
            return Path.MAPPED
        if vouched and mode != "enable":
            return Path.DIRECT
        if mode == "enable":
            return Path.TWO_PHASE
        if (mode == "disable" or not facts.small) and disjoint():
            return Path.DIRECT
        if facts.checked <= CHECKED_MAX_RUNS and runs_disjoint():
            return Path.DIRECT
        return Path.TWO_PHASE
    if mode == "enable":
        return Path.TWO_PHASE
    kept = split()
    if kept is None:
        return Path.TWO_PHASE
    return Path.DIRECT if kept else Path.OWN


def domain_alignment(backend_alignment: int, hints: Hints) -> int:
    """The unit file domains are cut at: the backend's and ``striping_unit``'s."""
    return alignment(backend_alignment, hints.striping_unit)


def round_window(
    hints: Hints, bounds: I64, *, align: int, nranks: int, floor: int, sources: int = 0,
    writing: bool = True,
) -> int:  # fmt: skip
    """Bytes per round for file domains ``bounds`` (see
    :func:`~collio.aggregators.window_size`), capped at :data:`MAX_WINDOW`; ``floor`` is
    the backend's smallest round (``Backend.min_window``).

    ``sources`` > 0: a two-level call whose aggregators hear from that many local
    aggregators; its window is at least ``sources`` x ``cb_min_message``, above
    ``cb_buffer_size`` if need be, so that a layout in which every node has bytes in
    every window still sends large inter-node messages; a read's (not ``writing``) takes
    at most :data:`TWO_LEVEL_READ_ROUNDS` rounds per domain.  A short last round is
    spread over the others (:func:`whole_tail`).
    """
    # (not np.diff: every call of a time series asks, and its wrapper costs more)
    largest = int(np.maximum.reduce(bounds[1:] - bounds[:-1])) if len(bounds) > 1 else 0
    cap = min(hints.cb_buffer_size, MAX_WINDOW)
    rounds = hints.min_rounds
    if sources > 0:
        cap = max(cap, min(MAX_WINDOW, sources * hints.cb_min_message))
        nranks = sources
        if not writing:
            rounds = min(rounds, TWO_LEVEL_READ_ROUNDS)
    return whole_tail(window_size(cap, align, largest, rounds, nranks, floor), largest, cap, align)


def whole_tail(window: int, largest: int, cap: int, align: int) -> int:
    """``window``, or a wider one (at most ``cap``; whole units of ``align``, each unit
    at least :data:`TAIL_UNIT`) that takes the largest domain in fewer rounds, when its
    last round would move less than 1/:data:`TAIL_SHARE` of a window.

    A round's fixed cost (every rank's messages to its aggregator, the aggregator's
    request) is the same for a few bytes as for a window's, and a short last round
    has no I/O of its own to overlap: a batch of small arrays whose domains are a
    little over the smallest window paid two rounds' messages for one round's bytes.
    """
    nwin = -(-largest // window)
    if nwin < 2 or (largest - (nwin - 1) * window) * TAIL_SHARE >= window:
        return window
    unit = align if align >= TAIL_UNIT else align * -(-TAIL_UNIT // align)
    wider = -(-largest // (nwin - 1))
    wider = -(-wider // unit) * unit
    return wider if wider <= cap else window


def two_level(hints: Hints, *, nranks: int, nnodes: int, fullest: int) -> int:
    """Local aggregators per node for a file's two-level calls (0: one level).

    ``nnodes`` nodes, the fullest with ``fullest`` ranks.  Two levels need several
    nodes with several ranks on one; ``cb_two_level=automatic`` asks for more than
    :data:`TWO_LEVEL_RANKS` ranks too.  The count is ``cb_local_aggregators`` (at most
    ``fullest``), else one per :data:`RANKS_PER_LOCAL` ranks of the fullest node while
    the job has at most :data:`MAX_SOURCES` local aggregators (at least one per node).
    """
    mode = hints.cb_two_level
    if mode == "disable" or nnodes < 2 or fullest < 2:
        return 0
    if mode == "automatic" and nranks <= TWO_LEVEL_RANKS:
        return 0
    if hints.cb_local_aggregators is not None:
        return min(hints.cb_local_aggregators, fullest)
    return max(1, min(fullest // RANKS_PER_LOCAL, MAX_SOURCES // nnodes))
