"""Chunked HDF5 datasets: whole chunks per aggregator, encoded as HDF5 stores them.

The engine works in chunk-major byte space
(:class:`~collio.backends.chunkspace.ChunkSpace`, alignment = one chunk), so every
chunk has one aggregator; it assembles whole chunks, encodes them with the dataset's
filter pipeline and, in :meth:`ChunkedBackend.flush`, every rank makes the same
``write_direct_chunk`` calls with placeholder bytes (HDF5 allocates the same addresses
everywhere; the placeholder never reaches the disk) and the aggregators write the real
chunks at those addresses.
"""

from __future__ import annotations

import errno
import functools
import os
import time
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ...collective import Attempt, agree
from ...errors import BackendError, ModeError
from ...runs import Runs
from ..base import Backend
from ..chunkspace import ChunkSpace
from ..fdio import pread_zeros, pwrite_all
from .codec import Codec, make_codec
from .storage import check_dataset_layout
from .vfile import VFile

__all__ = ["ChunkedBackend", "allocate", "chunked_backend"]


class ChunkedBackend(Backend):
    """Whole chunks per aggregator; see the module docstring."""

    name: ClassVar[str] = "hdf5-chunked"
    partial_write: ClassVar[bool] = False  # requests cover whole windows of whole chunks
    independent: ClassVar[bool] = False  # chunks are assembled by their one aggregator
    sparse: ClassVar[bool] = True
    needs_flush: ClassVar[bool] = True  # chunk addresses are allocated collectively

    def __init__(self, vf: VFile, dset: Any, mode: str) -> None:
        self.vf = vf
        self.fd = vf.fd
        self.mode = mode
        self.writable = mode != "r"
        self.dset = dset
        chunks = tuple(int(c) for c in dset.chunks)
        self.space = ChunkSpace(tuple(int(n) for n in dset.shape), chunks, dset.dtype.itemsize)
        self.nbytes = self.space.unit_nbytes
        self.codec: Codec = make_codec(dset.id.get_create_plist(), dset.dtype, chunks)
        fill = np.zeros(1, dset.dtype)
        if dset.fillvalue is not None:
            fill[0] = dset.fillvalue
        # (np.tile keeps the dtype's byte order, where np.resize gives the native one)
        self.fill = np.tile(fill, int(np.prod(chunks))).view(np.uint8)
        self.table: dict[int, tuple[int, int, int]] = {}  # chunk -> (file offset, size, mask)
        self.out: list[tuple[int, bytes | npt.NDArray[np.uint8], int]] = []
        self.dirty = False

    def load_table(self) -> None:
        """Where each stored chunk is (from HDF5's chunk index, once per call)."""
        table: dict[int, tuple[int, int, int]] = {}
        space = self.space

        def visit(info: Any) -> None:
            table[space.unit_at(info.chunk_offset)] = (
                int(info.byte_offset),
                int(info.size),
                int(info.filter_mask),
            )

        if self.dset.id.get_storage_size():
            self.dset.id.chunk_iter(visit)
        self.table = table

    # -- mapping ----------------------------------------------------------------
    def check_layout(self, layout: Any) -> None:
        check_dataset_layout(self.dset, layout)

    def runs_for(self, layout: Any) -> Runs:
        return self.space.runs(layout.dims)

    def domain_extent(self, lo: int, hi: int) -> tuple[int, int]:
        b = self.nbytes
        return (lo // b) * b, -(-hi // b) * b

    # -- chunks -------------------------------------------------------------------
    def _decode_into(self, index: int, out: npt.NDArray[np.uint8]) -> int:
        """Fill ``out`` with stored chunk ``index`` (or the fill value); bytes read."""
        entry = self.table.get(index)
        if entry is None:
            out[:] = self.fill
            return 0
        off, size, mask = entry
        stored = bytearray(size)
        pread_zeros(self.fd, stored, off)
        try:
            self.codec.decode(bytes(stored), mask, out)
        except Exception as exc:  # (a filter's own error: zlib.error, a size that differs)
            name = getattr(self.dset, "name", "?")
            raise BackendError(
                f"hdf5: chunk {index} of dataset {name!r} ({size} bytes at {off}) cannot be "
                f"decoded: {type(exc).__name__}: {exc}",
                errno=errno.EIO,
            ) from exc
        return size

    def fill_holes(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        b = self.nbytes
        ids, have = self.space.unit_bytes(offset, len(buf), cover)
        full = self.space.valid_nbytes(ids)
        reads = []
        for i in np.flatnonzero(have).tolist():
            piece = buf[i * b : (i + 1) * b]
            if have[i] < full[i]:
                n = self._decode_into(int(ids[i]), piece)
                if n:
                    reads.append(n)
            else:  # complete: only the padding of an edge chunk is a hole
                piece[:] = self.fill
        return reads

    def write_window(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        b = self.nbytes
        first = offset // b
        _, have = self.space.unit_bytes(offset, len(buf), cover)
        sizes = []
        for i in np.flatnonzero(have).tolist():
            data, mask = self.codec.encode(buf[i * b : (i + 1) * b])
            self.out.append((first + i, bytes(data), mask))
            sizes.append(len(data))
        return sizes

    def read_window(self, offset: int, buf: npt.NDArray[np.uint8], need: Runs) -> list[int]:
        b = self.nbytes
        first = offset // b
        _, have = self.space.unit_bytes(offset, len(buf), need)
        return [
            n
            for i in np.flatnonzero(have).tolist()
            if (n := self._decode_into(first + i, buf[i * b : (i + 1) * b]))
        ]

    def flush(self, comm: Any) -> None:
        """Collective over `comm`: allocate the new chunks everywhere, write them here."""
        mine = np.array([(i, len(d), m) for i, d, m in self.out], np.int64).reshape(-1, 3)
        every = np.concatenate(comm.allgather(mine)).reshape(-1, 3)
        every = every[np.argsort(every[:, 0], kind="stable")]
        timings = self.vf.replica.timings
        t0 = time.perf_counter()
        step = Attempt()
        with step:
            allocate(self.vf, self.dset, self.space, every)
        self._agree_or_freeze(comm, step.error, "allocate chunks")
        t1 = time.perf_counter()
        step = Attempt()
        with step:
            for index, data, _ in self.out:
                info = self.dset.id.get_chunk_info_by_coord(_origin(self.space, index))
                pwrite_all(self.fd, data, int(info.byte_offset), self.vf.path)
                self.dirty = True
        self.out = []
        self._agree_or_freeze(comm, step.error, "write chunks")
        timings["allocate_chunks"] = timings.get("allocate_chunks", 0.0) + t1 - t0
        timings["write_chunks"] = timings.get("write_chunks", 0.0) + time.perf_counter() - t1

    def _agree_or_freeze(self, comm: Any, error: BaseException | None, what: str) -> None:
        """Collective: agree on ``error``; after a failure the file keeps its last agreed
        metadata (the chunk index would point at chunks never written) and the session
        refuses further calls, on every rank alike."""
        try:
            agree(comm, error, what=what)
        except BaseException as exc:
            self.vf.frozen = True  # rank 0 publishes nothing more
            self.vf.replica.diverged = (
                f"{what} failed ({exc}); the file keeps its metadata from before that "
                f"write_all: close it and open it again"
            )
            raise

    # -- completion -----------------------------------------------------------------
    def write_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        raise ModeError("chunked datasets are written in whole windows (write_window)")

    def read_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        raise ModeError("chunked datasets are read in whole windows (read_window)")

    @classmethod
    def open(cls, target: Any, mode: str, *, comm: Any, hints: Any, **options: Any) -> Backend:
        raise ModeError("a chunked dataset is opened with its file (backend 'hdf5')")

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def sync(self) -> None:
        if self.dirty:
            os.fsync(self.fd)
            self.dirty = False

    def close(self) -> None:
        if self.dirty:
            self.vf.dirty = True  # the session's flush fsyncs the shared descriptor
        self.codec.close()


def allocate(vf: VFile, dset: Any, space: ChunkSpace, chunks: npt.NDArray[np.int64]) -> None:
    """On every rank, in the same order: ``write_direct_chunk`` with placeholder bytes.

    The VFile drops the placeholder (``expect_raw``); HDF5 updates its chunk index
    identically on every rank.  One call per chunk: this is where chunked writes
    serialise (metadata only; the chunk bytes travel in parallel).
    """
    if not len(chunks):
        return
    dummy = np.zeros(int(chunks[:, 1].max()), np.uint8)
    for index, size, mask in chunks.tolist():
        vf.raw_expect = size
        dset.id.write_direct_chunk(_origin(space, index), dummy[:size], mask)
        if vf.raw_expect:
            vf.raw_expect = 0
            raise BackendError(f"HDF5 did not write chunk {index} as one request of {size} bytes")


def _origin(space: ChunkSpace, index: int) -> tuple[int, ...]:
    """Element coordinates of the first element of chunk ``index`` (HDF5's chunk offset)."""
    return tuple(r.start for r in space.region(index))


@functools.lru_cache(maxsize=64)
def chunked_backend(alignment: int) -> type[ChunkedBackend]:
    """A ChunkedBackend class whose ``alignment`` is one chunk of ``alignment`` bytes."""
    return type(f"ChunkedBackend{alignment}", (ChunkedBackend,), {"alignment": alignment})
