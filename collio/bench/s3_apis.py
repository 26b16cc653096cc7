"""S3 in ``collio-bench``: collio's multipart backend beside gather-to-0 and the server's ceiling.

``collio-s3``
    ``collio.open("s3://bucket/key")`` + ``write_all`` / ``read_all`` + close: the
    aggregators upload the parts of one object, and read it back with ranged GETs.
``s3-gather``
    Writes: the whole array gathered on rank 0 (straight into place), which uploads
    it as one multipart upload, parts of collio's size, as many at once.  Reads:
    rank 0 reads the whole object with large ranged GETs and sends each rank its piece.
``s3-ceiling``
    One process (rank 0) uploading the same bytes, already in memory (made before
    the timed phase), in parts of the same size; reads: rank 0 reading the whole
    object with large ranged GETs.  What the server can take.

Without an endpoint (``--s3-endpoint``, ``COLLIO_BENCH_S3_ENDPOINT``, ``-O
endpoint=``) rank 0 starts moto's S3 server on 127.0.0.1 in a child process (as
:func:`collio.testing.s3.serve_moto` does) with test credentials; with one,
credentials come the usual boto3 way and are never printed.  Rank 0 creates the
bucket; objects go under a fresh prefix and are deleted at the end unless ``-k``.
Waiting ranks sleep instead of polling MPI (the local server needs the CPU).
Durability: an object exists only once its upload completes, so ``-e`` adds nothing.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

import collio

from ..backends.s3 import upload
from ..backends.s3.client import client_for, get_into
from ..backends.s3.plan import S3Target, plan_part_size
from ..collective import Attempt, bcast_outcome
from ..hints import Hints
from ..redact import redact_url
from ..testing.s3 import fake_credentials, serve_moto
from ..waits import sleep_until_done
from .apis import Api, Job
from .builtin import CollioApi
from .options import S3, size_option
from .patterns import Workload
from .rootio import gather_whole, read_on_root

__all__ = ["CollioS3Api", "S3CeilingApi", "S3GatherApi", "read_ranged", "upload_parts"]

U8 = npt.NDArray[np.uint8]
MiB = 1 << 20


# ------------------------------------------------------------ one-process I/O
def upload_parts(
    client: Any, t: S3Target, raw: U8, part: int, pool: concurrent.futures.Executor
) -> None:
    """One process: a multipart upload of ``raw`` in parts of ``part`` bytes, from memory."""
    uid = upload.create(client, t)
    try:
        n = -(-len(raw) // part)
        tags = pool.map(
            lambda i: upload.upload_part(client, t, uid, i, raw[i * part : (i + 1) * part]),
            range(n),
        )
        upload.complete(client, t, uid, dict(enumerate(tags, 1)), n)
    except BaseException:
        upload.abort(client, t, uid)
        raise


def read_ranged(
    client: Any, t: S3Target, raw: U8, get_size: int, pool: concurrent.futures.Executor
) -> None:
    """One process: the whole object into ``raw`` with ranged GETs of ``get_size`` bytes."""
    starts = range(0, len(raw), get_size)
    list(pool.map(lambda a: get_into(client, t, a, raw[a : a + get_size], None), starts))


def _raw(arr: npt.NDArray[Any]) -> U8:
    return arr.reshape(-1).view(np.uint8)


# --------------------------------------------------- the server, shared by the APIs
class _Server:
    """The store every S3 API of this run uses (one server, one bucket, one prefix)."""

    users = 0
    url: str | None = None
    proc: Any = None
    bucket = "collio-bench"
    prefix = ""


def _start(endpoint: str | None, bucket: str) -> tuple[Any, str, str]:
    """On rank 0: (moto process or None, url, prefix), the bucket made."""
    import botocore.exceptions

    proc, url = (None, endpoint) if endpoint else serve_moto()
    try:
        client = client_for(url, None, 5, 4)
        try:
            client.create_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise
    except BaseException:
        if proc is not None:
            proc.terminate()
            proc.wait()
        raise
    return proc, str(url), f"collio-bench/{uuid.uuid4().hex[:12]}"


def _acquire(job: Job) -> None:
    """Collective over ``job.comm``: the first S3 API starts the server and makes the bucket."""
    if _Server.users == 0:
        endpoint = job.options.get("endpoint")
        if endpoint is None:
            fake_credentials()  # (only where none are set) for the local test server
        _Server.bucket = job.option("bucket", "collio-bench")
        step = Attempt()
        found: tuple[str, str] | None = None
        if job.comm.rank == 0:
            with step:
                _Server.proc, url, prefix = _start(endpoint, _Server.bucket)
                found = (url, prefix)
        where = redact_url(endpoint) if endpoint else "a local moto server"
        found = bcast_outcome(job.comm, found, step.error, what=f"S3 store at {where}")
        assert found is not None
        _Server.url, _Server.prefix = found
    _Server.users += 1


def _release(job: Job) -> None:
    """Collective: the last S3 API removes its objects (unless -k) and stops the server."""
    _Server.users -= 1
    if _Server.users:
        return
    sleep_until_done(job.comm.Ibarrier())
    if job.comm.rank != 0:
        return
    try:
        if not job.keep:
            client = client_for(_Server.url, None, 5, 4)
            found = client.list_objects_v2(Bucket=_Server.bucket, Prefix=_Server.prefix + "/")
            keys = [{"Key": o["Key"]} for o in found.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=_Server.bucket, Delete={"Objects": keys})
    finally:
        if _Server.proc is not None:
            _Server.proc.terminate()
            _Server.proc.wait()
            _Server.proc = None


# ------------------------------------------------------------------- the APIs
class _S3Target:
    """What the three share: the store, the object, the part size, -W from the object."""

    name: ClassVar[str]
    job: Job
    own_target: ClassVar[bool] = True
    quiet: ClassVar[bool] = True
    option_help: ClassVar[dict[str, str]] = S3

    @classmethod
    def check(cls, work: Workload, options: dict[str, str], writing: bool) -> None:
        for key in ("part_size", "max_concurrency", "get_size", "get_threads"):
            if size_option(options, key, 1) < 1:
                raise ValueError(f"-O {key}={options[key]!r} must be >= 1")

    def setup(self) -> None:
        j = self.job
        _acquire(j)
        self.t = S3Target(_Server.bucket, f"{_Server.prefix}/{self.name}")
        self.threads = size_option(j.options, "max_concurrency", 8)
        cb = Hints.coerce(j.hints, warn=False).cb_buffer_size
        planned = plan_part_size(j.work.nbytes, cb, concurrency=self.threads)
        self.part = size_option(j.options, "part_size", planned)
        self.get_size = size_option(j.options, "get_size", 64 * MiB)
        self.get_threads = size_option(j.options, "get_threads", 4)
        self.client = client_for(_Server.url, None, 5, max(self.threads, self.get_threads) + 2)
        self.pool = concurrent.futures.ThreadPoolExecutor(self.threads)
        self.get_pool = concurrent.futures.ThreadPoolExecutor(self.get_threads)

    def teardown(self) -> None:
        if hasattr(self, "pool"):
            self.pool.shutdown()
            self.get_pool.shutdown()
            _release(self.job)

    def written(self) -> npt.NDArray[Any] | None:
        """This rank's piece of the stored object: one ranged GET of the rank's extent."""
        j, w = self.job, self.job.work
        runs = j.layout.runs()
        flat = np.empty(w.nbytes, np.uint8)  # pages outside the extent are never touched
        if len(runs):
            lo, hi = int(runs.file.min()), int((runs.file + runs.length).max())
            get_into(self.client, self.t, lo, flat[lo:hi], None)
        return w.piece(flat.view(w.dtype).reshape(w.shape), j.comm.rank)

    def store_used(self) -> dict[str, Any]:
        return {
            "s3_endpoint": redact_url(_Server.url), "s3_bucket": self.t.bucket,
            "s3_key": self.t.key, "s3_part_size": self.part, "s3_max_concurrency": self.threads,
            "s3_get_size": self.get_size, "s3_get_threads": self.get_threads,
        }  # fmt: skip


class CollioS3Api(_S3Target, CollioApi):
    """collio's S3 backend: aggregators upload the parts of one object."""

    name: ClassVar[str] = "collio-s3"
    backend: ClassVar[str | None] = "s3"

    def target(self) -> str:
        return self.t.url

    def open(self, writing: bool) -> None:
        j = self.job
        opts: dict[str, Any] = {"endpoint_url": _Server.url, "max_concurrency": self.threads}
        if "part_size" in j.options:
            opts["part_size"] = self.part
        self.f = collio.open(
            self.target(), "w" if writing else "r", comm=j.comm, hints=self.hints() or None,
            backend="s3", **opts,
        )  # fmt: skip

    def hints_used(self) -> dict[str, Any]:
        out = {**super().hints_used(), **self.store_used()}
        stats = getattr(self, "stats", None)
        if stats is not None and stats.backend.get("part_size"):
            out["s3_part_size"] = int(stats.backend["part_size"])  # what collio planned
        return out


class S3GatherApi(_S3Target, Api):
    """Gather to rank 0, one multipart upload from there; reads: rank 0 reads, then scatters."""

    name: ClassVar[str] = "s3-gather"

    def open(self, writing: bool) -> None:
        pass

    def transfer(self, writing: bool) -> None:
        j = self.job
        if writing:
            whole = gather_whole(j)
            if whole is not None:
                upload_parts(self.client, self.t, _raw(whole), self.part, self.pool)
            return

        def read() -> npt.NDArray[Any]:
            whole = np.empty(j.work.shape, j.work.dtype)
            read_ranged(self.client, self.t, _raw(whole), self.get_size, self.get_pool)
            return whole

        read_on_root(j, read, "s3-gather read on rank 0")

    def close(self) -> None:
        pass

    def hints_used(self) -> dict[str, Any]:
        return self.store_used()


class S3CeilingApi(S3GatherApi):
    """One process uploading the bytes already in memory (rank 0), or reading the whole object."""

    name: ClassVar[str] = "s3-ceiling"

    whole: npt.NDArray[Any] | None = None

    def prepare(self, writing: bool) -> None:
        """Not timed: rank 0 holds the global array (writes) or an empty one (reads)."""
        if self.job.comm.rank == 0:
            w = self.job.work
            self.whole = w.whole() if writing else np.empty(w.shape, w.dtype)

    def transfer(self, writing: bool) -> None:
        if self.whole is None:
            return
        if writing:
            upload_parts(self.client, self.t, _raw(self.whole), self.part, self.pool)
        else:
            read_ranged(self.client, self.t, _raw(self.whole), self.get_size, self.get_pool)

    def read_errors(self) -> int:
        """Rank 0 checks every rank's piece of what it read (the others read nothing)."""
        if self.whole is None:
            return 0
        w = self.job.work
        return sum(
            int(np.count_nonzero(w.piece(self.whole, r) != w.data(r))) for r in range(w.nranks)
        )

    def finish(self, writing: bool) -> None:
        self.whole = None
