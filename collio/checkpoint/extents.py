"""Which bytes each checksum covers, and which rank computes or verifies it.  Pure numpy.

An array's extents are cut at a fixed grid (:data:`BLOCK`) and at the edges of the
saving ranks' pieces, wherever a piece is one contiguous range of the array's
bytes (a row-sharded tensor is).  So each saving rank checksums its extents from
its own memory, with no exchange and no reading back; and a load at the same
decomposition verifies everything from the arrays it has just read.  A resharded
load reads again only the extents that no single rank's piece covers whole.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["BLOCK", "cut", "owners", "span"]

I64 = npt.NDArray[np.int64]

#: Extent size where no piece edge cuts: a resharded load re-reads at most one extent
#: per piece edge, and the table holds one row per extent.
BLOCK = 4 << 20


def span(file: I64, length: I64, mem: I64) -> tuple[int, int, bool]:
    """(lo, hi, contiguous) of a piece's sorted runs, relative to its array's start:
    contiguous when the runs are one range of the file held in the same order in memory."""
    if len(length) == 0:
        return 0, 0, True
    lo, hi = int(file[0]), int(file[-1] + length[-1])
    same = bool(np.array_equal(mem, file - lo))
    return lo, hi, same and int(length.sum()) == hi - lo


def box_span(
    global_shape: tuple[int, ...],
    start: tuple[int, ...],
    shape: tuple[int, ...],
    itemsize: int,
    order: str,
) -> tuple[int, int, bool] | None:
    """(lo, hi, contiguous) of one box by arithmetic, when it is one range (None: ask its
    runs): a row shard is, and flattening hundreds of layouts costs more than the save's
    other planning together."""
    g, st, sh = (global_shape, start, shape) if order == "C" else (
        global_shape[::-1], start[::-1], shape[::-1])  # fmt: skip
    n = 1
    for c in sh:
        n *= c
    if n == 0:
        return 0, 0, True
    k = next((i for i, c in enumerate(sh) if c != 1), len(sh))  # leading dims of one index
    if any(sh[i] != g[i] for i in range(k + 1, len(g))):
        return None
    lo, stride = 0, itemsize
    for i in range(len(g) - 1, -1, -1):
        lo += st[i] * stride
        stride *= g[i]
    return lo, lo + n * itemsize, True


def cut(nbytes: int, lo: I64, hi: I64, block: int = BLOCK) -> I64:
    """Extent starts of an array of ``nbytes``: a ``block`` grid and the pieces' edges."""
    if nbytes == 0:
        return np.zeros(0, np.int64)
    # pieces come in rank order, usually sorted already: a stable sort (timsort on
    # int64) merges sorted runs in linear time where np.unique's quicksort would not
    edges = np.concatenate([np.arange(0, nbytes, block, dtype=np.int64), lo, hi])
    edges = np.sort(edges[(edges >= 0) & (edges < nbytes)], kind="stable")
    keep = np.ones(len(edges), bool)
    keep[1:] = edges[1:] != edges[:-1]
    return edges[keep]


def owners(starts: I64, nbytes: int, lo: I64, hi: I64, contiguous: npt.NDArray[np.bool_]) -> I64:
    """For each extent, a rank whose contiguous piece ``[lo, hi)`` covers it whole, else -1.

    Where several pieces cover an extent (a whole array on every rank), the extents are
    dealt round-robin among them, so that no rank checksums everything.
    """
    ends = np.append(starts[1:], nbytes)
    out = np.full(len(starts), -1, np.int64)
    ranks = np.flatnonzero(contiguous & (hi > lo))
    if len(ranks) == 0 or len(starts) == 0:
        return out
    rlo, rhi = lo[ranks], hi[ranks]
    if np.all(rlo == rlo[0]) and np.all(rhi == rhi[0]) and len(ranks) > 1:
        inside = (starts >= rlo[0]) & (ends <= rhi[0])
        out[inside] = ranks[np.arange(len(starts))[inside] % len(ranks)]
        return out
    if bool((rlo[1:] >= rlo[:-1]).all()):  # rank order is file order (row shards)
        slo, shi, sr = rlo, rhi, ranks
    else:
        order = np.argsort(rlo, kind="stable")
        slo, shi, sr = rlo[order], rhi[order], ranks[order]
    k = np.searchsorted(slo, starts, side="right") - 1
    ok = k >= 0
    kk = np.where(ok, k, 0)
    ok &= shi[kk] >= ends
    out[ok] = sr[kk[ok]]
    return out


def deal(uncovered: npt.NDArray[np.bool_], size: int) -> I64:
    """Ranks for the extents no piece covers, round-robin: one rank reads each back."""
    out = np.full(len(uncovered), -1, np.int64)
    out[uncovered] = np.arange(int(uncovered.sum())) % max(size, 1)
    return out
