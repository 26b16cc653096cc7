"""The mpiio backend (conformance, same bytes as posix) and parallel .npy files."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import all_layouts, local_piece, raises_everywhere, read_file, reference
from mpi4py import MPI

import collio
from collio import layouts
from collio.testing.target_suites import ByteBackendTests


class TestMpiio(ByteBackendTests):
    backend = "mpiio"

    @pytest.fixture
    def target(self, mpi_tmp_path):
        return str(mpi_tmp_path / "conformance.bin")

    def stored(self, target, open_options):
        return read_file(target)


@pytest.mark.mpi
def test_mpiio_refuses_unknown_options_everywhere(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "a.bin")
    err = raises_everywhere(
        comm, collio.ModeError, lambda: collio.open(path, "w", comm=comm, backend="mpiio", bogus=1)
    )
    assert "unknown options ['bogus']" in str(err)


@pytest.mark.mpi
@pytest.mark.parametrize("hints", [{}, {"cb_buffer_size": 4096, "romio_cb_write": "enable"}])
def test_mpiio_writes_what_posix_writes(comm, mpi_tmp_path, hints):
    shape = (37, 45)
    glob = reference(shape, "<f8")
    for name, lay in all_layouts(comm, shape, "<f8"):
        local = local_piece(glob, lay)
        paths = {}
        for be in ("posix", "mpiio"):
            paths[be] = str(mpi_tmp_path / f"{name}-{be}.bin")
            with collio.open(paths[be], "w", comm=comm, backend=be, hints=hints) as f:
                f.write_all(local, lay)
                np.testing.assert_array_equal(f.read_all(lay), local, err_msg=name)
        comm.Barrier()
        with open(paths["posix"], "rb") as a, open(paths["mpiio"], "rb") as b:
            assert a.read() == b.read() == glob.tobytes(order=lay.order), name


@pytest.mark.mpi
def test_mpiio_hints_reach_romio(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "target.bin")
    info = {"romio_ds_write": "disable"}
    hints = {"cb_buffer_size": 1 << 20, "striping_unit": 65536}
    with collio.open(path, "w", comm=comm, backend="mpiio", hints=hints, info=info) as f:
        fh_info = f.backend.fh.Get_info()
        try:
            assert fh_info.Get("cb_buffer_size") == str(1 << 20)
            assert fh_info.Get("romio_ds_write") == "disable"
        finally:
            fh_info.Free()
        assert f.stats.backend["backend"] == "mpiio"


@pytest.mark.mpi
def test_mpiio_view_write_same_as_romio(comm, mpi_tmp_path):
    """A file view through the mpiio backend: ROMIO's own Write_all gives the same file."""
    mine = str(mpi_tmp_path / "view-mpiio.bin")
    theirs = str(mpi_tmp_path / "view-romio.bin")
    ft = MPI.INT.Create_vector(4, 2, 2 * comm.size)
    ft2 = ft.Create_resized(0, 4 * 8 * comm.size).Commit()
    try:
        data = np.arange(24, dtype="i4") + 100 * comm.rank
        with collio.open(mine, "w", comm=comm, backend="mpiio") as f:
            f.set_view(8 * comm.rank, MPI.INT, ft2)
            f.write_all(data)
        fh = MPI.File.Open(comm, theirs, MPI.MODE_CREATE | MPI.MODE_WRONLY)
        try:
            fh.Set_view(8 * comm.rank, MPI.INT, ft2)
            fh.Write_all(data)
        finally:
            fh.Close()
    finally:
        ft.Free()
        ft2.Free()
    comm.Barrier()
    with open(mine, "rb") as a, open(theirs, "rb") as b:
        assert a.read() == b.read()


# ------------------------------------------------------------------ .npy
NPY = [
    ((13, 7, 5), "<f8", "C"),
    ((13, 7, 5), "<f8", "F"),
    ((40, 3), ">i4", "C"),
    ((9, 6), [("a", "<i2"), ("b", "<u4", (2,))], "F"),
]


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["posix", "mpiio"])
@pytest.mark.parametrize("shape,dtype,order", NPY, ids=[f"{s}-{o}" for s, _, o in NPY])
def test_npy_loads_in_numpy(comm, mpi_tmp_path, shape, dtype, order, backend):
    glob = reference(shape, dtype, seed=3)
    path = str(mpi_tmp_path / "a.npy")
    kinds = {
        "block": layouts.block(shape, glob.dtype, comm=comm, order=order),
        "cyclic": layouts.block_cyclic(
            shape, glob.dtype, block=2, grid=layouts.dims_create(comm.size, len(shape)),
            comm=comm, order=order,
        ),
    }  # fmt: skip
    for kind, lay in kinds.items():
        local = local_piece(glob, lay)
        collio.save_npy(path, local, lay, comm=comm, backend=backend)
        comm.Barrier()
        if comm.rank == 0:
            for mode in (None, "r"):
                arr = np.load(path, mmap_mode=mode)
                assert arr.dtype == glob.dtype and arr.shape == glob.shape, kind
                assert arr.flags.f_contiguous if order == "F" else arr.flags.c_contiguous
                assert np.array_equal(arr, glob), kind
                del arr
        back = collio.load_npy(path, lay, comm=comm, backend=backend)
        np.testing.assert_array_equal(back, local, err_msg=kind)
        comm.Barrier()


@pytest.mark.mpi
def test_npy_header_mismatch_raises_everywhere(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "b.npy")
    glob = reference((8, 6), "<f8")
    lay = layouts.block((8, 6), "<f8", comm=comm)
    collio.save_npy(path, local_piece(glob, lay), lay, comm=comm)
    for other in (
        layouts.block((8, 6), "<f4", comm=comm),
        layouts.block((6, 8), "<f8", comm=comm),
        layouts.block((8, 6), "<f8", comm=comm, order="F"),
    ):
        with pytest.raises(collio.LayoutError, match="file holds shape") as info:
            collio.load_npy(path, other, comm=comm)
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size


@pytest.mark.mpi
def test_npy_pieces_must_cover_the_array(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "c.npy")
    lay = layouts.Subarray((8, 6), (0, 0), (1, 6), "<f8")  # every rank: row 0 only
    with pytest.raises(collio.CollioError) as info:
        collio.save_npy(path, np.zeros((1, 6)), lay, comm=comm)
    if comm.size == 1:
        assert "pieces hold 48 bytes; the array has 384" in str(info.value)
    texts = comm.allgather(str(info.value))
    assert texts == [texts[0]] * comm.size
    bad = layouts.Segments([0], [8]) if comm.rank == 0 else layouts.block((8, 6), "<f8", comm=comm)
    with pytest.raises(collio.LayoutError, match="array layout") as info:
        collio.save_npy(path, np.zeros(8, np.uint8), bad, comm=comm)
    texts = comm.allgather(str(info.value))
    assert texts == [texts[0]] * comm.size


@pytest.mark.mpi
def test_save_and_load_fortran_order(comm, mpi_tmp_path):
    """A Fortran-order array: np.load (and its memory map) sees the global array; a bad
    layout or a truncated file is refused on every rank and leaves the file alone."""
    path = str(mpi_tmp_path / "x.npy")
    glob = np.arange(60, dtype="<i8").reshape(5, 12)
    lay = layouts.block(glob.shape, glob.dtype, comm=comm, order="F")
    collio.save_npy(path, local_piece(glob, lay), lay, comm=comm)
    comm.Barrier()
    np.testing.assert_array_equal(np.load(path), glob)
    np.testing.assert_array_equal(np.load(path, mmap_mode="r"), glob)
    np.testing.assert_array_equal(collio.load_npy(path, lay, comm=comm), local_piece(glob, lay))
    shifted = layouts.Subarray((5, 12), (0, 0), (5, 12), "<i8", offset=8)
    mine = shifted if comm.rank == 0 else layouts.Subarray((5, 12), (0, 0), (0, 0), "<i8", offset=8)
    err = raises_everywhere(
        comm, collio.LayoutError, lambda: collio.save_npy(path, glob, mine, comm=comm)
    )
    assert "offset 8" in str(err)
    np.testing.assert_array_equal(np.load(path), glob)
    comm.Barrier()
    if comm.rank == 0:
        with open(path, "r+b") as fh:
            fh.truncate(200)
    comm.Barrier()
    err = raises_everywhere(comm, collio.LayoutError, lambda: collio.load_npy(path, lay, comm=comm))
    assert "file has 200 bytes" in str(err)


@pytest.mark.mpi
def test_utf8_field_names_are_format_3_both_ways(comm, mpi_tmp_path):
    """Field names beyond latin-1 need .npy format 3.0: the file is byte for byte what
    np.save writes, and collio reads what np.save wrote."""
    dt = np.dtype([("温度", "<f4"), ("x", "<i2")])
    glob = np.zeros(6, dt)
    glob["温度"], glob["x"] = np.arange(6) / 2, np.arange(6)
    lay = layouts.block(glob.shape, dt, comm=comm)
    path, theirs = str(mpi_tmp_path / "t.npy"), str(mpi_tmp_path / "theirs.npy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "stored array in format 3.0"
        collio.save_npy(path, glob[lay.slices], lay, comm=comm)
        if comm.rank == 0:
            np.save(theirs, glob)
    comm.Barrier()
    assert read_file(path) == read_file(theirs)
    np.testing.assert_array_equal(collio.load_npy(theirs, lay, comm=comm), glob[lay.slices])
