"""I/O statistics in Darshan's vocabulary, reduced over ranks."""

from __future__ import annotations

import bisect
import dataclasses
import operator
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Again", "Stats", "BUCKETS", "MAXES", "SUMS", "histogram", "print_at_close"]

#: Darshan's access-size buckets: inclusive upper bounds in bytes, as darshan-core counts them.
BUCKETS = (100, 1 << 10, 10 << 10, 100 << 10, 1 << 20, 4 << 20, 10 << 20, 100 << 20, 1 << 30)
BUCKET_NAMES = (
    "0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M", "1M_4M", "4M_10M", "10M_100M",
    "100M_1G", "1G_PLUS",
)  # fmt: skip

# counters summed over ranks (order is the wire format of the reduction)
SUMS = (
    "bytes_written",
    "bytes_read",
    "write_ops",
    "read_ops",
    "messages",
    "exchanged_bytes",
    "direct_calls",
    "collective_calls",
    "direct_io_bytes",
    "early_flushes",
    "mapped_bytes",
    "runs",
)
#: The per-call figures the ranks agree on by their maximum, in the order of
#: :meth:`Stats.pack`'s second list (and of a completion's maxima).
MAXES = ("rounds", "time_plan", "time_exchange", "time_io", "time_total")
# (one C call reads them all: packing and absorbing come once per call, small calls too)
_get_sums = operator.attrgetter(*SUMS)
_get_maxes = operator.attrgetter(*MAXES)


#: The keys of ``Stats.last_call``, in the order of ``Stats.last_facts``.
_LAST_KEYS = (
    "items", "runs", "direct", "path", "rounds", "extent", "plan_reused", "window", "nodes",
    "two_level", "aggregators", "guessed",
)  # fmt: skip

_BUCKET_BOUNDS = np.asarray(BUCKETS, np.int64)
#: A histogram with nothing counted (copied: every call's counters start from it)
_NO_SIZES = np.zeros(len(BUCKET_NAMES), np.int64)
_NO_SIZES.flags.writeable = False
#: Up to this many sizes are counted one by one (a small call's one or few requests:
#: cheaper than numpy's passes).
_FEW = 4


def _count(buckets: npt.NDArray[np.int64], sizes: list[int]) -> None:
    """Add a few request sizes to Darshan bucket counts, one by one."""
    for size in sizes:
        buckets[bisect.bisect_left(BUCKETS, size)] += 1


def _tally(sizes: npt.ArrayLike, buckets: npt.NDArray[np.int64]) -> tuple[int, int]:
    """Add request ``sizes`` to ``buckets`` in place; their count and bytes (a small
    call's few requests without numpy's passes)."""
    s = np.asarray(sizes, np.int64)
    if s.ndim == 1 and len(s) <= _FEW:
        few = s.tolist()
        _count(buckets, few)
        return len(few), sum(few)
    buckets += histogram(s)
    return len(s), int(s.sum())


def histogram(sizes: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Counts of request sizes per Darshan bucket."""
    s = np.asarray(sizes, np.int64)
    if s.ndim == 1 and len(s) <= _FEW:
        out = np.zeros(len(BUCKET_NAMES), np.int64)
        _count(out, s.tolist())
        return out
    idx = np.searchsorted(_BUCKET_BOUNDS, s, side="left")
    return np.bincount(idx, minlength=len(BUCKET_NAMES)).astype(np.int64)


@dataclasses.dataclass(frozen=True, slots=True)
class Again:
    """A call's reduced sums, kept to add again (:meth:`Stats.add_again`): the counters
    it moved, by name, and its request-size histograms (None: all zero); ``add(stats)``
    adds those counters (:func:`_adder`)."""

    moved: tuple[tuple[str, int], ...]
    write_sizes: npt.NDArray[np.int64] | None
    read_sizes: npt.NDArray[np.int64] | None
    add: Callable[[Any], None] = dataclasses.field(repr=False)


#: The functions :func:`_adder` made, by the counters' names and values; added and
#: dropped under :data:`_ADDERS_LOCK` (two threads' calls may both drop the oldest)
_ADDERS: dict[tuple[tuple[str, int], ...], Callable[[Any], None]] = {}
_ADDERS_LOCK = threading.Lock()


def _adder(moved: tuple[tuple[str, int], ...]) -> Callable[[Any], None]:
    """A function ``add(stats)`` adding each ``(name, value)`` of ``moved`` to ``stats``:
    one line per counter, where a loop of getattr and setattr costs a repeated small
    call as much as its agreement (made once per distinct sums: a series repeats them)."""
    add = _ADDERS.get(moved)
    if add is None:
        lines = "".join(f"    s.{name} += {int(a)}\n" for name, a in moved) or "    pass\n"
        env: dict[str, Any] = {}
        exec(compile("def add(s):\n" + lines, "<Again.add>", "exec"), env)  # noqa: S102
        add = env["add"]
        with _ADDERS_LOCK:
            _ADDERS[moved] = add
            if len(_ADDERS) > 256:  # (bounded: sums that never repeat make new ones)
                del _ADDERS[next(iter(_ADDERS))]
    return add


@dataclasses.dataclass(slots=True)
class Stats:
    """One file's statistics; after each collective call they are reduced over ranks.

    Counters are sums over ranks, times the slowest rank's, ``rounds`` the most
    any call needed.  ``hints`` holds the values actually used.
    """

    bytes_written: int = 0
    bytes_read: int = 0
    write_ops: int = 0
    read_ops: int = 0
    messages: int = 0
    exchanged_bytes: int = 0
    direct_calls: int = 0
    collective_calls: int = 0
    #: Bytes written around the page cache (hint ``direct_write``), summed over ranks.
    direct_io_bytes: int = 0
    #: ``fdatasync`` calls started while writing (hint ``early_flush``), summed over ranks.
    early_flushes: int = 0
    #: Bytes read by copying from the mapped file (hint ``mapped_reads``), summed over ranks.
    mapped_bytes: int = 0
    #: Byte runs of the calls (after merging neighbours), summed over ranks.
    runs: int = 0
    rounds: int = 0
    time_plan: float = 0.0
    time_exchange: float = 0.0
    time_io: float = 0.0
    time_total: float = 0.0
    #: The request-size histograms (:attr:`write_sizes`, :attr:`read_sizes`) but for the
    #: ``_again_n`` repeats of ``_again`` added since (made whole when read)
    _write_sizes: npt.NDArray[np.int64] = dataclasses.field(
        default_factory=_NO_SIZES.copy, repr=False
    )
    _read_sizes: npt.NDArray[np.int64] = dataclasses.field(
        default_factory=_NO_SIZES.copy, repr=False
    )
    aggregators: tuple[int, ...] = ()
    hints: dict[str, Any] = dataclasses.field(default_factory=dict)
    backend: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The last call's facts in the order of ``_LAST_KEYS``, as the completion left them
    #: (made into the dict :attr:`last_call` only when read: most programs never read it,
    #: and a small call would spend as much on the dict as on a step of its own)
    last_facts: tuple[Any, ...] | None = dataclasses.field(default=None, repr=False)
    _last_call: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    _local: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    #: How to make :attr:`local` when it is read (a function and its arguments), or None
    _local_of: tuple[Any, ...] | None = dataclasses.field(default=None, repr=False)
    _again: Again | None = dataclasses.field(default=None, repr=False)
    _again_n: int = dataclasses.field(default=0, repr=False)

    @property
    def write_sizes(self) -> npt.NDArray[np.int64]:
        """Requests written per size bucket (:data:`BUCKET_NAMES`), summed over ranks."""
        if self._again_n:
            self._merge_again()
        return self._write_sizes

    @write_sizes.setter
    def write_sizes(self, value: npt.NDArray[np.int64]) -> None:
        if self._again_n:
            self._merge_again()
        self._write_sizes = value

    @property
    def read_sizes(self) -> npt.NDArray[np.int64]:
        """Requests read per size bucket (:data:`BUCKET_NAMES`), summed over ranks."""
        if self._again_n:
            self._merge_again()
        return self._read_sizes

    @read_sizes.setter
    def read_sizes(self, value: npt.NDArray[np.int64]) -> None:
        if self._again_n:
            self._merge_again()
        self._read_sizes = value

    def __getstate__(self) -> list[Any]:
        """Pickled with the histograms whole (the counted repeats' sums hold a function
        made at run time, which pickle cannot name)."""
        if self._again_n:
            self._merge_again()
        return [None if f.name == "_again" else getattr(self, f.name) for f in _FIELDS]

    def __setstate__(self, state: list[Any]) -> None:
        for f, value in zip(_FIELDS, state, strict=True):
            object.__setattr__(self, f.name, value)

    def _merge_again(self) -> None:
        """Add the repeats of ``_again`` counted since into the histograms (new arrays,
        as :meth:`absorb` makes: a caller may hold the totals of before)."""
        again, n = self._again, self._again_n
        self._again_n = 0
        assert again is not None
        if again.write_sizes is not None:
            self._write_sizes = self._write_sizes + n * again.write_sizes
        if again.read_sizes is not None:
            self._read_sizes = self._read_sizes + n * again.read_sizes

    @property
    def local(self) -> dict[str, Any]:
        """This rank's own figures of the last call, not reduced (so not in ``as_dict``,
        which is the same on every rank): its file domain (-1 if it does not
        aggregate), bytes, rounds, messages per round, backend request sizes (see
        :func:`collio.aggregators.summary.aggregator_summary`). A direct call gives
        ``{"domain": -1, "direct": True, "requests": sizes}``, ``sizes`` a read-only
        int64 array of this rank's run lengths.  (Made when read, as :attr:`last_call`.)"""
        of = self._local_of
        if of is not None:
            self._local, self._local_of = of[0](*of[1:]), None
        return self._local

    @local.setter
    def local(self, value: dict[str, Any]) -> None:
        self._local, self._local_of = value, None

    def local_when_read(self, make: Any, *args: Any) -> None:
        """Local: :attr:`local` is ``make(*args)``, made only if it is read (a small
        two-phase call would spend as much on the figures as on a step of its own)."""
        self._local_of = (make, *args)

    @property
    def last_call(self) -> dict[str, Any]:
        """What the last collective call did, the same on every rank: ``items``, ``runs``
        (summed over ranks), ``direct``, ``path``, ``rounds``, ``extent``, ``plan_reused``,
        ``window``, ``nodes``, ``two_level``, ``guessed`` (every rank did its I/O before
        the call's one agreement: a repeat of the last call, see collio.speculate),
        ``aggregators`` (how many had a file domain in the call: a small call takes fewer
        than :attr:`aggregators`, hint ``cb_min_domain``; 0 when none did)."""
        facts = self.last_facts
        if facts is not None:
            self._last_call = dict(zip(_LAST_KEYS, facts, strict=True))
            self.last_facts = None
        return self._last_call

    @last_call.setter
    def last_call(self, value: dict[str, Any]) -> None:
        self._last_call, self.last_facts = value, None

    def add_writes(self, sizes: npt.ArrayLike) -> None:
        n, nbytes = _tally(sizes, self.write_sizes)
        self.write_ops += n
        self.bytes_written += nbytes

    def add_reads(self, sizes: npt.ArrayLike) -> None:
        n, nbytes = _tally(sizes, self.read_sizes)
        self.read_ops += n
        self.bytes_read += nbytes

    def pack(self) -> tuple[list[int], list[float]]:
        """Local counters as (sums, maxima) for one reduction (lists: a small call's few
        dozen numbers are packed faster without numpy)."""
        sums = [*_get_sums(self), *self.write_sizes.tolist(), *self.read_sizes.tolist()]
        return sums, list(_get_maxes(self))

    def absorb(
        self, sums: npt.NDArray[np.int64], maxes: npt.NDArray[np.float64],
        again: Again | None = None,
    ) -> None:  # fmt: skip
        """Add reduced per-call counters to the file's totals (``again``: the same sums as
        :meth:`again` made them, kept from an earlier call: a repeated call's)."""
        self.absorb_most(sums, maxes.tolist(), again)

    def absorb_most(self, sums: npt.NDArray[np.int64], most: list[float],
                    again: Again | None = None) -> None:  # fmt: skip
        """:meth:`absorb` of maxima given as a list (a repeated small call unpacks them
        so, :class:`collio.completion.KeptReduce`: no array made to be listed again)."""
        if again is not None:
            self._add(again)
        else:
            n = len(SUMS)
            nb = len(BUCKET_NAMES)
            every = sums.tolist()
            old = _get_sums(self)
            for i, a in enumerate(every[:n]):
                if a:  # (a call moves a few of the counters; the others stay as they are)
                    setattr(self, SUMS[i], a + old[i])
            # (new arrays, not added in place: a caller may hold the totals of before)
            if any(every[n : n + nb]):
                self.write_sizes = self.write_sizes + sums[n : n + nb]
            if any(every[n + nb : n + 2 * nb]):
                self.read_sizes = self.read_sizes + sums[n + nb : n + 2 * nb]
        if most[0] > self.rounds:
            self.rounds = int(most[0])
        old = _get_maxes(self)
        for i in range(1, len(MAXES)):
            if most[i]:
                setattr(self, MAXES[i], most[i] + old[i])

    @staticmethod
    def again(sums: npt.NDArray[np.int64]) -> Again:
        """Reduced per-call sums (as :meth:`absorb` takes them) kept for :meth:`add_again`."""
        n, nb = len(SUMS), len(BUCKET_NAMES)
        every = sums.tolist()
        moved = tuple((SUMS[i], a) for i, a in enumerate(every[:n]) if a)
        w, r = sums[n : n + nb].copy(), sums[n + nb : n + 2 * nb].copy()
        return Again(moved, w if w.any() else None, r if r.any() else None, _adder(moved))

    def add_again(self, sums: Again, io: float, total: float) -> None:
        """:meth:`absorb` of a call whose sums are an earlier call's (``sums``), whose
        plan, exchange and rounds took nothing, and whose I/O and whole call took ``io``
        and ``total`` seconds (the slowest rank's): a repeated small call's."""
        self._add(sums)
        self.time_io += io
        self.time_total += total

    def _add(self, sums: Again) -> None:
        """Add the sums of :meth:`again` to the totals.  Its histograms are counted, not
        added: a series repeats the same sums, and an array per call costs a small call
        more than its other counters (added when the histograms are read)."""
        sums.add(self)
        if sums.write_sizes is None and sums.read_sizes is None:
            return
        if self._again is not sums:
            if self._again_n:
                self._merge_again()
            self._again = sums
        self._again_n += 1

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in SUMS + MAXES}
        out["aggregators"] = list(self.aggregators)
        out["write_size_histogram"] = dict(
            zip(BUCKET_NAMES, self.write_sizes.tolist(), strict=True)
        )
        out["read_size_histogram"] = dict(zip(BUCKET_NAMES, self.read_sizes.tolist(), strict=True))
        out["hints"] = dict(self.hints)
        out["backend"] = dict(self.backend)
        out["last_call"] = dict(self.last_call)
        return out

    def summary(self, name: str | None = None) -> str:
        """A few lines for humans about the file ``name`` (``COLLIO_STATS=1`` prints it at
        close: :func:`print_at_close`)."""
        mib = 1 << 20
        about = f" {name}" if name else ""
        return (
            f"collio stats{about}: "
            f"{self.bytes_written / mib:.1f} MiB written in {self.write_ops} ops, "
            f"{self.bytes_read / mib:.1f} MiB read in {self.read_ops} ops; "
            f"{self.collective_calls} two-phase calls ({self.direct_calls} direct), "
            f"max {self.rounds} rounds, {len(self.aggregators)} aggregators "
            f"{list(self.aggregators)[:8]}; time plan {self.time_plan:.3f}s exchange "
            f"{self.time_exchange:.3f}s io {self.time_io:.3f}s total {self.time_total:.3f}s"
        )


#: Stats' fields, in order (its pickled state)
_FIELDS = dataclasses.fields(Stats)


def print_at_close(stats: Stats, name: str, rank: int) -> None:
    """With ``COLLIO_STATS`` set, rank 0 prints the closing file's summary to stderr (for
    ``collio.open`` and :mod:`collio.h5` files alike), naming the file."""
    if os.environ.get("COLLIO_STATS") and rank == 0:
        print(stats.summary(name), file=sys.stderr, flush=True)
