"""zarr arrays written by collio from several ranks, read back by plain zarr.

The cases (``zarr_cases``) are decompositions of 4 ranks: aligned and misaligned boxes,
block-cyclic tiles, codecs, shards, a partial box, an update, an empty rank.  Besides the
bytes, each case's statistics show that every chunk (shard) has one writer and which
chunks skip the shuffle.  Then a negative control (plain zarr from several ranks into one
shard loses data) and zarr stores on S3 (moto's server on 127.0.0.1).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from zarr_cases import BY_NAME, CASES, NRANKS, chunk_keys, local, reference

zarr = pytest.importorskip("zarr")

import collio  # noqa: E402
from collio import layouts  # noqa: E402


def stored_units(path: str) -> set[tuple[int, ...]]:
    """Grid coordinates of the chunk (or shard) objects present under ``path/c``."""
    out = set()
    base = os.path.join(path, "c")
    for root, _, files in os.walk(base):
        rel = os.path.relpath(root, base)
        parts = [] if rel == "." else rel.split(os.sep)
        out |= {tuple(int(p) for p in [*parts, f]) for f in files}
    return out


def write_case(comm: MPI.Intracomm, path: str, name: str) -> dict[str, Any]:
    """Every phase of the case through collio on ``comm``; each rank reads its piece back."""
    case = BY_NAME[name]
    ok = True
    for mode, make, seed in case.phases:
        lay = make(comm.rank, comm.size)
        mine = local(lay, reference(case.shape, case.dtype, seed))
        opts = {"shape": case.shape, "dtype": case.dtype, **case.create()} if mode == "w" else {}
        hints = {"cb_buffer_size": 1 << 20}  # several rounds: double buffering, partial chunks
        with collio.open(path, mode, comm=comm, backend="zarr", hints=hints, **opts) as f:
            f.write_all(mine, lay)
            written = f.stats.as_dict()
            back = f.read_all(lay)
            stats = f.stats.as_dict()
        ok = ok and np.array_equal(back, mine)
    return {
        "readback": all(comm.allgather(ok)),
        "domains": [d["nbytes"] for d in stats["backend"]["domains"]],
        "kept": stats["backend"].get("kept"),
        "aggregators": list(stats["aggregators"]),
        "write_ops": written["write_ops"],
        "fill_reads": written["read_ops"],
        "read_ops": stats["read_ops"] - written["read_ops"],
        "direct_calls": stats["direct_calls"],
    }


def _misaligned(r: dict[str, Any]) -> None:
    """100 chunks, each stored and decoded once.  333/667 is skewed (one rank holds 4/9):
    had each rank stored the chunks it alone touches, that rank would do far more than a
    quarter, so every chunk goes through the aggregators, 25 each."""
    assert r["write_ops"] == 100 and r["fill_reads"] == 0 and r["read_ops"] == 100
    assert r["domains"] == [2_000_000] * 4 and r["direct_calls"] == 0


def _update(r: dict[str, Any]) -> None:
    """The r+ update's even 2 x 2 cut (row 455, column 453) shares 17 chunks: only they go
    through the aggregators, to those with the least of their own (water filling); the 4
    shared ones on the box's border are read and merged."""
    shared = np.array(r["domains"])
    assert shared.sum() == 17 * 80_000
    own = np.array(r["kept"])[r["aggregators"]]
    assert own.min() > 0 and own.max() > own.min()  # 400/333 rows/columns: uneven
    light, heavy = shared[own == own.min()], shared[own == own.max()]
    assert light.min() >= 7 * 80_000 and heavy.max() <= 80_000, (own, shared)
    assert r["fill_reads"] == 4


def _partial(r: dict[str, Any]) -> None:
    """The box [150, 620) x [230, 710) meets 6 x 6 chunks; its balanced cut lets ranks keep
    the chunks they alone touch; the 4 shared ones on the border are read and merged."""
    assert r["write_ops"] == 36 and r["fill_reads"] == 4


def _sharded(r: dict[str, Any]) -> None:
    """4 x 4 shards stored once each, not 256 inner chunks; none skips the shuffle."""
    assert r["write_ops"] == 16 and r["direct_calls"] == 0


def _aligned(r: dict[str, Any]) -> None:
    """Every chunk has one rank: the write and the read skip the shuffle."""
    assert r["direct_calls"] == 2


def _one_d(r: dict[str, Any]) -> None:
    """100003 / 4 ranks is not a multiple of 4096: chunks are shared, none skips."""
    assert r["direct_calls"] == 0


STATS = {
    "misaligned": _misaligned,
    "update": _update,
    "partial": _partial,
    "sharded": _sharded,
    "aligned": _aligned,
    "1d": _one_d,
}


@pytest.mark.mpi(min_size=NRANKS)
@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_plain_zarr_reads_what_collio_wrote(comm, mpi_tmp_path, name):
    path = str(mpi_tmp_path / f"{name}.zarr")
    four = comm.Split(0 if comm.rank < NRANKS else MPI.UNDEFINED, comm.rank)
    result = None
    if four != MPI.COMM_NULL:
        try:
            result = write_case(four, path, name)
        finally:
            four.Free()
    comm.Barrier()
    if comm.rank == 0:
        case = BY_NAME[name]
        arr = zarr.open_array(path, mode="r")
        want, mask = case.expected()
        np.testing.assert_array_equal(arr[...], want)
        # exactly the units some rank touched exist; untouched ones keep the fill value
        unit = arr.shards or arr.chunks
        assert stored_units(path) == chunk_keys(case.shape, unit, mask)
        if name == "sharded":
            assert arr.shards == (200, 200) and arr.chunks == (50, 50)
    if result is not None:
        assert result["readback"]
        STATS.get(name, lambda r: None)(result)


@pytest.mark.mpi(min_size=2)
def test_negative_control_plain_zarr_loses_shard_data_collio_does_not(comm, mpi_tmp_path):
    """Every rank writes its own box of one shard with plain zarr, aligned to the inner
    chunks; zarr re-encodes the whole shard on every write, so writers overwrite each
    other.  The same decomposition through collio keeps every box."""
    shape, chunks = (400, 400), (50, 50)
    glob = np.arange(shape[0] * shape[1], dtype="<i4").reshape(shape) + 1
    lay = layouts.block(shape, "<i4", comm=comm)
    opts = {"shape": shape, "dtype": "<i4", "chunks": chunks, "shards": shape, "fill_value": 0}
    lost, trials = False, 0
    while not lost and trials < 8:
        path = str(mpi_tmp_path / f"plain-{trials}.zarr")
        if comm.rank == 0:
            zarr.create_array(path, **opts)
        comm.Barrier()
        arr = zarr.open_array(path, mode="r+")
        rows = lay.slices[0]
        for r0 in range(rows.start, rows.stop, chunks[0]):  # one shard rewrite per strip
            strip = slice(r0, min(r0 + chunks[0], rows.stop))
            arr[strip, lay.slices[1]] = glob[strip, lay.slices[1]]
        comm.Barrier()
        plain = zarr.open_array(path, mode="r")[...]
        lost = bool(comm.bcast(not np.array_equal(plain, glob), root=0))
        trials += 1
    assert lost, "plain zarr kept every rank's box in 8 tries: the control shows nothing"
    path = str(mpi_tmp_path / "collio.zarr")
    with collio.open(path, "w", comm=comm, backend="zarr", **opts) as f:
        f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
    comm.Barrier()
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], glob)


# ------------------------------------------------------------------ stores on S3
BUCKET, REGION = "collio-zarr", "us-east-1"


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on rank 0 (with the bucket); every rank gets its URL."""
    pytest.importorskip("s3fs")
    s3testing = pytest.importorskip("collio.testing.s3")
    with s3testing.shared_moto(MPI.COMM_WORLD, BUCKET) as url:
        yield url


def _keys(url: str) -> set[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=url, region_name=REGION)
    return {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])}


@pytest.mark.mpi
def test_fsspec_store_on_s3(comm, s3):
    """An s3:// URL: zarr makes an FsspecStore (s3fs) from it and the storage options."""
    so = {"endpoint_url": s3, "client_kwargs": {"region_name": REGION}}
    shape = (300, 200)
    glob = np.arange(shape[0] * shape[1], dtype="<f8").reshape(shape)
    lay = layouts.block(shape, "<f8", comm=comm)
    url = f"s3://{BUCKET}/fsspec.zarr"
    opts = {"shape": shape, "dtype": "<f8", "chunks": (64, 48), "storage_options": so}
    with collio.open(url, "w", comm=comm, backend="zarr", **opts) as f:
        f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
    with collio.open(url, "r", comm=comm, backend="zarr", storage_options=so) as f:
        np.testing.assert_array_equal(f.read_all(lay), glob[lay.slices])
    comm.Barrier()
    if comm.rank == 0:
        np.testing.assert_array_equal(zarr.open_array(url, mode="r", storage_options=so)[...], glob)
        chunks = {k for k in _keys(s3) if k.startswith("fsspec.zarr/c/")}
        assert len(chunks) == 5 * 5  # every chunk once


@pytest.mark.mpi
def test_object_store_on_s3(comm, s3):
    """zarr's ObjectStore over obstore's S3Store, each rank with its own client; a box
    [60, 210) x [50, 150) of 128 x 96 shards: the shards it does not touch are not stored."""
    obstore = pytest.importorskip("obstore.store")
    creds = {"access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
             "secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"]}  # fmt: skip
    store = zarr.storage.ObjectStore(
        obstore.S3Store(
            BUCKET, endpoint=s3, region=REGION, client_options={"allow_http": True}, **creds
        )  # fmt: skip
    )
    shape = (300, 200)
    glob = np.arange(shape[0] * shape[1], dtype="<f8").reshape(shape)
    box = layouts.block((150, 100), "<f8", comm=comm)
    start = [s + o for s, o in zip(box.start, (60, 50), strict=True)]
    sub = layouts.Subarray(shape, start, box.shape, "<f8")
    opts = {"shape": shape, "dtype": "<f8", "chunks": (64, 48), "shards": (128, 96),
            "fill_value": -1.0, "path": "obstore.zarr"}  # fmt: skip
    with collio.open(store, "w", comm=comm, backend="zarr", **opts) as f:
        f.write_all(np.ascontiguousarray(glob[sub.slices]), sub)
        np.testing.assert_array_equal(f.read_all(sub), glob[sub.slices])
    comm.Barrier()
    if comm.rank == 0:
        want = np.full(shape, -1.0)
        want[60:210, 50:150] = glob[60:210, 50:150]
        np.testing.assert_array_equal(
            zarr.open_array(store, path="obstore.zarr", mode="r")[...], want
        )
        shards = {k for k in _keys(s3) if k.startswith("obstore.zarr/c/")}
        assert shards == {f"obstore.zarr/c/{i}/{j}" for i in (0, 1) for j in (0, 1)}
