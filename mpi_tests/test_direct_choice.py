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


def test_extents_moving_alike_keep_the_answer(comm, mpi_tmp_path, monkeypatch):
    """A time series (every rank's extent moves by the same shift, widths kept) reuses
    the answer without comparing extents again; a rank moving otherwise, or changing its
    width, makes the ranks compare again, and the choice follows."""
    import collio.choose

    compared = []
    real = collio.choose._disjoint
    monkeypatch.setattr(collio.choose, "_disjoint", lambda *a: compared.append(1) or real(*a))
    path = str(mpi_tmp_path / "series.bin")
    p, r = comm.size, comm.rank
    hints = {"mapped_reads": "disable"}
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        for step in range(5):  # chunks (3r, 3r + 2) of step's 3p chunks: disjoint
            base = step * 3 * p * K
            chunks = [3 * r, 3 * r + 2]
            lay = layouts.Segments([base + c * K for c in chunks], [K, K])
            f.write_all(np.full(2 * K, step + r, np.uint8), lay)
            assert f.stats.last_call["direct"]
        assert len(compared) == 1  # only the first call compared
        last = r == p - 1
        # the last rank reaches back into rank 0's gap (interleaved on 2+ ranks)
        chunks = [1, 3 * r + 2] if last else [3 * r, 3 * r + 2]
        lay = layouts.Segments([5 * 3 * p * K + c * K for c in chunks], [K, K])
        f.write_all(np.full(2 * K, 9, np.uint8), lay)
        assert f.stats.last_call["direct"] is (p == 1) and len(compared) == 2
        # the last rank's width changes again (on one rank: as wide as before, moved)
        chunks = [3 * r, 3 * r + (1 if last else 2)]
        lay = layouts.Segments([6 * 3 * p * K + c * K for c in chunks], [K, K])
        f.write_all(np.full(2 * K, 7, np.uint8), lay)
        assert f.stats.last_call["direct"] and len(compared) == (3 if p > 1 else 2)
    comm.Barrier()
    got = np.fromfile(path, np.uint8)
    for step in range(5):
        for rr in range(p):
            for c in (3 * rr, 3 * rr + 2):
                at = step * 3 * p * K + c * K
                assert (got[at : at + K] == step + rr).all()
