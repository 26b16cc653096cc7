"""An in-memory target held by rank 0 and reached with MPI one-sided Put/Get.

For tests and for staging: ``collio.open("mem://name", "w", capacity=...)``.
The bytes live in rank 0's process (:func:`contents` returns them there) and
persist across opens until :func:`drop` or the end of the process.  Every
request crosses MPI, so it exercises the same collective paths as a file.
"""

from __future__ import annotations

import errno
import threading
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..collective import Attempt, agree
from ..errors import BackendError, ModeError
from .base import Backend

__all__ = ["MemoryBackend", "contents", "drop"]

_STORE: dict[str, tuple[npt.NDArray[np.uint8], int]] = {}  # name -> (memory, size), rank 0 only
_MAX_PUT = 1 << 30


def contents(name: str) -> bytes:
    """On rank 0: the bytes of ``mem://name`` (its current size)."""
    mem, size = _STORE[_name(name)]
    return mem[:size].tobytes()


def drop(name: str) -> None:
    """On rank 0: forget ``mem://name``."""
    _STORE.pop(_name(name), None)


def _name(target: Any) -> str:
    text = str(target)
    return text[len("mem://") :] if text.startswith("mem://") else text


class MemoryBackend(Backend):
    """Bytes in rank 0's memory; options: ``capacity`` (bytes, default 256 MiB) in 'w'."""

    name: ClassVar[str] = "memory"

    def __init__(self, key: str, win: MPI.Win, size: int, capacity: int, mode: str) -> None:
        self.key = key
        self.win = win
        self.capacity = capacity
        self.end = size
        self.mode = mode
        self.writable = mode != "r"
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls, target: Any, mode: str, *, comm: Any, hints: Any, **options: Any
    ) -> MemoryBackend:
        """Collective over `comm`: rank 0 finds or makes the bytes and exposes them."""
        capacity = int(options.pop("capacity", 256 << 20))
        if options:
            raise ModeError(f"memory backend: unknown options {sorted(options)}")
        if getattr(hints, "atomic_commit", False) and mode != "r":
            # writes land in rank 0's memory as they happen: nothing could be discarded
            raise ModeError("memory backend: atomic_commit is not supported")
        key = _name(target)
        step = Attempt()
        info = (0, 0)
        mem: npt.NDArray[np.uint8] | None = None
        if comm.Get_rank() == 0:
            with step:
                if not key:
                    raise BackendError("memory target needs a name: mem://NAME")
                if mode == "w":
                    _STORE[key] = (np.zeros(capacity, np.uint8), 0)
                elif key not in _STORE:
                    raise BackendError(f"no memory target {key!r}", errno=errno.ENOENT)
                mem, size = _STORE[key]
                info = (size, len(mem))
        agree(comm, step.error, what=f"open mem://{key}")
        size, cap = comm.bcast(info, root=0)
        win = MPI.Win.Create(mem if mem is not None else MPI.BOTTOM, 1, MPI.INFO_NULL, comm)
        return cls(key, win, size, cap, mode)

    def _check(self, offset: int, n: int) -> None:
        if offset + n > self.capacity:
            raise BackendError(
                f"memory target {self.key!r} is full: [{offset}, {offset + n}) beyond "
                f"capacity {self.capacity}",
                errno=errno.ENOSPC,
            )

    def write_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        self._check(offset, len(buf))
        for s in range(0, len(buf), _MAX_PUT):
            part = np.ascontiguousarray(buf[s : s + _MAX_PUT])
            with self._lock:
                self.win.Lock(0, MPI.LOCK_SHARED)
                try:
                    self.win.Put([part, MPI.BYTE], 0, (offset + s, len(part), MPI.BYTE))
                finally:
                    self.win.Unlock(0)
        self.end = max(self.end, offset + len(buf))

    def read_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        n = max(0, min(len(buf), self.capacity - offset))
        for s in range(0, n, _MAX_PUT):
            part = buf[s : min(n, s + _MAX_PUT)]
            with self._lock:
                self.win.Lock(0, MPI.LOCK_SHARED)
                try:
                    self.win.Get([part, MPI.BYTE], 0, (offset + s, len(part), MPI.BYTE))
                finally:
                    self.win.Unlock(0)
        buf[n:] = 0

    def size(self) -> int:
        return self.end

    def sync(self) -> None:
        pass

    def commit(self, comm: Any, ok: bool) -> None:
        """Collective over `comm`: record the size reached on rank 0."""
        end = comm.allreduce(self.end, op=MPI.MAX)
        if comm.Get_rank() == 0 and self.key in _STORE:
            mem, size = _STORE[self.key]
            _STORE[self.key] = (mem, max(size, end))

    def close(self) -> None:
        if self.win != MPI.WIN_NULL:
            self.win.Free()
