"""The chunk-major byte space (pure, no MPI, no zarr): checked against brute force."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from collio import layouts
from collio.backends.chunkspace import ChunkSpace, covered_below
from collio.runs import Runs


def brute_map(space: ChunkSpace, lay: layouts.ArrayLayout) -> dict[int, int]:
    """Virtual byte of every element -> its byte in the rank's buffer, one element at a time."""
    idx = [d.indices() for d in lay.dims]
    lshape = tuple(len(i) for i in idx)
    flip = space.order == "F"
    out = {}
    for lpos in itertools.product(*[range(n) for n in lshape]):
        gi = [int(idx[k][p]) for k, p in enumerate(lpos)]
        q = [g // u for g, u in zip(gi, space.unit, strict=True)]
        r = [g % u for g, u in zip(gi, space.unit, strict=True)]
        if flip:
            uid = np.ravel_multi_index(q[::-1], space.grid[::-1])
            inner = np.ravel_multi_index(r[::-1], space.unit[::-1])
            mem = np.ravel_multi_index(lpos[::-1], lshape[::-1])
        else:
            uid = np.ravel_multi_index(q, space.grid)
            inner = np.ravel_multi_index(r, space.unit)
            mem = np.ravel_multi_index(lpos, lshape)
        out[int((uid * space.unit_items + inner) * space.itemsize)] = int(mem * space.itemsize)
    return out


@st.composite
def cases(draw):
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 11), min_size=nd, max_size=nd)))
    unit = tuple(draw(st.lists(st.integers(1, 5), min_size=nd, max_size=nd)))
    order = draw(st.sampled_from("CF"))
    dtype = draw(st.sampled_from(["u1", "<i4", "<f8"]))
    if draw(st.booleans()):
        start = [draw(st.integers(0, s - 1)) for s in shape]
        ext = [draw(st.integers(0, s - b)) for s, b in zip(shape, start, strict=True)]
        lay = layouts.Subarray(shape, start, ext, dtype, order=order)
    else:
        grid = tuple(draw(st.lists(st.integers(1, 2), min_size=nd, max_size=nd)))
        size = int(np.prod(grid))
        blk = tuple(draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd)))
        lay = layouts.block_cyclic(
            shape, dtype, block=blk, grid=grid, rank=draw(st.integers(0, size - 1)), size=size,
            order=order,
        )  # fmt: skip
    return ChunkSpace(shape, unit, np.dtype(dtype).itemsize, order), lay


@given(cases())
def test_runs_match_brute_force(case):
    space, lay = case
    runs = space.runs(lay.dims)
    got = {}
    for f, n, m in zip(runs.file.tolist(), runs.length.tolist(), runs.mem.tolist(), strict=True):
        for k in range(0, n, space.itemsize):
            got[f + k] = m + k
    assert got == brute_map(space, lay)
    assert runs.nbytes == lay.nbytes
    assert (np.diff(runs.file) > 0).all()
    assert (runs.file + runs.length <= space.nbytes).all()


@given(cases())
def test_parts_rebuild_the_piece_unit_by_unit(case):
    """What the plain-library baselines do: store each unit's part with one assignment
    (or a read-merge-write); brute force over the global array."""
    space, lay = case
    glob = np.arange(int(np.prod(space.shape))).reshape(space.shape)
    piece = glob[np.ix_(*(d.indices() for d in lay.dims))]
    owner = np.zeros(space.shape, bool)
    owner[np.ix_(*(d.indices() for d in lay.dims))] = True
    rebuilt = np.full(space.shape, -1)
    parts = space.parts(lay.dims)
    for p in parts:
        block = rebuilt[p.region]
        block[
            np.ix_(*(np.arange(i.start, i.stop) if isinstance(i, slice) else i for i in p.inner))
        ] = piece[p.local]
        assert p.full == bool(owner[p.region].all())
        assert p.coords == tuple(r.start // u for r, u in zip(p.region, space.unit, strict=True))
    np.testing.assert_array_equal(rebuilt[owner], glob[owner])
    assert (rebuilt[~owner] == -1).all()
    ids = space.touched_by(lay.dims)
    units = {
        tuple(int(g) // u for g, u in zip(pos, space.unit, strict=True))
        for pos in zip(*np.nonzero(owner), strict=True)
    }
    assert sorted(p.coords for p in parts) == sorted(units)
    assert sorted(map(tuple, np.stack(space.coords(ids), axis=1).tolist())) == sorted(units)
    whole = all(owner[space.region(u)].all() for u in ids.tolist())
    assert (space.misaligned(lay.dims) is None) == whole
    for u in ids.tolist():
        assert space.unit_at([r.start for r in space.region(u)]) == u


def test_runs_are_cut_at_chunk_edges_only():
    # a 2 x 2 rank block of 1000 x 1000 split at 333 over 100 x 100 chunks
    space = ChunkSpace((1000, 1000), (100, 100), 8)
    lay = layouts.Subarray((1000, 1000), (0, 333), (333, 667), "<f8")
    runs = space.runs(lay.dims)
    # per row: a 67-column piece, then six whole chunk rows of 100 columns, then 0
    assert len(runs) == 333 * 7
    assert sorted(set((runs.length // 8).tolist())) == [67, 100]


@given(cases())
def test_views_and_extents_cover_the_array_once(case):
    space, _ = case
    seen = np.zeros(space.shape, np.int64)
    ids = np.arange(space.nunits, dtype=np.int64)
    ext = space.extents(ids)
    for u in ids.tolist():
        reg = space.region(u)
        assert tuple(r.stop - r.start for r in reg) == tuple(ext[u])
        seen[reg] += 1
    assert (seen == 1).all()
    assert space.valid_nbytes(ids).sum() == int(np.prod(space.shape)) * space.itemsize


def test_view_places_elements_in_layout_order():
    for order in "CF":
        space = ChunkSpace((5, 7), (2, 3), 8, order)
        glob = np.arange(35.0).reshape(5, 7)
        raw = np.zeros(space.nbytes, np.uint8)
        lay = layouts.Subarray((5, 7), (0, 0), (5, 7), "<f8", order=order)
        runs = space.runs(lay.dims)
        src = (np.asfortranarray(glob).T if order == "F" else glob).reshape(-1).view(np.uint8)
        triples = zip(runs.file.tolist(), runs.length.tolist(), runs.mem.tolist(), strict=True)
        for f, n, m in triples:
            raw[f : f + n] = src[m : m + n]
        for u in range(space.nunits):
            ub = space.unit_nbytes
            view = space.view(raw[u * ub : (u + 1) * ub], "<f8", u)
            np.testing.assert_array_equal(view, glob[space.region(u)])


def test_touched_units_and_boxes():
    space = ChunkSpace((10, 12), (4, 5), 8)
    lay = layouts.Subarray((10, 12), (2, 5), (6, 5), "<f8")
    ids, got = space.touched(space.runs(lay.dims))
    assert ids.tolist() == [1, 4] and got.tolist() == [2 * 5 * 8, 4 * 5 * 8]
    boxes = space.boxes(lay.dims, ids)
    assert boxes == [
        ((slice(2, 4), slice(5, 10)), (slice(0, 2), slice(0, 5))),
        ((slice(4, 8), slice(5, 10)), (slice(2, 6), slice(0, 5))),
    ]
    # two blocks of a cyclic rank inside one chunk are not one box
    cyc = layouts.block_cyclic((10, 12), "<f8", block=(1, 5), grid=(2, 1), rank=0, size=2)
    ids, _ = space.touched(space.runs(cyc.dims))
    assert space.boxes(cyc.dims, ids) is None


def test_unit_bytes_counts_covered_bytes_per_unit():
    space = ChunkSpace((10,), (4,), 1)  # units [0,4) [4,8) [8,12) with 2 padding bytes
    runs = Runs(np.array([1, 4, 9]), np.array([2, 4, 1]), np.zeros(3, np.int64))
    ids, got = space.unit_bytes(0, 12, runs)
    assert ids.tolist() == [0, 1, 2] and got.tolist() == [2, 4, 1]
    assert space.valid_nbytes(ids).tolist() == [4, 4, 2]
    ids, got = space.unit_bytes(4, 8, runs)
    assert ids.tolist() == [1, 2] and got.tolist() == [4, 1]


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 6)), max_size=12),
    st.lists(st.integers(0, 70), max_size=10),
)
def test_covered_below_matches_brute_force(pieces, xs):
    mask = np.zeros(80, bool)
    for a, n in pieces:
        mask[a : a + n] = True
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    starts, ends = edges[0::2], edges[1::2]
    runs = Runs(starts.astype(np.int64), (ends - starts).astype(np.int64), starts.astype(np.int64))
    x = np.array(xs, np.int64)
    assert covered_below(runs, x).tolist() == [int(mask[:v].sum()) for v in xs]


def test_domains_balance_real_bytes_of_padded_edge_units():
    # 1000 x 1000 in 300 x 300 chunks: the last chunk row holds a third of a full row
    space = ChunkSpace((1000, 1000), (300, 300), 8)
    ub = space.unit_nbytes
    bounds = space.domain_bounds(0, space.nbytes, 4, ub)
    assert (bounds % ub == 0).all() and bounds[0] == 0 and bounds[-1] == space.nbytes
    real = [d["nbytes"] for d in space.assignment(bounds)]
    assert sum(real) == 8 * 10**6
    assert max(real) - min(real) <= space.unit_nbytes  # within one unit of even
    # even shares of the padded space would give the last aggregator a third
    even = np.arange(5) * (16 // 4) * ub
    uneven = [d["nbytes"] for d in space.assignment(even)]
    assert min(uneven) * 2.5 < max(uneven)


@given(
    st.integers(1, 40), st.integers(1, 40), st.integers(1, 9), st.integers(1, 9),
    st.integers(1, 6), st.integers(1, 3), st.data(),
)  # fmt: skip
def test_domain_bounds_are_aligned_monotone_and_cover(n0, n1, c0, c1, naggs, mult, data):
    space = ChunkSpace((n0, n1), (c0, c1), 4)
    ub = space.unit_nbytes
    a = data.draw(st.integers(0, space.nunits - 1))
    b = data.draw(st.integers(a + 1, space.nunits))
    lo, hi = space.extent(a * ub + data.draw(st.integers(0, ub - 1)), b * ub)
    bounds = space.domain_bounds(lo, hi, naggs, ub * mult)
    assert len(bounds) == naggs + 1 and bounds[0] == lo and bounds[-1] == hi
    assert (np.diff(bounds) >= 0).all()
    inner = bounds[1:-1]
    assert ((inner % (ub * mult) == 0) | (inner == lo) | (inner == hi)).all()
    assert sum(d["nbytes"] for d in space.assignment(bounds)) == int(
        space.valid_nbytes(np.arange(lo // ub, hi // ub)).sum()
    )


def test_keep_own_unless_one_rank_would_carry_too_much():
    from collio.backends.zarr.shares import keep_own

    quarter = np.array([25, 25, 25, 25])
    np.testing.assert_array_equal(keep_own(quarter, 100, 4), 0)  # aligned: no shuffle at all
    np.testing.assert_array_equal(keep_own(np.array([20] * 4), 100, 4), 5)  # 20 shared, even
    assert keep_own(np.array([4, 9, 16, 36]), 100, 4) is None  # 333/667-like skew
    assert keep_own(np.zeros(4, np.int64), 100, 4) is None  # nothing to keep
    np.testing.assert_array_equal(keep_own(np.array([100]), 100, 1), 0)  # one rank


def test_keep_own_gives_the_shared_units_to_the_least_loaded_aggregators():
    from collio.backends.zarr.shares import keep_own

    # column blocks of 1024 over chunks of 768: rank 1 touches no chunk alone
    caps = keep_own(np.array([24, 0, 24, 32]), 128, 4)
    np.testing.assert_allclose(caps, [8, 32, 8, 0])  # every rank ends at 32 (an even share)
    # water filling: the load (own + cap) is level for every aggregator that gets a share
    own = np.array([3, 17, 0, 40, 11])
    caps = keep_own(own, 120, 5, slack=10)
    assert caps is not None and abs(caps.sum() - (120 - own.sum())) < 1e-9
    load = own + caps
    np.testing.assert_allclose(load[caps > 0], load[caps > 0].max())
    assert (own[caps == 0] >= load[caps > 0].max() - 1e-9).all()
    # aggregators are not ranks 0..n-1: agg_own says what each domain's owner keeps
    caps = keep_own(np.array([0, 30, 0, 30]), 100, 2, agg_own=np.array([30, 30]))
    np.testing.assert_allclose(caps, [20, 20])
