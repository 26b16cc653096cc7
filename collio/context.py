"""Value objects shared by the engine and the round loops."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.nodes import LocalGroups
from .aggregators.plan import AggregatorPlan, SenderPlan
from .backends.base import Backend
from .exchange import Shapes, group_shapes
from .hints import Hints
from .plancache import PlanCache
from .policy import Path
from .runs import Runs
from .stats import Stats

__all__ = ["Context", "Call", "Plan"]

I64 = npt.NDArray[np.int64]


@dataclasses.dataclass(slots=True)
class Context:
    """What a collective call needs: the file's private communicator and its parts."""

    comm: MPI.Comm
    backend: Backend
    hints: Hints
    aggregators: I64
    stats: Stats
    mode: str
    plans: PlanCache | None = None  # plans of earlier calls on this communicator
    read_aggregators: I64 | None = None  # when reads use other aggregators (see Backend)
    file: tuple[int, str] = (0, "")  # serial on the communicator, name: see call_head
    aborted: bool = False  # an atomic commit was dropped: writes are refused (collective)
    # this rank's (lo, hi) when the ranks last compared extents on this file, and whether
    # they were disjoint then (collective: the same on every rank); see engine._check
    extents: tuple[int, int, bool] | None = None
    # the write calls made on the file so far (any way, batches too): a step of a series
    # trusts the file's end it learned only when no other write came since
    # (collio.quick.Step)
    writes: int = 0
    # two-level aggregation: each rank's local aggregator (None: one level), and the nodes
    local: LocalGroups | None = None
    nodes: int = 1
    # what this rank kept of its last read and write (None: not kept), for the steps that
    # follow the call (collio.speculate.note_layout; a list, shared by the copies a read
    # makes of ctx)
    guesses: list[Any] = dataclasses.field(default_factory=lambda: [None, None])
    # this rank's kept reads and writes, one of which the next call may repeat
    # (collio.speculate.KeptCalls; shared as ``guesses`` is)
    kept: list[Any] = dataclasses.field(default_factory=lambda: _kept_calls())
    # the same for batches (write_all_many, read_all_many), kept apart: a single call
    # never repeats a batch, and the lanes count single calls alone
    kept_many: list[Any] = dataclasses.field(default_factory=lambda: _kept_calls())
    # per call name, this rank's counters of the last call completed with that name and
    # their agreed sums (collio.completion; shared as ``guesses`` is)
    sums_kept: dict[str, Any] = dataclasses.field(default_factory=dict)
    # this rank's last single two-phase write through a Subarray (collio.keptcall.Lane)
    lane: Any = None
    # this rank's last batch's two-phase write (collio.keptcall.keep_batch: a Lane)
    batch_lane: Any = None
    # whether the call in progress is a write_at_all/read_at_all (set by collio.file
    # while it holds the communicator): its head and messages name it (call_name), and
    # it repeats only kept calls of its own kind
    call_at: bool = False
    # my_domain's answer for the aggregators array it was asked of (not copied by
    # dataclasses.replace, which gives a read its own aggregators)
    _domain: tuple[Any, int] | None = dataclasses.field(default=None, init=False, repr=False)

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    def call_name(self, writing: bool) -> str:
        """The call in progress of a single piece, as its head and messages name it."""
        if self.call_at:
            return "write_at_all" if writing else "read_at_all"
        return "write_all" if writing else "read_all"

    @property
    def my_domain(self) -> int:
        """Index of this rank's file domain, or -1 when it does not aggregate."""
        kept = self._domain
        if kept is not None and kept[0] is self.aggregators:
            return int(kept[1])
        hit = np.flatnonzero(self.aggregators == self.rank)
        d = int(hit[0]) if len(hit) else -1
        self._domain = (self.aggregators, d)
        return d


def _kept_calls() -> list[Any]:
    from .speculate import KeptCalls  # (speculate builds on this module)

    return [KeptCalls(), KeptCalls()]


@dataclasses.dataclass(slots=True)
class Call:
    """Per-call facts every rank agreed on."""

    lo: int
    hi: int
    path: Path
    counters: Stats
    own: npt.NDArray[np.bool_] | None = None  # runs this rank does itself before the shuffle
    reused: bool = False  # the plan of an earlier, identical call was used
    window: int = 0  # bytes per round (0: no two-phase round)
    plan_epoch: int = -1  # the kept plan every rank's check found for these runs (-1: none)
    plan_shift: int = 0  # how far these runs lie from that plan's (the same on every rank)
    prekey: tuple[Any, ...] = ()  # what the plan depends on besides runs and extent
    nruns: int = 0  # this rank's runs (a batch's: the union of its items')
    name: str = ""  # the call, for messages (write_all, read_all_many, ...)
    two_level: bool = False  # the call aggregated in two levels (collio.twolevel)
    active: int = 0  # aggregators with a file domain in this call (cb_min_domain)
    # the path is direct because no two ranks' extents interleave (not the runs' check)
    by_extents: bool = False
    # what collio.speculate keeps of a completed call: this rank's facts, the agreed
    # shift, its requests' result, the agreed sums and the last-call facts
    facts: tuple[Any, ...] | None = None
    shift: int = -1
    sig: int | None = None  # the agreed global array (collio.speculate.call_key)
    done: Any = None
    sums: Any = None
    last: tuple[Any, ...] = ()
    early: Any = None  # a guess's I/O (collio.speculate.Guess), done before the head
    settled: bool = False  # complete already: every rank guessed (collio.speculate.settle)
    failed: BaseException | None = None  # before the transfer (a take-back), agreed at the end

    @property
    def direct(self) -> bool:
        """Each rank does its own I/O: no byte goes through an aggregator."""
        return self.path.direct


@dataclasses.dataclass(slots=True)
class Plan:
    """The agreed plan of one two-phase call, as seen by this rank."""

    bounds: I64
    window: int
    sender: SenderPlan
    sround: I64  # round of each sender group
    agg: AggregatorPlan | None
    nrounds: int
    # derived once, on first use (a kept plan serves later calls): see exchange.Shapes
    _agg_shapes: Shapes | None = None
    _sender_shapes: Shapes | None = None
    _by_round: tuple[I64, I64] | None = None

    def agg_shapes(self) -> Shapes:
        """Shapes of the aggregator's groups over file offsets (this rank aggregates)."""
        if self._agg_shapes is None:
            ap = self.agg
            assert ap is not None
            self._agg_shapes = group_shapes(ap.file, ap.length, ap.gstart)
        return self._agg_shapes

    def sender_shapes(self) -> Shapes:
        """Shapes of this rank's send groups over its buffer's offsets."""
        if self._sender_shapes is None:
            sp = self.sender
            self._sender_shapes = group_shapes(sp.pieces.mem, sp.pieces.length, sp.gstart)
        return self._sender_shapes

    def by_round(self) -> tuple[I64, I64]:
        """This rank's send groups ordered by round, and where each round's start."""
        if self._by_round is None:
            sround = self.sround
            order = np.argsort(sround, kind="stable").astype(np.int64)
            nr = int(sround.max()) + 1 if len(sround) else 0
            counts = np.bincount(sround, minlength=nr)
            self._by_round = order, np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return self._by_round

    def shifted(self, d: int) -> Plan:
        """This plan for the same runs moved ``d`` bytes in the file, with its domains: every
        file offset moved (domains, pieces, what the aggregator receives, its rounds'
        extents, its message shapes); what is counted in windows, groups and buffer
        offsets stays, and so do the shapes and order built from those."""
        sp, ap = self.sender, self.agg
        p = sp.pieces
        sender = _with(sp, pieces=Runs(p.file + d, p.length, p.mem))
        agg = None
        if ap is not None:
            agg = _with(ap, file=ap.file + d, rlo=ap.rlo + d, rhi=ap.rhi + d)
        shapes = self._agg_shapes
        if shapes is not None:
            shapes = _with(shapes, first=shapes.first + d)
        return _with(self, bounds=self.bounds + d, sender=sender, agg=agg, _agg_shapes=shapes)

    def nbytes(self) -> int:
        """Bytes of the plan's arrays (what keeping it costs)."""
        parts: list[object] = [self.bounds, self.sround, *_arrays(self.sender)]
        parts += _arrays(self.sender.pieces)
        if self.agg is not None:
            parts += _arrays(self.agg)
        return sum(a.nbytes for a in parts if isinstance(a, np.ndarray))


_T = TypeVar("_T")
_INIT: dict[type, tuple[tuple[str, ...], Any]] = {}


def _with(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for a kept plan's parts, which a time series moves every
    call: the field names are looked up once per class, not per call."""
    cls = type(obj)
    got = _INIT.get(cls)
    if got is None:
        names = tuple(f.name for f in dataclasses.fields(cls) if f.init)  # type: ignore[arg-type]
        get = operator.attrgetter(*names, *names[:1])  # (two names at least: a tuple)
        got = _INIT[cls] = (names, get)
    names = got[0]
    values = list(got[1](obj))[: len(names)]  # (one C call reads every field)
    for name, value in changes.items():
        values[names.index(name)] = value
    return cls(*values)


def _arrays(obj: object) -> list[object]:
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)]  # type: ignore[arg-type]
