"""S3 objects: aggregators upload the parts of ONE object (multipart) and read it back.

Write ('w', 'r+'): rank 0 starts a multipart upload and broadcasts its id.  Parts
have one size planned from the object size and ``cb_buffer_size``; the backend's
``alignment`` is that size, so file domains and round windows are whole parts and
each part has exactly one owner.  An aggregator uploads the parts its window
touches, several at once; parts nobody touched are zeros ('w') or copied
server-side from the old object ('r+') at close; rank 0 completes the upload
only when every rank agreed success, and aborts it otherwise.

Read ('r'): aggregators read their windows with ranged GETs (by default one GET
streamed through the domain) and the engine redistributes the bytes.
"""

from __future__ import annotations

import concurrent.futures
import errno
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ...collective import Attempt, agree, raise_agreed
from ...errors import BackendError, CommitError, LayoutError, MismatchError, ModeError
from ...runs import Runs, group_bounds, split_grid
from ..base import Backend
from . import upload
from .client import RangeStream, client_for, get_into, public_url, s3_error
from .options import S3Options
from .plan import MAX_PART_SIZE, MIN_PART_SIZE, PartPlan, S3Target, coalesce, holes, parse_target
from .plan import split_ranges as _split

__all__ = ["S3Backend"]

U8 = npt.NDArray[np.uint8]
T = TypeVar("T")
_GAP = 4 << 20  # read on through gaps up to this size rather than start a new GET


class S3Backend(Backend):
    """One S3 object; ``collio.open("s3://bucket/key", mode, **options)``.

    Options are those of :class:`~collio.backends.s3.options.S3Options`
    (``endpoint_url``, ``size``, ``max_concurrency``, ...).  ``f.backend.describe()``
    (and ``f.stats.backend``) show the planned part size once it is known.
    """

    name: ClassVar[str] = "s3"
    partial_write: ClassVar[bool] = False
    min_request: ClassVar[int] = MIN_PART_SIZE
    max_request: ClassVar[int] = MAX_PART_SIZE
    collective_open: ClassVar[bool] = True
    independent: ClassVar[bool] = False
    atomic: ClassVar[bool] = True

    def __init__(
        self, comm: MPI.Comm, t: S3Target, mode: str, opts: S3Options, client: Any, state: Any
    ) -> None:
        self.comm, self.t, self.mode, self.opts, self.client = comm, t, mode, opts, client
        self.buffer, self.old_size, self.old_etag, self.upload_id = state
        self.readable = mode == "r"
        self.writable = mode != "r"
        self.parts: PartPlan | None = None
        self._done = np.zeros(0, bool)  # parts uploaded so far (every rank, after flush)
        self._new: list[int] = []  # parts this rank uploaded in the current call
        self._etags: dict[int, str] = {}  # S3 part number -> ETag, this rank's parts
        self._failed = False
        self._finished = mode == "r"
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._stream: RangeStream | None = None
        self._read_end = 0
        self._info: dict[str, Any] = {
            "backend": self.name,
            "url": t.url,
            "endpoint_url": public_url(opts.endpoint_url),
            "mode": mode,
            "partial_write": False,
            "alignment": 1,
            "min_request": self.min_request,
            "max_request": self.max_request,
            "size": self.old_size if mode == "r" else None,
            "part_size": None,
            "parts": None,
            "max_concurrency": opts.max_concurrency,
            "get_concurrency": opts.get_concurrency,
        }

    # -- open -----------------------------------------------------------------
    @classmethod
    def open(cls, target: Any, mode: str, *, comm: Any, hints: Any, **options: Any) -> S3Backend:
        """Collective over `comm`: check the target, then rank 0 looks it up and starts the upload.

        Every rank gets the same error for a bad key or option, a missing bucket or
        key, or an unreachable endpoint.
        """
        buffer = min(int(getattr(hints, "cb_buffer_size", 16 << 20)), 1 << 30)
        step = Attempt()
        opts, t = S3Options(), S3Target("", "")
        with step:
            opts = S3Options.parse(options)
            t = parse_target(target, prefix=opts.prefix)
            if opts.size is not None and mode != "r":
                opts.plan(opts.size, buffer)
        agree(comm, step.error, what="open s3")
        ref = comm.bcast((t, opts), root=0)
        differs = MismatchError(
            f"rank {comm.Get_rank()}: s3 target or options differ from rank 0's"
        )
        agree(comm, None if ref == (t, opts) else differs, what="open s3")
        step = Attempt()
        client = None
        with step:
            pool = opts.max_concurrency + 2
            client = client_for(opts.endpoint_url, opts.region_name, opts.retries, pool)
        agree(comm, step.error, what=f"open {t.url}")
        step = Attempt()
        state: tuple[int, int, str | None, str | None] = (buffer, 0, None, None)
        if comm.Get_rank() == 0:
            with step:
                state = _prepare(client, t, mode, buffer)
        quiet_barrier(comm)
        agree(comm, step.error, what=f"open {t.url}")
        be = cls(comm, t, mode, opts, client, comm.bcast(state, root=0))
        if opts.size is not None and be.writable:
            be._plan(opts.size)
        return be

    def _plan(self, size: int) -> None:
        """Fix the parts (and so the alignment) for an object of ``size`` bytes."""
        self.parts = self.opts.plan(size, self.buffer)
        self.alignment = self.parts.part_size
        self._done = np.zeros(self.parts.nparts, bool)
        self._info.update(
            size=size, alignment=self.alignment, part_size=self.alignment, parts=self.parts.nparts
        )

    # -- layout hooks -----------------------------------------------------------
    def domain_extent(self, lo: int, hi: int) -> tuple[int, int]:
        """Writes: ``(0, object size)``, planning the parts at the first call; reads: as given."""
        if not self.writable:
            self._read_end = min(hi, self.old_size)
            return lo, hi
        if self.parts is None:  # every rank plans from the same global extent
            step = Attempt()
            with step:
                self._plan(max(hi, self.old_size))
            agree(self.comm, step.error, what="write_all")
        assert self.parts is not None
        return 0, self.parts.size

    def runs_for(self, layout: Any) -> Runs:
        """The layout's runs; refuses, before any data moves, what S3 parts cannot do."""
        runs: Runs = layout.runs()
        if self.writable and self.parts is not None and len(runs):
            p = self.parts
            end = int((runs.file + runs.length).max())
            if end > p.size:
                raise LayoutError(
                    f"{self.t.url}: write_all reaches byte {end}, past the object size {p.size} "
                    "fixed at open or by the first write_all; pass size= (at least the final "
                    "size) to collio.open to write the object in several calls"
                )
            hit = p.hit_any(runs.file, runs.length, self._done)
            if hit >= 0:
                a, b = p.bounds(hit)
                raise LayoutError(
                    f"{self.t.url}: part {hit + 1} (bytes [{a}, {b})) was uploaded by an earlier "
                    f"write_all; an uploaded part cannot take more bytes, so each part "
                    f"({p.part_size} bytes) must be written by one write_all"
                )
        return runs

    # -- data path (aggregators, in the engine's I/O thread) ------------------
    def write_window(self, offset: int, buf: U8, cover: Runs) -> list[int]:
        """Upload the parts of the window that ranks wrote into, concurrently."""
        p = self._plan_or_fail()
        touched = p.touched(cover.file, cover.length, offset, offset + len(buf)).tolist()
        jobs = []
        for i in touched:
            a, b = p.bounds(i)
            jobs.append((i, buf[a - offset : b - offset]))

        def put(job: tuple[int, U8]) -> str:
            return upload.upload_part(self.client, self.t, str(self.upload_id), *job)

        def what(job: tuple[int, U8]) -> str:
            a, b = p.bounds(job[0])
            return f"{self.t.url}: upload of part {job[0] + 1} (bytes [{a}, {b}))"

        etags = self._run(put, jobs, what)
        for (i, _), etag in zip(jobs, etags, strict=True):
            self._etags[i + 1] = etag
            self._new.append(i)
        return [len(d) for _, d in jobs]

    def fill_holes(self, offset: int, buf: U8, cover: Runs) -> list[int]:
        """Zeros ('w'); in 'r+' the old bytes of the holes of touched parts (ranged GETs)."""
        buf[:] = 0
        if self.mode != "r+" or offset >= self.old_size:
            return []
        p = self._plan_or_fail()
        end = offset + len(buf)
        touched = p.touched(cover.file, cover.length, offset, end)
        hs, he = holes(cover.file, cover.length, offset, end)
        pieces, k = split_grid(
            Runs(hs, he - hs, hs), np.full(len(hs), offset, np.int64), p.part_size
        )
        part = k + offset // p.part_size
        keep = np.isin(part, touched)
        s, e = pieces.file[keep], pieces.file[keep] + pieces.length[keep]
        if not len(s):
            return []
        first = group_bounds(part[keep])[0][:-1]
        s, e = coalesce(s[first], np.maximum.reduceat(e, first).astype(np.int64), _GAP)
        e = np.minimum(e, self.old_size)
        ok = e > s
        return self._fetch(offset, buf, s[ok], e[ok], p.part_size)

    def read_window(self, offset: int, buf: U8, need: Runs) -> list[int]:
        """Fill the ranges ranks need with ranged GETs; bytes past the end read as zeros."""
        end = offset + len(buf)
        if end > self.old_size:
            buf[max(0, self.old_size - offset) :] = 0
        s, e = coalesce(need.file, np.minimum(need.file + need.length, self.old_size), _GAP)
        ok = e > s
        s, e = s[ok], e[ok]
        if self.opts.get_concurrency > 1:
            chunk = max(1 << 20, -(-len(buf) // self.opts.get_concurrency))
            return self._fetch(offset, buf, s, e, chunk)
        if self._stream is None:
            self._stream = RangeStream(self.client, self.t, self.old_etag, self.opts.retries)
        stream = self._stream
        for a, b in zip(s.tolist(), e.tolist(), strict=True):
            try:
                stream.read_into(a, buf[a - offset : b - offset], gap=_GAP, end=self._read_end)
            except Exception as exc:
                raise s3_error(exc, f"{self.t.url}: read of bytes [{a}, {b})", self.client) from exc
        sizes: list[int] = (e - s).tolist()
        return sizes

    def _fetch(self, offset: int, buf: U8, s: Any, e: Any, chunk: int) -> list[int]:
        """Concurrent ranged GETs of ``[s, e)`` (cut at ``chunk``) into ``buf``."""
        s, e = _split(np.asarray(s, np.int64), np.asarray(e, np.int64), chunk)
        jobs = list(zip(s.tolist(), e.tolist(), strict=True))

        def get(job: tuple[int, int]) -> None:
            get_into(
                self.client, self.t, job[0], buf[job[0] - offset : job[1] - offset], self.old_etag
            )

        self._run(get, jobs, lambda j: f"{self.t.url}: read of bytes [{j[0]}, {j[1]})")
        return [b - a for a, b in jobs]

    def _run(
        self, fn: Callable[[Any], T], jobs: Sequence[Any], what: Callable[[Any], str]
    ) -> list[T]:
        """Run ``fn`` over ``jobs`` on this rank's request threads; wait for all of them."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.opts.max_concurrency, thread_name_prefix="collio-s3"
            )
        futs = [self._pool.submit(fn, job) for job in jobs]
        concurrent.futures.wait(futs)  # never return while a thread still uses the buffer
        out: list[T] = []
        for job, fut in zip(jobs, futs, strict=True):
            exc = fut.exception()
            if exc is not None:
                self._failed = True
                raise s3_error(exc, what(job), self.client) from exc
            out.append(fut.result())
        return out

    def _plan_or_fail(self) -> PartPlan:
        if self.parts is None:  # pragma: no cover - domain_extent plans first
            raise BackendError(f"{self.t.url}: parts are not planned yet")
        return self.parts

    # -- collective hooks -------------------------------------------------------
    def flush(self, comm: Any) -> None:
        """Collective over `comm`: every rank learns which parts this call uploaded."""
        new = np.array(self._new, np.int64)
        self._new = []
        every = comm.allgather(new)
        if len(self._done):
            self._done[np.concatenate(every)] = True

    def commit(self, comm: Any, ok: bool) -> None:
        """Collective over `comm`: complete the upload on agreed success, abort it otherwise.

        Parts no rank wrote are filled first (zeros, or server-side copies of the old
        object in 'r+'), shared round-robin over the ranks.  On any failure rank 0
        aborts the upload, so an object already at the key stays as it was.
        """
        if self._finished:
            return
        self._finished = True
        failed = Attempt()
        if self._failed:
            failed.fail(CommitError(f"{self.t.url}: a part upload failed earlier; nothing stored"))
        if comm.allreduce(1 if failed.error or not ok else 0, op=MPI.MAX):
            self._abort(comm)
            if ok:
                agree(comm, failed.error, what="commit")
            return
        if self.parts is None:
            if self.mode == "r+":  # nothing written: the object stays as it is
                self._abort(comm)
                return
            self._plan(0)
        p = self._plan_or_fail()
        if self.mode == "r+" and not self._done.any() and p.size == self.old_size:
            self._abort(comm)
            return
        self._fill_missing(comm, p)
        self._complete(comm, p)

    def _fill_missing(self, comm: Any, p: PartPlan) -> None:
        missing = np.flatnonzero(~self._done)
        copied = int((np.minimum((missing + 1) * p.part_size, p.size) <= self.old_size).sum())
        self._info.update(parts_copied=copied, parts_filled=len(missing) - copied)
        mine = missing[comm.Get_rank() :: comm.Get_size()].tolist()
        step = Attempt()
        with step:
            zeros = np.zeros(p.part_size if mine else 0, np.uint8)  # untouched pages: no RSS
            old = (self.old_size, self.old_etag)
            uid = str(self.upload_id)

            def fill(i: int) -> str:
                return upload.fill_part(self.client, self.t, uid, p, i, old, zeros)

            etags = self._run(fill, mine, lambda i: f"{self.t.url}: carrying part {i + 1}")
            self._etags.update({i + 1: etag for i, etag in zip(mine, etags, strict=True)})
        quiet_barrier(comm)
        if comm.allreduce(1 if step.error else 0, op=MPI.MAX):
            self._abort(comm)
            raise_agreed(comm, _as_commit(step.error) if step.error else None, what="commit")

    def _complete(self, comm: Any, p: PartPlan) -> None:
        every = comm.gather(self._etags, root=0)
        step = Attempt()
        if comm.Get_rank() == 0:
            with step:
                etags = {n: e for part in every or [] for n, e in part.items()}
                try:
                    upload.complete(self.client, self.t, str(self.upload_id), etags, p.nparts)
                except Exception as exc:
                    step.fail(_as_commit(s3_error(exc, f"{self.t.url}: completing", self.client)))
                    upload.abort(self.client, self.t, str(self.upload_id))
        quiet_barrier(comm)
        agree(comm, step.error, what="commit")

    def _abort(self, comm: Any) -> None:
        """Collective over `comm`: rank 0 aborts the upload; all raise if that failed."""
        step = Attempt()
        if comm.Get_rank() == 0 and self.upload_id:
            with step:
                try:
                    upload.abort(self.client, self.t, self.upload_id)
                except Exception as exc:
                    raise CommitError(
                        f"{s3_error(exc, f'{self.t.url}: abort', self.client)}; the object is "
                        "unchanged, but the upload's parts stay until a lifecycle rule "
                        "(AbortIncompleteMultipartUpload) removes them",
                        errno=errno.EIO,
                    ) from exc
        quiet_barrier(comm)
        agree(comm, step.error, what="abort")

    # -- the rest of the interface ----------------------------------------------
    def write_at(self, offset: int, buf: U8) -> None:
        raise ModeError("s3 objects are written in whole parts by write_all, not at offsets")

    def read_at(self, offset: int, buf: U8) -> None:
        n = max(0, min(len(buf), self.old_size - offset))
        buf[n:] = 0
        try:
            get_into(self.client, self.t, offset, buf[:n], self.old_etag)
        except Exception as exc:
            raise s3_error(exc, f"{self.t.url}: read at {offset}", self.client) from exc

    def size(self) -> int:
        return self.parts.size if self.parts is not None else self.old_size

    def sync(self) -> None:
        """Nothing to do: uploaded parts are stored; the object appears at close."""

    def close(self) -> None:
        """Release this rank's threads and connections; rank 0 aborts an unfinished upload."""
        if not self._finished and self.upload_id and self.comm.Get_rank() == 0:
            try:
                upload.abort(self.client, self.t, self.upload_id)
            except Exception:  # noqa: BLE001 - best effort, nothing else can be done here
                pass
        self._finished = True
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def describe(self) -> dict[str, Any]:
        """A live dict (updated in place when the parts are planned); never credentials."""
        return self._info


def quiet_barrier(comm: Any) -> None:
    """Collective over `comm`: a barrier that sleeps while it waits.

    Used where one rank talks to the server (create, complete, abort) while the
    others wait: MPI's blocking calls poll a core each, which a server on the same
    node (or an oversubscribed node) needs.
    """
    req = comm.Ibarrier()
    delay = 1e-5
    while not req.Test():
        time.sleep(delay)
        delay = min(2 * delay, 1e-3)


def _prepare(
    client: Any, t: S3Target, mode: str, buffer: int
) -> tuple[int, int, str | None, str | None]:
    """On rank 0: (cb_buffer_size, old size, old ETag, UploadId) for the mode."""
    size, etag, upload_id = 0, None, None
    if mode in ("r", "r+"):
        size, etag = upload.head(client, t)
    if mode in ("w", "r+"):
        upload_id = upload.create(client, t)
    return buffer, size, etag, upload_id


def _as_commit(exc: BaseException) -> CommitError:
    """Report failures of the commit step as :class:`CommitError`."""
    if isinstance(exc, CommitError):
        return exc
    return CommitError(str(exc), errno=getattr(exc, "errno", None) or errno.EIO)
