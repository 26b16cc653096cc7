"""A call's path from its agreed facts, and the two questions that cost communication.

:func:`~collio.policy.choose_path` decides; this module asks it, with the answers it
needs only when they matter: whether the ranks' extents interleave (kept while every
rank's extent moves alike, :attr:`Context.extents`) and, for few large runs, whether
any two ranks' runs overlap (one allgather of fixed blocks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .collective import Attempt, agree
from .context import Call, Context
from .policy import CHECKED_MAX_RUNS, Path, checked_runs, choose_path, extents_disjoint
from .runs import Runs, first_overlap
from .stats import Stats

__all__ = ["checked", "choose"]

I64 = npt.NDArray[np.int64]


def choose(
    ctx: Context,
    agreed: Any,
    runs: Runs,
    extent: tuple[int, int],
    *,
    writing: bool,
    what: str,
) -> Call:
    """Collective over ``ctx.comm``: the call's path (:func:`~collio.policy.choose_path`)."""
    own: npt.NDArray[np.bool_] | None = None
    asked = [False]

    def disjoint() -> bool:
        asked[0] = True
        if agreed.moved or agreed.shift is None or ctx.extents is None:
            # (ctx.extents is the same on every rank but for its (lo, hi), so is None
            # on all of them or none)
            ctx.extents = (*extent, _disjoint(ctx.comm, *extent))
        else:  # every extent as then, or moved alike: the same answer as then
            ctx.extents = (*extent, ctx.extents[2])
        return ctx.extents[2]

    def split() -> bool | None:
        nonlocal own
        kept = ctx.backend.own_runs(ctx.comm, runs, writing=writing)
        if kept is None:
            return None
        own = kept[0]
        return kept[1]

    def runs_disjoint() -> bool:
        return _runs_disjoint(ctx.comm, runs, agreed.checked, what=what)

    mode = ctx.hints.romio_cb_write if writing else ctx.hints.romio_cb_read
    be = ctx.backend
    path = choose_path(
        agreed, mode=mode, independent=be.independent, disjoint=disjoint, split=split,
        runs_disjoint=runs_disjoint, vouched=agreed.vouched,
    )  # fmt: skip
    call = Call(agreed.lo, agreed.hi, path, Stats(), own if path is Path.OWN else None)
    # (disjoint() was asked and said yes: the extents decided, not the runs' check)
    call.by_extents = (
        path is Path.DIRECT and asked[0] and ctx.extents is not None and ctx.extents[2]
    )
    return call


def _disjoint(comm: MPI.Comm, lo: int, hi: int) -> bool:
    """Collective: True when no two ranks' extents interleave (each may write alone)."""
    mine = np.array([lo, hi], np.int64)
    every = np.empty(2 * comm.Get_size(), np.int64)
    comm.Allgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
    return extents_disjoint(every[0::2], every[1::2])


def checked(runs: Runs) -> int:
    """Local: this rank's ``checked`` fact (:func:`~collio.policy.checked_runs`), kept
    for the read-only lengths it was found from (a time series' next runs share them)."""
    seen = _CHECKED[0]
    if seen is not None and seen[0] is runs.length:
        return seen[1]
    got = _checked_anew(runs)
    if not runs.length.flags.writeable:
        _CHECKED[0] = (runs.length, got)
    return got


#: the last lengths :func:`checked` was asked about and its answer (one entry, replaced
#: whole: another thread's call may read it)
_CHECKED: list[tuple[npt.NDArray[np.int64], int] | None] = [None]


def _checked_anew(runs: Runs) -> int:
    n = len(runs)
    if n == 0 or n > CHECKED_MAX_RUNS:  # (no shortest run to find)
        return 0 if n == 0 else CHECKED_MAX_RUNS + 1
    shortest = int(runs.length[0]) if n == 1 else int(runs.length.min())  # (a small call's)
    return int(checked_runs(n, shortest))


def _runs_disjoint(comm: MPI.Comm, runs: Runs, most: int, *, what: str) -> bool:
    """Collective: True when no two ranks' runs overlap (each may do its own I/O).

    ``most`` is the agreed ``checked`` fact, the most runs of any rank: every rank
    sends a block of that many (offset, length) pairs after a pair holding its count,
    so one allgather of fixed blocks moves them, with no allgather of the counts first.
    A rank that cannot allocate the blocks makes every rank raise the same error before
    they move (as :func:`~collio.exchange.alltoallv_i64`), and so does one failing to
    sort them (every rank computes the answer from the same pairs).
    """
    step = Attempt()
    mine = every = np.zeros(0, np.int64)
    with step:
        mine, every = _pair_buffers(runs, most, comm.Get_size())
    agree(comm, step.error, what=what)
    comm.Allgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
    disjoint = False
    with step:
        disjoint = _pairs_disjoint(every, most)
    agree(comm, step.error, what=what)
    return disjoint


def _pair_buffers(runs: Runs, most: int, size: int) -> tuple[I64, I64]:
    """Local: this rank's block (its count, 0, then its (offset, length) pairs, padded
    to ``most``) and room for every rank's."""
    n = len(runs)
    mine = np.zeros(2 * (most + 1), np.int64)
    mine[0] = n
    mine[2 : 2 * n + 2 : 2], mine[3 : 2 * n + 3 : 2] = runs.file, runs.length
    return mine, np.empty(size * len(mine), np.int64)


def _pairs_disjoint(blocks: I64, most: int) -> bool:
    """Local, pure: whether no two of the runs in ``blocks`` (every rank's block of
    :func:`_pair_buffers`) overlap.  A rank's runs overlapping each other (a read may)
    answer False too: the shuffle then reads them, as it did before the runs were
    compared."""
    pairs = blocks.reshape(-1, most + 1, 2)
    real = np.arange(most) < pairs[:, 0, 0, None]  # (the padding past each rank's count)
    file, length = pairs[:, 1:, 0][real], pairs[:, 1:, 1][real]
    order = np.argsort(file, kind="stable")
    return first_overlap(file[order], length[order]) < 0
