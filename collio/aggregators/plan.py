"""Exchange plans for one collective call (pure: numpy in, numpy out).

Semantics shared by the real engine and the simulator:

* domain ``d`` is ``[bounds[d], bounds[d+1])`` and belongs to aggregator ``d``;
* its windows are ``[bounds[d] + w*W, bounds[d] + (w+1)*W)`` clipped to the domain;
* an aggregator's rounds are its *non-empty* windows in file order; round ``k`` of
  the call moves the ``k``-th non-empty window of every aggregator at once;
* in a round an aggregator gets one message from each rank with bytes in that
  window and issues one backend request for the window's data extent.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from ..runs import Runs, first_overlap, group_bounds, split_at, split_grid

__all__ = ["SenderPlan", "AggregatorPlan", "plan_sender", "plan_aggregator", "round_requests"]

I64 = npt.NDArray[np.int64]


@dataclasses.dataclass(frozen=True, slots=True)
class SenderPlan:
    """One rank's pieces, cut at domain and window boundaries, grouped per message.

    ``pieces[gstart[g]:gstart[g+1]]`` go to aggregator ``gdom[g]`` for its window
    ``gwin[g]``; ``per_dom[d]`` is how many pieces go to aggregator ``d``.
    """

    pieces: Runs
    gstart: I64
    gdom: I64
    gwin: I64
    per_dom: I64

    @property
    def ngroups(self) -> int:
        return len(self.gdom)

    def group(self, g: int) -> Runs:
        return self.pieces.take(slice(int(self.gstart[g]), int(self.gstart[g + 1])))


def plan_sender(runs: Runs, bounds: I64, window: int) -> SenderPlan:
    """Cut a rank's runs (sorted by file) at domain bounds and window grid."""
    naggs = len(bounds) - 1
    pieces, bins = split_at(runs, bounds[1:-1])  # bin = domain index
    keep = pieces.length > 0  # an empty domain inside a run leaves a 0-byte piece: drop it,
    if not keep.all():  # or split_grid drops it and the domains below shift by one
        pieces, bins = pieces.take(np.flatnonzero(keep)), bins[keep]
    dom = bins.astype(np.int64)
    pieces, win = split_grid(pieces, bounds[dom if len(dom) else slice(0, 0)], window)
    # pieces are non-empty and lie inside one domain: find it again after the window
    # split (side="right" picks the non-empty domain among equal bounds)
    dom = np.searchsorted(bounds[1:-1], pieces.file, side="right").astype(np.int64)
    key = dom * (np.int64(1) << 40) + win
    if len(key) > 1 and not bool((key[1:] >= key[:-1]).all()):
        # runs that overlap (a read may name a byte twice): a long run's pieces in later
        # windows come before a short run's piece in an earlier one; each message and
        # the metadata to each aggregator need their pieces together (stable: by run
        # start within a window, so still sorted by file there)
        order = np.argsort(key, kind="stable")
        pieces, dom, win, key = pieces.take(order), dom[order], win[order], key[order]
    gstart, _ = group_bounds(key)
    firsts = gstart[:-1]
    per_dom = np.bincount(dom, minlength=naggs).astype(np.int64)
    return SenderPlan(pieces, gstart, dom[firsts], win[firsts], per_dom)


@dataclasses.dataclass(frozen=True, slots=True)
class AggregatorPlan:
    """What one aggregator receives, per round.

    Pieces (``file``, ``length``) arrive grouped by source rank, sorted by file
    within each source.  Group ``g`` is source ``gsrc[g]``'s pieces
    ``gstart[g]:gstart[g+1]`` for round ``ground[g]``.  ``rstart`` indexes the
    groups of round ``k`` in ``rorder[rstart[k]:rstart[k+1]]``.  Round ``k``'s
    data extent is ``[rlo[k], rhi[k])`` with ``rcovered[k]`` bytes written in it.
    """

    file: I64
    length: I64
    gstart: I64
    gsrc: I64
    ground: I64
    rorder: I64
    rstart: I64
    rlo: I64
    rhi: I64
    rcovered: I64
    rwin: I64

    @property
    def nrounds(self) -> int:
        return len(self.rlo)

    def groups_of_round(self, k: int) -> I64:
        return self.rorder[int(self.rstart[k]) : int(self.rstart[k + 1])]

    def replies(self, nsources: int) -> tuple[I64, I64]:
        """Round index of every group, ordered by source; and groups per source."""
        per_src = np.bincount(self.gsrc, minlength=nsources).astype(np.int64)
        return self.ground, per_src


def plan_aggregator(
    file: I64, length: I64, src: I64, dom_lo: int, window: int
) -> tuple[AggregatorPlan, int]:
    """Group the pieces an aggregator received; also find an overlap.

    Returns the plan and the index of a piece that overlaps another one (-1 if none).
    """
    order = np.argsort(file, kind="stable")
    bad = first_overlap(file[order], length[order])
    overlap = int(order[bad]) if bad >= 0 else -1
    win = (file - dom_lo) // window
    key = src * (np.int64(1) << 40) + win
    gstart, _ = group_bounds(key)
    firsts = gstart[:-1]
    gsrc = src[firsts]
    gwin = win[firsts]
    wins, ground = np.unique(gwin, return_inverse=True)
    ground = ground.astype(np.int64).reshape(-1)
    rorder = np.argsort(ground, kind="stable").astype(np.int64)
    counts = np.bincount(ground, minlength=len(wins))
    rstart = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    # per-round data extent and coverage
    pround = np.searchsorted(wins, win)
    nr = len(wins)
    rlo = np.full(nr, np.iinfo(np.int64).max, np.int64)
    rhi = np.zeros(nr, np.int64)
    np.minimum.at(rlo, pround, file)
    np.maximum.at(rhi, pround, file + length)
    rcovered = np.bincount(pround, weights=length, minlength=nr).astype(np.int64)
    plan = AggregatorPlan(
        file,
        length,
        gstart,
        gsrc,
        ground,
        rorder,
        rstart,
        rlo,
        rhi,
        rcovered,
        wins.astype(np.int64),
    )
    return plan, overlap


def round_requests(
    ap: AggregatorPlan, dom_lo: int, dom_hi: int, window: int, partial_write: bool
) -> tuple[I64, I64]:
    """(offsets, lengths) of the backend request of each of an aggregator's rounds.

    The round's data extent ``[rlo, rhi)`` when the backend writes part of a window
    (``partial_write``); otherwise its whole window, clipped to the domain
    ``[dom_lo, dom_hi)``.
    """
    if partial_write:
        out: I64 = ap.rhi - ap.rlo
        return ap.rlo, out
    start: I64 = dom_lo + ap.rwin * window
    return start, np.minimum(start + window, dom_hi) - start
