"""collio-bench's zarr, S3 and HDF5 APIs end to end under mpiexec, every iteration verified (-W -R).

Each run writes and reads through collio and through the peer it is compared with, then the
benchmark reads the target back with the peer's own library (zarr, boto3 ranged GETs, h5py)
and counts wrong elements; the job's JSON must show every row checked and no error.
"""

from __future__ import annotations

import json
import os

import pytest
from test_bench_cli import BENCH, needs_mpiexec

from collio.testing.jobs import mpiexec


def _run(tmp_path, apis: str, *extra: str, n: int = 3) -> dict:
    out = tmp_path / "b.json"
    args = ["-n", str(n), *BENCH, "-i", "2", "-W", "-R", "--compare", apis, *extra]
    proc = mpiexec([*args, "--json", str(out), "-o", str(tmp_path / "f")])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    names = apis.split(",")
    assert doc["apis"] == names and doc["errors"] == 0
    assert len(doc["rows"]) == 2 * len(names) * 2
    # every row was verified (errors >= 0) and found nothing wrong
    assert all(r["errors"] == 0 for r in doc["rows"]), doc["rows"]
    summary = {(s["op"], s["api"]) for s in doc["summary"]}
    assert summary == {(op, a) for op in ("write", "read") for a in names}
    return doc


@needs_mpiexec
def test_zarr_apis_verified(tmp_path):
    pytest.importorskip("zarr")
    doc = _run(tmp_path, "collio-zarr,zarr-plain,zarr-locked", "--size", "256", "-O", "chunks=64",
               n=4)  # fmt: skip
    assert doc["hints_used"]["collio-zarr"]["zarr_chunks"] in ([64, 64], "(64, 64)")


@needs_mpiexec
def test_zarr_plain_refuses_shared_chunks_before_any_io(tmp_path):
    pytest.importorskip("zarr")
    args = ["-n", "3", *BENCH, "-i", "1", "--compare", "collio-zarr,zarr-plain", "--size", "256"]
    proc = mpiexec([*args, "-O", "chunks=128", "-o", str(tmp_path / "f")])
    assert proc.returncode != 0
    assert "zarr-plain refuses this decomposition" in proc.stderr
    assert not (tmp_path / "f").exists()


@needs_mpiexec
def test_s3_apis_verified_on_a_local_server(tmp_path):
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    doc = _run(tmp_path, "collio-s3,s3-gather,s3-ceiling", "--size", "512")
    used = doc["hints_used"]["collio-s3"]
    assert used["s3_endpoint"].startswith("http://127.0.0.1:")
    assert used["s3_part_size"] >= 5 << 20


@needs_mpiexec
def test_hdf5_apis_verified(tmp_path):
    pytest.importorskip("h5py")
    doc = _run(tmp_path, "collio-hdf5,hdf5-gather", "--size", "256", "--pattern", "block2d")
    assert doc["hints_used"]["collio-hdf5"]["h5_layout"] == "contiguous"
    # contiguous datasets read through the map where the file system is local
    from collio.backends.mapped import fs_name

    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        local = fs_name(fd) is not None
    finally:
        os.close(fd)
    assert doc["hints_used"]["collio-hdf5"]["reads_mapped"] is local
    doc = _run(tmp_path, "collio-hdf5,hdf5-gather", "--size", "256", "-O", "codec=gzip,chunks=64")
    assert doc["hints_used"]["collio-hdf5"]["h5_compression"] == "gzip"
