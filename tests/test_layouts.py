"""Layouts against brute-force enumeration: runs, arithmetic counts, decompositions."""

from __future__ import annotations

import numpy as np
import pytest
from brute import byte_map, runs_map
from hypothesis import given
from hypothesis import strategies as st

import collio
from collio import layouts
from collio.layouts import count_below, numroc

dtypes = st.sampled_from(["u1", "<i2", "<f8", "<c16", "V3"])
orders = st.sampled_from(["C", "F"])


@st.composite
def boxes(draw):
    nd = draw(st.integers(0, 4))
    g = draw(st.lists(st.integers(1, 7), min_size=nd, max_size=nd))
    start = [draw(st.integers(0, x - 1)) for x in g]
    shape = [draw(st.integers(0, x - s)) for x, s in zip(g, start, strict=True)]
    return layouts.Subarray(g, start, shape, draw(dtypes), draw(orders), draw(st.integers(0, 9)))


@st.composite
def cyclics(draw):
    nd = draw(st.integers(1, 3))
    g = draw(st.lists(st.integers(1, 13), min_size=nd, max_size=nd))
    grid = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    blk = draw(st.lists(st.integers(1, 4), min_size=nd, max_size=nd))
    size = int(np.prod(grid))
    rank = draw(st.integers(0, size - 1))
    return layouts.block_cyclic(
        g, draw(dtypes), block=blk, grid=grid, rank=rank, size=size, order=draw(orders)
    )


@st.composite
def segments(draw):
    n = draw(st.integers(0, 12))
    offs = draw(st.lists(st.integers(0, 200), min_size=n, max_size=n))
    lens = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    # make them disjoint: spread offsets apart
    offs = [o * 10 for o in offs]
    if len(set(offs)) != len(offs):
        offs = list(range(0, 10 * n, 10))
    return layouts.Segments(offs, lens)


any_layout = st.one_of(boxes(), cyclics(), segments())


@given(any_layout)
def test_runs_match_enumeration(lay):
    lay.validate()
    np.testing.assert_array_equal(runs_map(lay), byte_map(lay))


@given(any_layout)
def test_runs_are_sorted_and_merged(lay):
    r = lay.runs()
    assert (r.length > 0).all()
    ends = r.file + r.length
    assert (r.file[1:] >= ends[:-1]).all()
    merged_both = (r.file[1:] == ends[:-1]) & (r.mem[1:] == (r.mem + r.length)[:-1])
    assert not merged_both.any()


@given(any_layout)
def test_kept_runs_are_read_only(lay):
    """A layout's runs serve every call (the check and a kept plan trust the same object)."""
    r = lay.runs()
    assert r is lay.runs()
    for a in (r.file, r.length, r.mem):
        with pytest.raises(ValueError, match="read-only"):
            a[...] = 0


@given(any_layout, st.data())
def test_count_below_is_arithmetic_truth(lay, data):
    b = lay.blocks()
    fb = np.sort(byte_map(lay))
    top = int(fb.max()) + 3 if len(fb) else 5
    xs = np.array(data.draw(st.lists(st.integers(-3, top), min_size=1, max_size=30)), np.int64)
    total = np.zeros(len(xs), np.int64)
    for i in range(len(b)):
        total += count_below(b, np.full(len(xs), i), xs)
    np.testing.assert_array_equal(total, np.searchsorted(fb, xs))


@given(st.integers(0, 50), st.integers(1, 6), st.integers(1, 5))
def test_numroc_partitions(n, nb, p):
    counts = [numroc(n, nb, i, p) for i in range(p)]
    assert sum(counts) == n
    owner = (np.arange(n) // nb) % p
    assert counts == [int((owner == i).sum()) for i in range(p)]


def test_block_splits_like_mpi_darray_block():
    # MPI darray BLOCK with the default darg: blocks of ceil(n/p); trailing ranks get less
    got = [layouts.block((10,), "u1", rank=r, size=4) for r in range(4)]
    assert [(g.start, g.shape) for g in got] == [
        ((0,), (3,)),
        ((3,), (3,)),
        ((6,), (3,)),
        ((9,), (1,)),
    ]
    got = [layouts.block((4,), "u1", rank=r, size=3) for r in range(3)]
    assert [g.shape for g in got] == [(2,), (2,), (0,)]


def test_block_grid_from_dims_create_and_slices():
    lay = layouts.block((100, 60), "<f8", rank=5, size=6)
    assert layouts.dims_create(6, 2) == (3, 2)
    assert lay.slices == (slice(68, 100), slice(30, 60))


def test_block_cyclic_local_shape_and_indices():
    lay = layouts.block_cyclic((10, 7), "<f8", block=(3, 2), grid=(2, 2), rank=3, size=4)
    assert lay.local_shape == (numroc(10, 3, 1, 2), numroc(7, 2, 1, 2)) == (4, 3)
    np.testing.assert_array_equal(lay.indices[0], [3, 4, 5, 9])
    np.testing.assert_array_equal(lay.indices[1], [2, 3, 6])


@pytest.mark.parametrize(
    "make,text",
    [
        (
            lambda: layouts.Subarray((4, 4), (0, 3), (4, 2), "<f8"),
            "region (0, 3)+(4, 2) exceeds global shape (4, 4)",
        ),
        (lambda: layouts.Subarray((4, 4), (0, -1), (4, 2), "<f8"), "negative start"),
        (lambda: layouts.Subarray((4, 4), (0,), (4, 2), "<f8"), "differ in length"),
        (lambda: layouts.Subarray((4,), (0,), (4,), "<f8", order="X"), "order must be"),
        (lambda: layouts.Subarray((4,), (0,), (4,), "nonsense"), "invalid dtype"),
        (lambda: layouts.Segments([0, -5], [1, 1]), "segment 1 has negative offset -5"),
        (lambda: layouts.Segments([0, 5], [1, -1]), "segment 1 has negative length -1"),
        (lambda: layouts.Segments([0, 5], [1]), "2 offsets but 1 lengths"),
        (
            lambda: layouts.BlockCyclic((4,), "u1", block=(0,), grid=(1,), coords=(0,)),
            "must be positive",
        ),
        (
            lambda: layouts.BlockCyclic((4,), "u1", block=(1,), grid=(2,), coords=(2,)),
            "outside grid",
        ),
    ],
)
def test_bad_layouts_fail_validation_not_construction(make, text):
    lay = make()  # constructing never raises: errors surface inside collective calls
    with pytest.raises(
        collio.LayoutError, match=text.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")
    ):
        lay.validate()


@pytest.mark.parametrize(
    "make",
    [
        lambda size: layouts.block((), "<f8", rank=0, size=size),
        lambda size: layouts.block_cyclic((), "<f8", block=1, grid=(), rank=0, size=size),
    ],
)
def test_zero_d_shape_is_whole_at_one_rank_and_refused_at_more(make):
    whole = make(1)
    whole.validate()
    assert whole.local_shape == ()
    assert whole.as_bytes(np.array(2.5)).tobytes() == np.float64(2.5).tobytes()
    with pytest.raises(
        collio.LayoutError,
        match=r"a 0-d global shape \(\) holds one element and cannot be split over 3 ranks",
    ):
        make(3).validate()


def test_data_checks():
    lay = layouts.Subarray((4, 4), (0, 0), (2, 4), "<f8")
    with pytest.raises(
        collio.LayoutError, match="dtype float32 does not match layout dtype float64"
    ):
        lay.as_bytes(np.zeros((2, 4), np.float32))
    with pytest.raises(
        collio.LayoutError, match=r"shape \(4, 2\) does not match layout shape \(2, 4\)"
    ):
        lay.as_bytes(np.zeros((4, 2)))
    a = np.arange(8.0).reshape(2, 4)
    assert lay.as_bytes(a).tobytes() == a.tobytes()
    # a non-contiguous view is accepted (copied in the layout's order)
    big = np.arange(16.0).reshape(4, 4)
    assert lay.as_bytes(big[::2]).tobytes() == big[::2].tobytes()
    f = layouts.Subarray((4, 4), (0, 0), (2, 4), "<f8", order="F")
    assert f.as_bytes(a).tobytes() == a.tobytes(order="F")
    offs = np.array([0, 10])
    seg = layouts.Segments(offs, [3, 2])
    offs[0] = 99  # the caller's array: copied
    assert seg.runs().file.tolist() == [0, 10]
    with pytest.raises(ValueError, match="read-only"):
        seg.offsets[0] = 99  # the layout's own: frozen (its runs and kept plans stay right)
    assert seg.as_bytes(b"abcde").tobytes() == b"abcde"
    with pytest.raises(collio.LayoutError, match="data has 4 bytes but the segments hold 5"):
        seg.as_bytes(b"abcd")


def test_allocate_checks_out():
    lay = layouts.Subarray((4, 4), (0, 0), (2, 4), "<f8", order="F")
    arr, view = lay.allocate()
    assert arr.flags.f_contiguous and arr.shape == (2, 4) and view.nbytes == 64
    with pytest.raises(collio.LayoutError, match="F-contiguous"):
        lay.allocate(np.zeros((2, 4)))
    with pytest.raises(collio.LayoutError, match="out has shape"):
        lay.allocate(np.zeros((2, 5), order="F"))


def test_million_runs_flatten_to_the_right_runs():
    """10^6 runs come out of numpy in one pass (the benchmark reports the time)."""
    lay = layouts.block_cyclic((4096, 4096), "<f8", block=(1, 4), grid=(1, 4), rank=1, size=4)
    runs = lay.runs()
    assert len(runs) == 4096 * 256  # 256 runs of 32 bytes per row
    assert (runs.length == 32).all()
    np.testing.assert_array_equal(runs.file[:3], [32, 160, 288])
    assert runs.mem_sequential()


def test_subarray_runs_are_the_runs_of_its_boxes():
    """Subarray lists its runs from its shape; they are the runs flatten() lists from
    its boxes, for every box of small arrays, both orders, several item sizes."""
    from collio.layouts.strided import flatten

    rng = np.random.default_rng(0)
    for t in range(2000):
        nd = int(rng.integers(0, 4))
        g = tuple(int(x) for x in rng.integers(1, 7, nd))
        st = tuple(int(rng.integers(0, x)) for x in g)
        sh = tuple(int(rng.integers(0, x - a + 1)) for x, a in zip(g, st, strict=True))
        dtype = ["u1", "<f8", "<i2"][t % 3]
        lay = layouts.Subarray(g, st, sh, dtype, "CF"[t % 2], offset=int(rng.integers(0, 50)))
        a, b = lay.runs(), flatten(lay.blocks())
        for x, y in ((a.file, b.file), (a.length, b.length), (a.mem, b.mem)):
            np.testing.assert_array_equal(x, y, err_msg=repr(lay))
