"""The two-level stage's local copies (collio.shmstage.copy_runs) against a copy run by run."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from collio.shmstage import NUMPY_LENGTHS, copy_runs


def _places(rng: np.random.Generator, length: np.ndarray, together: bool) -> np.ndarray:
    """Offsets for runs of ``length``: one after another, or apart in a shuffled order."""
    n = len(length)
    order = np.arange(n) if together else rng.permutation(n)
    gaps = np.zeros(n, np.int64) if together else rng.integers(0, 9, n)
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


@pytest.mark.parametrize("kind", list(LENGTHS))
@pytest.mark.parametrize(("src_together", "dst_together"), [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_copy_runs_equals_a_copy_run_by_run(kind, src_together, dst_together):
    rng = np.random.default_rng([len(kind), src_together, dst_together])
    for _ in range(20):
        n = int(rng.integers(1, 3 * NUMPY_LENGTHS))
        length = LENGTHS[kind](rng, n)
        soff, doff = _places(rng, length, src_together), _places(rng, length, dst_together)
        pad = int(rng.integers(1, 9))
        if kind == "whole rows":  # (runs apart on whole rows of buffers of whole rows)
            soff = soff if src_together else 16 * rng.permutation(n)
            doff = doff if dst_together else 16 * rng.permutation(n)
            pad = 16
        src = rng.integers(0, 256, int((soff + length).max()) + pad).astype(np.uint8)
        dst = np.zeros(int((doff + length).max()) + pad, np.uint8)
        want = dst.copy()
        for s, d, ln in zip(soff.tolist(), doff.tolist(), length.tolist(), strict=True):
            want[d : d + ln] = src[s : s + ln]
        copy_runs(src, soff, dst, doff, length, MPI.COMM_SELF)
        np.testing.assert_array_equal(dst, want)
