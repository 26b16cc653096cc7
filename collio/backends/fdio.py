"""Whole-buffer ``pread``/``pwrite`` on a descriptor: the one loop every file-backed part uses.

Linux moves at most 0x7ffff000 bytes per call and may move fewer, so a request is a
loop; the posix backend, the HDF5 storage and the benchmark's plain-POSIX APIs share it.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import BackendError

__all__ = [
    "MAX_IO",
    "data_from",
    "pread_exact",
    "pread_full",
    "pread_zeros",
    "pwrite_all",
    "pwrite_full",
    "joinable",
    "joined",
    "pwrite_joined",
    "pwrite_runs",
    "pread_runs",
    "pwritev_all",
]

#: Linux caps one read or write at this many bytes.
MAX_IO = 0x7FFFF000
#: ``lseek``'s whence for the next byte of data (None where the system has none)
_SEEK_DATA = getattr(os, "SEEK_DATA", None)
#: the most buffers one ``pwritev`` takes
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16


def _bytes(buf: Any) -> memoryview:
    if type(buf) is memoryview and buf.format == "B" and buf.ndim == 1:
        return buf  # (already flat bytes: a small request's cast costs as much as its call)
    return memoryview(buf).cast("B")


def pwrite_full(fd: int, buf: Any, offset: int) -> int:
    """``pwrite`` all of ``buf`` at ``offset``; the bytes written, fewer than ``len(buf)``
    only if a call wrote nothing."""
    view = _bytes(buf)
    done, total = 0, len(view)
    if total and total <= MAX_IO:  # (one call nearly always writes it all)
        done = os.pwrite(fd, view, offset)
        if done == total or done <= 0:
            return done if done > 0 else 0
    while done < total:
        n = os.pwrite(fd, view[done : done + MAX_IO], offset + done)
        if n <= 0:
            break
        done += n
    return done


def pread_full(fd: int, buf: Any, offset: int) -> int:
    """Fill ``buf`` from ``offset``; the bytes read, fewer than ``len(buf)`` only where the
    file ends."""
    view = _bytes(buf)
    done, total = 0, len(view)
    if total and total <= MAX_IO:  # (one call nearly always reads it all)
        done = os.preadv(fd, [view], offset)
        if done == total or done <= 0:
            return done if done > 0 else 0
    while done < total:
        n = os.preadv(fd, [view[done : done + MAX_IO]], offset + done)
        if n <= 0:
            break
        done += n
    return done


def pwrite_all(fd: int, buf: Any, offset: int, name: str = "the file") -> None:
    """Write all of ``buf`` at ``offset``, or raise :class:`BackendError` (a short write)."""
    if type(buf) is np.ndarray and 0 < buf.nbytes <= MAX_IO:
        # (an array, written whole by one call nearly always: a small call's one request
        # needs no view of it; a non-contiguous one raises as the view would)
        done = os.pwrite(fd, buf, offset)  # type: ignore[arg-type]
        if done == buf.nbytes:
            return
        view = _bytes(buf)
    else:
        view = _bytes(buf)
        done = os.pwrite(fd, view, offset) if 0 < len(view) <= MAX_IO else 0
    total = len(view)
    if done == total:
        return
    if done > 0 or total > MAX_IO:
        done += pwrite_full(fd, view[done:], offset + done)
    if done < total:
        raise BackendError(f"short write at offset {offset + done} of {name!r}")


def pwritev_all(fd: int, bufs: list[Any], offset: int, name: str = "the file") -> None:
    """Write ``bufs`` one after another from ``offset``, in as few ``pwritev`` calls as the
    system allows (``IOV_MAX`` buffers, :data:`MAX_IO` bytes each), or raise
    :class:`BackendError` (a short write)."""
    views = [_bytes(b) for b in bufs]
    at, i = offset, 0
    while i < len(views):
        j, size = i, 0
        while j < len(views) and j - i < IOV_MAX and size + len(views[j]) <= MAX_IO:
            size += len(views[j])
            j += 1
        if j == i:  # (one buffer over MAX_IO: the loop of pwrite_all)
            pwrite_all(fd, views[i], at, name)
            at, i = at + len(views[i]), i + 1
            continue
        done = os.pwritev(fd, views[i:j], at)
        if done < size:  # (rare: finish the rest buffer by buffer)
            for v in views[i:j]:
                skip = min(done, len(v))
                if skip < len(v):
                    pwrite_all(fd, v[skip:], at + skip, name)
                done -= skip
                at += len(v)
        else:
            at += size
        i = j


def joinable(file: npt.NDArray[np.int64], length: npt.NDArray[np.int64]) -> bool:
    """Whether some run (sorted) starts where the one before it ends in the file."""
    return bool((file[1:] == file[:-1] + length[:-1]).any())


def joined(
    file: npt.NDArray[np.int64], length: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The ranges of the file that runs (sorted) following each other cover: (start, length)."""
    head = np.ones(len(file), bool)
    head[1:] = file[1:] != file[:-1] + length[:-1]
    first = np.flatnonzero(head)
    last = np.append(first[1:], len(file)) - 1
    return file[first], file[last] + length[last] - file[first]


def pwrite_joined(
    fd: int, file: npt.NDArray[np.int64], length: npt.NDArray[np.int64],
    mem: npt.NDArray[np.int64], data: npt.NDArray[np.uint8], name: str = "the file",
) -> None:  # fmt: skip
    """Write runs (sorted; ``data[mem : mem + length]`` at ``file``), one ``pwritev`` per
    group of runs that follow each other in the file (:func:`pwritev_all`)."""
    cuts = [0, *(np.flatnonzero(file[1:] != file[:-1] + length[:-1]) + 1).tolist(), len(file)]
    fl, nl, ml = file.tolist(), length.tolist(), mem.tolist()
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        pwritev_all(fd, [data[ml[k] : ml[k] + nl[k]] for k in range(a, b)], fl[a], name)


def pwrite_runs(
    fd: int, file: npt.NDArray[np.int64], length: npt.NDArray[np.int64],
    mem: npt.NDArray[np.int64], data: npt.NDArray[np.uint8], name: str = "the file",
) -> None:  # fmt: skip
    """Write runs (``data[mem : mem + length]`` at ``file``), one ``pwrite`` each, or
    raise :class:`BackendError` (a short write).

    No vectored call takes scattered file offsets, so a request per run is what the
    system offers; the loop around them makes nothing per run but the slice of one view
    of ``data`` (a function call or two per run cost a small run as much as its
    ``pwrite``), and the rare short write is finished after it, run by run."""
    view = _bytes(data)
    pw = os.pwrite
    fl, ml, el = file.tolist(), mem.tolist(), (mem + length).tolist()
    done = [pw(fd, view[m:e], f) for f, m, e in zip(fl, ml, el, strict=True)]
    for k in np.flatnonzero(np.array(done, np.int64) != length).tolist():
        n = done[k]  # (a short write: its rest the checked way, which raises if it stays short)
        pwrite_all(fd, view[ml[k] + n : el[k]], fl[k] + n, name)


def pread_runs(
    fd: int, file: npt.NDArray[np.int64], length: npt.NDArray[np.int64],
    mem: npt.NDArray[np.int64], out: npt.NDArray[np.uint8],
) -> None:  # fmt: skip
    """Read runs into ``out[mem : mem + length]`` from ``file``, one ``preadv`` each,
    zeros past the end of the file (:func:`pread_zeros`); the loop as
    :func:`pwrite_runs`'."""
    view = _bytes(out)
    pr = os.preadv
    fl, ml, el = file.tolist(), mem.tolist(), (mem + length).tolist()
    done = [pr(fd, [view[m:e]], f) for f, m, e in zip(fl, ml, el, strict=True)]
    for k in np.flatnonzero(np.array(done, np.int64) != length).tolist():
        n = done[k]  # (the file's end, or a short read: the rest as pread_zeros reads it)
        pread_zeros(fd, view[ml[k] + n : el[k]], fl[k] + n)


def pread_zeros(fd: int, buf: Any, offset: int) -> int:
    """Fill ``buf`` from ``offset``, zeros past the end of the file; the bytes read."""
    if type(buf) is np.ndarray and 0 < buf.nbytes <= MAX_IO:
        done = os.preadv(fd, [buf], offset)  # type: ignore[list-item]  # (as pwrite_all)
        if done == buf.nbytes:
            return done
        view = _bytes(buf)
    else:
        view = _bytes(buf)
        done = os.preadv(fd, [view], offset) if 0 < len(view) <= MAX_IO else 0
    total = len(view)
    if done == total:
        return done
    if done > 0 or total > MAX_IO:
        done += pread_full(fd, view[done:], offset + done)
    if done < total:
        np.frombuffer(view, np.uint8)[done:] = 0
    return done


def pread_exact(fd: int, buf: Any, offset: int, name: str = "the file") -> None:
    """Fill all of ``buf`` from ``offset``; a file that ends first raises :class:`BackendError`."""
    view = _bytes(buf)
    done = pread_full(fd, view, offset)
    if done < len(view):
        raise BackendError(
            f"{name!r} ends at {offset + done}, {len(view) - done} bytes short of the request"
        )


def data_from(fd: int, offset: int, end: int) -> int:
    """The first byte in ``[offset, end)`` that the file holds as data rather than a
    hole (``lseek`` with ``SEEK_DATA``), or ``end`` when none is.  A hole reads as zeros
    and was never written; a file system that keeps no holes, or a system without
    ``SEEK_DATA``, has every byte below the end as data (``offset``).  Moves the
    descriptor's offset, which pread and pwrite do not use."""
    if _SEEK_DATA is None:
        return offset
    try:
        found = os.lseek(fd, offset, _SEEK_DATA)
    except OSError as exc:  # (ENXIO: no data at or after offset)
        return end if exc.errno == errno.ENXIO else offset
    return min(found, end)
