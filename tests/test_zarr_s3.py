"""zarr arrays on S3: collio writes under mpiexec against moto's S3 server; plain zarr reads.

Skipped when moto's server, s3fs or boto3 are missing (``pip install 'collio[test]'``
installs them, so CI runs it).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

MPIEXEC = shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KEY, SECRET, REGION, BUCKET = "collio", "collio-secret", "us-east-1", "collio-zarr"


@pytest.fixture(scope="module")
def endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=url, aws_access_key_id=KEY,
                              aws_secret_access_key=SECRET, region_name=REGION)  # fmt: skip
        client.create_bucket(Bucket=BUCKET)
        yield url, client
    finally:
        server.stop()


def test_zarr_on_s3_written_by_collio_read_by_plain_zarr(endpoint):
    url, client = endpoint
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [MPIEXEC, "-n", "3", sys.executable, os.path.join(HERE, "zarr_s3_job.py"), url, BUCKET]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][0]
    result = json.loads(line[len("RESULT ") :])
    glob = np.arange(300 * 200, dtype="<f8").reshape(300, 200)
    so = {"endpoint_url": url, "key": KEY, "secret": SECRET}
    so["client_kwargs"] = {"region_name": REGION}
    arr = zarr.open_array(f"s3://{BUCKET}/fsspec.zarr", mode="r", storage_options=so)
    np.testing.assert_array_equal(arr[...], glob)
    assert result["fsspec"]
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert len({k for k in keys if k.startswith("fsspec.zarr/c/")}) == 5 * 5  # every chunk once
    if "obstore" in result:
        assert result["obstore"]
        arr = zarr.open_array(f"s3://{BUCKET}/obstore.zarr", mode="r", storage_options=so)
        want = np.full((300, 200), -1.0)
        want[60:210, 50:150] = glob[60:210, 50:150]
        np.testing.assert_array_equal(arr[...], want)
        # shards of 128 x 96 over [60, 210) x [50, 150): grid rows 0-1, cols 0-1; the
        # third shard row and column were never touched and were never stored
        shards = {k for k in keys if k.startswith("obstore.zarr/c/")}
        assert shards == {f"obstore.zarr/c/{i}/{j}" for i in (0, 1) for j in (0, 1)}
