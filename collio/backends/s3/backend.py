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

from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ...collective import Attempt, agree, agree_same
from ...errors import BackendError, HintError, LayoutError, ModeError, scrubbed
from ...redact import redact_url
from ...runs import Runs, group_bounds, split_grid
from ...waits import quiet_barrier
from ..base import Backend
from . import upload
from .client import RangeStream, Requests, get_into, s3_error
from .multipart import Multipart
from .options import S3Options
from .plan import MAX_PART_SIZE, MIN_PART_SIZE, PartPlan, S3Target, coalesce, holes, parse_target
from .plan import split_ranges as _split

__all__ = ["S3Backend"]

U8 = npt.NDArray[np.uint8]
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
    independent: ClassVar[bool] = False
    atomic: ClassVar[bool] = True
    remote: ClassVar[bool] = True
    needs_flush: ClassVar[bool] = True  # ranks learn which parts each call uploaded
    # Reads: one aggregator per node (ROMIO's default, cb_config_list '*:1'), unless the
    # hints choose: a node's GETs share its network, each aggregator streams its domain
    # with get_concurrency requests in flight, and the other ranks leave their cores to
    # that I/O (and to a server on the node).  Writes keep every rank: uploads run in
    # parallel per aggregator (docs/design.md compares the counts).
    read_per_node: ClassVar[int | None] = 1

    def __init__(
        self, comm: MPI.Comm, t: S3Target, mode: str, opts: S3Options, client: Any, state: Any
    ) -> None:
        self.comm, self.t, self.mode, self.opts, self.client = comm, t, mode, opts, client
        self.buffer, self.old_size, self.old_etag, upload_id = state
        self.readable = mode == "r"
        self.writable = mode != "r"
        self.parts: PartPlan | None = None
        self.req = Requests(opts.max_concurrency, client)
        old = (self.old_size, self.old_etag)
        self.upload = None
        if upload_id:
            # (an abort follows a failure, maybe of a server that stopped answering: one
            # attempt, so the abort adds one timeout, not a round of retries)
            quick = opts.client(1, 2)
            self.upload = Multipart(client, t, upload_id, old, self.req, quick)
        self._stream: RangeStream | None = None
        self._read_end = 0
        #: ``watch(offset, window)``, called by an aggregator with each window it is about
        #: to upload (every byte as the object will hold it): a checkpoint save sums the
        #: extents it cannot read back from an upload in progress there
        self.watch: Any = None
        self._info: dict[str, Any] = {
            "backend": self.name,
            "url": t.url,
            "endpoint_url": redact_url(opts.endpoint_url),
            "connect_timeout": opts.connect_timeout,
            "read_timeout": opts.read_timeout,
            "retries": opts.retries,
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
        # (botocore's errors quote the endpoint as given, user info and all)
        endpoint = options.get("endpoint_url")
        step = Attempt()
        opts, t = S3Options(), S3Target("", "")
        with step:
            opts = S3Options.parse(options)
            t = parse_target(target, prefix=opts.prefix)
            if getattr(hints, "striping_unit", None):
                raise HintError(
                    "hint striping_unit does not apply to s3 objects: domains are whole "
                    "parts, planned from the object size (set part_size= to choose them)"
                )
            if opts.size is not None and mode != "r":
                opts.plan(opts.size, buffer)
        # one allreduce: errors, and the same target and options on every rank
        agree_same(
            comm,
            scrubbed(step.error, endpoint),
            None if step.error else (t, opts),
            what="open s3",
            describe=lambda v: f"s3 target {v[0].url} with {v[1]}",
        )
        step = Attempt()
        client = None
        with step:
            client = opts.client(opts.retries, opts.max_concurrency + 2)
        agree(comm, scrubbed(step.error, endpoint), what=f"open {t.url}")
        step = Attempt()
        state: tuple[int, int, str | None, str | None] = (buffer, 0, None, None)
        if comm.Get_rank() == 0:
            with step:
                state = _prepare(client, t, mode, buffer)
        quiet_barrier(comm)
        agree(comm, scrubbed(step.error, endpoint), what=f"open {t.url}")
        be = cls(comm, t, mode, opts, client, comm.bcast(state, root=0))
        if opts.size is not None and be.writable:
            be._plan(opts.size)
        return be

    def _plan(self, size: int) -> None:
        """Fix the parts (and so the alignment) for an object of ``size`` bytes."""
        self.parts = self.opts.plan(size, self.buffer)
        self.alignment = self.parts.part_size
        # a round uploads the parts of its window at once: keep cb_buffer_size's worth
        # (the parts were sized for that), whatever min_rounds asks
        self.min_window = max(self.alignment, self.buffer // self.alignment * self.alignment)
        if self.upload is not None:
            self.upload.start(self.parts.nparts)
        self._info.update(
            size=size, alignment=self.alignment, part_size=self.alignment, parts=self.parts.nparts
        )

    @classmethod
    def room_after(
        cls, end: int, tail: int, hints: Any, options: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """Local: where a second ``write_all`` of ``tail`` bytes can go after a first one
        ending at byte ``end`` (the start of the part after the first call's last one:
        an uploaded part takes no more bytes), and the open's options that fix the
        object's size and part size so (the user's part size kept; a ``size`` given is
        replaced: the object's is this one).  Raises what a bad option raises at open."""
        buffer = min(int(getattr(hints, "cb_buffer_size", 16 << 20)), 1 << 30)
        opts = S3Options.parse({k: v for k, v in options.items() if k != "size"})
        part = opts.part_size or opts.plan(end + tail, buffer).part_size
        at = -(-end // part) * part
        # (parts grow with the object only past 10,000 of them: planned again for the
        # size with the gap, the tail moved on, until the part size holds)
        while not opts.part_size and (bigger := opts.plan(at + tail, buffer).part_size) != part:
            part, at = bigger, -(-end // bigger) * bigger
        opts.plan(at + tail, buffer)  # (S3's rules for the final size: raised here if broken)
        return at, {**options, "size": at + tail, "part_size": part}

    # -- layout hooks -----------------------------------------------------------
    def domain_extent(self, lo: int, hi: int) -> tuple[int, int]:
        """Writes: ``(0, object size)``; reads: the data's own extent.

        The engine calls it on every rank with the same global extent; at the first
        write it plans the parts, agreeing on errors over the file's communicator.
        """
        if not self.writable:
            self._read_end = min(hi, self.old_size)  # narrowed per aggregator by read_extent
            return lo, hi
        if self.parts is None:  # every rank plans from the same global extent
            step = Attempt()
            with step:
                self._plan(max(hi, self.old_size))
            agree(self.comm, step.error, what="write_all")
        return 0, self._parts().size

    def read_extent(self, lo: int, hi: int) -> None:
        """This aggregator reads within ``[lo, hi)``: its streamed GET ends there."""
        self._read_end = min(hi, self.old_size)

    def runs_for(self, layout: Any) -> Runs:
        """The layout's runs; refuses, before any data moves, what S3 parts cannot do."""
        runs: Runs = layout.runs()
        if self.writable and self.parts is not None and self.upload is not None and len(runs):
            p = self.parts
            end = int((runs.file + runs.length).max())
            if end > p.size:
                raise LayoutError(
                    f"{self.t.url}: write_all reaches byte {end}, past the object size {p.size} "
                    "fixed at open or by the first write_all; pass size= (at least the final "
                    "size) to collio.open to write the object in several calls"
                )
            hit = p.hit_any(runs.file, runs.length, self.upload.done)
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
        p, up = self._parts(), self._upload()
        if self.watch is not None:
            self.watch(offset, buf)
        parts = p.touched(cover.file, cover.length, offset, offset + len(buf)).tolist()
        sizes = [min(p.part_size, p.size - i * p.part_size) for i in parts]

        def put(i: int) -> str:
            a, b = p.bounds(i)
            return upload.upload_part(
                self.client, self.t, up.upload_id, i, buf[a - offset : b - offset]
            )

        def what(i: int) -> str:
            a, b = p.bounds(i)
            return f"{self.t.url}: upload of part {i + 1} (bytes [{a}, {b}))"

        up.record(parts, self.req.run(put, parts, what))
        return sizes

    def fill_holes(self, offset: int, buf: U8, cover: Runs) -> list[int]:
        """Zeros ('w'); in 'r+' the old bytes of the holes of touched parts (ranged GETs)."""
        buf[:] = 0
        if self.mode != "r+" or offset >= self.old_size:
            return []
        p = self._parts()
        end = offset + len(buf)
        touched = p.touched(cover.file, cover.length, offset, end)
        hs, he = holes(cover.file, cover.length, offset, end)
        origin = np.full(len(hs), offset, np.int64)
        pieces, k = split_grid(Runs(hs, he - hs, hs), origin, p.part_size)
        part = k + offset // p.part_size
        keep = np.isin(part, touched)
        s, e = pieces.file[keep], pieces.file[keep] + pieces.length[keep]
        if not len(s):
            return []
        first = group_bounds(part[keep])[0][:-1]  # one range per part: its first to last hole
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
        for a, b in zip(s.tolist(), e.tolist(), strict=True):
            try:
                self._stream.read_into(
                    a, buf[a - offset : b - offset], gap=_GAP, end=self._read_end
                )
            except Exception as exc:
                raise s3_error(exc, f"{self.t.url}: read of bytes [{a}, {b})", self.client) from exc
        sizes: list[int] = (e - s).tolist()
        return sizes

    def _fetch(self, offset: int, buf: U8, s: Any, e: Any, chunk: int) -> list[int]:
        """Concurrent ranged GETs of ``[s, e)`` (cut at ``chunk``) into ``buf``."""
        s, e = _split(np.asarray(s, np.int64), np.asarray(e, np.int64), chunk)
        jobs = list(zip(s.tolist(), e.tolist(), strict=True))

        def get(job: tuple[int, int]) -> None:
            a, b = job
            get_into(self.client, self.t, a, buf[a - offset : b - offset], self.old_etag)

        self.req.run(get, jobs, lambda j: f"{self.t.url}: read of bytes [{j[0]}, {j[1]})")
        return [b - a for a, b in jobs]

    def _parts(self) -> PartPlan:
        if self.parts is None:  # pragma: no cover - domain_extent plans first
            raise BackendError(f"{self.t.url}: parts are not planned yet")
        return self.parts

    def _upload(self) -> Multipart:
        if self.upload is None:  # pragma: no cover - 'r' has no write path
            raise ModeError(f"{self.t.url} is open for reading")
        return self.upload

    # -- collective hooks -------------------------------------------------------
    def flush(self, comm: Any) -> None:
        """Collective over `comm`: every rank learns which parts this call uploaded."""
        if self.upload is not None:
            self.upload.flush(comm)

    def commit(self, comm: Any, ok: bool) -> None:
        """Collective over `comm`: complete the upload on agreed success, abort it otherwise.

        Parts no rank wrote are filled first (zeros, or server-side copies of the old
        object in 'r+'), shared round-robin over the ranks.  On any failure rank 0
        aborts the upload, so an object already at the key stays as it was.
        """
        if self.upload is None:
            return
        if self.parts is None and self.mode == "w" and ok:
            self._plan(0)  # nothing written: an empty object, as 'w' truncates
        self.upload.commit(comm, ok, self.parts, keep_if_unchanged=self.mode == "r+")
        self._info.update(self.upload.counts)

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
        if self.upload is not None:
            self.upload.abandon(self.comm.Get_rank())
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self.req.close()

    def describe(self) -> dict[str, Any]:
        """A live dict (updated in place when the parts are planned); never credentials."""
        return self._info


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
