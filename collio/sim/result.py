"""What the simulator is asked (:class:`SimConfig`) and what it answers (:class:`SimResult`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import policy
from ..hints import Hints
from ..policy import Path

__all__ = ["PIECE_BYTES", "SimConfig", "SimResult"]

I64 = npt.NDArray[np.int64]
#: Bytes of planner metadata per piece on an aggregator: (offset, length) received,
#: source, window, sort keys and order (8 int64 arrays).
PIECE_BYTES = 64


@dataclasses.dataclass(frozen=True, slots=True)
class SimConfig:
    """Hints and backend properties the planner sees, plus the job's shape.

    ``ppn`` ranks share a node (0: all on one; aggregators are spread over nodes and
    two-level aggregation groups each node's ranks, as in the engine); ``budget`` caps
    the (box, window) or (sub-box, domain) pairs evaluated before sampling;
    ``method`` forces ``explicit``, ``interval`` or ``sampled`` (tests) instead of ``auto``.
    ``local_fs``: the target is a posix file on a local file system, whose reads skip the
    shuffle (hint ``mapped_reads``); a cluster's parallel file system is not.
    """

    hints: Hints = dataclasses.field(default_factory=Hints)
    backend_alignment: int = 1
    backend_min_window: int = 0  # ``Backend.min_window``: rounds do not shrink below it
    partial_write: bool = True
    ppn: int = 0
    budget: int = 10_000_000
    writing: bool = True
    method: str = "auto"
    local_fs: bool = False


@dataclasses.dataclass(slots=True)
class SimResult:
    """What the real engine's stats would report, per aggregator and per round.

    ``msgs[rstart[a]:rstart[a+1]]`` are the messages of aggregator ``a``'s rounds
    (windows ``windows``), ``requests`` the backend request sizes in the same order,
    except when sampling a layout without holes: then ``requests`` are exact, for
    every round.  On the direct path ``requests``/``req_count`` give each distinct
    size and how many requests have it.
    """

    nranks: int
    nbytes: int
    extent: tuple[int, int]
    direct: bool
    naggs: int
    window: int
    bounds: I64
    agg_bytes: I64
    agg_rounds: I64
    rstart: I64
    msgs: I64
    requests: I64
    req_count: I64
    hole_reads: I64
    agg_pieces: I64
    rank_runs_max: int
    method: str
    windows_total: int
    windows_evaluated: int
    #: Global indices of the windows behind ``msgs`` / ``requests`` (busy, evaluated).
    windows: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    hints: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The direct path of a read copied from the mapped file (``SimConfig.local_fs``).
    mapped: bool = False
    #: Nodes of the job, and two-level aggregation: local aggregators per node (0: one
    #: level) and, per local aggregator, its ranks and their bytes (``msgs`` then count
    #: the local aggregators that send to an aggregator in a round).
    nnodes: int = 1
    local_per_node: int = 0
    #: (``group_bytes``: what each group stages, a write's for other groups' aggregators.)
    group_ranks: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    group_bytes: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    #: Most bytes one rank has in one round (0: not known, beyond the evaluation budget).
    rank_round_bytes: int = 0
    #: Most bytes one local group has in one round (0: not known, as ``rank_round_bytes``).
    group_round_bytes: int = 0
    #: Runs of each local aggregator's ranks (it plans them all), and those it stages
    #: (its pieces in its staging buffer; empty: all of them).
    group_runs: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    staged_runs: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    agg_nodes: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    #: A write (False: a read, whose aggregators send what they read).
    writing: bool = True

    @property
    def two_level(self) -> bool:
        return self.local_per_node > 0 and not self.direct and self.nbytes > 0

    @property
    def path(self) -> Path:
        """The engine's path for the call (``stats.last_call["path"]``)."""
        if self.mapped:
            return Path.MAPPED
        if self.direct:
            return Path.DIRECT
        return Path.TWO_PHASE if self.nbytes else Path.NONE

    @property
    def sampled(self) -> bool:
        return self.method == "sampled"

    @property
    def rounds(self) -> int:
        return int(self.agg_rounds.max(initial=0))

    def memory(self) -> I64:
        """Predicted extra memory per aggregator: round buffers plus planner metadata.

        The engine keeps :data:`collio.policy.DEPTH` round buffers of one window each.
        """
        buffers = np.where(self.agg_rounds > 0, policy.DEPTH * self.window, 0)
        out: I64 = buffers + self.agg_pieces * PIECE_BYTES
        return out
