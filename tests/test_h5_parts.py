"""HDF5 storage's parts that need no MPI: HDF5's chunk space, codecs, the replica file (VFile).

Collective files are tested in ``mpi_tests/test_h5.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collio import layouts
from collio.backends.chunkspace import ChunkSpace
from collio.runs import Runs

h5py = pytest.importorskip("h5py")
from collio.backends.hdf5.codec import make_codec  # noqa: E402
from collio.backends.hdf5.vfile import VFile  # noqa: E402


def _bytes_of(runs: Runs) -> tuple[np.ndarray, np.ndarray]:
    """(file offset, memory offset) of every byte the runs cover."""
    idx = np.repeat(np.arange(len(runs)), runs.length)
    first = np.concatenate(([0], np.cumsum(runs.length)[:-1])).astype(np.int64)
    k = np.arange(int(runs.length.sum())) - first[idx]
    return runs.file[idx] + k, runs.mem[idx] + k


def _chunk_offset_of_every_byte(g: ChunkSpace) -> np.ndarray:
    """Brute force: where HDF5 stores each byte of the C-order dataset, in chunk space
    (chunks in C order of the chunk grid, each a full, padded chunk in C order)."""
    pos = np.indices(g.shape).reshape(len(g.shape), -1)
    chunk = np.ravel_multi_index(tuple(p // c for p, c in zip(pos, g.unit, strict=True)), g.grid)
    inner = np.ravel_multi_index(tuple(p % c for p, c in zip(pos, g.unit, strict=True)), g.unit)
    elem = chunk * g.unit_nbytes + inner * g.itemsize
    return (elem[:, None] + np.arange(g.itemsize)).reshape(-1)


@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    data=st.data(),
)
def test_chunk_space_matches_brute_force(shape: list[int], data: st.DataObject) -> None:
    chunks = [data.draw(st.integers(1, s + 2)) for s in shape]
    itemsize = data.draw(st.sampled_from([1, 4, 8]))
    start = [data.draw(st.integers(0, s - 1)) for s in shape]
    count = [data.draw(st.integers(0, s - a)) for s, a in zip(shape, start, strict=True)]
    g = ChunkSpace(tuple(shape), tuple(chunks), itemsize)
    lay = layouts.Subarray(shape, start, count, f"V{itemsize}")
    mapped = g.runs(lay.dims)
    assert bool((np.diff(mapped.file) > 0).all()) or len(mapped) < 2
    f_ds, m_ds = _bytes_of(lay.runs())
    f_ch, m_ch = _bytes_of(mapped)
    brute = _chunk_offset_of_every_byte(g)
    order = np.argsort(m_ch)
    np.testing.assert_array_equal(m_ch[order], np.sort(m_ds))
    np.testing.assert_array_equal(f_ch[order], brute[f_ds[np.argsort(m_ds)]])


def test_bytes_per_chunk_and_edges() -> None:
    g = ChunkSpace((5, 7), (2, 3), 8)
    assert g.grid == (3, 3) and g.unit_nbytes == 48
    assert g.valid_nbytes(np.arange(9)).tolist() == [48, 48, 16, 48, 48, 16, 24, 24, 8]
    cover = Runs(np.array([0, 100, 150]), np.array([48, 20, 10]), np.zeros(3, np.int64))
    ids, got = g.unit_bytes(0, 4 * 48, cover)
    assert ids.tolist() == [0, 1, 2, 3] and got.tolist() == [48, 0, 20, 10]
    assert [r.start for r in g.region(5)] == [2, 6] and g.unit_at((2, 6)) == 5


@pytest.mark.parametrize(
    "opts",
    [{}, {"compression": "gzip"}, {"compression": "gzip", "shuffle": True, "compression_opts": 9},
     {"shuffle": True}, {"compression": "lzf"}, {"compression": "lzf", "fletcher32": True}],
)  # fmt: skip
def test_codecs_store_what_hdf5_stores(tmp_path, opts) -> None:
    rng = np.random.default_rng(1)
    chunk = rng.standard_normal((6, 5))
    chunk[:3] = 1.0  # compressible half
    noise = rng.standard_normal((6, 5))  # incompressible: optional filters skipped
    with h5py.File(tmp_path / "ref.h5", "w") as f:
        d = f.create_dataset("d", (12, 5), "<f8", chunks=(6, 5), **opts)
        d[:6], d[6:] = chunk, noise
        for fast in (True, False):
            codec = make_codec(d.id.get_create_plist(), d.dtype, (6, 5), fast=fast)
            for pos, arr in (((0, 0), chunk), ((6, 0), noise)):
                mask, stored = d.id.read_direct_chunk(pos)
                enc, m = codec.encode(np.ascontiguousarray(arr).view(np.uint8).reshape(-1))
                assert (bytes(enc), m) == (stored, mask), (codec.name, pos)
                out = np.empty(arr.nbytes, np.uint8)
                codec.decode(stored, mask, out)
                np.testing.assert_array_equal(out.view("<f8").reshape(arr.shape), arr)
            codec.close()


def test_vfile_overlay_reads_disk_where_not_written(tmp_path) -> None:
    path = tmp_path / "v.bin"
    path.write_bytes(bytes(range(200)) * 50)  # 10,000 bytes on disk
    fd = os.open(path, os.O_RDWR)
    vf = VFile(str(path), fd, 10_000, root=False)
    vf.seek(4090)
    vf.write(b"abcdefghij")  # crosses a page boundary
    buf = bytearray(20)
    vf.seek(4085)
    vf.readinto(buf)
    assert bytes(buf) == (bytes(range(200)) * 50)[4085:4090] + b"abcdefghij" + bytes(
        (bytes(range(200)) * 50)[4100:4105]
    )
    h = vf.epoch_digest()
    vf.truncate(4095)  # drops the overlay past the end
    assert vf.epoch_digest() != h and vf.seek(0, 2) == 4095
    vf.seek(4093)
    assert vf.read(4) == b"de\0\0"
    assert path.read_bytes()[4090:4100] != b"abcdefghij"  # a replica never writes
    vf.release()


def test_root_publishes_and_drops_raw_chunk_bytes(tmp_path) -> None:
    path = tmp_path / "r.bin"
    path.write_bytes(b"")
    vf = VFile(str(path), os.open(path, os.O_RDWR), 0, root=True)
    vf.in_sync = True
    vf.write(b"meta")
    vf.flush()  # inside a collective point: deferred
    assert path.read_bytes() == b""
    vf.raw_expect = 6
    vf.seek(10)
    vf.write(b"chunk!")  # the aggregator writes these bytes, not rank 0's library
    vf.in_sync = False
    vf.flush()
    assert path.read_bytes() == b"meta"
    vf.release()
