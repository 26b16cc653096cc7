"""One multipart upload as every rank sees it: parts uploaded, completion, abort.

Every rank keeps the ETags of the parts it uploaded and, after each
``write_all``, which parts any rank uploaded (:meth:`Multipart.flush`).  At close
the parts nobody wrote are filled (zeros, or server-side copies of the old
object), rank 0 gathers the ETags and completes the upload, or aborts it when
anything failed: the object appears whole or not at all.
"""

from __future__ import annotations

import errno
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ...collective import Attempt, agree, raise_agreed
from ...errors import CollioError, CommitError, add_later
from ...waits import quiet_barrier
from . import upload
from .client import Requests, s3_error
from .plan import PartPlan, S3Target

__all__ = ["Multipart"]


class Multipart:
    """The upload ``upload_id`` of ``t``; ``old`` is (size, ETag) of the object it replaces."""

    def __init__(
        self,
        client: Any,
        t: S3Target,
        upload_id: str,
        old: tuple[int, str | None],
        req: Requests,
        abort_client: Any = None,
    ) -> None:
        self.client, self.t, self.upload_id, self.old, self.req = client, t, upload_id, old, req
        self.abort_client = abort_client if abort_client is not None else client
        self.etags: dict[int, str] = {}  # S3 part number -> ETag, parts this rank uploaded
        self.new: list[int] = []  # 0-based parts this rank uploaded in the current call
        self.done = np.zeros(0, bool)  # parts any rank uploaded (known after flush)
        self.finished = False
        self.counts = {"parts_copied": 0, "parts_filled": 0}

    def start(self, nparts: int) -> None:
        self.done = np.zeros(nparts, bool)

    def record(self, parts: list[int], etags: list[str]) -> None:
        """This rank uploaded ``parts`` (0-based) with these ETags."""
        self.etags.update({i + 1: e for i, e in zip(parts, etags, strict=True)})
        self.new.extend(parts)

    def flush(self, comm: Any) -> None:
        """Collective over `comm`: every rank learns which parts this call uploaded."""
        every = comm.allgather(np.array(self.new, np.int64))
        self.new = []
        if len(self.done):
            self.done[np.concatenate(every)] = True

    def commit(self, comm: Any, ok: bool, plan: PartPlan | None, keep_if_unchanged: bool) -> None:
        """Collective over `comm`: complete on agreed success, abort otherwise.

        With ``keep_if_unchanged`` ('r+'), an upload that changes nothing is
        aborted and the object stays as it is.
        """
        if self.finished:
            return
        self.finished = True
        failed = Attempt()
        if self.req.failed:
            failed.fail(CommitError(f"{self.t.url}: a request failed earlier; nothing stored"))
        if comm.allreduce(1 if failed.error or not ok else 0, op=MPI.MAX):
            try:
                self.abort(comm)
            except CollioError as later:  # (agreed) the failure that made us abort goes first
                if ok:
                    try:
                        agree(comm, failed.error, what="commit")
                    except CollioError as cause:
                        add_later(cause, later)
                        raise cause from None
                raise
            if ok:
                agree(comm, failed.error, what="commit")
            return
        unchanged = plan is None or (not self.done.any() and plan.size == self.old[0])
        if keep_if_unchanged and unchanged:
            self.abort(comm)
            return
        plan = plan if plan is not None else PartPlan(0, 1)
        self._fill_missing(comm, plan)
        self._complete(comm, plan)

    def _fill_missing(self, comm: Any, p: PartPlan) -> None:
        """Collective: the parts nobody wrote, shared round-robin over the ranks."""
        missing = np.flatnonzero(~self.done) if len(self.done) == p.nparts else np.arange(p.nparts)
        copied = int((np.minimum((missing + 1) * p.part_size, p.size) <= self.old[0]).sum())
        self.counts = {"parts_copied": copied, "parts_filled": len(missing) - copied}
        mine = missing[comm.Get_rank() :: comm.Get_size()].tolist()
        step = Attempt()
        with step:
            zeros: npt.NDArray[np.uint8] = np.zeros(p.part_size if mine else 0, np.uint8)

            def fill(i: int) -> str:  # zeros' pages are never written: they cost no RSS
                return upload.fill_part(self.client, self.t, self.upload_id, p, i, self.old, zeros)

            tags = self.req.run(fill, mine, lambda i: f"{self.t.url}: carrying part {i + 1}")
            self.record(mine, tags)
        quiet_barrier(comm)
        if comm.allreduce(1 if step.error else 0, op=MPI.MAX):
            self.abort(comm)
            raise_agreed(comm, _as_commit(step.error) if step.error else None, what="commit")

    def _complete(self, comm: Any, p: PartPlan) -> None:
        """Collective: rank 0 gathers the ETags and completes (aborts if that fails: the
        completion's error is raised on every rank, the abort's failure, agreed, in its
        ``close_error``)."""
        every = comm.gather(self.etags, root=0)
        step, aborting = Attempt(), Attempt()
        if comm.Get_rank() == 0:
            with step:
                etags = {n: e for part in every or [] for n, e in part.items()}
                try:
                    upload.complete(self.client, self.t, self.upload_id, etags, p.nparts)
                except Exception as exc:
                    step.fail(_as_commit(s3_error(exc, f"{self.t.url}: completing", self.client)))
                    with aborting:
                        self._abort_upload()
        quiet_barrier(comm)
        try:
            agree(comm, step.error, what="commit")
        except CollioError as cause:  # (every rank: only then is the abort's outcome agreed)
            try:
                agree(comm, aborting.error, what="abort")
            except CollioError as later:
                add_later(cause, later)
            raise

    def abort(self, comm: Any) -> None:
        """Collective over `comm`: rank 0 aborts the upload; all raise if that failed."""
        self.finished = True
        step = Attempt()
        if comm.Get_rank() == 0:
            with step:
                self._abort_upload()
        quiet_barrier(comm)
        agree(comm, step.error, what="abort")

    def _abort_upload(self) -> None:
        """On rank 0: abort the upload; a :class:`CommitError` saying what stays if refused."""
        try:
            upload.abort(self.abort_client, self.t, self.upload_id)
        except Exception as exc:
            raise CommitError(
                f"{s3_error(exc, f'{self.t.url}: abort', self.client)}; the object is "
                "unchanged, but the upload's parts stay until a lifecycle rule "
                "(AbortIncompleteMultipartUpload) removes them",
                errno=errno.EIO,
            ) from exc

    def abandon(self, rank: int) -> None:
        """Not collective: rank 0 aborts an upload that was never committed (best effort)."""
        if not self.finished and rank == 0:
            try:
                upload.abort(self.abort_client, self.t, self.upload_id)
            except Exception:  # noqa: BLE001 - nothing else can be done at this point
                pass
        self.finished = True


def _as_commit(exc: BaseException) -> CommitError:
    """Report failures of the commit step as :class:`CommitError`."""
    if isinstance(exc, CommitError):
        return exc
    return CommitError(str(exc), errno=getattr(exc, "errno", None) or errno.EIO)
