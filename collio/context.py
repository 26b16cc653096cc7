"""Value objects shared by the engine and the round loops."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.plan import AggregatorPlan, SenderPlan
from .backends.base import Backend
from .hints import Hints
from .plancache import PlanCache
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

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def my_domain(self) -> int:
        """Index of this rank's file domain, or -1 when it does not aggregate."""
        hit = np.flatnonzero(self.aggregators == self.rank)
        return int(hit[0]) if len(hit) else -1


@dataclasses.dataclass(slots=True)
class Call:
    """Per-call facts every rank agreed on."""

    lo: int
    hi: int
    direct: bool
    counters: Stats
    own: npt.NDArray[np.bool_] | None = None  # runs this rank does itself before the shuffle
    reused: bool = False  # the plan of an earlier, identical call was used
    window: int = 0  # bytes per round (0: no two-phase round)
    plan_epoch: int = -1  # the kept plan every rank's check found for these runs (-1: none)
    prekey: tuple[Any, ...] = ()  # what the plan depends on besides runs and extent


@dataclasses.dataclass(slots=True)
class Plan:
    """The agreed plan of one two-phase call, as seen by this rank."""

    bounds: I64
    window: int
    sender: SenderPlan
    sround: I64  # round of each sender group
    agg: AggregatorPlan | None
    nrounds: int

    def nbytes(self) -> int:
        """Bytes of the plan's arrays (what keeping it costs)."""
        parts: list[object] = [self.bounds, self.sround, *_arrays(self.sender)]
        parts += _arrays(self.sender.pieces)
        if self.agg is not None:
            parts += _arrays(self.agg)
        return sum(a.nbytes for a in parts if isinstance(a, np.ndarray))


def _arrays(obj: object) -> list[object]:
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)]  # type: ignore[arg-type]
