"""File views from MPI datatypes write the same bytes ROMIO writes, in the same run.

Both files start as the same random pattern, so holes must keep it in both and
the whole files can be compared byte for byte (ROMIO leaves holes of a new file
undefined; a pre-filled file pins them down).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import prefill
from mpi4py import MPI

import collio
from collio import layouts
from collio.testing.views import datatype_cases, romio_view_read, romio_view_write, type_bag

NAMES = [
    "contiguous", "vector", "hvector", "indexed", "hindexed", "indexed_block", "hindexed_block",
    "struct", "resized-lb", "resized-neg-lb", "dup", "nested3", "subarray", "subarray-F",
    "darray", "darray-F",
]  # fmt: skip
DISP = 100


def span(ft, nbytes, disp=DISP):
    """A bound on the end of the bytes a view writes."""
    tiles = -(-nbytes // max(ft.Get_size(), 1)) + 1
    lb, extent = ft.Get_extent()
    tlb, text = ft.Get_true_extent()
    return disp + tiles * extent + abs(lb) + tlb + text + 64


def read(path):
    with open(path, "rb") as fh:
        return fh.read()


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_view_same_bytes_as_romio(comm, mpi_tmp_path, name):
    mine = str(mpi_tmp_path / f"{name}-collio.bin")
    theirs = str(mpi_tmp_path / f"{name}-romio.bin")
    with type_bag() as t:
        et, ft = {n: (e, f) for n, e, f in datatype_cases(t, comm.rank, comm.size)}[name]
        esize = et.Get_size()
        n_et = (ft.Get_size() // esize) * 5 // 2  # two and a half filetypes
        rng = np.random.default_rng(comm.rank + 1)
        buf = rng.integers(0, 256, n_et * esize, dtype=np.uint8)
        prefill(comm, [mine, theirs], span(ft, buf.nbytes))
        first = (n_et // 3) * esize  # two calls: the file pointer carries on
        with collio.open(mine, "r+", comm=comm, hints={"cb_buffer_size": 512}) as f:
            f.set_view(DISP, et, ft)
            f.write_all(buf[:first])
            assert f.position == first // esize
            f.write_all(buf[first:])
            assert f.position == n_et
        romio_view_write(theirs, DISP, et, ft, buf, comm)
        comm.Barrier()
        assert read(mine) == read(theirs), f"{name}: collio and ROMIO files differ"
        back = np.zeros_like(buf)
        with collio.open(theirs, "r", comm=comm) as f:
            f.set_view(DISP, et, ft)
            assert f.read_all(back) is back
        np.testing.assert_array_equal(back, buf)
        back[:] = 0
        romio_view_read(mine, DISP, et, ft, back, comm)
        np.testing.assert_array_equal(back, buf)


@pytest.mark.mpi
@pytest.mark.parametrize("form", ["count", "count-displ", "inferred", "typecode"])
def test_memory_datatype(comm, mpi_tmp_path, form):
    """``[buf, count, memtype]``: the buffer's bytes are gathered through a vector type."""
    mine = str(mpi_tmp_path / "mem-collio.bin")
    theirs = str(mpi_tmp_path / "mem-romio.bin")
    with type_bag() as t:
        et, ft = {n: (e, f) for n, e, f in datatype_cases(t, comm.rank, comm.size)}["subarray-F"]
        mem = t(t(MPI.DOUBLE.Create_vector(3, 1, 2)).Create_resized(0, 56)).Commit()  # 7 doubles
        local = np.arange(7 * 6, dtype="f8") + 1000 * comm.rank
        spec = {
            "count": [local, 3, mem],
            "count-displ": [local, (3, 2), mem],
            "inferred": [local, mem],
            "typecode": [local, (9, 4), "d"],
        }[form]
        prefill(comm, [mine, theirs], span(ft, 6 * 3 * 8 * 2))
        with collio.open(mine, "r+", comm=comm) as f:
            f.set_view(DISP, et, ft)
            f.write_all(spec)
        romio_view_write(theirs, DISP, et, ft, spec, comm)
        comm.Barrier()
        assert read(mine) == read(theirs)
        ours, ref = np.full_like(local, -1.0), np.full_like(local, -1.0)
        with collio.open(mine, "r", comm=comm) as f:
            f.set_view(DISP, et, ft)
            f.read_all([ours, *spec[1:]])
        romio_view_read(theirs, DISP, et, ft, [ref, *spec[1:]], comm)
        np.testing.assert_array_equal(ours, ref)
        assert (ours != -1.0).sum() == (ref != -1.0).sum() > 0


@pytest.mark.mpi
def test_explicit_offsets_and_from_datatype(comm, mpi_tmp_path):
    """``write_at_all``/``read_at_all`` and ``layouts.from_datatype`` against ROMIO's calls."""
    mine = str(mpi_tmp_path / "at-collio.bin")
    theirs = str(mpi_tmp_path / "at-romio.bin")
    with type_bag() as t:
        cases = {n: (e, f) for n, e, f in datatype_cases(t, comm.rank, comm.size)}
        et, ft = cases["hindexed"]
        data = np.arange(12, dtype="f8") * (comm.rank + 1)
        prefill(comm, [mine, theirs], span(ft, data.nbytes + 40))
        with collio.open(mine, "r+", comm=comm) as f:
            f.set_view(DISP, et, ft)
            f.write_at_all(5, data)
            assert f.position == 0
            back = f.read_at_all(5, np.zeros_like(data))
        np.testing.assert_array_equal(back, data)
        fh = MPI.File.Open(comm, theirs, MPI.MODE_RDWR)
        try:
            fh.Set_view(DISP, et, ft)
            fh.Write_at_all(5, data)
        finally:
            fh.Close()
        comm.Barrier()
        assert read(mine) == read(theirs)
        # the same datatypes as layouts, through write_all(data, layout)
        et, ft = cases["struct"]
        lay = layouts.from_datatype(ft, 2, disp=DISP)
        raw = np.random.default_rng(comm.rank).integers(0, 256, lay.nbytes, dtype=np.uint8)
        with collio.open(mine, "r+", comm=comm) as f:
            f.write_all(raw, lay)
            np.testing.assert_array_equal(f.read_all(lay), raw)
        romio_view_write(theirs, DISP, et, ft, raw, comm)
        comm.Barrier()
        assert read(mine) == read(theirs)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["darray", "subarray-F"])
def test_array_datatypes_as_layouts(comm, mpi_tmp_path, kind):
    mine = str(mpi_tmp_path / "lay-collio.bin")
    theirs = str(mpi_tmp_path / "lay-romio.bin")
    with type_bag() as t:
        grid = MPI.Compute_dims(comm.size, 2)
        if kind == "darray":
            dist = [MPI.DISTRIBUTE_CYCLIC, MPI.DISTRIBUTE_BLOCK]
            ft = t(MPI.INT.Create_darray(comm.size, comm.rank, [11, 9], dist, [2, -49767], grid))
        else:
            ft = t(MPI.INT.Create_subarray([5, 4 * comm.size], [5, 4], [0, 4 * comm.rank],
                                           order=MPI.ORDER_F))  # fmt: skip
        ft.Commit()
        lay = layouts.from_datatype(ft, disp=DISP)
        assert isinstance(lay, layouts.ArrayLayout)
        local = (np.arange(int(np.prod(lay.local_shape)), dtype="i4") + 100 * comm.rank).reshape(
            lay.local_shape, order=lay.order
        )
        prefill(comm, [mine, theirs], DISP + 4 * 11 * 9 * comm.size + 64)
        with collio.open(mine, "r+", comm=comm) as f:
            f.write_all(local, lay)
        romio_view_write(theirs, DISP, MPI.INT, ft, local.reshape(-1, order="A"), comm)
        comm.Barrier()
        assert read(mine) == read(theirs)


BAD = {
    "negative-disp": "displacement -8 is negative",
    "etype-not-dividing": "not a whole number of 8-byte etypes",
    "decreasing": "filetype displacements decrease",
    "negative-displacement": "negative displacement -8",
    "tiles-overlap": "from one tile to the next",
}


def _bad_view(t, kind):
    if kind == "negative-disp":
        return -8, MPI.INT, MPI.INT
    if kind == "etype-not-dividing":
        return 0, MPI.DOUBLE, t(MPI.INT.Create_contiguous(3)).Commit()
    if kind == "decreasing":
        return 0, MPI.INT, t(MPI.INT.Create_indexed([1, 1], [2, 0])).Commit()
    if kind == "negative-displacement":
        return 0, MPI.INT, t(MPI.INT.Create_hindexed([1], [-8])).Commit()
    return 0, MPI.INT, t(t(MPI.INT.Create_vector(2, 1, 4)).Create_resized(0, 8)).Commit()


@pytest.mark.mpi
@pytest.mark.parametrize("kind", list(BAD))
def test_bad_view_on_one_rank_raises_everywhere(comm, mpi_tmp_path, kind):
    path = str(mpi_tmp_path / "target.bin")
    bad = comm.size - 1
    with type_bag() as t, collio.open(path, "w", comm=comm) as f:
        view = _bad_view(t, kind) if comm.rank == bad else (8 * comm.rank, MPI.INT, MPI.INT)
        with pytest.raises(collio.LayoutError) as info:
            f.set_view(*view)
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size
        assert texts[0].startswith(f"set_view: rank {bad}: ") and BAD[kind] in texts[0]
        assert info.value.ranks == (bad,)
        # the file stays usable: a good view, then a collective write of data no
        # other outcome produces (element i of rank r is i*size + r + 1, never 0)
        f.set_view(4 * comm.rank, MPI.INT, t(MPI.INT.Create_resized(0, 4 * comm.size)).Commit())
        f.write_all(np.arange(3, dtype="<i4") * comm.size + comm.rank + 1)
    comm.Barrier()
    with open(path, "rb") as fh:
        got = fh.read()
    assert got == np.arange(1, 3 * comm.size + 1, dtype="<i4").tobytes()


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["partial-etype", "memtype-outside", "readonly-read"])
def test_bad_buffer_on_one_rank_raises_everywhere(comm, mpi_tmp_path, kind):
    path = str(mpi_tmp_path / "target.bin")
    bad = 0
    with type_bag() as t, collio.open(path, "w", comm=comm) as f:
        every = t(MPI.DOUBLE.Create_resized(0, 8 * comm.size)).Commit()
        f.set_view(8 * comm.rank, MPI.DOUBLE, every)
        good = np.zeros(4, "f8")
        if kind == "partial-etype":
            spec, call, match = np.zeros(12, np.uint8), f.write_all, "whole number of 8-byte"
        elif kind == "memtype-outside":
            vec = t(MPI.DOUBLE.Create_vector(3, 1, 4)).Commit()
            spec, call, match = [good, 1, vec], f.write_all, "outside the buffer of 32 bytes"
        else:
            spec, call, match = bytes(32), f.read_all, "the buffer to read into is read-only"
        with pytest.raises(collio.LayoutError) as info:
            call(spec if comm.rank == bad else good)
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size and match in texts[0]
        assert f.position == 0
        # still usable: element i of rank r is i*size + r + 1, never 0 (a no-op leaves 0)
        f.write_all(np.arange(4, dtype="<f8") * comm.size + comm.rank + 1)
        assert f.position == 4
    comm.Barrier()
    with open(path, "rb") as fh:
        got = fh.read()
    assert got == np.arange(1, 4 * comm.size + 1, dtype="<f8").tobytes()


@pytest.mark.mpi(min_size=2)
def test_etype_sizes_must_agree(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    with collio.open(path, "w", comm=comm) as f:
        et = MPI.INT if comm.rank else MPI.DOUBLE
        with pytest.raises(collio.MismatchError, match="etype sizes differ"):
            f.set_view(0, et, et)
