"""Packing equal runs with numpy before a send (collio.exchange.pack_uniform)."""

from __future__ import annotations

import numpy as np
import pytest

from collio.exchange import pack_uniform


def _reference(buf, offsets, length):
    return np.concatenate([buf[o : o + length] for o in offsets.tolist()])


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("length", [1, 8, 512, 3000])
def test_pack_uniform_matches_slicing(aligned, length):
    rng = np.random.default_rng(length)
    buf = rng.integers(0, 256, 64 * 4096 + 777, dtype=np.uint8)
    n = 40
    if aligned:  # multiples of the run length from the first one (a numpy take)
        rows = rng.choice((len(buf) - 100) // length - 1, n, replace=False)
        offsets = 100 + rows.astype(np.int64) * length
    else:  # anywhere (a sliding-window gather)
        offsets = rng.choice(len(buf) - length, n, replace=False).astype(np.int64)
        offsets[1] = offsets[0] + 1  # overlapping reads are fine for a send
    out = np.full(n * length + 16, 0xEE, np.uint8)
    got = pack_uniform(buf, offsets, length, out)
    np.testing.assert_array_equal(got, _reference(buf, offsets, length))
    assert got.base is out or np.shares_memory(got, out)  # packed in place, no new buffer
    assert (out[n * length :] == 0xEE).all()  # nothing written past the runs
