"""File pointers: positions of a view (pure) and the shared file pointer.

Positions count etypes of the file view, as MPI's do.  :func:`byte_offset`
(``Get_byte_offset``) and :func:`end_position` (where ``SEEK_END`` puts a pointer) are
pure functions of a :class:`~collio.view.FileView`, vectorised over the filetype's runs.

The shared file pointer (:class:`SharedPointer`) lives in a small file beside the target,
moved under an ``fcntl`` lock: an independent call moves it without the other ranks'
help, as ``MPI_File_write_shared`` must, and opening a file costs no message for it (an
MPI window would cost several at every open).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
from collections.abc import Callable

import numpy as np

from ..layouts.typemap import stream_runs
from ..view import FileView

__all__ = ["SharedPointer", "byte_offset", "end_position", "pointer_file"]

_RECORD = struct.Struct("<q")  # the position
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def byte_offset(view: FileView, position: int) -> int:
    """The absolute byte of the view's etype ``position`` (``MPI_File_get_byte_offset``)."""
    ft = view.filetype
    if not ft.size:
        return view.disp
    off, _ = stream_runs(ft, view.disp, position * view.etype_size, 1)
    return int(off[0])


def end_position(view: FileView, size: int) -> int:
    """The view's position at the end of a file of ``size`` bytes: its data bytes before
    ``size``, in etypes rounded up (ROMIO's ``ADIOI_Get_eof_offset``).

    The first run (in typemap order, tile by tile) that reaches ``size`` ends the count;
    it is found for every run of the filetype at once: run ``j`` first reaches ``size``
    in tile ``ceil((size - end_j) / extent)``.
    """
    ft = view.filetype
    if not ft.nruns or not ft.size:
        return 0
    start = view.disp + ft.off
    end = start + ft.length
    tile = np.maximum(0, -((end - size) // ft.extent))
    k = int(tile.min())
    j = int(np.flatnonzero(tile == k)[0])
    before = int(ft.length[:j].sum())
    part = min(max(size - int(start[j]) - k * ft.extent, 0), int(ft.length[j]))
    data = k * ft.size + before + part
    return -(-data // view.etype_size)


class SharedPointer:
    """The shared file pointer of one open file, in etypes, kept in a small file.

    As ROMIO does, the pointer lives in a file beside the target (8 bytes: the position),
    read and moved under an ``fcntl`` lock, so that an independent call moves it without
    any other rank's help and nothing is made before a shared-pointer call needs it; a
    file not made yet holds the start position (0 after a view: :meth:`restart`).
    """

    __slots__ = ("path", "base", "stem", "views", "_fd", "_lock")

    def __init__(self, path: str, start: int) -> None:
        self.path = path
        self.base = start
        self.stem = path
        self.views = 0  # views set (each gets a file of its own, see restart)
        self._fd = -1
        self._lock = threading.Lock()  # (fcntl locks do not exclude a process's threads)

    def _update(self, move: Callable[[int], int] | None) -> int:
        """Local: the position, and with ``move`` the new one written; returns the old."""
        with self._lock:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o600)
            fd = self._fd
            fcntl.lockf(fd, fcntl.LOCK_SH if move is None else fcntl.LOCK_EX, _RECORD.size)
            try:
                raw = os.pread(fd, _RECORD.size, 0)
                old = _RECORD.unpack(raw)[0] if len(raw) == _RECORD.size else self.base
                if move is not None:
                    os.pwrite(fd, _RECORD.pack(move(old)), 0)
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN, _RECORD.size)
        return int(old)

    def take(self, n: int) -> int:
        """Local: move the pointer on by ``n`` etypes; returns where it was."""
        return self._update(lambda old: old + n)

    def get(self) -> int:
        """Local: where the pointer is."""
        return self._update(None)

    def set(self, position: int) -> None:
        """Local: put the pointer at ``position`` (the caller makes the others wait)."""
        self._update(lambda _: position)

    def restart(self) -> str:
        """Local, alike on every rank (``Set_view``, once every rank is in it): the pointer
        at 0, in a file of its own that is not made until a call moves the pointer, so a
        view costs neither a message nor a write for it; returns the old file's path,
        which one rank removes (no rank uses it again: every rank's calls before the
        view are done)."""
        with self._lock:
            old = self.path
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self.views += 1
            self.path, self.base = f"{self.stem}.{self.views}", 0
        return old

    def close(self, *, remove: bool) -> None:
        """Local: let go of the file (``remove``: and delete it, one rank does)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def pointer_file(target: str, token: int, serial: int) -> str:
    """Where an open file's shared pointer lives: beside ``target``, named by the job's
    token and the open's serial number (so another open, another job, has its own)."""
    d, base = os.path.split(os.path.abspath(target))
    return os.path.join(d, f".{base[:150]}.collio-shfp-{token:x}-{serial}")
