"""Write zarr arrays on S3 through collio (run under mpiexec against a moto server).

Usage: mpiexec -n 3 python zarr_s3_job.py ENDPOINT BUCKET
Writes ``fsspec.zarr`` through zarr's FsspecStore (an s3:// URL) and
``obstore.zarr`` through zarr's ObjectStore, each rank with its own client.
"""

import json
import sys

import numpy as np
import zarr
from mpi4py import MPI

import collio
from collio import layouts

comm = MPI.COMM_WORLD
endpoint, bucket = sys.argv[1], sys.argv[2]
KEY, SECRET, REGION = "collio", "collio-secret", "us-east-1"
SHAPE = (300, 200)
glob = np.arange(SHAPE[0] * SHAPE[1], dtype="<f8").reshape(SHAPE)
out = {}

# an s3:// URL: zarr makes an FsspecStore (s3fs) from it and the storage options
so = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET}
so["client_kwargs"] = {"region_name": REGION}
lay = layouts.block(SHAPE, "<f8", comm=comm)  # rows cut at 100 over 64-row chunks
url = f"s3://{bucket}/fsspec.zarr"
opts = {"shape": SHAPE, "dtype": "<f8", "chunks": (64, 48), "storage_options": so}
with collio.open(url, "w", comm=comm, backend="zarr", **opts) as f:
    f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
with collio.open(url, "r", comm=comm, backend="zarr", storage_options=so) as f:
    out["fsspec"] = all(comm.allgather(bool(np.array_equal(f.read_all(lay), glob[lay.slices]))))

# zarr's ObjectStore over obstore's S3Store, when obstore is installed
try:
    from obstore.store import S3Store
except ImportError:
    S3Store = None
if S3Store is not None:
    s3 = S3Store(bucket, endpoint=endpoint, access_key_id=KEY, secret_access_key=SECRET,
                 region=REGION, client_options={"allow_http": True})  # fmt: skip
    store = zarr.storage.ObjectStore(s3)
    box = layouts.block((150, 100), "<f8", comm=comm)  # only [60, 210) x [50, 150) is written
    start = [s + o for s, o in zip(box.start, (60, 50), strict=True)]
    sub = layouts.Subarray(SHAPE, start, box.shape, "<f8")
    opts = {"shape": SHAPE, "dtype": "<f8", "chunks": (64, 48), "shards": (128, 96),
            "fill_value": -1.0, "path": "obstore.zarr"}  # fmt: skip
    with collio.open(store, "w", comm=comm, backend="zarr", **opts) as f:
        f.write_all(np.ascontiguousarray(glob[sub.slices]), sub)
        same = bool(np.array_equal(f.read_all(sub), glob[sub.slices]))
        out["obstore"] = all(comm.allgather(same))
if comm.rank == 0:
    print("RESULT " + json.dumps(out))
