"""The two-level stage's local copies (collio.shmstage.copy_runs, copy_blocks) against a copy
run by run."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

from collio.shmstage import MAX_BLOCKS, NUMPY_LENGTHS, SPAN_RUNS, blocks, copy_blocks, copy_runs


def _places(rng: np.random.Generator, length: np.ndarray, together: int) -> np.ndarray:
    """Offsets for runs of ``length``: one after another (1), apart in a shuffled order
    (0), or in order in a few spans of runs one after another, apart (2)."""
    n = len(length)
    order = np.arange(n) if together else rng.permutation(n)
    gaps = np.zeros(n, np.int64) if together else rng.integers(0, 9, n)
    if together == 2:  # (a gap before a few runs: where a span starts)
        gaps[rng.choice(n, int(rng.integers(1, 5)), replace=False)] = rng.integers(1, 99)
    start = np.concatenate(([0], np.cumsum(length[order] + gaps)[:-1])) + int(rng.integers(0, 5))
    out = np.empty(n, np.int64)
    out[order] = start
    return out


LENGTHS = {
    "one length": lambda rng, n: np.full(n, int(rng.integers(1, 20)), np.int64),
    "whole rows": lambda rng, n: np.full(n, 8, np.int64),
    "two lengths": lambda rng, n: rng.choice([8, 24], n).astype(np.int64),
    "many lengths (MPI)": lambda rng, n: rng.permutation(np.arange(1, n + 1)).astype(np.int64),
}


def _whole(rng: np.random.Generator, n: int, together: int) -> np.ndarray:
    """Row numbers for ``n`` runs of whole rows: shuffled (0), or a few spans (2)."""
    if together == 0:
        return rng.permutation(n)
    return np.arange(n) + np.cumsum(rng.random(n) < 0.02) * int(rng.integers(1, 5))


@pytest.mark.parametrize("kind", list(LENGTHS))
@pytest.mark.parametrize(
    ("src_together", "dst_together"), [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (0, 2), (2, 2)]
)
def test_copy_runs_equals_a_copy_run_by_run(kind, src_together, dst_together):
    rng = np.random.default_rng([len(kind), src_together, dst_together])
    spans = 2 in (src_together, dst_together)  # (enough runs for a span's copy: see _spans)
    for _ in range(20):
        lo, hi = (4 * SPAN_RUNS, 12 * SPAN_RUNS) if spans else (1, 3 * NUMPY_LENGTHS)
        n = int(rng.integers(lo, hi))
        length = LENGTHS[kind](rng, n)
        soff, doff = _places(rng, length, src_together), _places(rng, length, dst_together)
        pad = int(rng.integers(1, 9))
        if kind == "whole rows":  # (runs apart on whole rows of buffers of whole rows)
            soff = 16 * _whole(rng, n, src_together) if src_together != 1 else soff
            doff = 16 * _whole(rng, n, dst_together) if dst_together != 1 else doff
            pad = 16
        src = rng.integers(0, 256, int((soff + length).max()) + pad).astype(np.uint8)
        dst = np.zeros(int((doff + length).max()) + pad, np.uint8)
        want = dst.copy()
        for s, d, ln in zip(soff.tolist(), doff.tolist(), length.tolist(), strict=True):
            want[d : d + ln] = src[s : s + ln]
        copy_runs(src, soff, dst, doff, length, MPI.COMM_SELF)
        np.testing.assert_array_equal(dst, want)


def test_runs_off_the_rows_of_their_buffer_copy_in_memory_of_their_size():
    """Runs of one length that are not whole rows of the source (uneven column blocks:
    a row's piece of 2736 bytes in a buffer of 2728-byte rows), copied into a few spans
    of the staging: the copy holds at most about the runs' bytes besides the buffers, not
    a run's bytes at every byte of the source (gigabytes for a 1024 x 1024 column block)."""
    size, n = 100, 300
    soff = np.arange(n, dtype=np.int64) * 3 * size + 7  # (apart, and off any row of size)
    doff = np.arange(n, dtype=np.int64) * size  # (one span)
    length = np.full(n, size, np.int64)
    src = np.random.default_rng(3).integers(0, 256, int(soff[-1]) + size + 5).astype(np.uint8)
    dst = np.zeros(n * size, np.uint8)
    tracemalloc.start()
    try:
        copy_runs(src, soff, dst, doff, length, MPI.COMM_SELF)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    want = np.concatenate([src[s : s + size] for s in soff.tolist()])
    np.testing.assert_array_equal(dst, want)
    # (the overlapping rows of the source hold len(src) x size bytes: 9 MB here)
    assert peak < 4 * n * size, peak


def _progressions(rng: np.random.Generator, n: int, slot: bool) -> tuple[np.ndarray, np.ndarray]:
    """Lengths and offsets of ``n`` pieces as a rank's pieces of a round tend to be: a few
    arithmetic progressions of equal pieces (a column block's rows of each domain, one
    step in the buffer and another in the slot), some of one piece, and a step now and
    then that goes back or overlaps (every break :func:`blocks` knows)."""
    length = np.empty(n, np.int64)
    off = np.empty(n, np.int64)
    at, i = int(rng.integers(0, 5)), 0
    while i < n:
        c = min(n - i, int(rng.integers(1, 40)))
        ln = int(rng.integers(1, 24))
        step = ln + int(rng.integers(0, 3)) * int(rng.integers(0, 30))
        length[i : i + c] = ln
        off[i : i + c] = at + step * np.arange(c)
        at += step * c + int(rng.integers(0, 50))
        i += c
    if not slot and n > 2:  # (the buffer's side in another order: steps that go back)
        swap = rng.choice(n, 2, replace=False)
        off[swap] = off[swap[::-1]]
        length[swap] = length[swap[::-1]]
    return length, off


@pytest.mark.parametrize("seed", range(6))
def test_copy_blocks_equals_a_copy_run_by_run(seed):
    """Every round's blocks copy what a copy run by run does, into the slot and back out,
    for rounds of pieces in a few progressions, empty rounds, and rounds of more blocks
    than a round copies in blocks (those say so; the stage copies them run by run)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 120, 6)
    counts[int(rng.integers(0, 6))] = 0  # (a round without pieces)
    starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    mem, pos, length = [], [], []
    for c in counts.tolist():  # (each round's pieces from 0 of its slot)
        ln, p = _progressions(rng, c, slot=True)
        perm = rng.permutation(c)
        m = np.empty(c, np.int64)  # (the same pieces' places in the buffer: apart, any order)
        m[perm] = np.concatenate(([0], np.cumsum(ln[perm] + rng.integers(0, 3, c))[:-1]))
        base = sum(int(x.sum()) * 2 for x in length) + 1000 * len(length)
        mem.append(m + base), pos.append(p), length.append(ln)
    mem_, pos_, length_ = (np.concatenate(x).astype(np.int64) for x in (mem, pos, length))
    # (steps of 2 and 3 bytes in turn: a block of one piece each)
    many = np.concatenate(([0], np.cumsum(np.arange(3 * MAX_BLOCKS) % 2 + 2))).astype(np.int64)
    tests = [(mem_, pos_, length_, starts)]
    tests.append((many * 3, many, np.ones(len(many), np.int64), np.array([0, len(many)])))
    for m, p, ln, st in tests:
        bl = blocks(m, p, ln, st)
        buf = rng.integers(0, 256, int((m + ln).max(initial=0)) + 8).astype(np.uint8)
        for k in range(len(st) - 1):
            sl = slice(int(st[k]), int(st[k + 1]))
            if not bl.whole[k]:
                assert int(bl.first[k + 1] - bl.first[k]) > MAX_BLOCKS
                continue
            size = int((p[sl] + ln[sl]).max(initial=0)) + 8
            slot, want = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
            for a, b, n in zip(m[sl].tolist(), p[sl].tolist(), ln[sl].tolist(), strict=True):
                want[b : b + n] = buf[a : a + n]
            copy_blocks(bl, k, buf, slot, into_slot=True)
            np.testing.assert_array_equal(slot, want)
            back, got = np.zeros_like(buf), np.zeros_like(buf)
            for a, b, n in zip(m[sl].tolist(), p[sl].tolist(), ln[sl].tolist(), strict=True):
                back[a : a + n] = slot[b : b + n]
            copy_blocks(bl, k, got, slot, into_slot=False)
            np.testing.assert_array_equal(got, back)
        # (the progressions are few blocks: the copies above were not a block per piece)
        assert int(bl.count.sum()) == len(m) and len(bl.count) <= len(m)
    assert bool(blocks(mem_, pos_, length_, starts).whole.any())
    assert not bool(blocks(*tests[1][:3], tests[1][3]).whole[0])
