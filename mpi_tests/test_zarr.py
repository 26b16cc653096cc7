"""The zarr backend: conformance suite, options and targets, errors raised alike everywhere.

Every array is read back by plain zarr (rank 0, after the ranks closed it).
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from mpi4py import MPI

zarr = pytest.importorskip("zarr")

import collio  # noqa: E402
from collio import layouts  # noqa: E402
from collio.testing.zarr_suite import ZarrBackendTests  # noqa: E402


class TestZarr(ZarrBackendTests):
    @pytest.fixture
    def target(self, mpi_tmp_path):
        return str(mpi_tmp_path / "conformance.zarr")


class TestZarrShardedZstd(ZarrBackendTests):
    @pytest.fixture
    def target(self, mpi_tmp_path):
        return str(mpi_tmp_path / "sharded.zarr")

    @pytest.fixture
    def open_options(self):
        return {
            "shape": (48, 40), "dtype": "<f8", "chunks": (4, 5), "shards": (12, 10),
            "compressors": [zarr.codecs.ZstdCodec(level=1)],
        }  # fmt: skip


class TestZarrShardedBlosc(TestZarrShardedZstd):
    @pytest.fixture
    def open_options(self):
        codec = zarr.codecs.BloscCodec(cname="lz4", clevel=3, shuffle="shuffle")
        return {
            "shape": (48, 40), "dtype": "<f8", "chunks": (5, 7), "shards": (10, 14),
            "compressors": [codec],
        }  # fmt: skip


def same_everywhere(comm, exc):
    texts = comm.allgather((type(exc).__name__, str(exc)))
    assert texts == [texts[0]] * comm.size
    return texts[0][1]


def plain_array(comm, path, **opts):
    """An array made by rank 0 with plain zarr, seen by every rank afterwards."""
    if comm.rank == 0:
        zarr.create_array(path, **opts)
    comm.Barrier()


@pytest.mark.mpi
def test_layout_shape_or_dtype_mismatch_fails_on_every_rank(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "m.zarr")
    with collio.open(path, "w", comm=comm, backend="zarr", shape=(20, 30), dtype="<f8",
                     chunks=(7, 7)) as f:  # fmt: skip
        bad = layouts.block((20, 31), "<f8", comm=comm)
        with pytest.raises(collio.LayoutError) as info:
            f.write_all(np.zeros(bad.shape), bad)
        assert "does not match the zarr array's shape (20, 30)" in same_everywhere(comm, info.value)
        bad = layouts.block((20, 30), "<f4", comm=comm)
        with pytest.raises(collio.LayoutError) as info:
            f.read_all(bad)
        assert "dtype float32 does not match" in same_everywhere(comm, info.value)
        # one rank alone disagreeing is caught too
        shape = (20, 31) if comm.rank == comm.size - 1 else (20, 30)
        lay = layouts.Subarray(shape, (0, 0), (0, 0), "<f8")
        with pytest.raises(collio.LayoutError) as info:
            f.write_all(np.zeros((0, 0)), lay)
        assert f"rank {comm.size - 1}:" in same_everywhere(comm, info.value)
        good = layouts.block((20, 30), "<f8", comm=comm)
        f.write_all(np.full(good.shape, 2.0), good)  # usable afterwards
        assert (f.read_all(good) == 2.0).all()
    comm.Barrier()
    assert sorted(os.listdir(os.path.join(path, "c"))) == ["0", "1", "2"]
    assert (zarr.open_array(path, mode="r")[...] == 2.0).all()


@pytest.mark.mpi
def test_missing_array_fails_on_every_rank(comm, mpi_tmp_path):
    with pytest.raises(collio.BackendError) as info:
        collio.open(str(mpi_tmp_path / "nothing.zarr"), "r+", comm=comm, backend="zarr")
    assert info.value.errno == errno.ENOENT
    assert "no zarr array at" in same_everywhere(comm, info.value)


@pytest.mark.mpi
def test_read_only_store_fails_on_every_rank(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "ro.zarr")
    plain_array(comm, path, shape=(8, 8), dtype="<f8", chunks=(3, 3))
    store = zarr.storage.LocalStore(path, read_only=True)
    for mode in ("r+", "w"):
        opts = {"shape": (8, 8), "dtype": "<f8"} if mode == "w" else {}
        with pytest.raises(collio.BackendError) as info:
            collio.open(store, mode, comm=comm, backend="zarr", **opts)
        assert info.value.errno == errno.EROFS
        assert "read-only" in same_everywhere(comm, info.value)
    with collio.open(store, "r", comm=comm, backend="zarr") as f:
        lay = layouts.block((8, 8), "<f8", comm=comm)
        with pytest.raises(collio.ModeError) as info:
            f.write_all(np.zeros(lay.shape), lay)
        same_everywhere(comm, info.value)
    assert zarr.open_array(path, mode="r").nchunks_initialized == 0


@pytest.mark.mpi(min_size=2)
def test_ranks_opening_different_arrays_fail_together(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / f"own-{comm.rank}.zarr")
    arr = zarr.create_array(path, shape=(8, 8 + comm.rank), dtype="<f8", chunks=(4, 4))
    comm.Barrier()
    with pytest.raises(collio.MismatchError) as info:
        collio.open(arr, "r+", comm=comm, backend="zarr")
    text = same_everywhere(comm, info.value)
    assert "rank 1 (zarr target" in text and "own-1.zarr" in text and "((8, 9)," in text


@pytest.mark.mpi
def test_misaligned_blocks_read_back_by_plain_zarr(comm, mpi_tmp_path):
    shape = (333, 257)
    glob = np.arange(shape[0] * shape[1], dtype="<i8").reshape(shape)
    path = str(mpi_tmp_path / "plain.zarr")
    lay = layouts.block(shape, "<i8", comm=comm)
    with collio.open(path, "w", comm=comm, backend="zarr", shape=shape, dtype="<i8",
                     chunks=(50, 40), hints={"cb_buffer_size": 64 << 10}) as f:  # fmt: skip
        f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
    if comm.rank == 0:
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], glob)
    comm.Barrier()


@pytest.mark.mpi
def test_a_failing_chunk_write_raises_on_every_rank_and_the_file_goes_on(comm, mpi_tmp_path):
    # chunk row 3's keys live under c/3/: a regular file there makes exactly the
    # aggregator that owns that row fail (ENOTDIR or EEXIST), mid-call
    shape, chunks = (40, 40), (5, 40)
    path = str(mpi_tmp_path / "fail.zarr")
    glob = np.arange(1600.0).reshape(shape)
    lay = layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))  # every chunk shared
    with collio.open(path, "w", comm=comm, backend="zarr", shape=shape, dtype="<f8",
                     chunks=chunks, hints={"cb_buffer_size": 1600}) as f:  # fmt: skip
        if comm.rank == 0:
            os.makedirs(os.path.join(path, "c"), exist_ok=True)
            with open(os.path.join(path, "c", "3"), "w") as fh:
                fh.write("in the way")
        comm.Barrier()
        with pytest.raises(collio.BackendError) as info:
            f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        text = same_everywhere(comm, info.value)
        assert text.startswith("backend I/O: rank ") and info.value.errno is not None
        assert len(info.value.ranks) == 1 and info.value.ranks[0] in f.aggregators, text
        if comm.rank == 0:
            os.unlink(os.path.join(path, "c", "3"))
        comm.Barrier()
        f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        np.testing.assert_array_equal(f.read_all(lay), glob[lay.slices])
    if comm.rank == 0:  # the whole array, chunk row 3 included, as stock zarr reads it
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], glob)
    comm.Barrier()


def _random_layout(rng, comm, shape, dtype, order):
    nd, grid = len(shape), layouts.dims_create(comm.size, len(shape))
    kind = int(rng.integers(3))
    if kind == 1:
        blk = tuple(int(x) for x in rng.integers(1, 6, nd))
        return layouts.block_cyclic(shape, dtype, block=blk, grid=grid, comm=comm, order=order)
    if kind == 2:
        return layouts.block(shape, dtype, comm=comm, order=order)
    coords = np.unravel_index(comm.rank, grid)
    start, ext = [], []
    for c, n, p in zip(coords, shape, grid, strict=True):
        edges = [0, *sorted(rng.integers(0, n + 1, p - 1).tolist()), n]  # some ranks empty
        start.append(edges[c])
        ext.append(edges[c + 1] - edges[c])
    return layouts.Subarray(shape, start, ext, dtype, order=order)


@pytest.mark.mpi
@pytest.mark.parametrize("seed", range(6))
def test_random_decompositions_and_updates_match_plain_zarr(comm, mpi_tmp_path, seed):
    """Chunks, shards, orders, dtypes, buffer sizes and decompositions drawn at random."""
    rng = np.random.default_rng(seed)  # the same draws on every rank
    nd = int(rng.integers(1, 4))
    shape = tuple(int(x) for x in rng.integers(1, 40, nd))
    chunks = tuple(int(x) for x in rng.integers(1, 12, nd))
    shards = tuple(c * int(rng.integers(1, 3)) for c in chunks) if rng.random() < 0.3 else None
    order, dtype = "CF"[int(rng.integers(2))], ["<f8", "<i4", "u1"][int(rng.integers(3))]
    hints = {"cb_buffer_size": int(rng.choice([1, 4096, 1 << 20]))}
    if rng.random() < 0.3:
        hints["romio_cb_write"] = "enable"
    path = str(mpi_tmp_path / f"random-{seed}.zarr")
    want = np.zeros(shape, dtype)
    for phase in range(2):
        glob = (rng.random(shape) * 100).astype(dtype) + 1 + 100 * phase
        lay = _random_layout(rng, comm, shape, dtype, order)
        sel = lay.slices if isinstance(lay, layouts.Subarray) else np.ix_(*lay.indices)
        mine = np.asfortranarray(glob[sel]) if order == "F" else np.ascontiguousarray(glob[sel])
        opts = {"shape": shape, "dtype": dtype, "chunks": chunks, "shards": shards}
        with collio.open(path, "w" if phase == 0 else "r+", comm=comm, backend="zarr",
                         hints=hints, fill_value=0, **opts) as f:  # fmt: skip
            f.write_all(mine, lay)
            np.testing.assert_array_equal(f.read_all(lay), mine)
        mask = np.zeros(shape, np.int32)
        mask[sel] = 1
        wrote = comm.allreduce(mask) > 0
        want[wrote] = glob[wrote]
    if comm.rank == 0:
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], want)
    comm.Barrier()


def _existing(comm, path):
    """A small zarr array with known content, made by rank 0 with plain zarr."""
    import zarr

    if comm.rank == 0:
        a = zarr.create_array(path, shape=(6,), dtype="<i4", chunks=(2,), overwrite=True)
        a[:] = np.arange(1, 7, dtype="<i4")
    comm.Barrier()


def _content(path):
    import zarr

    return zarr.open_array(path, mode="r")[:].tolist()


@pytest.mark.mpi(min_size=2)
def test_creation_options_differ_on_one_rank_leaves_the_array(comm, mpi_tmp_path):
    """Mode 'w' overwrites: every rank's creation options are agreed before rank 0 does."""
    path = str(mpi_tmp_path / "keep.zarr")
    _existing(comm, path)
    shape = (7,) if comm.rank == comm.size - 1 else (6,)
    with pytest.raises(collio.MismatchError) as info:
        collio.open(path, "w", comm=comm, backend="zarr", shape=shape, dtype="<i4", chunks=(2,))
    text = same_everywhere(comm, info.value)
    assert f"rank {comm.size - 1}:" in text and "(7,)" in text
    assert _content(path) == [1, 2, 3, 4, 5, 6]
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_arrays_at_different_paths_in_one_store(comm, mpi_tmp_path):
    """Ranks naming different arrays (path=) fail everywhere instead of splitting the data."""
    store = str(mpi_tmp_path / "group.zarr")
    if comm.rank == 0:
        import zarr

        for name in ("x", "y"):
            zarr.create_array(store, name=name, shape=(6,), dtype="<i4", chunks=(2,))
    comm.Barrier()
    name = "y" if comm.rank == comm.size - 1 else "x"
    with pytest.raises(collio.MismatchError) as info:
        collio.open(store, "r+", comm=comm, backend="zarr", path=name)
    text = same_everywhere(comm, info.value)
    assert f"rank {comm.size - 1}" in text and "'y'" in text


@pytest.mark.mpi
def test_big_endian_dtype(comm, mpi_tmp_path):
    """zarr v3 keeps byte order in its codecs: an array made with '>i2' holds int16."""
    path = str(mpi_tmp_path / "be.zarr")
    n = 4 * comm.size
    with collio.open(path, "w", comm=comm, backend="zarr", shape=(n,), dtype=">i2",
                     chunks=(4,)) as f:  # fmt: skip
        lay = layouts.block((n,), "<i2", comm=comm)
        f.write_all(np.arange(lay.start[0], lay.start[0] + lay.shape[0], dtype="<i2"), lay)
    with collio.open(path, "r+", comm=comm, backend="zarr", dtype=">i2") as f:
        got = f.read_all(layouts.block((n,), "<i2", comm=comm))
        assert got.tolist() == list(range(lay.start[0], lay.start[0] + lay.shape[0]))
    comm.Barrier()
    assert _content(path) == list(range(n))


def _rows_of(box: layouts.Subarray, comm: MPI.Intracomm) -> layouts.Subarray:
    """This rank's rows of ``box`` (a few ranks may hold none)."""
    part = layouts.block(
        box.shape, box.dtype, comm=comm, grid=(comm.size,) + (1,) * (len(box.shape) - 1)
    )
    start = [a + b for a, b in zip(box.start, part.start, strict=True)]
    return layouts.Subarray(box.global_shape, start, part.shape, box.dtype, order=box.order)


def _write(comm, target, glob, lay, mode="w", **opts):
    """Write ``glob`` under ``lay`` (this rank's piece); returns the file's stats."""
    piece = glob[lay.slices]
    piece = np.asfortranarray(piece) if lay.order == "F" else np.ascontiguousarray(piece)
    with collio.open(target, mode, comm=comm, backend="zarr", **opts) as f:
        f.write_all(piece, lay)
        return f.stats.as_dict()


@pytest.mark.mpi
def test_fortran_and_3d_layouts_and_fill_value(comm, mpi_tmp_path):
    shape = (13, 17, 11)
    glob = np.random.default_rng(1).standard_normal(shape)
    path = str(mpi_tmp_path / "f.zarr")
    box = layouts.Subarray(shape, (2, 3, 1), (9, 12, 10), "<f8", order="F")
    lay = _rows_of(box, comm)
    opts = {"shape": shape, "dtype": "<f8", "chunks": (4, 5, 3), "fill_value": -7.0}
    want = np.full(shape, -7.0)
    want[box.slices] = glob[box.slices]
    whole = layouts.block(shape, "<f8", comm=comm, order="F")
    with collio.open(path, "w", comm=comm, backend="zarr", **opts) as f:
        f.write_all(np.asfortranarray(glob[lay.slices]), lay)
        np.testing.assert_array_equal(f.read_all(lay), glob[lay.slices])
        got = f.read_all(whole)  # never-written chunks read as the fill value
    np.testing.assert_array_equal(got, want[whole.slices])
    comm.Barrier()
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], want)


@pytest.mark.mpi
def test_huge_chunks_and_variable_size_dtypes_are_refused(comm, mpi_tmp_path):
    huge, text = str(mpi_tmp_path / "huge.zarr"), str(mpi_tmp_path / "s.zarr")
    if comm.rank == 0:
        zarr.create_array(huge, shape=(1 << 16, 1 << 16), dtype="<f8", chunks=(1 << 14, 1 << 14))
        zarr.create_array(text, shape=(4,), dtype=str, chunks=(2,))
    comm.Barrier()
    with pytest.raises(collio.BackendError) as info:
        collio.open(huge, "r", comm=comm, backend="zarr")
    assert "chunks (16384, 16384) of 2147483648 bytes" in same_everywhere(comm, info.value)
    with pytest.raises(collio.BackendError) as info:
        collio.open(text, "r", comm=comm, backend="zarr")
    assert "variable-size elements" in same_everywhere(comm, info.value)


@pytest.mark.mpi
def test_zarr_array_and_store_targets(comm, mpi_tmp_path):
    """Each rank passes its own zarr.Array ('r+'), then its own LocalStore ('r')."""
    path = str(mpi_tmp_path / "a.zarr")
    plain_array(comm, path, shape=(30, 20), dtype="<i4", chunks=(7, 6), fill_value=0)
    arr = zarr.open_array(path, mode="r+")
    glob = np.arange(600, dtype="<i4").reshape(30, 20)
    lay = _rows_of(layouts.Subarray((30, 20), (3, 0), (20, 20), "<i4"), comm)
    _write(comm, arr, glob, lay, mode="r+")
    with collio.open(zarr.storage.LocalStore(path), "r", comm=comm, backend="zarr") as f:
        np.testing.assert_array_equal(f.read_all(lay), glob[lay.slices])
    want = np.zeros_like(glob)
    want[3:23] = glob[3:23]
    comm.Barrier()
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], want)


@pytest.mark.mpi
def test_array_in_a_group_by_path(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "g.zarr")
    if comm.rank == 0:
        zarr.create_group(path)
    comm.Barrier()
    glob = np.arange(100.0).reshape(10, 10)
    lay = layouts.block((10, 10), "<f8", comm=comm)
    _write(comm, path, glob, lay, shape=(10, 10), dtype="<f8", chunks=(3, 3), path="sub/data")
    comm.Barrier()
    np.testing.assert_array_equal(zarr.open_array(path, path="sub/data", mode="r")[...], glob)


@pytest.mark.mpi
def test_memory_store_on_its_own_rank(comm):
    """A MemoryStore lives in one process: each rank writes its own over ``COMM_SELF``."""
    store = zarr.storage.MemoryStore()
    glob = np.arange(64.0).reshape(8, 8) + comm.rank
    lay = layouts.Subarray((8, 8), (0, 0), (8, 8), "<f8")
    opts = {"shape": (8, 8), "dtype": "<f8", "chunks": (3, 3), "compressors": None}
    _write(MPI.COMM_SELF, store, glob, lay, **opts)
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], glob)


@pytest.mark.mpi
def test_stats_report_the_units_each_aggregator_owns(comm, mpi_tmp_path):
    glob = np.ones((1000, 1000))
    lay = layouts.block((1000, 1000), "<f8", comm=comm)
    st = _write(comm, str(mpi_tmp_path / "s.zarr"), glob, lay, shape=(1000, 1000), dtype="<f8",
                chunks=(300, 300), hints={"romio_cb_write": "enable", "cb_nodes": 1})  # fmt: skip
    assert st["collective_calls"] == 1 and st["direct_calls"] == 0
    be = st["backend"]
    assert be["unit"] == "chunk" and be["unit_nbytes"] == 300 * 300 * 8 and be["units"] == 16
    assert be["domains"] == [{"units": [0, 16], "nbytes": 8 * 10**6}]
    assert st["write_ops"] == 16 and st["bytes_written"] == 8 * 10**6


@pytest.mark.mpi
def test_units_one_rank_holds_skip_the_shuffle(comm, mpi_tmp_path):
    """Whole chunks, then a partial box, on a file of the rank's own (``COMM_SELF``): every
    unit has one writer, so no call goes through the aggregators (many ranks sharing one
    array: ``test_zarr_cases.py``)."""
    me = MPI.COMM_SELF
    glob = np.arange(600.0).reshape(20, 30) + comm.rank
    path = str(mpi_tmp_path / f"d{comm.rank}.zarr")
    for start, shape in (((0, 0), (20, 30)), ((3, 4), (9, 13))):
        lay = layouts.Subarray((20, 30), start, shape, "<f8")
        st = _write(me, path, glob, lay, mode="r+" if start[0] else "w", shape=(20, 30),
                    dtype="<f8", chunks=(8, 8), fill_value=0.0)  # fmt: skip
        assert st["direct_calls"] == 1 and st["collective_calls"] == 0
    with collio.open(path, "r", comm=me, backend="zarr") as f:
        back = f.read_all(layouts.Subarray((20, 30), (0, 0), (20, 30), "<f8"))
        assert f.stats.direct_calls == 1
    np.testing.assert_array_equal(back, glob)
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], glob)


@pytest.mark.mpi
@pytest.mark.parametrize(
    "mode,opts,cls,text",
    [
        ("w", {"shape": (4, 4)}, collio.ModeError, "give shape= and dtype="),
        ("w", {"shape": (4, 4), "dtype": "f8", "bogus": 1}, collio.ModeError, "unknown options"),
        ("r", {}, collio.BackendError, "no zarr array at"),
    ],
)
def test_open_errors(comm, mpi_tmp_path, mode, opts, cls, text):
    path = str(mpi_tmp_path / "missing.zarr")
    with pytest.raises(cls, match=text) as info:
        collio.open(path, mode, comm=comm, backend="zarr", **opts)
    same_everywhere(comm, info.value)
    assert not os.path.exists(path)


@pytest.mark.mpi
def test_creation_options_do_not_apply_to_an_existing_array(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "x.zarr")
    plain_array(comm, path, shape=(4,), dtype="<f8", chunks=(2,))
    arr = zarr.open_array(path, mode="r+")
    with pytest.raises(collio.ModeError, match=r"\['fill_value'\] do not apply") as info:
        collio.open(arr, "r+", comm=comm, backend="zarr", fill_value=3.0)
    same_everywhere(comm, info.value)
    with pytest.raises(collio.ModeError, match="path and storage_options") as info:
        collio.open(arr, "r", comm=comm, backend="zarr", path="a")
    same_everywhere(comm, info.value)


@pytest.mark.mpi
def test_expectations_are_checked_on_open(comm, mpi_tmp_path):
    path = str(mpi_tmp_path / "e.zarr")
    plain_array(comm, path, shape=(10, 10), dtype="<f4", chunks=(5, 5))
    with pytest.raises(collio.MismatchError) as info:
        collio.open(path, "r", comm=comm, backend="zarr", shape=(10, 11))
    assert "has shape (10, 10), but shape=(10, 11)" in same_everywhere(comm, info.value)
    with pytest.raises(collio.MismatchError, match="has chunks") as info:
        collio.open(path, "r+", comm=comm, backend="zarr", chunks=4)
    same_everywhere(comm, info.value)
    with collio.open(path, "r", comm=comm, backend="zarr", shape=(10, 10), dtype="<f4",
                     chunks=5) as f:  # fmt: skip
        assert f.backend.describe()["chunks"] == [5, 5]
