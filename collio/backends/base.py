"""The backend interface: a small class the aggregators call with large requests.

A backend is IOR's ``aiori`` table in Python: a handful of required methods and
class attributes that say what it can do.  Core code checks these attributes,
never ``isinstance`` against a concrete backend.

Required: :meth:`Backend.open` (a classmethod, called by *every* rank),
:meth:`write_at`, :meth:`read_at`, :meth:`size`, :meth:`sync`, :meth:`close`.
Optional hooks with defaults: :meth:`check_options` (validate ``collio.open``'s
backend options inside its first agreement), :meth:`runs_for` (map a layout into the backend's
byte space, e.g. chunk-major for zarr), :meth:`domain_extent` (e.g. S3 objects
always start at 0), :meth:`domain_bounds` (cut the domains, e.g. by real bytes),
:meth:`commit` / :meth:`abort` (atomic completion).

How the backends fit:

* ``posix``: byte-addressable; ``partial_write``; alignment = ``striping_unit``.
* ``mpiio``: same as posix, requests go to ``MPI.File.Write_at`` on a file every
  rank opened.
* ``hdf5`` (contiguous dataset): posix at the dataset's file offset; chunked:
  ``runs_for`` maps to chunk-major space, ``alignment`` = chunk bytes, the
  aggregator compresses whole chunks (:mod:`collio.backends.hdf5`).
* ``zarr``: ``runs_for`` maps to chunk- (shard-) major space, ``alignment`` = chunk
  (shard) bytes, ``write_at`` stores whole chunks through zarr's codecs;
  ``partial_write`` False (the owner reads, merges and rewrites a partial chunk).
* ``s3``: ``partial_write`` False (holes are zeros), ``alignment`` = part size,
  ``min_request`` 5 MiB, ``max_parts`` 10,000 (rank 0 creates the multipart
  upload), ``commit`` completes it, ``abort`` aborts it.
"""

from __future__ import annotations

import abc
import errno
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..aggregators.domains import file_domains
from ..errors import BackendError
from ..runs import Runs

if TYPE_CHECKING:
    from .fsync import EarlyFlush

__all__ = ["Backend"]


#: The slots of the open's head (one allreduce, MAX) an early open takes
#: (:meth:`Backend.open_early`)
EARLY_SLOTS = 6
#: Those of a rank with no early open: a failure, and zeros, which no early open's
#: negated pairs all agree with, so that every rank goes its open's general way
NO_EARLY = (1,) + (0,) * (EARLY_SLOTS - 1)


class Backend(abc.ABC):
    """Storage that aggregators write to with few, large requests.

    Capabilities (class attributes, override in subclasses):

    ``readable``, ``writable``
        What the backend supports at all.
    ``partial_write``
        True: any byte range can be written, so holes keep old content (the core
        reads, merges and writes a window with holes).  False: requests cover whole
        windows and holes are written as zeros (object stores).
    ``alignment``
        File-domain boundaries and round windows are multiples of this.  May be
        set per instance, at open or in :meth:`domain_extent` (which the engine
        calls first), e.g. to a multipart part size planned from the object size.
    ``min_window``
        Rounds are not shrunk below this (``min_rounds`` hint), e.g. an object
        store whose window holds the parts it uploads at once.  0: no floor.  May
        be set per instance, like ``alignment``.
    ``min_request``, ``max_request``
        Smallest request except the last one; largest single request (larger ones
        are split by :meth:`write_at` itself).
    ``independent``
        Any rank may write its own ranges directly (the shuffle can be skipped).
    ``sparse``
        Bytes never written read back as zeros.
    ``needs_flush``
        :meth:`flush` must run (collectively) after every ``write_all``.
    ``remote``
        Requests cross a network and take milliseconds (object stores): ranks that
        wait for each other's I/O between rounds sleep instead of polling MPI,
        leaving the CPU to the ranks still doing I/O (and to a server on the node).
    ``takes_back``
        A rank's own write can be undone (:meth:`keep_before`, :meth:`take_back`).
    ``local_sync``
        :meth:`sync` is this rank's own (an ``fsync``), not collective, and changes
        nothing but durability: ``File.sync``/``close`` run it, where the rank is not
        :meth:`clean`, before their head, which then agrees on the call and on every
        rank's sync error at once.  Such a backend keeps an error its sync raised beside
        another rank's different call for the next sync (:meth:`unsynced`, which it must
        implement: without it, the sync agrees first as any other backend's).
    ``atomic``
        Writes become visible only at :meth:`commit` (an S3 multipart upload):
        :class:`collio.File` then treats every write as ``atomic_commit`` does: after
        a failed ``write_all`` later writes are refused and ``close`` calls
        ``commit(comm, ok=False)``.
    """

    name: ClassVar[str] = "abstract"
    readable: bool = True  # may be narrowed per instance (e.g. by mode)
    writable: bool = True
    partial_write: ClassVar[bool] = True
    alignment: int = 1  # may be set per instance (see above)
    min_window: int = 0  # may be set per instance (see above)
    min_request: ClassVar[int] = 1
    max_request: ClassVar[int] = 0x7FFFF000
    independent: ClassVar[bool] = True
    sparse: ClassVar[bool] = True
    needs_flush: ClassVar[bool] = False  # call flush(comm) after every write_all
    atomic: ClassVar[bool] = False
    remote: ClassVar[bool] = False
    #: :meth:`keep_before` and :meth:`take_back` work: a repeated small write may go
    #: before the agreement (collio.speculate)
    takes_back: ClassVar[bool] = False
    #: :meth:`sync` is local and changes nothing but durability (see above)
    local_sync: ClassVar[bool] = False
    #: Aggregators per node for reads when the hints choose none (None: as for writes).
    read_per_node: ClassVar[int | None] = None
    #: Whether this rank writes another round of the same call after the window being
    #: written (:func:`collio.roundio.window_write` says so around each window; a backend
    #: sees one request at a time).  Starting the disk on a window (writeback, an early
    #: flush) pays only where the call goes on shuffling the next round meanwhile: after
    #: the last or only round the call waits for it and the final fsync is no shorter.
    more_rounds: bool = True
    #: Ranks owning file domains, in domain order (set at open by the file core).
    aggregators: npt.NDArray[np.int64] | None = None

    mode: str = "r"
    #: This file's early flush (hint ``early_flush``), for backends that flush while
    #: writing (posix, mpiio, contiguous HDF5 datasets); None: no flush before ``sync()``.
    flusher: EarlyFlush | None = None

    @classmethod
    def check_options(cls, mode: str, options: dict[str, Any]) -> None:
        """Local: raise if ``options`` (``collio.open``'s extra keywords) are invalid.

        ``collio.open`` calls it on every rank inside its first agreement, so
        :meth:`open` may touch the target knowing every rank's options passed.
        The default accepts anything (:meth:`open` then checks, and agrees).  A
        subclass that adds options of its own must accept them here too.
        """
        return None

    @classmethod
    def compared_options(cls, mode: str, options: dict[str, Any]) -> tuple[Any, ...]:
        """Local: the options (checked by :meth:`check_options`) that every rank must
        pass alike, as ``(name, value)`` pairs: ``collio.open`` compares them with the
        mode, hints and target (a mismatch raises on every rank, naming them).  Only
        options whose values say nothing secret: the message shows them."""
        return ()

    @classmethod
    def open_early(
        cls, target: Any, mode: str, rank: int, hints: Any, options: dict[str, Any]
    ) -> Any:
        """Local, never raises: the part of :meth:`open` this rank can do before the
        open's agreement, for a backend whose open then needs no agreement of its own
        (``collio.open`` passes it to :meth:`open` as ``_early``); None (the default):
        nothing.  What it returns gives the open's head its facts (``slots()``,
        :data:`EARLY_SLOTS` ints, reduced with MAX; :data:`NO_EARLY` from a rank with
        none), learns their maxima (``agreed(out)``) and lets go of what it holds
        (``drop()``)."""
        return None

    @classmethod
    @abc.abstractmethod
    def open(cls, target: Any, mode: str, *, comm: Any, hints: Any, **options: Any) -> Backend:
        """Collective over `comm`: open (or create, in 'w') the target on every rank.

        Must raise the same error on every rank (use :func:`collio.collective.agree`).
        """

    # -- data path (aggregators, or every rank on the direct path) --------
    @abc.abstractmethod
    def write_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        """Write all of ``buf`` at byte ``offset``."""

    @abc.abstractmethod
    def read_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        """Fill ``buf`` from byte ``offset``; bytes past the end read as zeros."""

    def keep_before(self, runs: Runs, limit: int) -> Any:
        """Local: what :meth:`take_back` needs to undo this rank's own write of ``runs``
        (the bytes they cover now, the target's size), or None when it cannot (more than
        ``limit`` bytes to keep, or a backend that cannot take writes back: the default).

        A call may then write before the ranks agree (one agreement per small call
        instead of two) and take the write back if the agreement says it must not stand.
        """
        return None

    def take_back(self, kept: Any, size: int) -> None:
        """Local: put back what :meth:`keep_before` kept, and cut the target back to
        ``size`` bytes (its size before the call, agreed by the ranks) if it grew."""
        raise NotImplementedError(f"{self.name} cannot take writes back")

    @property
    def joins_runs(self) -> bool:
        """Whether :meth:`write_runs` writes runs that follow each other in the file with
        one request (then a batch of a rank's arrays one after another is a few requests
        however many arrays it has: :func:`collio.policy.has_many_small_runs`)."""
        return False

    def write_runs(self, runs: Runs, data: npt.NDArray[np.uint8]) -> int | list[int]:
        """Write a rank's own runs directly; returns the number of requests, or their sizes.

        The default loops over runs: only used on the direct path, which the core
        takes for a few large runs (or when the user disables collective buffering).
        """
        for f, n, m in zip(
            runs.file.tolist(), runs.length.tolist(), runs.mem.tolist(), strict=True
        ):
            self.write_at(f, data[m : m + n])
        return len(runs)

    def read_runs(self, runs: Runs, out: npt.NDArray[np.uint8]) -> int | list[int]:
        """Read a rank's own runs into ``out``; returns the number of requests, or their sizes."""
        for f, n, m in zip(
            runs.file.tolist(), runs.length.tolist(), runs.mem.tolist(), strict=True
        ):
            self.read_at(f, out[m : m + n])
        return len(runs)

    # -- one run: a repeated small call's (collio.quick), without arrays ------
    def keep_before_one(self, offset: int, nbytes: int, limit: int) -> Any:
        """:meth:`keep_before` of the one run of ``nbytes`` at ``offset``."""
        return self.keep_before(_one(offset, nbytes), limit)

    def write_one(self, offset: int, buf: npt.NDArray[np.uint8]) -> int | list[int]:
        """:meth:`write_runs` of all of ``buf`` as one run at ``offset``."""
        return self.write_runs(_one(offset, len(buf)), buf)

    def read_one(self, offset: int, out: npt.NDArray[np.uint8]) -> int | list[int]:
        """:meth:`read_runs` of all of ``out`` as one run at ``offset``."""
        return self.read_runs(_one(offset, len(out)), out)

    def maps_one(self, offset: int, nbytes: int) -> bool:
        """:meth:`maps_reads` of the one run of ``nbytes`` at ``offset``."""
        return self.maps_reads(_one(offset, nbytes))

    def read_if_maps(self, offset: int, out: npt.NDArray[np.uint8]) -> tuple[bool, Any]:
        """:meth:`maps_one` of the run that ``out`` fills from ``offset`` and, if True,
        its :meth:`read_one` (False: ``out`` holds anything, or nothing was read)."""
        if not self.maps_one(offset, len(out)):
            return False, None
        return True, self.read_one(offset, out)

    # -- windows (what the two-phase engine calls) --------------------------
    def write_window(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        """Write one round's buffer ``[offset, offset+len(buf))``; return request sizes.

        ``cover`` lists the byte ranges ranks actually wrote (absolute offsets,
        sorted, merged); the rest of ``buf`` was filled by :meth:`fill_holes`.
        Runs in the I/O thread.  Default: one :meth:`write_at`.
        """
        self.write_at(offset, buf)
        return [len(buf)]

    def fill_holes(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        """Before a round with holes: fill ``buf`` with what the target holds now.

        Bytes no rank writes must keep their previous content.  Default: read the
        whole range if the target is readable (read-modify-write), else zeros.
        Returns the sizes of the read requests made.
        """
        if self.readable:
            self.read_at(offset, buf)
            return [len(buf)]
        buf[:] = 0
        return []

    def read_window(self, offset: int, buf: npt.NDArray[np.uint8], need: Runs) -> list[int]:
        """Fill one round's buffer; ``need`` lists the ranges ranks asked for.

        Runs in the I/O thread.  Default: one :meth:`read_at` of the whole range.
        """
        self.read_at(offset, buf)
        return [len(buf)]

    def read_extent(self, lo: int, hi: int) -> None:  # noqa: B027 - optional hook
        """Before an aggregator's read rounds: it will read within ``[lo, hi)`` in this call.

        Lets a backend size its requests to what is needed (S3 streams one ranged
        GET of exactly this range).  Main thread, aggregators only; default: nothing.
        """

    def flush(self, comm: Any) -> None:  # noqa: B027 - optional hook
        """Collective over `comm`: called after every write_all if ``needs_flush``.

        Backends that finish work collectively (ship compressed chunks to the
        rank that owns the real file, gather upload tags) do it here.
        """

    # -- layout mapping ---------------------------------------------------
    def runs_for(self, layout: Any) -> Runs:
        """This rank's runs in the backend's byte space (default: the layout's own)."""
        runs: Runs = layout.runs()
        return runs

    def check_layout(self, layout: Any) -> None:  # noqa: B027 - optional hook
        """Raise :class:`~collio.errors.LayoutError` if the layout does not fit the target."""

    def check_batch(self, layouts: Sequence[Any]) -> None:  # noqa: B027 - optional hook
        """Local, after :meth:`check_layout` of each of a batch's layouts (``write_all_many``,
        ``read_all_many``): raise :class:`~collio.errors.LayoutError` if they cannot be one
        call, and forget what :meth:`check_layout` kept of the last one alone."""

    def own_runs(
        self, comm: Any, runs: Runs, *, writing: bool
    ) -> tuple[npt.NDArray[np.bool_], bool] | None:
        """Collective over `comm`: which of its runs may this rank do itself, unshuffled?

        Asked (on every rank alike) only of backends that are not ``independent``,
        when the hints allow skipping the shuffle.  Returns None when no rank keeps
        any run, else ``(mask over runs, every rank keeps all)``, the flag the same
        on every rank.  The kept runs go to :meth:`write_runs` / :meth:`read_runs`,
        the rest through the aggregators.  Zarr keeps the chunks that one rank
        alone touches.  Default: None.
        """
        return None

    def domain_extent(self, lo: int, hi: int) -> tuple[int, int]:
        """The byte range the file domains split (default: the data's own extent)."""
        return lo, hi

    def take_direct_bytes(self) -> int:
        """Bytes written with ``O_DIRECT`` since the last call (hint ``direct_write``); 0
        for backends that never write around the page cache."""
        return 0

    def take_mapped_bytes(self) -> int:
        """Bytes :meth:`read_runs` copied from a mapped file since the last call (hint
        ``mapped_reads``); 0 for backends that never map."""
        return 0

    def maps_reads(self, runs: Runs) -> bool:
        """Whether this rank would read ``runs`` itself from a mapped file (hint
        ``mapped_reads``) rather than through the shuffle.  The engine skips the shuffle
        of a read when every rank says yes.  Local, cheap; default False."""
        return False

    def take_flushes(self) -> int:
        """Early flushes started since the last call (hint ``early_flush``); 0 for
        backends that never flush while writing."""
        return self.flusher.take_count() if self.flusher is not None else 0

    def take_counts(self) -> tuple[int, int, int]:
        """:meth:`take_direct_bytes`, :meth:`take_flushes` and :meth:`take_mapped_bytes`
        at once (a repeated small call asks every time)."""
        return self.take_direct_bytes(), self.take_flushes(), self.take_mapped_bytes()

    def domain_bounds(self, lo: int, hi: int, naggs: int, align: int) -> npt.NDArray[np.int64]:
        """``naggs + 1`` domain bounds over ``[lo, hi)``, interior ones multiples of ``align``.

        Must be a pure function of its arguments (every rank calls it and must get
        the same bounds).  Default: even shares of the byte range
        (:func:`~collio.aggregators.file_domains`).  Backends whose units carry
        unequal real bytes (zarr's and chunked HDF5's padded edge chunks) weigh them.
        """
        return file_domains(lo, hi, naggs, align)

    # -- what MPI-IO's file calls need beyond the data path (collio.mpi) ----
    def set_size(self, size: int) -> None:
        """Truncate or extend the target to ``size`` bytes (``MPI_File_set_size``; one rank
        calls it).  Default: refused, for targets whose size only their writes make."""
        raise self._unsupported("set the size of")

    def preallocate(self, size: int) -> None:
        """Reserve storage for the first ``size`` bytes, the target growing to at least that
        size and its bytes kept (``MPI_File_preallocate``; one rank calls it)."""
        raise self._unsupported("preallocate")

    def lock(self, lo: int, hi: int, *, write: bool) -> AbstractContextManager[None]:
        """Hold a lock on bytes ``[lo, hi)`` against other processes while the block runs,
        exclusive for ``write`` (MPI's atomic mode for a rank's own accesses)."""
        raise self._unsupported("lock byte ranges of")

    def _unsupported(self, what: str) -> BackendError:
        return BackendError(
            f"the {self.name} backend cannot {what} its target", errno=errno.ENOTSUP
        )

    # -- completion -------------------------------------------------------
    @abc.abstractmethod
    def size(self) -> int:
        """Current size in bytes."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Make written data durable (on the ranks that wrote)."""

    def reserve(  # noqa: B027 - optional hook
        self,
        size: int,
        holes: tuple[Any, Any] | None = None,
        unwritten: Callable[[], tuple[Any, Any]] | None = None,
    ) -> None:
        """Local, one rank: have the storage allocate room for the first ``size`` bytes in
        one request, before the ranks write them, where it can (a hint: the size and the
        bytes stay as they are), but for the ranges ``holes`` (sorted, disjoint, page
        aligned ``(starts, lengths)`` that nobody writes: left holes); nothing by default.
        ``unwritten`` gives the ranges of the first ``size`` bytes the ranks will not
        write (sorted, disjoint, any alignment): a backend that writes into an older
        file's blocks zeroes them, and cuts the file to ``size``, so that the target
        holds what a new file would."""

    def release_replaced(self, part: int, parts: int) -> None:  # noqa: B027 - optional hook
        """Local: writing what will replace an existing target, give back this rank's
        share (``part`` of ``parts`` equal byte ranges) of the memory caching the target
        being replaced, before the ranks write, where the storage can (a hint); nothing
        by default."""

    def flush_soon(self) -> None:  # noqa: B027 - optional hook
        """Local: start making what this rank wrote durable in the background, where the
        backend can, so that a later :meth:`sync` waits less; nothing by default."""

    def clean(self) -> bool:
        """Local: :meth:`sync` would do nothing on this rank now (nothing written since its
        last sync, no early flush running or failed), so ``File.sync``/``close`` may skip
        it: on this rank alone where the sync is local (``local_sync``), else when every
        rank says so.  False unless a backend knows: a sync that is collective
        (``MPI_File_sync``) or publishes anything must always run."""
        return False

    def unsynced(self, error: BaseException) -> None:
        """Local, for ``local_sync`` backends: ``error``, raised by :meth:`sync` in a call
        whose head then met another rank's different call (the mismatch is what every rank
        raises), is the next sync's to raise; until then the backend is not clean."""
        raise NotImplementedError(f"{type(self).__name__} has no local sync")

    def commit(self, comm: Any, ok: bool) -> None:  # noqa: B027 - optional hook
        """Collective over `comm`: make the writes visible (``ok``) or drop them.  ``ok`` is
        the same on every rank (the file core agrees on it), so a commit may decide on one
        rank's ``ok`` and make collective calls only when it is true."""

    def discard(self) -> None:  # noqa: B027 - optional hook
        """Local: drop what this rank holds of writes that will never be committed (a
        close interrupted before its commit, where no rank can agree any more)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources on this rank (after :meth:`commit`)."""

    def describe(self) -> dict[str, Any]:
        """Capabilities, for stats and error messages."""
        return {
            "backend": self.name,
            "partial_write": self.partial_write,
            "alignment": self.alignment,
            "min_request": self.min_request,
            "max_request": self.max_request,
        }


def _one(offset: int, nbytes: int) -> Runs:
    """The one run of ``nbytes`` at ``offset`` from a buffer's start."""
    return Runs.sequential(np.array([offset], np.int64), np.array([nbytes], np.int64))
