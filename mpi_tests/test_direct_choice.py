"""The direct path (no shuffle) is taken exactly when no two ranks' extents interleave.

The ranks compare extents (an allgather) only when some rank's extent moved since the
last comparison on the file; otherwise they reuse that answer.  Each call below moves
or keeps one rank's extent, and checks the choice (``f.stats.last_call["direct"]``,
against the extents gathered here) and the bytes, in the file and read back.
"""

from __future__ import annotations

import numpy as np
import pytest

import collio
from collio import layouts

pytestmark = pytest.mark.mpi(min_size=1)
K = 1024  # bytes per chunk


def _chunks(comm, moved: bool) -> list[int]:
    """This rank's chunks of a file of 3p chunks: 3r and 3r + 2 (a gap between), or,
    for the last rank when ``moved``, chunk 1 (in rank 0's gap) and its own 3r + 2: then
    its extent reaches into rank 0's (interleaved on 2+ ranks), no byte written twice."""
    r, p = comm.rank, comm.size
    if moved and r == p - 1:
        return [1, 3 * r + 2]
    return [3 * r, 3 * r + 2]


def _disjoint(extents: list[tuple[int, int]]) -> bool:
    ext = sorted(e for e in extents if e[1] > e[0])
    return all(b[0] >= a[1] for a, b in zip(ext, ext[1:], strict=False))


def test_direct_choice_follows_the_extents(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    p = comm.size
    rng = np.random.default_rng(7)
    want = np.zeros(3 * p * K, np.uint8)
    plan = [False, False, True, True, False, True]  # the last rank moved, call by call
    seen = []
    # (reads on a local file system would go direct whatever the extents: mapped_reads)
    with collio.open(path, "w", comm=comm, hints={"mapped_reads": "disable"}) as f:
        for it, moved in enumerate(plan):
            chunks = _chunks(comm, moved)
            lay = layouts.Segments([c * K for c in chunks], [K] * len(chunks))
            every = comm.allgather(chunks)
            fresh = rng.integers(0, 256, (p, 2 * K), dtype=np.uint8)  # same on every rank
            for r, cs in enumerate(every):
                for j, c in enumerate(cs):
                    want[c * K : (c + 1) * K] = fresh[r, j * K : (j + 1) * K]
            f.write_all(fresh[comm.rank], lay)
            extents = [(min(cs) * K, (max(cs) + 1) * K) for cs in every]
            expect = _disjoint(extents)
            seen.append(expect)
            assert f.stats.last_call["direct"] is expect, (it, moved, extents)
            comm.Barrier()
            np.testing.assert_array_equal(np.fromfile(path, np.uint8), want)
            comm.Barrier()
            got = f.read_all(lay)
            assert f.stats.last_call["direct"] is expect, (it, moved, extents)
            np.testing.assert_array_equal(got, fresh[comm.rank])
    # on 2+ ranks both answers came up, each right after the other: a stale one shows
    assert seen == ([True, True, False, False, True, False] if p > 1 else [True] * 6)
