"""Overlapping writes, reported once: which bytes, and every rank that writes them.

Each aggregator finds the overlaps among the pieces of its own file domain
(:func:`overlap_region`, pure); when several aggregators find them (all ranks writing
the same bytes spans every domain), :func:`raise_plan_error` merges what they found
into one :class:`~collio.errors.OverlapError`: ranges that touch and share their ranks
become one, and each range names all the ranks writing into it, not the first two.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .collective import detached, raise_agreed
from .errors import OverlapError, classify

__all__ = ["overlap_error", "overlap_region", "raise_plan_error", "rank_list"]

I64 = npt.NDArray[np.int64]
#: Ranges and ranks shown in one message; the rest are counted.
_SHOWN = 4
_RANKS = 8


def overlap_region(file: I64, length: I64, src: I64) -> tuple[int, int, list[int]] | None:
    """The first stretch ``[lo, hi)`` of bytes that two or more pieces cover, and the
    ranks (``src``) of every piece reaching into it; None when no byte is covered twice.

    Vectorised: the pieces' starts and ends as +1/-1 events, a running sum for the
    depth; a run's end sorts before another's start at the same byte (touching is fine).
    """
    keep = length > 0
    f, e, s = file[keep], file[keep] + length[keep], src[keep]
    pos = np.concatenate((f, e))
    step = np.concatenate((np.ones(len(f), np.int64), -np.ones(len(e), np.int64)))
    order = np.lexsort((step, pos))
    pos, depth = pos[order], np.cumsum(step[order])
    width = np.diff(pos)
    twice = (depth[:-1] >= 2) & (width > 0)
    if not twice.any():
        return None
    first = int(np.argmax(twice))
    breaks = ~twice[first:] & (width[first:] > 0)
    end = first + int(np.argmax(breaks)) if breaks.any() else len(width)
    lo, hi = int(pos[first]), int(pos[end])
    ranks = np.unique(s[(f < hi) & (e > lo)])
    return lo, hi, [int(r) for r in ranks]


def rank_list(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0 and 1``, ``ranks 0, 1 and 2``, ``ranks 0, 1, ... (and 12 more)``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > _RANKS:
        head = ", ".join(str(r) for r in ranks[:_RANKS])
        return f"ranks {head} and {len(ranks) - _RANKS} more"
    return f"ranks {', '.join(str(r) for r in ranks[:-1])} and {ranks[-1]}"


def overlap_error(file: I64, length: I64, src: I64) -> OverlapError:
    """An aggregator's error for the overlaps among its pieces (it must have one)."""
    found = overlap_region(file, length, src)
    lo, hi, ranks = found if found is not None else (0, 0, [])
    err = OverlapError(f"bytes [{lo}, {hi}) are written by {rank_list(ranks)}", ranks=tuple(ranks))
    err.region = (lo, hi, tuple(ranks))
    return err


def _merged(regions: list[tuple[int, int, tuple[int, ...]]]) -> list[list[Any]]:
    """Sorted ranges, those that touch or overlap with the same ranks joined."""
    out: list[list[Any]] = []
    for lo, hi, ranks in sorted(regions):
        if out and out[-1][2] == ranks and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi, ranks])
    return out


def raise_plan_error(comm: MPI.Comm, error: BaseException | None, *, what: str) -> None:
    """Collective over `comm` (some rank failed planning): raise the agreed error, one
    :class:`OverlapError` for the whole call when every failure was an overlap."""
    region = getattr(error, "region", None) if isinstance(error, OverlapError) else None
    infos: list[Any] = comm.allgather(None if error is None else (classify(error)[0], region))
    failed = [i for i in infos if i is not None]
    if not failed or any(region is None for _, region in failed):
        raise_agreed(comm, error, what=what)
        return
    found = _merged([region for _, region in failed])
    parts = [f"bytes [{lo}, {hi}) are written by {rank_list(list(r))}" for lo, hi, r in found]
    text = "; ".join(parts[:_SHOWN])
    if len(parts) > _SHOWN:
        text += f"; and {len(parts) - _SHOWN} more ranges"
    ranks = sorted({r for _, _, rs in found for r in rs})
    err = OverlapError(f"{what}: {text}", ranks=tuple(ranks))
    # (every overlapping range, the same on every rank: a front end names what is there)
    err.regions = [(int(lo), int(hi), tuple(r)) for lo, hi, r in found]
    try:
        raise err from detached(error)
    finally:  # (the traceback holds this frame: a cycle through ``err`` otherwise)
        del err, error
