"""collio.h5 under mpiexec: real h5py, real MPI; files checked by stock h5py and h5dump."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collio
from collio import layouts

h5py = pytest.importorskip("h5py")
from h5check import check_file  # noqa: E402
from helpers import local_piece, reference  # noqa: E402

import collio.h5  # noqa: E402  - after the importorskip
from collio.testing.hdf5_suite import Hdf5BackendTests  # noqa: E402

pytestmark = pytest.mark.mpi


def _layout(kind: str, comm: MPI.Comm, shape: tuple[int, ...], dtype: str) -> Any:
    if kind == "colblock":
        return layouts.block(shape, dtype, comm=comm, grid=(1,) * (len(shape) - 1) + (comm.size,))
    if kind == "cyclic":
        return layouts.block_cyclic(
            shape, dtype, block=(5, 3), grid=layouts.dims_create(comm.size, 2), comm=comm
        )
    return layouts.block(shape, dtype, comm=comm)


CASES = [
    ("colblock", (45, 38), "<f8"),
    ("cyclic", (41, 37), "<i4"),
    ("block3d", (9, 14, 11), "<f4"),
]


@pytest.mark.parametrize(("kind", "shape", "dtype"), CASES)
@pytest.mark.parametrize("storage", ["contiguous", "chunked-gzip"])
def test_write_read_and_stock_h5py_agrees(
    comm: MPI.Comm, mpi_tmp_path: Path, kind: str, shape: tuple[int, ...], dtype: str, storage: str
) -> None:
    path = str(mpi_tmp_path / f"{kind}-{storage}.h5")
    glob = reference(shape, dtype)
    lay = _layout(kind, comm, shape, dtype)
    opts: dict[str, Any] = {}
    if storage != "contiguous":
        opts = {"chunks": tuple(max(1, s // 3 - 1) for s in shape), "compression": "gzip"}
        opts["shuffle"] = True
    with collio.h5.File(path, "w", comm=comm, hints={"cb_buffer_size": 4096}) as f:
        grp = f.create_group("results/run1")
        grp.attrs["step"] = 7
        d = collio.h5.create_dataset(grp, "field", shape, dtype, **opts)
        d.attrs["units"] = "m/s"
        collio.h5.write_all(d, local_piece(glob, lay), lay)
        # read back through another decomposition
        other = layouts.block(shape, dtype, comm=comm)
        np.testing.assert_array_equal(collio.h5.read_all(d, other), local_piece(glob, other))
        f.attrs["title"] = "collio"
    attrs = {"/": {"title": "collio"}, "results/run1": {"step": 7}}
    attrs["results/run1/field"] = {"units": "m/s"}
    check_file(comm, path, {"results/run1/field": glob}, attrs)


def test_empty_rank_and_update_in_place(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    path = str(mpi_tmp_path / "empty.h5")
    shape = (30, 26)
    glob = reference(shape, "<f8", seed=3)
    last = comm.rank == comm.size - 1
    whole = layouts.Subarray(shape, (0, 0), shape if last else (0, 0), "<f8")
    with collio.h5.File(path, "w", comm=comm) as f:
        c = collio.h5.create_dataset(f, "c", shape, "<f8", chunks=(7, 5), compression="gzip")
        d = collio.h5.create_dataset(f, "d", shape, "<f8")
        z = collio.h5.create_dataset(f, "z", shape, "<f8", chunks=(4, 9), compression="lzf")
        for dset in (c, d, z):
            collio.h5.write_all(dset, glob if last else np.zeros((0, 0)), whole)
    # r+: rewrite rows 10..19 only, split over ranks; the rest must stay
    new = glob.copy()
    new[10:20] = -1.0
    band = layouts.block((10, shape[1]), "<f8", comm=comm, grid=(comm.size, 1))
    lay = layouts.Subarray(shape, (10 + band.start[0], 0), band.shape, "<f8")
    with collio.h5.File(path, "r+", comm=comm) as f:
        for name in ("c", "d", "z"):
            collio.h5.write_all(f[name], np.full(lay.shape, -1.0), lay)
    check_file(comm, path, {"c": new, "d": new, "z": new})


def test_h5py_spelling_collective_indexing_and_append(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    path = str(mpi_tmp_path / "spelling.h5")
    shape = (20, 12)
    glob = reference(shape, "<f8", seed=5)
    lay = layouts.block(shape, "<f8", comm=comm, grid=(comm.size, 1))
    f = h5py.File(path, "w", driver="collio", comm=comm)
    d = f.create_dataset("plain", shape, "<f8")  # h5py's defaults: late allocation
    f.attrs["note"] = "x"
    if comm.rank == 0:  # reads on one rank only are not metadata calls: no mismatch
        assert list(f) == ["plain"] and f.attrs["note"] == "x" and d.shape == shape
    with collio.h5.collective(d) as c:
        c[lay.slices] = local_piece(glob, lay)
        back = c[:, 2:5]
    np.testing.assert_array_equal(back, glob[:, 2:5])
    np.testing.assert_array_equal(d[...], glob)  # plain h5py on every rank's replica
    collio.h5.close(f)
    with h5py.File(path, "a", driver="collio", comm=comm) as g:
        e = collio.h5.create_dataset(g, "more", shape, "<f8", chunks=(4, 4))
        collio.h5.collective(e)[lay.slices] = 2 * local_piece(glob, lay)
        np.testing.assert_array_equal(e[...], 2 * glob)
        collio.h5.flush(g)
    check_file(comm, path, {"plain": glob, "more": 2 * glob})


def test_missing_file_fails_everywhere(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    path = str(mpi_tmp_path / "absent.h5")
    with pytest.raises(collio.BackendError) as info:
        collio.h5.File(path, "r", comm=comm)
    texts = comm.allgather(str(info.value))
    assert texts == [texts[0]] * comm.size and "rank 0: no such file" in texts[0]


@pytest.mark.mpi(min_size=2)
def test_different_metadata_call_fails_everywhere(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    path = str(mpi_tmp_path / "diverge.h5")
    lay = layouts.block((8, 8), "<f8", comm=comm)
    with collio.h5.File(path, "w", comm=comm) as f:
        d = collio.h5.create_dataset(f, "x", (8, 8), "<f8")
        if comm.rank == comm.size - 1:
            f.attrs["only-here"] = 1  # a metadata call the other ranks do not make
        with pytest.raises(collio.MismatchError) as info:
            collio.h5.write_all(d, np.ones(lay.shape), lay)
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size
        assert f"rank {comm.size - 1} has /@only-here" in texts[0]
        assert info.value.ranks == (comm.size - 1,)
        with pytest.raises(collio.MismatchError):  # stays failed, still no hang
            collio.h5.flush(f)


def test_wrong_piece_on_one_rank_fails_everywhere(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    path = str(mpi_tmp_path / "bad.h5")
    lay = layouts.block((16, 8), "<f8", comm=comm)
    with collio.h5.File(path, "w", comm=comm) as f:
        d = collio.h5.create_dataset(f, "x", (16, 8), "<f8")
        data = np.ones(lay.shape)
        if comm.rank == comm.size - 1:
            data = np.ones((lay.shape[0] + 1, lay.shape[1]))
        with pytest.raises(collio.LayoutError) as info:
            collio.h5.write_all(d, data, lay)
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size and f"rank {comm.size - 1}" in texts[0]
        collio.h5.write_all(d, np.full(lay.shape, 2.0), lay)  # and the file goes on
    check_file(comm, path, {"x": np.full((16, 8), 2.0)})


def test_reads_files_written_by_plain_h5py(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    path = str(mpi_tmp_path / "foreign.h5")
    shape = (37, 29)
    glob = reference(shape, "<f8", seed=9)
    if comm.rank == 0:
        with h5py.File(path, "w") as f:
            f["contig"] = glob
            f.create_dataset("gz", data=glob, chunks=(6, 7), compression="gzip", shuffle=True)
            f.create_dataset("lzf", data=glob, chunks=(10, 4), compression="lzf", fletcher32=True)
            part = f.create_dataset("partial", shape, "<f8", chunks=(8, 8), fillvalue=-5.0)
            part[:8, :16] = glob[:8, :16]  # other chunks never written: the fill value
            f.create_dataset("late", shape, "<f8")  # never written, never allocated
    comm.Barrier()
    expect_partial = np.full(shape, -5.0)
    expect_partial[:8, :16] = glob[:8, :16]
    lay = layouts.block_cyclic(shape, "<f8", block=(4, 5), grid=layouts.dims_create(comm.size, 2))
    with collio.h5.File(path, "r", comm=comm) as f:
        cases = [("contig", glob), ("gz", glob), ("lzf", glob), ("partial", expect_partial)]
        for name, ref in [*cases, ("late", np.zeros(shape))]:
            got = collio.h5.read_all(f[name], lay)
            np.testing.assert_array_equal(got, local_piece(ref, lay), err_msg=name)
        st = collio.h5.stats(f)
        assert st.bytes_read > 0


def test_other_filters_through_hdf5(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    """Pipelines outside the numpy+zlib fast path are encoded by HDF5 itself."""
    path = str(mpi_tmp_path / "filters.h5")
    shape = (33, 40)
    glob = reference(shape, "<f4", seed=11)
    lay = layouts.block(shape, "<f4", comm=comm)
    with collio.h5.File(path, "w", comm=comm) as f:
        d = collio.h5.create_dataset(
            f, "lzf", shape, "<f4", chunks=(9, 8), compression="lzf", fletcher32=True
        )
        collio.h5.write_all(d, local_piece(glob, lay), lay)
    check_file(comm, path, {"lzf": glob})


def test_plugin_filter_zstd(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    """A filter HDF5 loads from a plugin (hdf5plugin's Zstd) is encoded by HDF5 too.

    The file is checked by a separate stock h5py that imports hdf5plugin, as a user would.
    """
    hdf5plugin = pytest.importorskip("hdf5plugin", reason="the zstd filter needs hdf5plugin")
    path = str(mpi_tmp_path / "zstd.h5")
    shape = (33, 40)
    glob = reference(shape, "<f4", seed=12)
    lay = layouts.block(shape, "<f4", comm=comm)
    with collio.h5.File(path, "w", comm=comm) as f:
        z = collio.h5.create_dataset(f, "zstd", shape, "<f4", chunks=(16, 16),
                                     **hdf5plugin.Zstd())  # fmt: skip
        collio.h5.write_all(z, local_piece(glob, lay), lay)
    other = layouts.block_cyclic(shape, "<f4", block=(5, 7), grid=layouts.dims_create(comm.size, 2))
    with collio.h5.File(path, "r", comm=comm) as f:
        back = collio.h5.read_all(f["zstd"], other)
        dcpl = f["zstd"].id.get_create_plist()
        filters = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())]
    np.testing.assert_array_equal(back, local_piece(glob, other))
    assert filters == [hdf5plugin.ZSTD_ID]  # the pipeline is zstd's, not dropped on the way
    check_file(comm, path, {"zstd": glob}, plugins=("hdf5plugin",))


def test_latest_format_resize_and_append_in_r_plus(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    path = str(mpi_tmp_path / "latest.h5")
    shape = (50, 40)
    glob = reference(shape, "<f8", seed=13)
    lay = layouts.block(shape, "<f8", comm=comm)
    with collio.h5.File(path, "w", comm=comm, libver="latest") as f:
        e = collio.h5.create_dataset(
            f, "ext", shape, "<f8", chunks=(8, 8), maxshape=(None, 40), compression="gzip"
        )
        collio.h5.write_all(e, local_piece(glob, lay), lay)
    grown = np.concatenate([glob, np.full((10, 40), 7.0)])
    lay2 = layouts.block(grown.shape, "<f8", comm=comm)
    with collio.h5.File(path, "r+", comm=comm) as f:
        f["ext"].resize(grown.shape)  # a metadata call, on every rank
        collio.h5.write_all(f["ext"], local_piece(grown, lay2), lay2)
        np.testing.assert_array_equal(collio.h5.read_all(f["ext"], lay2), local_piece(grown, lay2))
        f.attrs["done"] = 1
    check_file(comm, path, {"ext": grown}, {"/": {"done": 1}}, h5dump=False)


def test_sub_communicators_write_their_own_files(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    color = comm.rank % 2
    sub = comm.Split(color, comm.rank)
    try:
        path = str(mpi_tmp_path / f"sub{color}.h5")
        shape = (12, 10)
        glob = reference(shape, "<f8", seed=20 + color)
        lay = layouts.block(shape, "<f8", comm=sub)
        with collio.h5.File(path, "w", comm=sub) as f:
            d = collio.h5.create_dataset(f, "x", shape, "<f8")
            collio.h5.write_all(d, local_piece(glob, lay), lay)
            d.attrs["color"] = color
    finally:
        sub.Free()
    expected = {"x": reference((12, 10), "<f8", seed=20)}
    check_file(comm, str(mpi_tmp_path / "sub0.h5"), expected, {"x": {"color": 0}})
    if comm.size > 1:
        expected = {"x": reference((12, 10), "<f8", seed=21)}
        check_file(comm, str(mpi_tmp_path / "sub1.h5"), expected, {"x": {"color": 1}})


@pytest.mark.mpi(min_size=2)
def test_different_path_on_one_rank_fails_everywhere(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    """The file, mode and hints are agreed before rank 0 creates or truncates anything."""
    name = "other.h5" if comm.rank == comm.size - 1 else "mine.h5"
    with pytest.raises(collio.MismatchError) as info:
        collio.h5.File(str(mpi_tmp_path / name), "w", comm=comm)
    texts = comm.allgather(str(info.value))
    assert texts == [texts[0]] * comm.size and f"rank {comm.size - 1}: h5 open" in texts[0]
    assert "other.h5" in texts[0]
    assert not os.path.exists(str(mpi_tmp_path / "mine.h5"))


@pytest.mark.parametrize("how", ["data", "fill-at-alloc"])
def test_plain_reads_see_what_write_all_wrote(comm: MPI.Comm, mpi_tmp_path: Path, how: str) -> None:
    """Raw data HDF5 wrote itself (data=, fill values) must not shadow later collective writes
    on any rank."""
    path = str(mpi_tmp_path / f"shadow-{how}.h5")
    n = comm.size
    with collio.h5.File(path, "w", comm=comm) as f:
        if how == "data":
            ds = f.create_dataset("x", data=np.zeros((n, 4)))
        else:
            ds = f.create_dataset("x", (n, 4), "<f8", fillvalue=-1.0, fill_time="alloc")
        lay = layouts.Subarray((n, 4), (comm.rank, 0), (1, 4), "<f8")
        collio.h5.write_all(ds, np.full((1, 4), comm.rank + 1.0), lay)
        got = ds[:, 0]  # plain h5py, on every rank
        assert got.tolist() == [r + 1.0 for r in range(n)]
    check_file(comm, path, {"x": np.repeat(np.arange(1.0, n + 1)[:, None], 4, axis=1)})


@pytest.mark.parametrize("codec", [None, "gzip"])
def test_resize_between_collective_writes(comm: MPI.Comm, mpi_tmp_path: Path, codec: Any) -> None:
    """Shrinking rewrites edge chunks on every rank; a later write_all must not diverge."""
    path = str(mpi_tmp_path / f"resize-{codec}.h5")
    rows = 4 * comm.size
    with collio.h5.File(path, "w", comm=comm) as f:
        ds = collio.h5.create_dataset(
            f, "x", (rows, 8), "<f8", chunks=(4, 8), maxshape=(None, 8), compression=codec
        )

        def put(value: float) -> None:
            m = ds.shape[0]
            lo, hi = min(m, 4 * comm.rank), min(m, 4 * comm.rank + 4)
            lay = layouts.Subarray(ds.shape, (lo, 0), (hi - lo, 8), "<f8")
            collio.h5.write_all(ds, np.full((hi - lo, 8), value), lay)

        put(1.0)
        ds.resize((rows - 2, 8))
        collio.h5.flush(f)
        put(2.0)
        assert ds[:, 0].tolist() == [2.0] * (rows - 2)  # plain h5py, on every rank
        ds.resize((rows - 3, 8))
        collio.h5.flush(f)
    check_file(comm, path, {"x": np.full((rows - 3, 8), 2.0)})


def test_value_that_does_not_convert_on_one_rank(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    path = str(mpi_tmp_path / "convert.h5")
    with collio.h5.File(path, "w", comm=comm) as f:
        ds = collio.h5.create_dataset(f, "x", (comm.size, 4), "<f8")
        c = collio.h5.collective(ds)
        bad = comm.rank == comm.size - 1
        with pytest.raises(collio.LayoutError) as info:
            c[comm.rank : comm.rank + 1, :] = "oops" if bad else np.ones((1, 4))
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size and f"rank {comm.size - 1}: value 'oops'" in texts[0]
        c[comm.rank : comm.rank + 1, :] = 3.0  # usable afterwards
    check_file(comm, path, {"x": np.full((comm.size, 4), 3.0)})


@pytest.mark.mpi(min_size=2)
def test_failed_chunk_write_keeps_the_file_readable(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    """An aggregator's chunk write fails (EFBIG): the same error everywhere, the session
    refuses more, and the file keeps its last agreed metadata (stock h5py reads it)."""
    import resource
    import signal

    path = str(mpi_tmp_path / "efbig.h5")
    # (every rank aggregates: rank 1's own chunks fail)
    f = collio.h5.File(path, "w", comm=comm, hints={"cb_min_domain": 0})
    good = collio.h5.create_dataset(f, "good", (4,), "<i4")
    mine = 4 if comm.rank == 0 else 0
    collio.h5.write_all(
        good, np.arange(mine, dtype="<i4"), layouts.Subarray((4,), (0,), (mine,), "<i4")
    )
    ds = collio.h5.create_dataset(f, "x", (192, 192), "<f8", chunks=(64, 64), compression="gzip")
    collio.h5.flush(f)
    lay = layouts.block((192, 192), "<f8", grid=(1, comm.size), comm=comm)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if comm.rank == 1:
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 4096, hard))
    try:
        with pytest.raises(collio.BackendError) as info:
            collio.h5.write_all(ds, np.random.default_rng(comm.rank).random(lay.shape), lay)
    finally:
        if comm.rank == 1:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    texts = comm.allgather(str(info.value))
    assert texts == [texts[0]] * comm.size and "rank 1: file too large" in texts[0]
    with pytest.raises(collio.MismatchError, match="close it and open it again"):
        collio.h5.write_all(good, np.zeros(0, "<i4"), layouts.Subarray((4,), (0,), (0,), "<i4"))
    collio.h5.close(f)
    check_file(comm, path, {"good": np.arange(4, dtype="<i4"), "x": np.zeros((192, 192))})


def test_user_communicator_freed_while_the_file_is_open(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    """As with collio.open (and MPI-IO): the file keeps collio's duplicate of the
    communicator after the user frees theirs, until the file closes."""
    path = str(mpi_tmp_path / "freed.h5")
    sub = comm.Dup()
    glob = reference((4 * comm.size, 6), "<f8")
    lay = layouts.block(glob.shape, "<f8", grid=(comm.size, 1), comm=comm)
    f = collio.h5.File(path, "w", comm=sub)
    ds = collio.h5.create_dataset(f, "x", glob.shape, "<f8")
    sub.Free()
    collio.h5.write_all(ds, local_piece(glob, lay), lay)
    np.testing.assert_array_equal(collio.h5.read_all(ds, lay), local_piece(glob, lay))
    collio.h5.close(f)
    check_file(comm, path, {"x": glob})
    # a new file on the same ranks still works (the freed duplicate is not reused)
    again = str(mpi_tmp_path / "again.h5")
    with collio.h5.File(again, "w", comm=comm) as g:
        ds = collio.h5.create_dataset(g, "x", glob.shape, "<f8")
        collio.h5.write_all(ds, local_piece(glob, lay), lay)
    check_file(comm, again, {"x": glob})


@pytest.mark.mpi(min_size=2)
def test_read_beside_write_fails_everywhere(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    """read_all on one rank beside write_all on the others: one message on every rank
    naming each rank's call; the dataset keeps its bytes and the file goes on (more
    pairs in test_h5_mismatch.py)."""
    path = str(mpi_tmp_path / "rw.h5")
    lay = layouts.block((8, 8), "<f8", comm=comm)
    with collio.h5.File(path, "w", comm=comm) as f:
        d = collio.h5.create_dataset(f, "x", (8, 8), "<f8")
        collio.h5.write_all(d, np.ones(lay.shape), lay)
        with pytest.raises(collio.MismatchError) as info:
            if comm.rank == comm.size - 1:
                collio.h5.read_all(d, lay)
            else:
                collio.h5.write_all(d, np.zeros(lay.shape), lay)
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size
        assert texts[0] == (
            "ranks called different collective operations: rank 0 write_all of dataset '/x'; "
            f"rank {comm.size - 1}: read_all of dataset '/x' (every rank must make the same call)"
        )
        np.testing.assert_array_equal(collio.h5.read_all(d, lay), np.ones(lay.shape))
    check_file(comm, path, {"x": np.ones((8, 8))})


def test_row_blocks_through_collective_indexing(comm: MPI.Comm, mpi_tmp_path) -> None:
    """h5py-style ``collective(d)[box] = piece`` into a chunked gzip and a contiguous
    dataset; the collio driver is registered with h5py."""
    path = str(mpi_tmp_path / "rows.h5")
    glob = np.arange(7 * 9, dtype="<i8").reshape(7, 9)
    lay = layouts.block((7, 9), "<i8", comm=comm, grid=(comm.size, 1))
    band = layouts.block((3, 9), "<i8", comm=comm, grid=(comm.size, 1))
    rows = slice(2 + band.start[0], 2 + band.start[0] + band.shape[0])
    with collio.h5.File(path, "w", comm=comm) as f:
        c = collio.h5.create_dataset(f, "c", (7, 9), "<i8", chunks=(3, 4), compression="gzip")
        collio.h5.collective(c)[lay.slices] = glob[lay.slices]
        d = collio.h5.create_dataset(f, "d", (7, 9), "<i8")
        collio.h5.collective(d)[rows, :] = glob[rows]
        np.testing.assert_array_equal(collio.h5.collective(c)[1:6, 3:4], glob[1:6, 3:4])
    want = np.zeros_like(glob)
    want[2:5] = glob[2:5]
    check_file(comm, path, {"c": glob, "d": want})
    assert "collio" in h5py.registered_drivers()
    assert collio.h5.info()["h5py_mpi"] is bool(h5py.get_config().mpi)


def test_bad_selection_dtype_and_plain_h5py_file(comm: MPI.Comm, mpi_tmp_path) -> None:
    plain = str(mpi_tmp_path / f"plain-{comm.rank}.h5")
    with h5py.File(plain, "w") as f:  # each rank its own file: no collective call
        d = f.create_dataset("x", (4,), "<f8")
        with pytest.raises(collio.ModeError, match="driver='collio'"):
            collio.h5.write_all(d, np.zeros(4), layouts.Subarray((4,), (0,), (4,), "<f8"))
    with collio.h5.File(str(mpi_tmp_path / "c.h5"), "w", comm=comm) as f:
        d = collio.h5.create_dataset(f, "x", (4, 4), "<f8")
        with pytest.raises(collio.LayoutError, match="step 1") as info:
            collio.h5.collective(d)[::2, :] = 1.0
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size
        empty = layouts.Subarray((4, 4), (0, 0), (0, 0), "<f4")
        with pytest.raises(collio.LayoutError, match="dtype") as info:
            collio.h5.write_all(d, np.zeros((0, 0), "<f4"), empty)
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size


def test_partial_chunks_get_the_fill_value_and_1d(comm: MPI.Comm, mpi_tmp_path) -> None:
    """Chunks partly written keep the fill value elsewhere; chunks nobody touches are not
    stored; a 1-D shuffled dataset and an empty one."""
    path = str(mpi_tmp_path / "fill.h5")
    box = layouts.block((4, 2), "<i4", comm=comm, grid=(comm.size, 1))
    part = layouts.Subarray((10, 10), (2 + box.start[0], 3), box.shape, "<i4")
    span = layouts.block((88,), "<f8", comm=comm)
    line_lay = layouts.Subarray((100,), (5 + span.start[0],), span.shape, "<f8")
    with collio.h5.File(path, "w", comm=comm) as f:
        c = collio.h5.create_dataset(f, "c", (10, 10), "<i4", chunks=(4, 4), fillvalue=-1,
                                     compression="gzip")  # fmt: skip
        collio.h5.write_all(c, np.full(part.shape, 9, "<i4"), part)  # 4 chunks, each in part
        v = collio.h5.create_dataset(f, "v", (100,), "<f8", chunks=(7,), shuffle=True)
        collio.h5.write_all(v, np.arange(5, 93, dtype="<f8")[span.slices], line_lay)
        e = collio.h5.create_dataset(f, "e", (0, 3), "<f8")
        collio.h5.collective(e)[...] = np.zeros((0, 3))
    expect = np.full((10, 10), -1, "<i4")
    expect[2:6, 3:5] = 9
    line = np.zeros(100)
    line[5:93] = np.arange(5, 93)
    check_file(comm, path, {"c": expect, "v": line, "e": np.zeros((0, 3))})
    if comm.rank == 0:
        with h5py.File(path, "r") as f:
            assert f["c"].id.get_num_chunks() == 4  # untouched chunks are not stored


# ------------------------------------------------- the shared conformance suite
class TestHdf5Backend(Hdf5BackendTests):
    """``collio.open(..., backend="hdf5")`` under mpiexec: a contiguous dataset."""

    @pytest.fixture
    def target(self, mpi_tmp_path):
        return str(mpi_tmp_path / "conformance.h5")


class TestHdf5BackendChunked(Hdf5BackendTests):
    """A chunked, compressed dataset whose chunks no decomposition lines up with."""

    @pytest.fixture
    def target(self, mpi_tmp_path):
        return str(mpi_tmp_path / "chunked.h5")

    @pytest.fixture
    def open_options(self):
        return {"dataset": "m", "shape": (48, 40), "dtype": "<f8", "chunks": (10, 7),
                "compression": "gzip", "shuffle": True}  # fmt: skip


@pytest.mark.parametrize("chunks", [None, (7, 5)])
def test_hdf5_backend_file_read_by_stock_h5py(
    comm: MPI.Comm, mpi_tmp_path, chunks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What collio.open(backend='hdf5') wrote and closed is what stock h5py (another
    process) and h5dump read; a sync in between leaves the file readable too, by a
    reader that does not take HDF5's file lock (collio holds it to write)."""
    path = str(mpi_tmp_path / "backend.h5")
    shape = (29, 23)
    glob = reference(shape, "<f8", seed=41)
    lay = _layout("cyclic", comm, shape, "<f8")
    opts: dict[str, Any] = {"dataset": "grp/x", "shape": shape, "dtype": "<f8"}
    if chunks is not None:
        opts.update(chunks=chunks, compression="gzip")
    with collio.open(path, "w", comm=comm, backend="hdf5", **opts) as f:
        f.write_all(local_piece(glob, lay), lay)
        f.sync()
        with monkeypatch.context() as m:
            m.setenv("HDF5_USE_FILE_LOCKING", "FALSE")  # (the reader's, as a user would)
            check_file(comm, path, {"grp/x": glob})
        f.write_all(local_piece(-glob, lay), lay)
    check_file(comm, path, {"grp/x": -glob})


def test_collio_h5_refuses_atomic_commit_everywhere(comm: MPI.Comm, mpi_tmp_path) -> None:
    """HDF5 files are written in place: collio.h5 refuses the hint on every rank alike,
    before rank 0 creates anything (as the hdf5 backend does)."""
    path = str(mpi_tmp_path / "atomic.h5")
    with pytest.raises(collio.ModeError, match="atomic_commit is not supported") as info:
        collio.h5.File(path, "w", comm=comm, hints={"atomic_commit": True})
    texts = comm.allgather(str(info.value))
    assert texts == [texts[0]] * comm.size
    assert not comm.allgather(os.path.exists(path))[0]


def test_many_datasets_in_one_call(comm: MPI.Comm, mpi_tmp_path: Path) -> None:
    """``write_many``/``read_many``: pieces of several contiguous datasets (one in a
    group) in one call each; stock h5py reads what was written;
    a chunked dataset or a bad item is refused on every rank, naming the item."""
    path = str(mpi_tmp_path / "many.h5")
    shapes = [(37, 45), (16,), (9, 4, 5)]
    globs = [reference(s, "<f8", seed=20 + k) for k, s in enumerate(shapes)]
    with collio.h5.File(path, "w", comm=comm) as f:
        grp = f.create_group("g")
        ds = [collio.h5.create_dataset(grp if k == 1 else f, f"d{k}", s, "<f8")
              for k, s in enumerate(shapes)]  # fmt: skip
        chunked = collio.h5.create_dataset(f, "c", (8,), "<f8", chunks=(4,))
        lays = [layouts.block(s, "<f8", comm=comm) for s in shapes]
        items = [(d, local_piece(g, lay), lay) for d, g, lay in zip(ds, globs, lays, strict=True)]
        collio.h5.write_many(f, items)
        assert collio.h5.stats(f).last_call["items"] == 3
        rows = [layouts.block(s, "<f8", comm=comm, grid=(comm.size,) + (1,) * (len(s) - 1))
                for s in shapes]  # fmt: skip
        back = collio.h5.read_many(f, list(zip(ds, rows, strict=True)))
        for g, lay, got in zip(globs, rows, back, strict=True):
            np.testing.assert_array_equal(got, local_piece(g, lay))
        with pytest.raises(collio.LayoutError, match="item 1: dataset '/c' is chunked"):
            collio.h5.write_many(f, [items[0], (chunked, np.zeros(0), layouts.Segments([], []))])
        bad = list(items)
        if comm.rank == comm.size - 1:
            bad[2] = (ds[2], np.zeros(3), lays[2])
        with pytest.raises(collio.LayoutError, match=f"rank {comm.size - 1}: item 2: data shape"):
            collio.h5.write_many(f, bad)
    check_file(comm, path, {"d0": globs[0], "g/d1": globs[1], "d2": globs[2]}, {})


def test_a_contiguous_dataset_with_a_fill_value_reads_it_where_nothing_was_written(
    comm: MPI.Comm, mpi_tmp_path: Path
) -> None:
    """A fill value given to a contiguous dataset is written as h5py's default
    (``fill_time='ifset'``) has HDF5 write it: the elements no rank wrote read as it, in
    stock h5py (another process) too, not as the zeros of the file's new space.  The
    ranks write it, each its share, at the next collective call: a rank's plain reads
    see it before, and plain writes made before that call are kept over it.
    ``fill_time='never'`` keeps it as a property only."""
    path = str(mpi_tmp_path / "fill.h5")
    n = comm.size
    with collio.h5.File(path, "w", comm=comm) as f:
        ds = collio.h5.create_dataset(f, "k", (8, 4 * n), "<i4", fillvalue=-3)
        big = collio.h5.create_dataset(f, "big", (3, 1000 * n + 1), ">f8", fillvalue=2.5)
        alloc = collio.h5.create_dataset(f, "alloc", (5,), "<i2", fillvalue=7, fill_time="alloc")
        never = collio.h5.create_dataset(f, "never", (4, n), "<i4", fillvalue=9,
                                         fill_time="never")  # fmt: skip
        assert ds[7, :].tolist() == [-3] * 4 * n  # (plain h5py, before any collective call)
        ds[7, 0] = 11  # (every rank alike, before the fill is written)
        lay = layouts.Subarray((8, 4 * n), (0, 4 * comm.rank), (2, 4), "<i4")
        collio.h5.write_all(ds, np.full((2, 4), comm.rank, "<i4"), lay)
        assert (ds.fillvalue, never.fillvalue, big.fillvalue, alloc.fillvalue) == (-3, 9, 2.5, 7)
    want = np.full((8, 4 * n), -3, "<i4")
    want[:2] = np.repeat(np.arange(n, dtype="<i4"), 4)
    want[7, 0] = 11
    check_file(comm, path, {"k": want, "big": np.full((3, 1000 * n + 1), 2.5, ">f8"),
                            "alloc": np.full(5, 7, "<i2"),
                            "never": np.zeros((4, n), "<i4")})  # fmt: skip


def test_the_hdf5_backend_fills_a_new_dataset(
    comm: MPI.Comm, mpi_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``collio.open(..., backend="hdf5", fillvalue=...)``: the fill is written at the
    open, in steps of a bounded size (rank 0 holds one, not the dataset's size); the
    ranks' writes land over it.  A fill_time HDF5 does not know is refused on every
    rank."""
    from collio.backends.hdf5 import vfile

    monkeypatch.setattr(vfile, "FILL_STEP", 1000)  # (many steps)
    path = str(mpi_tmp_path / "backend-fill.h5")
    n = comm.size
    lay = layouts.Subarray((n, 700), (comm.rank, 0), (1, 350), "<f4")
    with collio.open(path, "w", comm=comm, backend="hdf5", dataset="x", shape=(n, 700),
                     dtype="<f4", fillvalue=-1.5) as f:  # fmt: skip
        f.write_all(np.full((1, 350), comm.rank, "<f4"), lay)
    want = np.full((n, 700), -1.5, "<f4")
    want[:, :350] = np.arange(n, dtype="<f4")[:, None]
    check_file(comm, path, {"x": want})
    with pytest.raises(collio.LayoutError, match="fill_time 'sometimes' is not one of"):
        collio.open(str(mpi_tmp_path / "bad.h5"), "w", comm=comm, backend="hdf5", dataset="x",
                    shape=(4,), dtype="<f4", fillvalue=1.0, fill_time="sometimes")  # fmt: skip


def test_fills_keep_hdf5s_order_and_survive_a_plain_close(
    comm: MPI.Comm, mpi_tmp_path: Path
) -> None:
    """Fills land as HDF5 would have written them at creation: a dataset deleted before
    any collective call and another made in its space (smaller, with its own fill) read
    as stock h5py writes them; a file closed by h5py alone right after a create keeps
    the fill; datasets whose fill only HDF5 can write (variable length, references,
    scalars) are made and filled by it."""
    path = str(mpi_tmp_path / "order.h5")
    n = comm.size
    with h5py.File(path, "w", driver="collio", comm=comm) as f:
        collio.h5.create_dataset(f, "gone", (5000,), "<i4", fillvalue=-1)
        del f["gone"]
        collio.h5.create_dataset(f, "new2", (3000,), "<i4", fillvalue=7)
        collio.h5.flush(f)
        collio.h5.create_dataset(f, "vl", (6,), h5py.vlen_dtype("i4"), fill_time="alloc")
        collio.h5.create_dataset(f, "ref", (3,), h5py.ref_dtype, fill_time="alloc")
        collio.h5.create_dataset(f, "one", (), "<f8", fillvalue=4.5)
        collio.h5.create_dataset(f, "last", (10 * n + 3,), ">u2", fillvalue=513)
    # (h5py's own close, no collective call after the last create)
    check_file(comm, path, {"new2": np.full(3000, 7, "<i4"), "one": np.array(4.5),
                            "last": np.full(10 * n + 3, 513, ">u2")})  # fmt: skip
    if comm.rank == 0:
        with h5py.File(path, "r") as f:
            assert [len(v) for v in f["vl"][...]] == [0] * 6
            assert not any(bool(r) for r in f["ref"][...])


def test_a_chunked_big_endian_dataset_keeps_its_fill_where_nothing_was_written(
    comm: MPI.Comm, mpi_tmp_path: Path
) -> None:
    """The unwritten elements of a chunk the ranks wrote in part read as the fill value
    in the dataset's own byte order."""
    path = str(mpi_tmp_path / "bigendian.h5")
    n = comm.size
    with collio.h5.File(path, "w", comm=comm) as f:
        ds = collio.h5.create_dataset(f, "b", (4, 8 * n), ">i4", chunks=(4, 8), fillvalue=1)
        lay = layouts.Subarray((4, 8 * n), (0, 8 * comm.rank), (1, 4), ">i4")
        collio.h5.write_all(ds, np.full((1, 4), 100 + comm.rank, ">i4"), lay)
        mine = layouts.Subarray((4, 8 * n), (0, 8 * comm.rank), (4, 8), ">i4")
        got = collio.h5.read_all(ds, mine)
        ok = comm.allgather(bool((got[1:] == 1).all() and (got[0, 4:] == 1).all()))
        assert all(ok), ok
    want = np.ones((4, 8 * n), ">i4")
    for r in range(n):
        want[0, 8 * r : 8 * r + 4] = 100 + r
    check_file(comm, path, {"b": want})


def test_a_file_another_program_holds_open_is_locked_as_hdf5_locks_it(
    comm: MPI.Comm, mpi_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HDF5's file lock, which h5py's file-object driver leaves out: while stock h5py in
    another process reads the file, collio opens it to read but not to write ('r+', or
    'w', which leaves its bytes as they were), the same error on every rank;
    ``HDF5_USE_FILE_LOCKING=FALSE`` opens it anyway, as HDF5 does."""
    import subprocess
    import sys

    path = str(comm.bcast(str(mpi_tmp_path / "locked.h5"), root=0))
    with collio.h5.File(path, "w", comm=comm) as f:
        collio.h5.create_dataset(f, "x", (4,), "<i4", fillvalue=3)
    holder: Any = None
    if comm.rank == 0:
        code = (
            f"import h5py, sys; f = h5py.File({path!r}, 'r'); print(1, flush=True); "
            "sys.stdin.read()"
        )
        holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        holder.stdout.readline()
    comm.Barrier()
    try:
        for mode in ("r+", "w"):
            with pytest.raises(collio.BackendError, match="unable to lock") as info:
                collio.h5.File(path, mode, comm=comm)
            assert "rank 0" in str(info.value)
        with collio.h5.File(path, "r", comm=comm) as f:
            assert f["x"][...].tolist() == [3] * 4
        monkeypatch.setenv("HDF5_USE_FILE_LOCKING", "FALSE")
        with collio.h5.File(path, "r+", comm=comm) as f:
            assert f["x"][...].tolist() == [3] * 4
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait()
            holder.stdout.close()
    check_file(comm, path, {"x": np.full(4, 3, "<i4")})


def test_a_chunk_that_cannot_be_decoded_is_a_backend_error_on_every_rank(
    comm: MPI.Comm, mpi_tmp_path: Path
) -> None:
    """A gzip chunk garbled on the disk: reading it (and writing part of it, which reads
    it first) raises the same BackendError on every rank, naming the chunk and dataset;
    the other chunks still read."""
    from helpers import raises_everywhere

    path = str(comm.bcast(str(mpi_tmp_path / "garbled.h5"), root=0))
    ref = np.arange(4096.0).reshape(64, 64)
    if comm.rank == 0:
        with h5py.File(path, "w") as h:
            h.create_dataset("g", data=ref, chunks=(16, 16), compression="gzip")
            off = h["g"].id.get_chunk_info(5).byte_offset
        with open(path, "r+b") as fh:
            fh.seek(off + 10)
            fh.write(b"\0" * 40)
    comm.Barrier()
    whole = layouts.Subarray((64, 64), (0, 0), (64, 64), "<f8")
    with collio.h5.File(path, "r+", comm=comm) as f:
        err = raises_everywhere(comm, collio.BackendError,
                                lambda: collio.h5.read_all(f["g"], whole))  # fmt: skip
        assert "chunk 5 of dataset '/g'" in str(err) and "cannot be decoded" in str(err)
        rows = 2 if comm.rank == 0 else 0  # (one rank writes into the garbled chunk)
        band = layouts.Subarray((64, 64), (16, 16), (rows, 4), "<f8")
        ones = np.ones((rows, 4))
        raises_everywhere(comm, collio.BackendError,
                          lambda: collio.h5.write_all(f["g"], ones, band))  # fmt: skip
        fine = layouts.Subarray((64, 64), (48, 48), (16, 16), "<f8")
        got = collio.h5.read_all(f["g"], fine)
        assert got.tobytes() == ref[48:, 48:].tobytes()
