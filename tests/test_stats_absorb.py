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


def test_counted_repeats_read_pickled_and_held_alike():
    """Repeats of kept sums are counted, not added, until the histograms are read: two
    kept sums in turn, read at some points, leave what adding each anew leaves; an array
    read earlier does not change; a pickled copy holds the whole histograms."""
    import pickle

    maxes = np.zeros(5)
    sums = {1: _sums(1, reads=True), 2: _sums(2, reads=False)}
    kept_sums = {k: Stats.again(v) for k, v in sums.items()}
    anew, kept = Stats(), Stats()
    held = []
    for i, k in enumerate([1, 1, 1, 2, 2, 1, 2, 2, 2]):
        anew.absorb(sums[k], maxes)
        kept.add_again(kept_sums[k], 0.0, 0.0)
        if i in (1, 4):
            held.append((kept.write_sizes, kept.write_sizes.copy()))
            np.testing.assert_array_equal(kept.read_sizes, anew.read_sizes)
    assert kept._again_n == 3  # (the last three: counted, not yet added)
    copy = pickle.loads(pickle.dumps(kept))
    for got in (kept, copy):
        np.testing.assert_array_equal(got.write_sizes, anew.write_sizes)
        np.testing.assert_array_equal(got.read_sizes, anew.read_sizes)
        assert got.as_dict() == anew.as_dict()
    for arr, was in held:
        np.testing.assert_array_equal(arr, was)
