"""One S3 object written from every rank (a multipart upload) and read back with ranged GETs.

    mpiexec -n 4 python examples/s3_user.py                        # a local moto server
    mpiexec -n 4 python examples/s3_user.py --endpoint-url URL --bucket NAME

Without ``--endpoint-url`` rank 0 starts moto's S3 server on 127.0.0.1 (``pip install
'moto[server]'``) with test credentials; with it, credentials come the usual boto3 way.
The object appears only when every rank has closed the file (all or nothing); boto3
then reads it like any other object.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator

import boto3
import numpy as np
from mpi4py import MPI

import collio
from collio import layouts

SHAPE = (512, 512)  # 2 MiB of float64


@contextlib.contextmanager
def local_server(comm: MPI.Intracomm, bucket: str) -> Iterator[str]:
    """Collective over `comm`: moto's S3 server on rank 0, with ``bucket``; yields its URL."""
    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):  # fmt: skip
        os.environ.setdefault(var, value)  # moto accepts any credentials
    server, url = None, None
    if comm.rank == 0:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
    try:
        yield comm.bcast(url, root=0)
    finally:
        comm.Barrier()
        if server is not None:
            server.stop()


def run(comm: MPI.Intracomm, endpoint: str, bucket: str) -> None:
    """Collective over `comm`: write, read back, and check the stored object with boto3."""
    url = f"s3://{bucket}/checkpoints/step-100.bin"
    truth = np.arange(SHAPE[0] * SHAPE[1], dtype="<f8").reshape(SHAPE)  # for the check
    lay = layouts.block(SHAPE, "<f8", comm=comm, grid=(1, comm.size))  # column blocks
    with collio.open(url, "w", comm=comm, endpoint_url=endpoint) as f:
        f.write_all(truth[lay.slices], lay)  # collective; parts uploaded by the aggregators
        parts = f.backend.describe()["parts"]
    # closed on every rank: the upload is complete and the object visible
    with collio.open(url, "r", comm=comm, endpoint_url=endpoint) as f:
        np.testing.assert_array_equal(f.read_all(lay), truth[lay.slices])
    if comm.rank == 0:
        client = boto3.client("s3", endpoint_url=endpoint)
        body = client.get_object(Bucket=bucket, Key="checkpoints/step-100.bin")["Body"].read()
        assert body == truth.tobytes()
        print(f"{url}: {len(body)} bytes from {comm.size} ranks, multipart parts: {parts}")
    comm.Barrier()


def main(
    comm: MPI.Intracomm = MPI.COMM_WORLD,
    endpoint: str | None = None,
    bucket: str = "collio-example",
) -> None:
    if endpoint is not None:
        run(comm, endpoint, bucket)
        return
    with local_server(comm, bucket) as url:
        run(comm, url, bucket)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint-url", help="an S3 endpoint (default: a local moto server)")
    ap.add_argument("--bucket", default="collio-example", help="an existing bucket")
    a = ap.parse_args()
    main(endpoint=a.endpoint_url, bucket=a.bucket)
