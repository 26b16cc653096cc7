"""The file objects behind h5py's ``fileobj`` driver: rank 0's real file and the replicas.

Every rank's HDF5 library runs the same metadata calls against its own file
object; the objects decide what reaches the disk:

* :class:`VFile` on every rank keeps the metadata bytes its library wrote in an
  overlay of 4 KiB pages; bytes it never wrote are read from the real file (so a
  replica reads raw data that the aggregators wrote, and r+ files are never
  copied whole).
* On rank 0 (``root``) the overlay is *published* to the disk at agreed points:
  after every rank flushed and the digests matched, or when HDF5 flushes on its
  own (``File.flush``, ``File.close``) and when the library lets go of the file.
  Replicas never write.
* A digest of what this rank's library wrote since the last collective point (the
  final bytes per address, the raw chunk requests, the end of file) tells whether all
  ranks made the same metadata calls.  It is a digest of the *result*, not of the
  sequence, so a rank whose metadata cache evicted an entry early (because it also
  read something) still agrees.
* Raw chunk bytes that HDF5 writes during a direct chunk write are dropped
  (``expect_raw``): the aggregator that compressed the chunk writes it itself.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import BackendError
from ..fdio import pread_zeros, pwrite_all
from ..fsync import EarlyFlush

__all__ = ["VFile", "PAGE"]

PAGE = 4096


class VFile:
    """A file-like object for h5py's fileobj driver (seek/tell/readinto/write/...)."""

    def __init__(self, path: str, fd: int, size: int, *, root: bool) -> None:
        self.path = path
        self.fd = fd
        self.size = size  # the logical end of file HDF5 sees
        self.root = root
        self.pos = 0
        self.pages: dict[int, tuple[bytearray, bytearray]] = {}  # page -> (bytes, written mask)
        self.epoch: dict[int, tuple[bytearray, bytearray]] = {}  # written since the last point
        self.raw: list[tuple[int, int]] = []  # raw chunk requests since the last point
        self.truncated: int | None = None  # pending ftruncate (root)
        self.raw_expect = 0  # the next write of exactly this many bytes is raw chunk data
        self.in_sync = False  # inside a collective point: root defers publishing
        self.frozen = False  # ranks diverged: never publish again
        self.dirty = False
        self.error: BaseException | None = None  # a failure inside a callback
        #: Called once the descriptor is closed (the file core lets go of its communicator).
        self.on_release: Callable[[], None] | None = None
        self.replica: Any = None  # the metadata agreement (replica.Replica) this file owns
        self.session: Any = None  # the front end's state of the file, kept alive with it
        self.flusher: EarlyFlush | None = None  # contiguous datasets' early flush (hint)
        #: Fills rank 0 wrote that this rank reads until the next collective point (rank 0
        #: may not have written them yet): (offset, bytes, one element).  Empty on rank 0.
        self.fills: list[tuple[int, int, bytes]] = []
        self._spans: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None

    # -- the file-object protocol h5py's fileobj driver uses ---------------
    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else (self.size + offset if whence == 2 else self.pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, mv: Any) -> int:
        view = memoryview(mv).cast("B")
        off, n = self.pos, len(view)
        out = np.frombuffer(view, np.uint8)
        disk = max(0, min(n, self.size - off))
        if disk:
            pread_zeros(self.fd, view[:disk], off)
        out[disk:] = 0
        for at, size, one in self._pending(off, n) if self.fills else ():
            # (not on the disk yet: the fill is what is there)
            lo, hi = max(off, at), min(off + n, at + size)
            if lo < hi:
                out[lo - off : hi - off] = _tiled(one, lo - at, hi - lo)
        self._overlay(out, off)
        self.pos = off + n
        return n

    def _overlay(self, out: npt.NDArray[np.uint8], off: int) -> None:
        """The bytes this rank's library wrote (the overlay) over ``out``, the file's
        bytes from ``off``."""
        n = len(out)
        first, last = off // PAGE, (off + n - 1) // PAGE
        if n == 0:
            candidates: Any = ()
        elif last - first + 1 > len(self.pages):  # a large (raw) read: walk the overlay
            candidates = sorted(p for p in self.pages if first <= p <= last)
        else:
            candidates = range(first, last + 1)
        for p in candidates:
            page = self.pages.get(p)
            if page is None:
                continue
            lo, hi = max(off, p * PAGE), min(off + n, (p + 1) * PAGE)
            src = np.frombuffer(page[0], np.uint8)[lo - p * PAGE : hi - p * PAGE]
            keep = np.frombuffer(page[1], np.bool_)[lo - p * PAGE : hi - p * PAGE]
            np.copyto(out[lo - off : hi - off], src, where=keep)

    def read(self, n: int) -> bytes:
        buf = bytearray(n)
        self.readinto(buf)
        return bytes(buf)

    def write(self, mv: Any) -> int:
        view = memoryview(mv).cast("B")
        off, n = self.pos, len(view)
        self.pos = off + n
        self.size = max(self.size, off + n)
        if self.raw_expect and n == self.raw_expect:
            self.raw_expect = 0
            self.raw.append((off, n))
            return n
        _store(self.pages, off, view)
        _store(self.epoch, off, view)
        return n

    def truncate(self, size: int | None = None) -> int:
        size = self.pos if size is None else int(size)
        self.size = size
        for pages in (self.pages, self.epoch):
            for p in [p for p in pages if p * PAGE >= size]:
                del pages[p]
            last = pages.get(size // PAGE)
            if last is not None:
                last[1][size % PAGE :] = bytes(PAGE - size % PAGE)
        if self.root:
            self.truncated = size
        return size

    def forget(self, lo: int, hi: int) -> None:
        """Drop overlay bytes in ``[lo, hi)`` (raw data: read it from the disk instead)."""
        first, last = lo // PAGE, (hi - 1) // PAGE
        if hi <= lo:
            return
        # (a new dataset's range may span many more pages than the overlay holds)
        pages = range(first, last + 1) if last - first < len(self.pages) else sorted(self.pages)
        for p in pages:
            page = self.pages.get(p) if first <= p <= last else None
            if page is not None:
                a, b = max(lo, p * PAGE) - p * PAGE, min(hi, (p + 1) * PAGE) - p * PAGE
                page[1][a:b] = bytes(b - a)

    def flush(self) -> None:
        """HDF5 flushed on its own (``File.flush``/``close``): rank 0 publishes now."""
        if self.root and not self.in_sync:
            try:
                self.publish()
            except BaseException as exc:  # noqa: BLE001 - reported at the next collective point
                self.error = exc
                raise

    # -- collio's side ------------------------------------------------------
    def fill(self, offset: int, size: int, one: bytes) -> None:
        """Local, every rank alike: the ``size`` bytes from ``offset`` (a new contiguous
        dataset's) hold the element ``one`` repeated.  Rank 0 writes them now, as HDF5
        would have at the creation (so a dataset made later in space freed since keeps
        the order HDF5 gives), at most :data:`FILL_STEP` bytes per ``pwrite``; its failure
        is reported at the next collective point.  The other ranks read the fill there
        until that point (rank 0 may not have written it yet).  Bytes the library wrote
        there before (a deleted dataset's) are forgotten, on every rank."""
        self.forget(offset, offset + size)
        self.size = max(self.size, offset + size)  # (as HDF5's own write of it would)
        if not self.root:
            self.fills.append((offset, size, one))
            self._spans = None
            return
        e = len(one)
        step = max(FILL_STEP // e, 1) * e
        buf = _tiled(one, 0, min(step, size))
        try:
            for lo in range(0, size, step):
                n = min(step, size - lo)
                pwrite_all(self.fd, buf[:n].data, offset + lo, self.path)
        except OSError as exc:
            if self.error is None:
                self.error = BackendError(
                    f"writing the fill value of a new dataset, bytes [{offset}, "
                    f"{offset + size}) of {self.path!r}: {exc.strerror or exc}",
                    errno=exc.errno,
                )
        self.dirty = True

    def filled(self) -> None:
        """Local, at a collective point every rank passed: rank 0 wrote the fills."""
        self.fills.clear()
        self._spans = None

    def _pending(self, off: int, n: int) -> list[tuple[int, int, bytes]]:
        """The pending fills that meet the bytes ``[off, off + n)``."""
        if self._spans is None:
            self._spans = (np.array([f[0] for f in self.fills], np.int64),
                           np.array([f[0] + f[1] for f in self.fills], np.int64))  # fmt: skip
        lo, hi = self._spans
        return [self.fills[k] for k in np.flatnonzero((lo < off + n) & (hi > off)).tolist()]

    def epoch_digest(self) -> bytes:
        """Digest of the bytes written since the last point (the result, not the sequence)."""
        h = hashlib.blake2b(digest_size=8)
        h.update(b"S%d;" % self.size)
        for p in sorted(self.epoch):
            data, mask = self.epoch[p]
            keep = np.frombuffer(mask, np.bool_)
            h.update(b"P%d;" % p)
            h.update(mask)
            h.update(np.frombuffer(data, np.uint8)[keep].tobytes())
        for off, n in sorted(self.raw):
            h.update(b"R%d,%d;" % (off, n))
        return h.digest()

    def new_epoch(self) -> None:
        """All ranks agreed on what was written so far: start the next digest."""
        self.epoch.clear()
        self.raw.clear()

    def publish(self) -> None:
        """On rank 0: write the overlay to the real file (then forget it)."""
        if not self.root or self.frozen:
            return
        for p in sorted(self.pages):
            data, mask = self.pages[p]
            keep = np.frombuffer(mask, np.bool_)
            edges = np.flatnonzero(np.diff(np.concatenate(([0], keep.view(np.int8), [0]))))
            for lo, hi in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True):
                pwrite_all(self.fd, memoryview(data)[lo:hi], p * PAGE + lo, self.path)
        if self.truncated is not None:
            os.ftruncate(self.fd, self.truncated)
            self.truncated = None
        if self.pages:
            self.dirty = True
        self.pages.clear()

    def sync(self) -> None:
        """fsync the real file when this rank published metadata or wrote chunks."""
        if self.dirty and self.fd >= 0:
            os.fsync(self.fd)
            self.dirty = False

    def early_flush(self) -> EarlyFlush:
        """The file's :class:`~collio.backends.fsync.EarlyFlush` (made once); it belongs to
        this descriptor, so :meth:`release` waits for it before closing."""
        if self.flusher is None:
            self.flusher = EarlyFlush(self.fd, self.path)
        return self.flusher

    def release(self) -> None:
        """Publish what is left (rank 0), make it durable, close the descriptor."""
        if self.fd < 0:
            return
        if self.flusher is not None:  # (its error: the session's sync reported it)
            self.flusher.wait()
        try:
            if self.root and not self.frozen:
                self.publish()
            self.sync()  # (any rank: the fills it wrote)
        finally:
            os.close(self.fd)
            self.fd = -1
            done, self.on_release = self.on_release, None
            if done is not None:
                done()  # (frees the duplicate if the user freed their communicator)

    def __del__(self) -> None:  # the HDF5 library closed the file and let go of us
        try:
            self.release()
        except OSError:
            pass


#: The most bytes of a fill one ``pwrite`` writes (and rank 0 holds).
FILL_STEP = 16 << 20


def _tiled(one: bytes, start: int, n: int) -> npt.NDArray[np.uint8]:
    """``n`` bytes of the element ``one`` repeated, from byte ``start`` of the repetition."""
    e = len(one)
    reps = np.tile(np.frombuffer(one, np.uint8), (start % e + n) // e + 1)
    return reps[start % e : start % e + n]


def _store(pages: dict[int, tuple[bytearray, bytearray]], off: int, view: memoryview) -> None:
    """Copy ``view`` into 4 KiB pages at ``off`` and mark the bytes written."""
    n = len(view)
    for p in range(off // PAGE, (off + n - 1) // PAGE + 1 if n else 0):
        lo, hi = max(off, p * PAGE), min(off + n, (p + 1) * PAGE)
        page = pages.get(p)
        if page is None:
            page = pages[p] = (bytearray(PAGE), bytearray(PAGE))
        page[0][lo - p * PAGE : hi - p * PAGE] = view[lo - off : hi - off]
        page[1][lo - p * PAGE : hi - p * PAGE] = b"\1" * (hi - lo)
