"""Every virtual rank's layout as one batch of nested strided boxes, and arithmetic on it.

Nothing here makes a Python object per rank or per run: a 65,536-rank job is a
few numpy arrays of at most ``2**ndim`` boxes per rank.  The arithmetic
(:func:`~collio.layouts.count_below`, :func:`select`, :func:`explode`) works on
box indices vectorised over (box, file offset) pairs.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import numpy.typing as npt

from ..bench.patterns import Workload
from ..layouts.strided import Blocks

__all__ = ["batched_blocks", "squeeze", "select", "explode", "inner_sizes"]

I64 = npt.NDArray[np.int64]


@dataclasses.dataclass(frozen=True, slots=True)
class _Part:
    """One regular part of every rank's index set in one dimension (DimSet.pieces)."""

    valid: npt.NDArray[np.bool_]
    start: I64  # global index of the first item
    nblocks: I64
    per: I64  # items per block
    local: I64  # local index of the first item


def _parts(first: I64, block: I64, period: I64, count: I64) -> tuple[_Part, _Part]:
    """The full blocks, then the partial last block (vectorised DimSet.pieces)."""
    nfull: I64 = count // block
    rest: I64 = count - nfull * block
    full = _Part(nfull > 0, first, nfull, block, np.zeros_like(first))
    part = _Part(rest > 0, first + nfull * period, np.ones_like(first), rest, nfull * block)
    return full, part


def _strides(work: Workload, count: I64) -> tuple[list[int], I64]:
    """Bytes per index step in the file (per dimension) and in each rank's buffer."""
    n = len(work.shape)
    fstride = [work.itemsize] * n
    mstride = np.full((work.nranks, n), work.itemsize, np.int64)
    for k in range(n - 2, -1, -1):
        fstride[k] = fstride[k + 1] * work.shape[k + 1]
        mstride[:, k] = mstride[:, k + 1] * count[:, k + 1]
    return fstride, mstride


def batched_blocks(work: Workload) -> tuple[Blocks, I64]:
    """All ranks' boxes (same boxes, same order as each rank's ``layout().blocks()``).

    Returns the boxes and the owner rank of each, sorted by owner.  The loop is
    over the ``2**ndim`` combinations of parts, never over ranks.
    """
    first, block, period, count = work.dimsets()
    n = len(work.shape)
    fstride, mstride = _strides(work, count)
    per_dim = [_parts(first[:, k], block[:, k], period[:, k], count[:, k]) for k in range(n)]
    cols: list[list[I64]] = [[] for _ in range(7)]
    for combo_id, combo in enumerate(itertools.product(*per_dim)):
        sel = np.flatnonzero(np.logical_and.reduce([c.valid for c in combo]))
        base = np.zeros(len(sel), np.int64)
        mem = np.zeros(len(sel), np.int64)
        cnt, st, mst = [], [], []
        for k, c in enumerate(combo):
            base += c.start[sel] * fstride[k]
            mem += c.local[sel] * mstride[sel, k]
            cnt += [c.nblocks[sel], c.per[sel]]
            st += [period[sel, k] * fstride[k], np.full(len(sel), fstride[k], np.int64)]
            mst += [block[sel, k] * mstride[sel, k], mstride[sel, k]]
        row = [sel.astype(np.int64), np.full(len(sel), combo_id, np.int64), base, mem]
        row += [np.stack(cnt, axis=1), np.stack(st, axis=1), np.stack(mst, axis=1)]
        for col, value in zip(cols, row, strict=True):
            col.append(value)
    owner, combo_ids, base, mem, cnt2, st2, mst2 = (np.concatenate(c) for c in cols)
    order = np.lexsort((combo_ids, owner))
    rl = np.full(len(order), work.itemsize, np.int64)
    blocks = Blocks.build(base[order], mem[order], cnt2[order], st2[order], mst2[order], rl)
    return blocks, owner[order]


def squeeze(blocks: Blocks) -> Blocks:
    """Drop the levels where every box has count 1 (they never change a count)."""
    keep = (blocks.counts != 1).any(axis=0)
    if keep.all():
        return blocks
    if not keep.any():
        keep[-1] = True
    return Blocks(
        blocks.base,
        blocks.mem,
        np.ascontiguousarray(blocks.counts[:, keep]),
        np.ascontiguousarray(blocks.strides[:, keep]),
        np.ascontiguousarray(blocks.mstrides[:, keep]),
        blocks.runlen,
    )


def inner_sizes(counts: I64, runlen: I64) -> I64:
    """Bytes in one item of each level: ``prod(counts[k+1:]) * runlen``."""
    inner = np.empty_like(counts)
    acc = runlen.copy()
    for k in range(counts.shape[1] - 1, -1, -1):
        inner[:, k] = acc
        acc = acc * counts[:, k]
    return inner


def select(blocks: Blocks, which: npt.NDArray[np.intp], k: I64) -> I64:
    """File offset of byte ``k[j]`` (0-based, in file order) of box ``which[j]``.

    The inverse of :func:`~collio.layouts.count_below`: ``count_below(b, w,
    select(b, w, k)) == k``.  Vectorised over j; ``0 <= k[j] < nbytes``.
    """
    inner = inner_sizes(blocks.counts[which], blocks.runlen[which])
    st = blocks.strides[which]
    off = blocks.base[which].copy()
    rem = k.copy()
    for lvl in range(inner.shape[1]):
        i = rem // inner[:, lvl]
        rem -= i * inner[:, lvl]
        off += i * st[:, lvl]
    out: I64 = off + rem
    return out


def _spans(counts: I64, strides: I64, runlen: I64) -> I64:
    """span[:, k]: bytes from the first byte to the end of one item of level k-1."""
    n = counts.shape[1]
    span = np.empty((len(runlen), n + 1), np.int64)
    span[:, n] = runlen
    for k in range(n - 1, -1, -1):
        span[:, k] = (counts[:, k] - 1) * strides[:, k] + span[:, k + 1]
    return span


def explode_levels(blocks: Blocks, window: int) -> npt.NDArray[np.bool_]:
    """Levels to list item by item so that no sub-box has a gap of ``window`` bytes or more.

    Innermost first: once a level is exploded its count is 1 in the sub-boxes, so
    the levels above see a shorter span (and a larger gap).
    """
    cnt = blocks.counts.copy()
    n = cnt.shape[1]
    out = np.zeros(cnt.shape, bool)
    span = blocks.runlen.copy()
    for k in range(n - 1, -1, -1):
        gap = blocks.strides[:, k] - span
        out[:, k] = (cnt[:, k] > 1) & (gap >= window)
        cnt[out[:, k], k] = 1
        span = (cnt[:, k] - 1) * blocks.strides[:, k] + span
    return out


def explode(blocks: Blocks, owner: I64, levels: npt.NDArray[np.bool_]) -> tuple[Blocks, I64]:
    """Split boxes into one sub-box per item of the marked levels (vectorised).

    Only the levels that keep a count above 1 are copied to the sub-boxes, and the
    mixed-radix digits are taken only for levels some box explodes.
    """
    ecount = np.where(levels, blocks.counts, 1)
    nsub = np.prod(ecount, axis=1)
    rep = np.repeat(np.arange(len(blocks)), nsub)
    start = np.concatenate(([0], np.cumsum(nsub)[:-1]))
    local = np.arange(len(rep), dtype=np.int64) - start[rep]
    base = blocks.base[rep]
    for k in np.flatnonzero(levels.any(axis=0))[::-1].tolist():
        local, digit = np.divmod(local, ecount[:, k][rep])
        base += digit * blocks.strides[:, k][rep]
    rest = np.where(levels, 1, blocks.counts)
    keep = (rest != 1).any(axis=0)
    if not keep.any():
        keep[-1] = True
    sub = Blocks(
        base, blocks.mem[rep], rest[:, keep][rep], blocks.strides[:, keep][rep],
        blocks.mstrides[:, keep][rep], blocks.runlen[rep],
    )  # fmt: skip
    return sub, owner[rep]


def max_gap(blocks: Blocks) -> I64:
    """Largest gap between consecutive runs of each box (0 for one run)."""
    span = _spans(blocks.counts, blocks.strides, blocks.runlen)
    gap = blocks.strides - span[:, 1:]
    out: I64 = np.where(blocks.counts > 1, gap, 0).max(axis=1, initial=0)
    return out
