"""The two-level stage's local copies (collio.shmstage.copy_runs) against a copy run by run."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

from collio.shmstage import NUMPY_LENGTHS, SPAN_RUNS, copy_runs


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
