"""A repeated call's sums added as kept (Stats.again) leave the totals that adding them
anew leaves.  Local, no MPI."""

from __future__ import annotations

import numpy as np

from collio.stats import BUCKET_NAMES, SUMS, Stats


def _sums(seed: int, *, reads: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n, nb = len(SUMS), len(BUCKET_NAMES)
    out = rng.integers(0, 1000, n + 2 * nb).astype(np.int64)
    out[rng.integers(0, n, 4)] = 0  # (a call moves a few counters)
    if not reads:
        out[n + nb :] = 0
    return out


def test_sums_added_as_kept_equal_sums_added_anew():
    for seed in range(6):
        sums = _sums(seed, reads=seed % 2 == 0)
        maxes = np.array([3.0, 0.25, 0.0, 1.5, 2.0])
        anew, kept = Stats(), Stats()
        again = Stats.again(sums)
        for _ in range(3):
            anew.absorb(sums, maxes)
            kept.absorb(sums, maxes, again)
        a, k = anew.as_dict(), kept.as_dict()
        assert a == k
        assert a["bytes_written"] == 3 * int(sums[0])
        assert a["rounds"] == 3
        assert k["write_size_histogram"] == dict(
            zip(BUCKET_NAMES, (3 * sums[len(SUMS) : len(SUMS) + len(BUCKET_NAMES)]).tolist(),
                strict=True)
        )  # fmt: skip
