"""Encode and decode whole chunks exactly as the dataset's HDF5 filter pipeline does.

Two ways, chosen per dataset:

* a fast path in numpy + :mod:`zlib` for the pipelines h5py makes most often
  (none, ``shuffle``, ``gzip``, ``shuffle`` + ``gzip``); zlib releases the GIL, so
  aggregators compress in their I/O thread while the next round is exchanged;
* for any other pipeline (fletcher32, lzf, scale-offset, n-bit, szip, and the
  hdf5plugin filters such as Blosc or Zstd), HDF5 itself: a one-chunk dataset in an
  in-memory file with the same creation property list, written normally and read
  back with ``read_direct_chunk`` (and the reverse to decode).  The bytes are what
  HDF5 would have stored, with every filter parameter HDF5 derives from the dtype.
"""

from __future__ import annotations

import itertools
import threading
import zlib
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

__all__ = ["Codec", "make_codec"]

FILTER_DEFLATE = 1
FILTER_SHUFFLE = 2
_counter = itertools.count()


class Codec:
    """Turns a full chunk's bytes into what HDF5 stores (and back)."""

    name = "abstract"

    def encode(self, raw: npt.NDArray[np.uint8]) -> tuple[bytes | npt.NDArray[np.uint8], int]:
        """Stored bytes and the filter mask (bit i set: filter i skipped)."""
        raise NotImplementedError

    def decode(self, stored: bytes, mask: int, out: npt.NDArray[np.uint8]) -> None:
        """Fill ``out`` (a full chunk) from the stored bytes."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the codec holds."""


class FastCodec(Codec):
    """Shuffle and/or deflate in numpy + zlib; mirrors H5Z_filter_shuffle/deflate."""

    name = "numpy+zlib"

    def __init__(self, steps: list[tuple[int, int, int]]) -> None:
        self.steps = steps  # (filter id, flags, parameter)

    def encode(self, raw: npt.NDArray[np.uint8]) -> tuple[bytes | npt.NDArray[np.uint8], int]:
        data: bytes | npt.NDArray[np.uint8] = raw
        mask = 0
        for fid, _, par in self.steps:
            if fid == FILTER_SHUFFLE:
                data = _shuffle(np.frombuffer(data, np.uint8), par)
            else:  # HDF5 keeps deflate's output even when it grew (zlib stored blocks)
                data = zlib.compress(_buffer(data), par)
        return data, mask

    def decode(self, stored: bytes, mask: int, out: npt.NDArray[np.uint8]) -> None:
        data: bytes | npt.NDArray[np.uint8] = stored
        for i in range(len(self.steps) - 1, -1, -1):
            if mask & (1 << i):
                continue
            fid, _, par = self.steps[i]
            if fid == FILTER_SHUFFLE:
                data = _unshuffle(np.frombuffer(data, np.uint8), par)
            else:
                data = zlib.decompress(_buffer(data))
        out[:] = np.frombuffer(data, np.uint8)


def _buffer(data: bytes | npt.NDArray[np.uint8]) -> bytes | memoryview:
    return data if isinstance(data, bytes) else np.ascontiguousarray(data).data


def _shuffle(a: npt.NDArray[np.uint8], size: int) -> npt.NDArray[np.uint8]:
    n = len(a) // size
    if size <= 1 or n <= 1:
        return a
    out = np.empty_like(a)
    out[: n * size] = a[: n * size].reshape(n, size).T.reshape(-1)
    out[n * size :] = a[n * size :]
    return out


def _unshuffle(a: npt.NDArray[np.uint8], size: int) -> npt.NDArray[np.uint8]:
    n = len(a) // size
    if size <= 1 or n <= 1:
        return a
    out = np.empty_like(a)
    out[: n * size] = a[: n * size].reshape(size, n).T.reshape(-1)
    out[n * size :] = a[n * size :]
    return out


class HDF5Codec(Codec):
    """Any pipeline HDF5 can run: a one-chunk dataset in an in-memory file."""

    name = "hdf5"

    def __init__(self, dcpl: Any, dtype: np.dtype[Any], chunks: tuple[int, ...]) -> None:
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        fapl.set_fapl_core(backing_store=False)
        name = f"collio-codec-{next(_counter)}.h5".encode()
        self.fid = h5py.h5f.create(name, h5py.h5f.ACC_TRUNC, fapl=fapl)
        plist = dcpl.copy()
        plist.set_chunk(chunks)
        plist.set_alloc_time(h5py.h5d.ALLOC_TIME_INCR)
        space = h5py.h5s.create_simple(chunks)
        tid = h5py.h5t.py_create(dtype)
        self.dset = h5py.h5d.create(self.fid, b"c", tid, space, dcpl=plist)
        self.dcpl = dcpl
        self.dtype = dtype
        self.chunks = chunks
        self.origin = (0,) * len(chunks)
        self.partial: dict[int, Codec] = {}  # filter mask -> codec of the filters that ran
        # the I/O thread encodes while the main thread may decode (fill_holes): one at a time
        self.lock = threading.Lock()

    def encode(self, raw: npt.NDArray[np.uint8]) -> tuple[bytes | npt.NDArray[np.uint8], int]:
        arr = raw.view(self.dtype).reshape(self.chunks)
        with self.lock:
            self.dset.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(arr))
            mask, data = self.dset.read_direct_chunk(self.origin)
        return data, int(mask)

    def decode(self, stored: bytes, mask: int, out: npt.NDArray[np.uint8]) -> None:
        if mask:
            # HDF5 2.0 ignores the filter mask of a chunk written directly when it is
            # read in the same session; decode with a pipeline of the filters that ran
            with self.lock:
                sub = self.partial.get(mask)
                if sub is None:
                    sub = self.partial[mask] = self._without(mask)
            sub.decode(stored, 0, out)
            return
        arr = out.view(self.dtype).reshape(self.chunks)
        with self.lock:
            self.dset.write_direct_chunk(self.origin, stored, 0)
            self.dset.read(h5py.h5s.ALL, h5py.h5s.ALL, arr)

    def _without(self, mask: int) -> Codec:
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)  # (copy + remove_filter crashes)
        plist.set_chunk(self.chunks)
        for i in range(self.dcpl.get_nfilters()):
            code, flags, values, _ = self.dcpl.get_filter(i)
            if not mask & (1 << i):
                plist.set_filter(code, flags, values)
        if plist.get_nfilters() == 0:
            return FastCodec([])
        return HDF5Codec(plist, self.dtype, self.chunks)

    def close(self) -> None:
        for sub in self.partial.values():
            sub.close()
        self.dset.close()
        self.fid.close()


def make_codec(
    dcpl: Any, dtype: np.dtype[Any], chunks: tuple[int, ...], *, fast: bool = True
) -> Codec:
    """The codec for a dataset's creation property list (fast path when it fits)."""
    steps: list[tuple[int, int, int]] = []
    for i in range(dcpl.get_nfilters()):
        fid, flags, values, _ = dcpl.get_filter(i)
        if fid == FILTER_SHUFFLE:
            steps.append((fid, flags, int(values[0]) if values else dtype.itemsize))
        elif fid == FILTER_DEFLATE:
            steps.append((fid, flags, int(values[0]) if values else 6))
        else:
            steps = [(-1, 0, 0)]
            break
    if fast and all(s[0] in (FILTER_SHUFFLE, FILTER_DEFLATE) for s in steps):
        return FastCodec(steps)
    return HDF5Codec(dcpl, dtype, chunks)
