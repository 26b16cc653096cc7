"""The zarr backend at many ranks: conformance suite, and errors raised alike everywhere."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

import collio  # noqa: E402
from collio import layouts  # noqa: E402
from collio.testing.zarr_suite import ZarrBackendTests  # noqa: E402


@pytest.mark.mpi
class TestZarr(ZarrBackendTests):
    @pytest.fixture
    def target(self, shared_dir):
        return os.path.join(shared_dir, "conformance.zarr")


@pytest.mark.mpi
class TestZarrShardedZstd(ZarrBackendTests):
    @pytest.fixture
    def target(self, shared_dir):
        return os.path.join(shared_dir, "sharded.zarr")

    @pytest.fixture
    def open_options(self):
        return {
            "shape": (48, 40), "dtype": "<f8", "chunks": (4, 5), "shards": (12, 10),
            "compressors": [zarr.codecs.ZstdCodec(level=1)],
        }  # fmt: skip


def same_everywhere(comm, exc):
    texts = comm.allgather((type(exc).__name__, str(exc)))
    assert texts == [texts[0]] * comm.size
    return texts[0][1]


@pytest.mark.mpi
def test_layout_shape_or_dtype_mismatch_fails_on_every_rank(comm, shared_dir):
    path = os.path.join(shared_dir, "m.zarr")
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


@pytest.mark.mpi
def test_missing_array_fails_on_every_rank(comm, shared_dir):
    with pytest.raises(collio.BackendError) as info:
        collio.open(os.path.join(shared_dir, "nothing.zarr"), "r+", comm=comm, backend="zarr")
    assert info.value.errno == errno.ENOENT
    assert "no zarr array at" in same_everywhere(comm, info.value)


@pytest.mark.mpi
def test_read_only_store_fails_on_every_rank(comm, shared_dir):
    path = os.path.join(shared_dir, "ro.zarr")
    if comm.rank == 0:
        zarr.create_array(path, shape=(8, 8), dtype="<f8", chunks=(3, 3))
    comm.Barrier()
    store = zarr.storage.LocalStore(path, read_only=True)
    for mode in ("r+", "w"):
        opts = {"shape": (8, 8), "dtype": "<f8"} if mode == "w" else {}
        with pytest.raises(collio.BackendError) as info:
            collio.open(store, mode, comm=comm, backend="zarr", **opts)
        assert info.value.errno == errno.EROFS
        assert "read-only" in same_everywhere(comm, info.value)
    assert zarr.open_array(path, mode="r").nchunks_initialized == 0


@pytest.mark.mpi
def test_ranks_opening_different_arrays_fail_together(comm, shared_dir):
    if comm.size < 2:
        pytest.skip("needs two ranks")
    path = os.path.join(shared_dir, f"own-{comm.rank}.zarr")
    arr = zarr.create_array(path, shape=(8, 8 + comm.rank), dtype="<f8", chunks=(4, 4))
    comm.Barrier()
    with pytest.raises(collio.MismatchError) as info:
        collio.open(arr, "r+", comm=comm, backend="zarr")
    text = same_everywhere(comm, info.value)
    assert "rank 1 (zarr target" in text and "own-1.zarr" in text and "((8, 9)," in text


@pytest.mark.mpi
def test_misaligned_blocks_read_back_by_plain_zarr(comm, shared_dir):
    shape = (333, 257)
    glob = np.arange(shape[0] * shape[1], dtype="<i8").reshape(shape)
    path = os.path.join(shared_dir, "plain.zarr")
    lay = layouts.block(shape, "<i8", comm=comm)
    with collio.open(path, "w", comm=comm, backend="zarr", shape=shape, dtype="<i8",
                     chunks=(50, 40), hints={"cb_buffer_size": 64 << 10}) as f:  # fmt: skip
        f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
    if comm.rank == 0:
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], glob)
    comm.Barrier()


@pytest.mark.mpi
def test_a_failing_chunk_write_raises_on_every_rank_and_the_file_goes_on(comm, shared_dir):
    # chunk row 3's keys live under c/3/: a regular file there makes exactly the
    # aggregator that owns that row fail (ENOTDIR or EEXIST), mid-call
    shape, chunks = (40, 40), (5, 40)
    path = os.path.join(shared_dir, "fail.zarr")
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
def test_random_decompositions_and_updates_match_plain_zarr(comm, shared_dir, seed):
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
    path = os.path.join(shared_dir, f"random-{seed}.zarr")
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


@pytest.mark.mpi
def test_creation_options_differ_on_one_rank_leaves_the_array(comm, shared_dir):
    """Mode 'w' overwrites: every rank's creation options are agreed before rank 0 does."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    path = os.path.join(shared_dir, "keep.zarr")
    _existing(comm, path)
    shape = (7,) if comm.rank == comm.size - 1 else (6,)
    with pytest.raises(collio.MismatchError) as info:
        collio.open(path, "w", comm=comm, backend="zarr", shape=shape, dtype="<i4", chunks=(2,))
    text = same_everywhere(comm, info.value)
    assert f"rank {comm.size - 1}:" in text and "(7,)" in text
    assert _content(path) == [1, 2, 3, 4, 5, 6]
    comm.Barrier()


@pytest.mark.mpi
def test_arrays_at_different_paths_in_one_store(comm, shared_dir):
    """Ranks naming different arrays (path=) fail everywhere instead of splitting the data."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    store = os.path.join(shared_dir, "group.zarr")
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
def test_big_endian_dtype(comm, shared_dir):
    """zarr v3 keeps byte order in its codecs: an array made with '>i2' holds int16."""
    path = os.path.join(shared_dir, "be.zarr")
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
