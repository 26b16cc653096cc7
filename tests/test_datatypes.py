"""Decoding MPI datatypes into byte runs, checked byte for byte against MPI's own typemaps.

The reference is MPI itself: ``typemap_bytes`` packs numbered byte planes through
the datatype, so it lists where MPICH (not collio) puts every data byte.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from mpi4py import MPI

import collio
from collio import datatypes, layouts
from collio.layouts import typemap as tm
from collio.testing.views import datatype_cases, flat_bytes, type_bag, typemap_bytes


def same_typemap(dt: MPI.Datatype, counts: tuple[int, ...] = (1, 3)) -> None:
    flat = datatypes.flatten(dt)
    assert flat.size == dt.Get_size()
    assert (flat.lb, flat.extent) == tuple(dt.Get_extent())
    for c in counts:
        np.testing.assert_array_equal(flat_bytes(flat, c), typemap_bytes(dt, c))


@pytest.mark.parametrize("size,rank", [(1, 0), (3, 2), (4, 1)])
def test_every_constructor_matches_mpi(size, rank):
    with type_bag() as t:
        cases = datatype_cases(t, rank, size)
        names = {name for name, _, _ in cases}
        assert {"contiguous", "vector", "hvector", "indexed", "hindexed", "indexed_block"} <= names
        assert {"hindexed_block", "struct", "resized-lb", "dup", "subarray", "darray"} <= names
        for _, etype, ft in cases:
            same_typemap(ft)
            same_typemap(etype)


def test_predefined_leaves():
    for dt in (MPI.BYTE, MPI.DOUBLE, MPI.INT, MPI.C_DOUBLE_COMPLEX, MPI.SHORT_INT, MPI.DOUBLE_INT):
        same_typemap(dt)
    assert datatypes.leaf_dtype(MPI.DOUBLE) == np.dtype("f8")
    flat = datatypes.flatten(MPI.SHORT_INT)  # {short, int}: a hole in the middle
    assert flat.off.tolist() == [0, 4] and flat.length.tolist() == [2, 4]


def test_negative_lb_struct_and_overlapping_resized():
    with type_bag() as t:
        a = t(MPI.Datatype.Create_struct([1, 2], [-16, 24], [MPI.DOUBLE, MPI.INT])).Commit()
        same_typemap(a)
        b = t(t(MPI.INT.Create_resized(-4, 2)).Create_contiguous(5)).Commit()  # copies overlap
        same_typemap(b)
        c = t(MPI.DOUBLE.Create_hvector(3, 1, -24)).Commit()  # negative stride
        same_typemap(c)


def test_cached_on_the_datatype_and_freed_with_it():
    dt = MPI.DOUBLE.Create_vector(4, 1, 3).Commit()
    try:
        first = datatypes.flatten(dt)
        assert datatypes.flatten(dt) is first
        dup = dt.Dup()
        try:
            assert datatypes.flatten(dup) is not first  # a new type: decoded afresh
        finally:
            dup.Free()
    finally:
        dt.Free()


def test_unsupported_and_null_types_are_layout_errors():
    lay = layouts.from_datatype(MPI.DATATYPE_NULL)  # errors wait for the collective call
    with pytest.raises(collio.LayoutError, match="DATATYPE_NULL"):
        lay.validate()
    with pytest.raises(ValueError, match="expected an MPI datatype"):
        datatypes.flatten("not a type")  # type: ignore[arg-type]


# ---------------------------------------------------------------- random nesting
LEAVES = [MPI.BYTE, MPI.SHORT, MPI.INT, MPI.DOUBLE]


@st.composite
def nested_types(draw, depth=3):
    """A recipe: leaf or a constructor over a smaller recipe."""
    if depth == 0 or draw(st.booleans()) and depth < 3:
        return ("leaf", draw(st.integers(0, len(LEAVES) - 1)))
    kid = draw(nested_types(depth=depth - 1))
    kind = draw(
        st.sampled_from(
            ["contiguous", "vector", "hvector", "indexed", "hindexed", "block", "hblock",
             "struct", "resized", "subarray", "darray", "dup"]
        )
    )  # fmt: skip
    small = st.integers(0, 3)
    if kind in ("contiguous",):
        return (kind, kid, draw(small))
    if kind in ("vector", "hvector"):
        return (kind, kid, draw(small), draw(small), draw(st.integers(-6, 40)))
    if kind in ("indexed", "hindexed", "block", "hblock"):
        n = draw(st.integers(0, 4))
        return (kind, kid, draw(st.lists(small, min_size=n, max_size=n)),
                draw(st.lists(st.integers(-3, 60), min_size=n, max_size=n)))  # fmt: skip
    if kind == "struct":
        other = draw(nested_types(depth=depth - 1))
        return (kind, kid, other, draw(small), draw(small), draw(st.integers(0, 64)))
    if kind == "resized":
        return (kind, kid, draw(st.integers(-8, 8)), draw(st.integers(1, 80)))
    if kind == "subarray":
        sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
        subs = [draw(st.integers(0, s)) for s in sizes]
        starts = [draw(st.integers(0, s - b)) for s, b in zip(sizes, subs, strict=True)]
        return (kind, kid, sizes, subs, starts, draw(st.booleans()))
    if kind == "darray":
        nd = draw(st.integers(1, 3))
        psizes = [draw(st.integers(1, 3)) for _ in range(nd)]
        dist = [draw(st.sampled_from([MPI.DISTRIBUTE_BLOCK, MPI.DISTRIBUTE_CYCLIC,
                                      MPI.DISTRIBUTE_NONE])) for _ in range(nd)]  # fmt: skip
        psizes = [1 if d == MPI.DISTRIBUTE_NONE else p for d, p in zip(dist, psizes, strict=True)]
        gsizes = [draw(st.integers(1, 7)) for _ in range(nd)]
        dargs = [
            MPI.DISTRIBUTE_DFLT_DARG
            if d == MPI.DISTRIBUTE_NONE or draw(st.booleans())
            else draw(st.integers(-(-g // p), -(-g // p) + 2)) if d == MPI.DISTRIBUTE_BLOCK
            else draw(st.integers(1, 3))
            for d, g, p in zip(dist, gsizes, psizes, strict=True)
        ]  # fmt: skip
        size = int(np.prod(psizes))
        return (kind, kid, size, draw(st.integers(0, size - 1)), gsizes, dist, dargs, psizes,
                draw(st.booleans()))  # fmt: skip
    return (kind, kid)


def build(t, r):
    kind = r[0]
    if kind == "leaf":
        return LEAVES[r[1]]
    kid = build(t, r[1])
    if kind == "contiguous":
        return t(kid.Create_contiguous(r[2]))
    if kind == "vector":
        return t(kid.Create_vector(r[2], r[3], r[4]))
    if kind == "hvector":
        return t(kid.Create_hvector(r[2], r[3], r[4]))
    if kind == "indexed":
        return t(kid.Create_indexed(r[2], r[3]))
    if kind == "hindexed":
        return t(kid.Create_hindexed(r[2], r[3]))
    if kind == "block":
        return t(kid.Create_indexed_block(2, r[3]))
    if kind == "hblock":
        return t(kid.Create_hindexed_block(2, r[3]))
    if kind == "struct":
        return t(MPI.Datatype.Create_struct([r[3], r[4]], [0, r[5]], [kid, build(t, r[2])]))
    if kind == "resized":
        return t(kid.Create_resized(r[2], r[3]))
    if kind == "subarray":
        order = MPI.ORDER_C if r[5] else MPI.ORDER_FORTRAN
        return t(kid.Create_subarray(r[2], r[3], r[4], order=order))
    if kind == "darray":
        order = MPI.ORDER_C if r[8] else MPI.ORDER_FORTRAN
        return t(kid.Create_darray(r[2], r[3], r[4], r[5], r[6], r[7], order=order))
    return t(kid.Dup())


def _empty_vector_of_derived(r) -> bool:
    """Whether the recipe holds a (h)vector with blocklength 0 of a derived type.

    MPICH 5.0.2 (yaksa) dies of SIGFPE packing a struct that holds one, e.g.
    ``struct([struct([MPI_INT x2 @0, MPI_INT x0 @29]), hvector(2, 0, 39,
    vector(2, 3, 33, MPI_BYTE))], blocklengths [1, 3], displacements [0, 0])`` (the
    reference side of the test below: ``MPI.Datatype.Pack``); collio's flattening of
    that type is checked without Pack in test_empty_vector_inside_a_struct.
    """
    if not isinstance(r, tuple) or r[0] == "leaf":
        return False
    if r[0] in ("vector", "hvector") and r[3] == 0 and r[1][0] != "leaf":
        return True
    return any(_empty_vector_of_derived(x) for x in r[1:] if isinstance(x, tuple))


def test_empty_vector_inside_a_struct():
    """The type that crashes MPICH's Pack: its bytes are its non-empty member's (which
    MPI's Pack checks), its size and extent MPI's."""
    crash = ("struct", ("struct", ("leaf", 2), ("leaf", 2), 2, 0, 29),
             ("hvector", ("vector", ("leaf", 0), 2, 3, 33), 2, 0, 39), 1, 3, 0)  # fmt: skip
    assert _empty_vector_of_derived(crash)
    with type_bag() as t:
        dt = build(t, crash).Commit()
        kept = build(t, crash[1]).Commit()
        flat = datatypes.flatten(dt)
        assert (flat.size, flat.lb, flat.extent) == (dt.Get_size(), *dt.Get_extent())
        assert flat.size == kept.Get_size() == 8
        np.testing.assert_array_equal(flat_bytes(flat), typemap_bytes(kept))


@given(nested_types())
def test_random_nested_types_match_mpi(recipe):
    assume(not _empty_vector_of_derived(recipe))
    with type_bag() as t:
        dt = build(t, recipe).Commit()
        if dt.Get_true_extent()[1] > 1 << 20:
            return
        same_typemap(dt, (1, 2))


# ------------------------------------------------- the MPI-3 form of the contents
def _libmpi() -> ctypes.CDLL | None:
    if MPI.get_vendor()[0] != "MPICH":
        return None
    with open("/proc/self/maps") as fh:
        libs = sorted({ln.split()[-1] for ln in fh if "libmpi.so" in ln})
    return ctypes.CDLL(libs[0]) if libs else None


def _h(dt):
    return ctypes.c_int(dt.handle & 0xFFFFFFFF)


def _ints(values):
    return (ctypes.c_int * len(values))(*values)


def _aints(values):
    return (ctypes.c_long * len(values))(*values)


def _classic_types(lib):
    """Types built with the MPI-3 (int / MPI_Aint) constructors, as C or Fortran codes make them."""
    d, i = MPI.DOUBLE, MPI.INT
    calls = {
        "contiguous": lambda o: lib.MPI_Type_contiguous(3, _h(d), o),
        "vector": lambda o: lib.MPI_Type_vector(3, 2, 5, _h(d), o),
        "hvector": lambda o: lib.MPI_Type_create_hvector(3, 2, 44, _h(i), o),
        "indexed": lambda o: lib.MPI_Type_indexed(2, _ints([2, 1]), _ints([0, 5]), _h(i), o),
        "hindexed": lambda o: lib.MPI_Type_create_hindexed(
            2, _ints([1, 2]), _aints([4, 40]), _h(d), o),
        "indexed_block": lambda o: lib.MPI_Type_create_indexed_block(
            3, 2, _ints([0, 4, 9]), _h(i), o),
        "hindexed_block": lambda o: lib.MPI_Type_create_hindexed_block(
            2, 1, _aints([8, 32]), _h(d), o),
        "struct": lambda o: lib.MPI_Type_create_struct(
            2, _ints([1, 3]), _aints([0, 12]), (ctypes.c_int * 2)(_h(d), _h(i)), o),
        "subarray": lambda o: lib.MPI_Type_create_subarray(
            3, _ints([4, 5, 6]), _ints([2, 3, 2]), _ints([1, 1, 3]), MPI.ORDER_FORTRAN, _h(d), o),
        "darray": lambda o: lib.MPI_Type_create_darray(
            4, 3, 2, _ints([9, 7]), _ints([MPI.DISTRIBUTE_CYCLIC, MPI.DISTRIBUTE_BLOCK]),
            _ints([2, MPI.DISTRIBUTE_DFLT_DARG]), _ints([2, 2]), MPI.ORDER_C, _h(d), o),
        "resized": lambda o: lib.MPI_Type_create_resized(
            _h(d), ctypes.c_long(-8), ctypes.c_long(32), o),
    }  # fmt: skip
    return calls


@pytest.mark.parametrize("kind", list(_classic_types(None)))
def test_mpi3_contents_form(kind):
    lib = _libmpi()
    if lib is None:
        pytest.skip("needs MPICH's libmpi")
    out = ctypes.c_int()
    assert _classic_types(lib)[kind](ctypes.byref(out)) == 0
    dt = MPI.Datatype.fromhandle(out.value & 0xFFFFFFFFFFFFFFFF)
    try:
        assert dt.Get_envelope()[2] == 0, "expected the MPI-3 form (no large counts)"
        same_typemap(dt)
    finally:
        dt.Free()


# ------------------------------------------------------------------ layouts
def test_from_datatype_keeps_structure():
    with type_bag() as t:
        sub = t(MPI.DOUBLE.Create_subarray([6, 8], [2, 3], [1, 4], order=MPI.ORDER_F)).Commit()
        lay = layouts.from_datatype(sub, disp=16)
        assert isinstance(lay, layouts.Subarray)
        assert (lay.shape, lay.start, lay.order, lay.offset) == ((2, 3), (1, 4), "F", 16)
        dist = [MPI.DISTRIBUTE_CYCLIC, MPI.DISTRIBUTE_BLOCK]
        dar = t(MPI.INT.Create_darray(4, 2, [9, 7], dist, [2, MPI.DISTRIBUTE_DFLT_DARG], [2, 2]))
        lay = layouts.from_datatype(dar.Commit())
        assert isinstance(lay, layouts.ArrayLayout) and lay.dtype == np.dtype("i4")
        flat = datatypes.flatten(dar)
        np.testing.assert_array_equal(lay.runs().file, flat.off)
        vec = t(MPI.DOUBLE.Create_vector(5, 2, 7)).Commit()
        lay = layouts.from_datatype(vec, 3, disp=8)
        assert isinstance(lay, layouts.TypedLayout) and lay.local_shape == (30,)
        blocks = lay.blocks()
        assert len(blocks) == 1 and blocks.counts.tolist() == [[3, 5]]
        ref = flat_bytes(datatypes.flatten(vec), 3) + 8
        r = lay.runs()
        np.testing.assert_array_equal(np.concatenate([np.arange(f, f + n) for f, n in zip(
            r.file.tolist(), r.length.tolist(), strict=True)]), ref)  # fmt: skip
        np.testing.assert_array_equal(layouts.flatten(blocks).file, r.file)


def test_stream_runs_and_zip_against_bytes():
    with type_bag() as t:
        ft = t(t(MPI.INT.Create_indexed([2, 1, 3], [1, 5, 9])).Create_resized(0, 64)).Commit()
        flat = datatypes.flatten(ft)
        every = flat_bytes(flat, 10) + 100
        for start, n in ((0, 24), (8, 40), (20, 4), (3, 101), (0, 0)):
            off, length = tm.stream_runs(flat, 100, start, n)
            got = np.concatenate([np.arange(o, o + k) for o, k in zip(off, length, strict=True)] +
                                 [np.zeros(0, np.int64)])  # fmt: skip
            np.testing.assert_array_equal(got, every[start : start + n])
        mem_flat = datatypes.flatten(t(MPI.BYTE.Create_vector(9, 3, 5)).Commit())
        m = tm.stream_runs(mem_flat, 0, 0, 27)
        f = tm.stream_runs(flat, 0, 0, 27)
        runs = tm.zip_runs(f, m)
        fb, mb = flat_bytes(flat, 2)[:27], flat_bytes(mem_flat)
        for fo, n, mo in zip(runs.file, runs.length, runs.mem, strict=True):
            i = np.flatnonzero(fb == fo)[0]
            np.testing.assert_array_equal(mb[i : i + n], np.arange(mo, mo + n))


def _lines_during(fn: Any) -> tuple[Any, int]:
    """``fn()`` and the number of Python lines run while it ran (a loop per item runs a
    line or more per item)."""
    count = [0]

    def tally(frame: Any, event: str, arg: Any) -> Any:
        count[0] += 1
        return tally

    sys.settrace(tally)
    try:
        out = fn()
    finally:
        sys.settrace(None)
    return out, count[0]


def test_flatten_a_million_runs_without_a_line_per_run():
    # A million runs flattened by numpy, not by a Python loop: the Python lines run
    # while flattening are counted (a count, unlike a time, does not depend on the load).
    with type_bag() as t:
        sub = t(MPI.DOUBLE.Create_subarray([2000, 2000, 64], [1000, 1000, 32], [500, 500, 16]))
        dist = [MPI.DISTRIBUTE_CYCLIC] * 2
        dar = t(MPI.DOUBLE.Create_darray(4, 1, [4000, 4000], dist, [4, 4], [2, 2]))
        for dt in (sub.Commit(), dar.Commit()):
            flat, lines = _lines_during(lambda dt=dt: datatypes.flatten(dt))
            assert flat.nruns == 10**6
            assert lines < 20_000, f"{lines} Python lines to flatten {flat.nruns} runs"
