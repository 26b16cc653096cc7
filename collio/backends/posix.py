"""POSIX files (local disks, NFS, parallel file systems through their POSIX mounts)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..buffers import PAGE
from ..collective import Attempt, agree
from ..errors import CommitError
from ..runs import Runs
from .directio import DIRECT_MIN, direct_possible, open_direct, write_split
from .fdio import joinable, joined, pwrite_all, pwrite_joined, pwrite_runs
from .fileopen import Early, check_options, early_open, open_file
from .filereads import MappedReads
from .fsync import SYNC_FILE_RANGE_WRITE, EarlyFlush, fallocate, sync_file_range
from .keeping import KEEP_RUNS, Before, keep_one, keep_runs, put_back
from .localfile import (
    Prepared,
    drop_spare,
    finish_temporary,
    forget_cached,
    fsync_dir,
    hold,
    keep_spare,
    keepable,
    reclaim,
    release_later,
    spare_name,
    unlink_quietly,
)
from .mapped import Rows

__all__ = [
    "PosixBackend",
    "direct_possible",
    "open_direct",
    "write_split",
]

_O_BINARY = getattr(os, "O_BINARY", 0)
#: With holes="auto", a round with at most this many covered ranges skips the read.
_FEW_RUNS = 16
#: Write-behind (:meth:`PosixBackend._write_behind`) starts the disk on a run's whole
#: pages only, and only where they come to this much: a small run's pages are mostly
#: shared with the runs other ranks write beside it (a page written back half filled
#: is written again once they fill it), and a small request costs the disk about what
#: a large one does.  The close's fsync takes those pages with the rest.
WRITE_BEHIND_MIN = 64 << 10
#: A direct call (each rank its own runs) that overwrites this much of what the file held
#: at its open on a rank starts the disk on its runs at once
#: (:meth:`PosixBackend._behind`, with the hint ``early_flush``).
DIRECT_FLUSH_MIN = 1 << 20
#: What a file system that cannot allocate blocks ahead says to (posix_)fallocate.
_CANNOT_ALLOCATE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)
#: fallocate's modes that free a range's blocks and leave zeros, the size kept.
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE


class PosixBackend(MappedReads):
    """A file opened by every rank; aggregators use ``pwrite``/``preadv`` with big buffers.

    Options
    -------
    writeback : bool
        Start writeback of each written round right away (``sync_file_range``),
        so a later ``sync()`` has less left to flush, and, with the hint
        ``early_flush`` (default true), ``fdatasync`` in a background thread
        while the call goes on (:class:`~collio.backends.fsync.EarlyFlush`).
        Default True where Linux offers it.
    holes : {"auto", "rmw", "runs"}
        How a round with holes keeps the bytes no rank writes: ``rmw`` reads the
        round's extent, merges and writes it back in one request; ``runs`` writes
        only the covered byte ranges, one request each; ``auto`` (default) writes
        the covered ranges when there are at most 16 of them, else uses ``rmw``.
    create : {False, True, "exclusive"}
        In ``'r+'``: rank 0 makes a missing file, never truncating one that exists
        (MPI's ``MODE_CREATE``); ``"exclusive"`` refuses one that exists (``EEXIST``,
        MPI's ``MODE_EXCL``).  Default False: the file must exist.
    """

    name: ClassVar[str] = "posix"
    takes_back: ClassVar[bool] = True
    local_sync: ClassVar[bool] = True  # (an fsync of this rank's descriptor)
    #: A sync's error no call reported yet (:meth:`unsynced`): the next sync's.
    pending: BaseException | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass with a sync of its own may make it collective or publish: it agrees
        before syncing unless it says its sync is local (``local_sync``)."""
        super().__init_subclass__(**kwargs)
        if "sync" in cls.__dict__ and "local_sync" not in cls.__dict__:
            cls.local_sync = False

    #: The target's size when rank 0 opened it, the same on every rank (``MODE_APPEND``).
    opened_size: int = 0
    #: The bytes the file held once opened (none in ``'w'``): a direct call overwriting
    #: them starts their writeback at once (:meth:`_behind`).
    stored: int = 0

    def __init__(
        self, path: str, fd: int, mode: str, final: str | None, writeback: bool, holes: str = "auto"
    ) -> None:
        self.holes = holes
        self.path = path
        self.fd = fd
        self.mode = mode
        self.final = final  # the target when writing to a temporary (atomic_commit)
        self.writeback = writeback and sync_file_range is not None
        self.dirty = False
        self.readable = True
        self.writable = mode != "r"
        self.dfd = -1  # O_DIRECT descriptor (hint direct_write)
        self.direct_bytes = 0  # written through it
        self.flusher: EarlyFlush | None = None  # hint early_flush
        self.eager = False  # flush after each direct write (flush_soon)
        self.maps = False  # reads copy many small runs from a mapped file (mapped_reads)
        self.mapped_bytes = 0  # read that way
        self._copyable: tuple[Runs, bool] | None = None  # the last runs asked about
        self._gather: npt.NDArray[np.uint8] | None = None  # read_gathered's, kept
        self._rows: tuple[Runs, Rows | None] | None = None  # (MappedReads._rows_of's)
        self.made = Prepared(path, -1, None)  # rank 0's temporary (atomic_commit), see open
        self.free_now = False  # hint free_replaced=commit: the commit frees the old file
        self.keep = False  # hint free_replaced=reuse (a checkpoint's): the commit keeps it

    # -- open ---------------------------------------------------------------
    @classmethod
    def check_options(cls, mode: str, options: dict[str, Any]) -> None:
        check_options(mode, options)

    @classmethod
    def compared_options(cls, mode: str, options: dict[str, Any]) -> tuple[Any, ...]:
        """``create``, in ``'r+'``: it decides what rank 0 does to the target (as
        ``MPI_MODE_CREATE`` in an amode every rank must pass alike)."""
        return (("create", options.get("create", False)),) if mode == "r+" else ()

    @classmethod
    def open(
        cls, target: Any, mode: str, *, comm: Any, hints: Any, _early: Early | None = None,
        **options: Any,
    ) -> PosixBackend:  # fmt: skip
        """Collective over `comm`: :func:`~collio.backends.fileopen.open_file`; ``_early``
        (internal): this rank's :meth:`open_early`, agreed in the open's head."""
        return open_file(cls, target, mode, comm, hints, options, _early)

    @classmethod
    def open_early(
        cls, target: Any, mode: str, rank: int, hints: Any, options: dict[str, Any]
    ) -> Early | None:
        """Local: :func:`~collio.backends.fileopen.early_open`."""
        return early_open(target, mode, rank, hints, options)

    # -- data ---------------------------------------------------------------
    def take_direct_bytes(self) -> int:
        n, self.direct_bytes = self.direct_bytes, 0
        return n

    @property
    def joins_runs(self) -> bool:
        # (pwrite_joined below; O_DIRECT writes (hint direct_write) go run by run)
        return self.dfd < 0 and type(self).write_runs is PosixBackend.write_runs

    def write_runs(self, runs: Runs, data: npt.NDArray[np.uint8]) -> int | list[int]:
        """A rank's own runs (the direct path).  When they come to
        :data:`DIRECT_FLUSH_MIN` or more (or after :meth:`flush_soon`), the rank starts
        the disk on them as soon as it wrote them (:meth:`_behind`)."""
        if len(runs.file) == 1:  # (a small call's one run: no lists to build)
            m, n = int(runs.mem[0]), int(runs.length[0])
            self.write_one(int(runs.file[0]), data[m : m + n])
            return 1
        if self.dfd < 0 and joinable(runs.file, runs.length):
            # (runs that follow each other in the file, a checkpoint rank's pieces in its
            # region: a pwritev each, one hold of the file's lock, where a pwrite per run
            # waits on it for the other ranks' writes every time)
            self.dirty = True
            pwrite_joined(self.fd, runs.file, runs.length, runs.mem, data, self.path)
            if self._behind(runs):
                self._write_behind(Runs.sequential(*joined(runs.file, runs.length)))
            return len(runs)
        if self.dfd < 0 or not len(runs.file) or int(runs.length.max()) < DIRECT_MIN:
            self.dirty = True
            pwrite_runs(self.fd, runs.file, runs.length, runs.mem, data, self.path)
        else:
            for f, n, m in zip(
                runs.file.tolist(), runs.length.tolist(), runs.mem.tolist(), strict=True
            ):
                self._put(f, data[m : m + n])
        if self._behind(runs):
            self._write_behind(runs)
        return len(runs)

    def _behind(self, runs: Runs) -> bool:
        """Whether a direct call's ``runs`` start the disk at once (:meth:`write_runs`).

        Four ranks writing one shared file take its inode lock in turn, so a rank done
        with its runs waits for the others' copies into the page cache; started then,
        the disk writes its pages meanwhile, and the ``sync()`` or ``close()`` that makes
        them durable (which every written byte meets) waits that much less.  Each call
        pays for it (``sync_file_range`` waits while the disk's queue is full), and only
        where the runs overwrite bytes the file held at its open (:attr:`stored`): into
        new blocks, a growing file's, it makes the file system allocate them inside the
        call while the other ranks still append theirs, and a time series of 8 MiB per
        rank per call took several times as long per call (docs/design.md)."""
        if self.eager or not len(runs):
            return self.eager
        return self._behind_span(int(runs.length.sum()), int((runs.file + runs.length).max()))

    def _behind_span(self, nbytes: int, end: int) -> bool:
        """The rule of :meth:`_behind` for a call of ``nbytes`` ending at ``end``: after
        :meth:`flush_soon`, or with ``early_flush`` on and Linux's ``sync_file_range``,
        enough of it, all over bytes the file held at its open."""
        return self.eager or (
            self.flusher is not None and self.writeback
            and nbytes >= DIRECT_FLUSH_MIN and end <= self.stored
        )  # fmt: skip

    def _write_behind(self, runs: Runs) -> None:
        """Start the disk on the runs just written (:meth:`flush_soon`): writeback of
        their own whole pages (``sync_file_range``, which does not wait), where they come
        to :data:`WRITE_BEHIND_MIN` or more.  An
        ``fdatasync`` of the whole file, as the rounds' early flush, would also take the
        pages other ranks are still filling into one shared file, and their writes wait
        for it; the close's fsync makes everything durable.  Where Linux's call is
        missing, that ``fdatasync`` in the background all the same."""
        if not self.writeback:
            self.flusher.kick(0, now=True)  # type: ignore[union-attr]
            return
        lo = -(-runs.file // PAGE) * PAGE
        n = (runs.file + runs.length) // PAGE * PAGE - lo
        big = n >= WRITE_BEHIND_MIN
        for f, k in zip(lo[big].tolist(), n[big].tolist(), strict=True):
            sync_file_range(self.fd, f, k, SYNC_FILE_RANGE_WRITE)  # type: ignore[misc]

    def write_one(self, offset: int, buf: npt.NDArray[np.uint8]) -> int:
        """A direct call's one run (as :meth:`write_runs`, whose writeback rule it keeps)."""
        n = len(buf)
        self._put(offset, buf)
        if self._behind_span(n, offset + n):
            self._write_behind(Runs.sequential(np.array([offset]), np.array([n])))
        return 1

    def _put(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        """One request, through the page cache or in part with ``O_DIRECT`` (direct_write)."""
        self.dirty = True
        if len(buf) < DIRECT_MIN:  # (small: all through the page cache)
            pwrite_all(self.fd, buf, offset, self.path)
        else:
            self.direct_bytes += write_split(self.fd, self.dfd, buf, offset, self.path)

    def write_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        total = len(buf)
        self._put(offset, buf)
        if self.writeback and total >= (1 << 20) and self.more_rounds:  # (direct parts: written)
            sync_file_range(self.fd, offset, total, SYNC_FILE_RANGE_WRITE)
            if self.flusher is not None:
                self.flusher.kick(total)

    def _by_runs(self, cover: Runs) -> bool:
        return self.holes == "runs" or (self.holes == "auto" and len(cover) <= _FEW_RUNS)

    def fill_holes(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        """Read the round's old bytes, unless only the covered ranges will be written."""
        if self._by_runs(cover):
            return []
        return super().fill_holes(offset, buf, cover)

    def write_window(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        """One request for the round, or one per covered range (see ``holes``)."""
        whole = len(cover) == 1 and cover.length[0] == len(buf)
        if whole or not self._by_runs(cover):
            self.write_at(offset, buf)
            return [len(buf)]
        starts = (cover.file - offset).tolist()
        for s, n in zip(starts, cover.length.tolist(), strict=True):
            self.write_at(offset + s, buf[s : s + n])
        sizes: list[int] = cover.length.tolist()
        return sizes

    def keep_before(self, runs: Runs, limit: int) -> Before | None:
        """The bytes ``runs`` cover below the end of the file and the file's size
        (:func:`~collio.backends.keeping.keep_runs`); None beyond ``limit`` bytes or
        :data:`~collio.backends.keeping.KEEP_RUNS` runs."""
        if len(runs.file) > KEEP_RUNS:
            return None
        return keep_runs(self.fd, self.size(), runs, limit)

    def keep_before_one(self, offset: int, nbytes: int, limit: int) -> Before | None:
        # (the size as size() finds it, inline: every guessed small write asks)
        return keep_one(self.fd, os.lseek(self.fd, 0, os.SEEK_END), offset, nbytes, limit)

    def take_back(self, kept: Any, size: int) -> None:
        """Put the kept bytes back and cut the file to ``size``
        (:func:`~collio.backends.keeping.put_back`).  Every rank that wrote does this
        at once: their runs are disjoint, and none writes at or beyond ``size``."""
        put_back(self.fd, kept, size, self.path)

    def size(self) -> int:
        # (the end as lseek finds it: no stat result to build, and collio never uses the
        # descriptor's offset, reading and writing with pread and pwrite)
        return os.lseek(self.fd, 0, os.SEEK_END)

    def take_counts(self) -> tuple[int, int, int]:
        fl = self.flusher  # (take_flushes, inline: every repeated small call asks)
        got = (self.direct_bytes, fl.take_count() if fl is not None else 0, self.mapped_bytes)
        self.direct_bytes = self.mapped_bytes = 0
        return got

    def set_size(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.dirty = True

    def preallocate(self, size: int) -> None:
        """``posix_fallocate`` of the missing bytes (a file system without it: the size
        only, the blocks then come with the writes)."""
        have = self.size()
        if size <= have:
            return
        self.dirty = True
        try:
            os.posix_fallocate(self.fd, have, size - have)
        except OSError as exc:
            if exc.errno not in _CANNOT_ALLOCATE:
                raise
            os.ftruncate(self.fd, size)

    def reserve(
        self,
        size: int,
        holes: tuple[Any, Any] | None = None,
        unwritten: Callable[[], tuple[Any, Any]] | None = None,
    ) -> None:
        """``fallocate`` (mode 0) of the first ``size`` bytes: the file system allocates
        their blocks at once, as one extent where it can, so the ranks' writes and their
        writeback allocate none while the ranks write (each allocation holds the inode's
        block map against the other ranks' writes into the same file).  The ``holes``
        are left out (a request per range between them: blocks allocated for them would
        take disk space for nothing).  Where the file system cannot (``EOPNOTSUPP``),
        nothing: the writes allocate as they go.  A full disk is raised here, before any
        byte is written.

        A temporary that is a reused spare (hint ``free_replaced=reuse``) is cut to
        ``size`` and its ``unwritten`` ranges zeroed first (:meth:`_zero`): a new file
        would read zeros there, and the spare holds an older save's bytes."""
        if self.made.reused:
            self.dirty = True
            os.ftruncate(self.fd, max(size, 0))
            if unwritten is not None:
                self._zero(max(size, 0), *unwritten())
        if fallocate is None or size <= 0:
            return
        self.dirty = True  # (the file's size and blocks: the close's fsync makes them durable)
        starts, ends = [0], [size]
        if holes is not None and len(holes[0]):
            starts = [0, *(holes[0] + holes[1]).tolist()]
            ends = [*holes[0].tolist(), size]
        for lo, hi in zip(starts, ends, strict=True):
            if hi > lo and fallocate(self.fd, 0, lo, hi - lo) != 0:
                code = ctypes.get_errno()
                if code not in _CANNOT_ALLOCATE:
                    raise OSError(code, os.strerror(code), self.path)
                return

    def _zero(self, size: int, starts: Any, lengths: Any) -> None:
        """Zero the ranges ``(starts, lengths)``: their whole blocks freed (a hole, as a new
        file has there; cheap where one is already), the bytes around them zeroed by the
        file system.  Where it cannot punch holes, the file is emptied and cut to
        ``size`` again: a new file's bytes, its blocks freed (writing the zeros instead
        would write and allocate the gaps a new file leaves as holes)."""
        for lo, n in zip(starts.tolist(), lengths.tolist(), strict=True):
            if n <= 0:
                continue
            if fallocate is not None and fallocate(self.fd, _PUNCH_HOLE, lo, n) == 0:
                continue
            code = ctypes.get_errno() if fallocate is not None else errno.ENOSYS
            if code not in _CANNOT_ALLOCATE:
                raise OSError(code, os.strerror(code), self.path)
            os.ftruncate(self.fd, 0)
            os.ftruncate(self.fd, size)
            return

    def release_replaced(self, part: int, parts: int) -> None:
        """Drop this rank's share of the page cache of the file the temporary will
        replace: it would be dropped at the commit anyway, and until then the new bytes'
        pages come from the machine's free memory, reclaimed from other pages or (in a
        virtual machine that hands free memory back to its host) faulted in again from
        the host, which can take longer than the write; a writer that truncates its file
        reuses its pages at once.  Each rank drops a share, side by side, and the pages
        it frees serve its own next writes.  A save that keeps the replaced file as its
        spare (``free_replaced=reuse``, where :func:`keepable`) drops nothing: the next
        save writes into that file, whose pages, still cached, take its bytes with no
        memory freed or allocated.  (Each rank asks on its own: the answer only decides
        whether its share of the cache is dropped, never a collective step.)"""
        if self.final is not None and not (self.keep and keepable(self.final)):
            forget_cached(self.final, part, parts)

    @contextlib.contextmanager
    def lock(self, lo: int, hi: int, *, write: bool) -> Iterator[None]:
        """An ``fcntl`` byte-range lock (ROMIO's for atomic mode): other processes' locks
        of overlapping bytes wait; threads of one process share its locks."""
        if hi <= lo:
            yield
            return
        fcntl.lockf(self.fd, fcntl.LOCK_EX if write else fcntl.LOCK_SH, hi - lo, lo)
        try:
            yield
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, hi - lo, lo)

    def flush_soon(self) -> None:
        """From now on, start the disk on this rank's own runs of a call as soon as they
        are written (:meth:`_write_behind`; with the hint ``early_flush``, and now on what
        it wrote, if anything): for a caller that computes after its writes (a
        checkpoint's checksums), so the disk works meanwhile, from the moment each rank
        is done, before the call's completion waits for the others.  Otherwise the direct
        path starts one only on 1 MiB or more of bytes held at the open (:meth:`_behind`)."""
        self.eager = self.flusher is not None
        if self.eager and self.dirty:
            if self.writeback:
                sync_file_range(self.fd, 0, 0, SYNC_FILE_RANGE_WRITE)
            else:
                self.flusher.kick(0, now=True)  # type: ignore[union-attr]

    def clean(self) -> bool:
        """Nothing written since the last fsync and no early flush started since (its
        error, if it failed, is the next sync's): every written byte is durable."""
        fl = self.flusher
        if self.dirty or self.pending is not None:
            return False
        return fl is None or (fl.future is None and fl.error is None)

    def unsynced(self, error: BaseException) -> None:
        self.pending = error

    def sync(self) -> None:
        """fsync, after the early flush still running (whose error is raised after it, or
        else the error of a sync that no call reported: :meth:`unsynced`)."""
        early = self.flusher.wait() if self.flusher is not None else None
        pending, self.pending = self.pending, None
        if self.dirty and self.fd >= 0:
            os.fsync(self.fd)
            self.dirty = False
        if early is not None:
            raise early
        if pending is not None:
            raise pending

    def commit(self, comm: Any, ok: bool) -> None:
        """Collective over `comm`: with ``atomic_commit``, rename the temporary on success
        (given the target's mode and owner first), else remove it; rank 0 then removes
        the temporaries that dead jobs left beside the target."""
        if self.final is None:
            return
        step = Attempt()
        if comm.Get_rank() == 0:
            with step:
                if ok:
                    old, kept = -1, False
                    try:
                        finish_temporary(self.made.lock, self.made.before)
                        kept = self.keep and keep_spare(self.final)
                        old = -1 if kept else hold(self.final)
                        try:
                            os.replace(self.path, self.final)
                        except OSError as exc:
                            # (named by the target, which the message's "commit" names:
                            # the OSError's name is the temporary's, which the user never
                            # made and which is removed below)
                            raise OSError(exc.errno, exc.strerror) from None
                    except BaseException:
                        # (the rename refused, e.g. a directory now at the target: the
                        # previous file stays, and the temporary goes as at any failure;
                        # so does a spare just made of the file that stays)
                        self.made.remove()
                        if kept:
                            unlink_quietly(spare_name(self.final))
                        if old >= 0:
                            os.close(old)
                        raise
                    if self.free_now and old >= 0:
                        # (freed here, and the directory's sync below commits the
                        # journal that frees its blocks: every rank waits for it in
                        # the commit, and nothing of it is left for whatever runs next)
                        os.close(old)
                        old = -1
                    if not kept:  # (a spare an earlier save kept: nothing reuses it now)
                        drop_spare(self.final, self.free_now)
                    fsync_dir(self.final)
                    release_later(old)
                else:
                    self.made.remove()
            with contextlib.suppress(OSError):  # (others' leftovers: never this call's error)
                reclaim(self.final, keep=self.path)
        agree(comm, step.error, what=f"commit {self.final!r}")
        if not ok:
            return
        if step.error is not None:  # pragma: no cover - agree raised already
            raise CommitError(str(step.error))

    def discard(self) -> None:
        """Rank 0 removes the temporary of an atomic write (the others hold none)."""
        if self.final is not None and self.made.lock >= 0:
            self.made.remove()

    def close(self) -> None:
        if self.flusher is not None:  # (it must not outlive the descriptor)
            self.flusher.wait()  # (its error: sync() before close reported it)
        if self.dfd >= 0:
            os.close(self.dfd)
            self.dfd = -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._gather = self._rows = None
        self.made.release()

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(path=self.final or self.path, atomic=self.final is not None)
        out.update(direct_write=self.dfd >= 0, mapped_reads=self.maps)
        return out
