"""Nested strided boxes: the structure layouts keep, like MPI datatypes do.

A :class:`Blocks` is a batch of boxes.  Box ``b`` holds the bytes::

    base[b] + sum_k i_k * strides[b, k] + [0, runlen[b])     for 0 <= i_k < counts[b, k]

and stores them in memory at ``mem[b] + sum_k i_k * mstrides[b, k]``.  Strides are
*nested* (each level's items lie inside one item of the level above), so the
bytes of a box that fall below a file offset can be counted by arithmetic
(:func:`count_below`) without listing runs, which is what lets the planner
simulate 65,536 ranks.  :func:`flatten` lists the runs for real I/O.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from ..runs import Runs, merge, sort

__all__ = ["Blocks", "count_below", "flatten"]

I64 = npt.NDArray[np.int64]


@dataclasses.dataclass(frozen=True, slots=True)
class Blocks:
    """A batch of nested strided byte boxes (see module docstring)."""

    base: I64
    mem: I64
    counts: I64
    strides: I64
    mstrides: I64
    runlen: I64

    @classmethod
    def build(
        cls,
        base: object,
        mem: object,
        counts: object,
        strides: object,
        mstrides: object,
        runlen: object,
    ) -> Blocks:
        """Normalise: 2-D arrays, empty boxes dropped, strides of count-1 levels nested."""
        base_a = np.atleast_1d(np.asarray(base, np.int64))
        cnt = np.atleast_2d(np.asarray(counts, np.int64))
        st = np.atleast_2d(np.asarray(strides, np.int64)).copy()
        mst = np.atleast_2d(np.asarray(mstrides, np.int64))
        mem_a = np.atleast_1d(np.asarray(mem, np.int64))
        rl = np.atleast_1d(np.asarray(runlen, np.int64))
        keep = (rl > 0) & (cnt > 0).all(axis=1)
        base_a, mem_a, cnt, st, mst, rl = (
            base_a[keep],
            mem_a[keep],
            cnt[keep],
            st[keep],
            mst[keep],
            rl[keep],
        )
        # absorb innermost levels that continue the run in both file and memory
        rl = rl.copy()
        cnt = cnt.copy()
        open_ = np.ones(len(rl), bool)
        for k in range(cnt.shape[1] - 1, -1, -1):
            absorb = open_ & (((st[:, k] == rl) & (mst[:, k] == rl)) | (cnt[:, k] == 1))
            rl[absorb] *= cnt[absorb, k]
            cnt[absorb, k] = 1
            open_ = absorb
        # span of the levels below k; a count-1 level gets stride = that span
        span = rl.copy()
        for k in range(cnt.shape[1] - 1, -1, -1):
            one = cnt[:, k] == 1
            st[one, k] = np.maximum(span[one], 1)
            span = (cnt[:, k] - 1) * st[:, k] + span
        return cls(base_a, mem_a, cnt, st, np.ascontiguousarray(mst), rl)

    @property
    def ndim(self) -> int:
        return int(self.counts.shape[1])

    def __len__(self) -> int:
        return len(self.base)

    def nbytes(self) -> I64:
        """Bytes in each box."""
        out: I64 = np.prod(self.counts, axis=1) * self.runlen
        return out

    def nruns(self) -> I64:
        """Runs in each box before merging."""
        out: I64 = np.prod(self.counts, axis=1)
        return out

    def extent(self) -> tuple[I64, I64]:
        """First byte and end of each box."""
        last = self.base + ((self.counts - 1) * self.strides).sum(axis=1) + self.runlen
        return self.base, last


def count_below(blocks: Blocks, which: npt.NDArray[np.intp], x: I64) -> I64:
    """Bytes of box ``which[j]`` that lie below file offset ``x[j]``, for every j.

    Vectorised over j; the cost is O(len(x) * ndim) numpy work and no listing of runs.
    """
    rel = x - blocks.base[which]
    cnt = blocks.counts[which]
    st = blocks.strides[which]
    rl = blocks.runlen[which]
    # bytes in one item of level k = prod(counts[k+1:]) * runlen
    inner = np.empty_like(cnt)
    acc = rl.copy()
    for k in range(cnt.shape[1] - 1, -1, -1):
        inner[:, k] = acc
        acc = acc * cnt[:, k]
    result = np.zeros(len(x), np.int64)
    alive = np.ones(len(x), bool)
    for k in range(cnt.shape[1]):
        q = np.floor_divide(rel, st[:, k])
        qc = np.clip(q, 0, cnt[:, k])
        result += np.where(alive, qc * inner[:, k], 0)
        alive &= (q >= 0) & (q < cnt[:, k])
        rel = rel - q * st[:, k]
    result += np.where(alive, np.clip(rel, 0, rl), 0)
    return result


def _box_offsets(base: int, counts: I64, strides: I64) -> I64:
    """All run starts of one box, in nested (file) order."""
    off = np.array([base], np.int64)
    for c, s in zip(counts.tolist(), strides.tolist(), strict=True):
        off = (off[:, None] + np.arange(c, dtype=np.int64) * s).reshape(-1)
    return off


def flatten(blocks: Blocks) -> Runs:
    """List the runs of all boxes, sorted by file offset and merged.

    The loop is per box (a layout has at most 2**ndim of them), never per run.
    """
    files: list[I64] = []
    mems: list[I64] = []
    lens: list[I64] = []
    for b in range(len(blocks)):
        f = _box_offsets(int(blocks.base[b]), blocks.counts[b], blocks.strides[b])
        m = _box_offsets(int(blocks.mem[b]), blocks.counts[b], blocks.mstrides[b])
        files.append(f)
        mems.append(m)
        lens.append(np.full(len(f), blocks.runlen[b], np.int64))
    if not files:
        return Runs.empty()
    runs = Runs(np.concatenate(files), np.concatenate(lens), np.concatenate(mems))
    return merge(sort(runs))
