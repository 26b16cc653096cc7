"""A plan's message groups as buffer shapes (collio.exchange.group_shapes and friends).

The shapes are checked against the runs they stand for: the group's kind from a
Python reading of the runs, and the bytes MPI moves with the shape's buffer spec
(a message from this process to itself) against numpy slicing of the runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from collio.exchange import (
    CONTIG,
    OTHER,
    VECTOR,
    Messages,
    group_shapes,
    pack_vector,
)


def _kind(off, ln):
    """The shape of one group's runs, read run by run (the reference)."""
    off, ln = off.tolist(), ln.tolist()
    if all(off[i + 1] == off[i] + ln[i] for i in range(len(off) - 1)):
        return CONTIG
    steps = {off[i + 1] - off[i] for i in range(len(off) - 1)}
    if len(set(ln)) == 1 and len(steps) == 1 and min(steps) >= ln[0]:
        return VECTOR
    return OTHER


def _groups(seed):
    """Groups of every kind one after another, with empty groups between some."""
    rng = np.random.default_rng(seed)
    offs, lens, gstart = [], [], [0]
    pos = 0
    for i in range(60):
        what = i % 7
        n = int(rng.integers(1, 9))
        block = int(rng.integers(1, 600))
        if what == 0:  # contiguous runs of different sizes
            ln = rng.integers(1, 600, n)
            off = pos + np.concatenate(([0], np.cumsum(ln)[:-1]))
        elif what == 1:  # a vector
            stride = block + int(rng.integers(1, 900))
            off, ln = pos + stride * np.arange(n), np.full(n, block)
        elif what == 2:  # equal runs, uneven gaps
            gaps = rng.integers(1, 50, n)
            off, ln = pos + np.cumsum(block + gaps) - block - gaps[0], np.full(n, block)
        elif what == 3:  # a vector but one run shorter
            off, ln = pos + 1000 * np.arange(n), np.full(n, block)
            ln[-1] = max(1, block - 1) if n > 1 else ln[-1]
        elif what == 4:  # descending (memory order of a transposed piece)
            off, ln = pos + 700 * np.arange(n)[::-1], np.full(n, block % 700 + 1)
        elif what == 5:  # equal runs that overlap (a send may read a byte twice)
            off, ln = pos + 10 * np.arange(n), np.full(n, 40)
        else:  # nothing in this group
            off, ln = np.zeros(0, np.int64), np.zeros(0, np.int64)
        offs.append(np.asarray(off, np.int64))
        lens.append(np.asarray(ln, np.int64))
        gstart.append(gstart[-1] + len(off))
        pos = int(max(pos, (off + ln).max() if len(off) else pos)) + int(rng.integers(0, 3000))
    return np.concatenate(offs), np.concatenate(lens), np.array(gstart, np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_group_shapes_match_a_run_by_run_reading(seed):
    off, ln, gstart = _groups(seed)
    sh = group_shapes(off, ln, gstart)
    for g in range(len(gstart) - 1):
        s, e = int(gstart[g]), int(gstart[g + 1])
        assert sh.count[g] == e - s
        assert sh.total[g] == ln[s:e].sum()
        if e == s:
            continue
        assert sh.first[g] == off[s]
        assert sh.kind[g] == _kind(off[s:e], ln[s:e]), (g, off[s:e], ln[s:e])
        if sh.kind[g] == VECTOR:
            assert (sh.block[g], sh.stride[g]) == (ln[s], off[s + 1] - off[s])
    kinds = set(sh.kind.tolist())
    assert kinds == {CONTIG, VECTOR, OTHER}  # the cases above reach all three


def test_group_shapes_of_no_runs():
    z = np.zeros(0, np.int64)
    sh = group_shapes(z, z, np.zeros(3, np.int64))
    assert sh.count.tolist() == [0, 0] and sh.total.tolist() == [0, 0]


def _gather(buf, off, ln):
    return np.concatenate([buf[o : o + n] for o, n in zip(off.tolist(), ln.tolist(), strict=True)])


@pytest.mark.parametrize("pack", [False, True])
def test_send_group_moves_the_runs_bytes(pack):
    """A message to this process from each group's shape carries its runs' bytes."""
    off, ln, gstart = _groups(11)
    base = 5
    buf = np.random.default_rng(3).integers(0, 256, int((off + ln).max()) + 64, np.uint8)
    sh = group_shapes(off + base, ln, gstart)  # offsets seen from `base` bytes earlier
    comm = MPI.COMM_SELF
    for g in range(len(gstart) - 1):
        s, e = int(gstart[g]), int(gstart[g + 1])
        if e == s:
            continue
        want = _gather(buf, off[s:e], ln[s:e])
        got = np.zeros(len(want), np.uint8)
        msgs = Messages(comm, 3)
        scratch = np.zeros(1 << 16, np.uint8) if pack else None
        runs = (off[s:e], ln[s:e])
        used = msgs.send_group(0, buf, sh, g, base, lambda r=runs: r, scratch)
        if pack and sh.kind[g] == VECTOR and sh.block[g] <= 4096:
            assert used == len(want)  # packed with numpy, sent as one slice
        assert used in (0, len(want) if pack else 0)
        comm.Recv([got, MPI.BYTE], 0, 3)
        msgs.wait()
        np.testing.assert_array_equal(got, want)


def test_recv_group_puts_each_byte_at_its_run():
    off, ln, gstart = _groups(12)
    size = int((off + ln).max()) + 64
    sh = group_shapes(off, ln, gstart)
    comm = MPI.COMM_SELF
    for g in range(len(gstart) - 1):
        s, e = int(gstart[g]), int(gstart[g + 1])
        if e == s or len(np.unique(off[s:e])) < e - s:
            continue
        if (off[s + 1 : e] < (off + ln)[s : e - 1]).any():
            continue  # overlapping runs: receiving into them is erroneous MPI
        data = np.arange(int(ln[s:e].sum()), dtype=np.int64).astype(np.uint8) + 1
        want = np.zeros(size, np.uint8)
        pos = 0
        for o, n in zip(off[s:e].tolist(), ln[s:e].tolist(), strict=True):
            want[o : o + n] = data[pos : pos + n]
            pos += n
        got = np.zeros(size, np.uint8)
        msgs = Messages(comm, 4)
        runs = (off[s:e], ln[s:e])
        msgs.recv_group(0, got, sh, g, 0, lambda r=runs: r)
        comm.Send([data, MPI.BYTE], 0, 4)
        msgs.wait()
        np.testing.assert_array_equal(got, want)
        assert not msgs.types  # every datatype was freed


def test_pack_vector_refuses_runs_outside_the_buffer():
    buf = np.zeros(100, np.uint8)
    out = np.zeros(100, np.uint8)
    np.testing.assert_array_equal(pack_vector(buf, 0, 10, 5, 10, out), np.zeros(50, np.uint8))
    with pytest.raises(ValueError, match="do not fit a buffer of 100 bytes"):
        pack_vector(buf, 10, 10, 5, 10, out)  # the last run would end at 105
    with pytest.raises(ValueError):
        pack_vector(buf, 0, 3, 5, 4, out)  # overlapping runs are not a vector here
