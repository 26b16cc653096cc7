"""Backends the engine writes a dataset's raw data through.

* :class:`ContiguousBackend`: POSIX ``pwrite``/``preadv`` at the dataset's file
  offset, on the descriptor every rank opened for the session.
* :class:`ChunkedBackend`: the engine works in chunk-major byte space (alignment =
  one chunk), so every chunk has one aggregator; it assembles whole chunks,
  encodes them with the dataset's filter pipeline and, in :meth:`flush`, every
  rank makes the same ``write_direct_chunk`` calls with placeholder bytes (HDF5
  allocates the same addresses everywhere; the placeholder never reaches the
  disk) and the aggregators write the real chunks at those addresses.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..backends.base import Backend
from ..backends.fsync import EarlyFlush
from ..backends.posix import PosixBackend
from ..collective import Attempt, agree
from ..errors import BackendError, LayoutError, ModeError
from ..layouts import ArrayLayout
from ..runs import Runs
from .chunkspace import ChunkGrid, bytes_per_chunk, to_chunk_space
from .codec import Codec, make_codec
from .vfile import VFile, _pread, _pwrite

__all__ = ["ContiguousBackend", "ChunkedBackend", "chunked_backend", "check_dataset_layout"]


def check_dataset_layout(dset: Any, layout: Any) -> None:
    """Raise :class:`LayoutError` unless ``layout`` describes a piece of ``dset``."""
    if not isinstance(layout, ArrayLayout):
        raise LayoutError(f"a dataset needs an array layout, not {type(layout).__name__}")
    if layout.global_shape != tuple(dset.shape):
        raise LayoutError(
            f"layout global shape {layout.global_shape} differs from dataset "
            f"{dset.name!r} shape {tuple(dset.shape)}"
        )
    if layout.dtype != dset.dtype:
        raise LayoutError(f"layout dtype {layout.dtype} differs from dataset dtype {dset.dtype}")
    if layout.order != "C" or layout.offset != 0:
        raise LayoutError(
            f"dataset layouts are C order from offset 0 (got order {layout.order!r}, "
            f"offset {layout.offset})"
        )


class ContiguousBackend(PosixBackend):
    """A contiguous dataset: the session's file, shifted to the dataset's offset."""

    name: ClassVar[str] = "hdf5-contiguous"

    def __init__(
        self, path: str, fd: int, mode: str, flusher: EarlyFlush | None = None, maps: bool = False
    ) -> None:
        super().__init__(path, fd, "r" if mode == "r" else "r+", None, True)
        self.dset: Any = None
        self.offset = 0
        self.maps = maps  # reads copy from the mapped file (hint mapped_reads)
        if mode != "r" and self.writeback:
            self.flusher = flusher  # (the VFile's: it outlives this backend with the fd)

    def bind(self, dset: Any, offset: int) -> None:
        self.dset, self.offset = dset, offset

    def check_layout(self, layout: Any) -> None:
        check_dataset_layout(self.dset, layout)

    def runs_for(self, layout: Any) -> Runs:
        r: Runs = layout.runs()
        return Runs(r.file + self.offset, r.length, r.mem)

    def close(self) -> None:
        """Let go of the dataset (the descriptor belongs to the session's VFile): a
        dataset held between calls keeps its file open in HDF5 after the user drops
        it, until HDF5's own exit handler, which then calls into a finalized Python."""
        self.dset = None


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
        self.grid = ChunkGrid.of(dset.shape, chunks, dset.dtype.itemsize)
        self.nbytes = self.grid.chunk_nbytes
        self.codec: Codec = make_codec(dset.id.get_create_plist(), dset.dtype, chunks)
        fill = np.zeros(1, dset.dtype)
        if dset.fillvalue is not None:
            fill[0] = dset.fillvalue
        self.fill = np.resize(fill, int(np.prod(chunks))).view(np.uint8)
        self.table: dict[int, tuple[int, int, int]] = {}  # chunk -> (file offset, size, mask)
        self.out: list[tuple[int, bytes | npt.NDArray[np.uint8], int]] = []
        self.dirty = False

    def load_table(self) -> None:
        """Where each stored chunk is (from HDF5's chunk index, once per call)."""
        table: dict[int, tuple[int, int, int]] = {}
        g = self.grid

        def visit(info: Any) -> None:
            table[g.index_of(info.chunk_offset)] = (
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
        return to_chunk_space(layout.runs(), self.grid)

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
        _pread(self.fd, memoryview(stored), off)
        self.codec.decode(bytes(stored), mask, out)
        return size

    def fill_holes(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        b = self.nbytes
        first, count = offset // b, len(buf) // b
        have = bytes_per_chunk(cover, b, first, count)
        full = self.grid.in_extent(first + np.arange(count, dtype=np.int64))
        reads = []
        for i in np.flatnonzero(have).tolist():
            piece = buf[i * b : (i + 1) * b]
            if have[i] < full[i]:
                n = self._decode_into(first + i, piece)
                if n:
                    reads.append(n)
            else:  # complete: only the padding of an edge chunk is a hole
                piece[:] = self.fill
        return reads

    def write_window(self, offset: int, buf: npt.NDArray[np.uint8], cover: Runs) -> list[int]:
        b = self.nbytes
        first, count = offset // b, len(buf) // b
        have = bytes_per_chunk(cover, b, first, count)
        sizes = []
        for i in np.flatnonzero(have).tolist():
            data, mask = self.codec.encode(buf[i * b : (i + 1) * b])
            self.out.append((first + i, bytes(data), mask))
            sizes.append(len(data))
        return sizes

    def read_window(self, offset: int, buf: npt.NDArray[np.uint8], need: Runs) -> list[int]:
        b = self.nbytes
        first, count = offset // b, len(buf) // b
        have = bytes_per_chunk(need, b, first, count)
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
        timings = getattr(getattr(self.vf, "session", None), "timings", {})
        t0 = time.perf_counter()
        step = Attempt()
        with step:
            allocate(self.vf, self.dset, self.grid, every)
        self._agree_or_freeze(comm, step.error, "allocate chunks")
        t1 = time.perf_counter()
        step = Attempt()
        with step:
            for index, data, _ in self.out:
                info = self.dset.id.get_chunk_info_by_coord(self.grid.coords(index))
                _pwrite(self.fd, np.frombuffer(data, np.uint8), int(info.byte_offset))
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
            session = getattr(self.vf, "session", None)
            if session is not None:
                session.diverged = (
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
        raise ModeError("chunked HDF5 datasets are opened through collio.h5")

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


def allocate(vf: VFile, dset: Any, grid: ChunkGrid, chunks: npt.NDArray[np.int64]) -> None:
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
        dset.id.write_direct_chunk(grid.coords(index), dummy[:size], mask)
        if vf.raw_expect:
            vf.raw_expect = 0
            raise BackendError(f"HDF5 did not write chunk {index} as one request of {size} bytes")


@functools.lru_cache(maxsize=64)
def chunked_backend(alignment: int) -> type[ChunkedBackend]:
    """A ChunkedBackend class whose ``alignment`` is one chunk of ``alignment`` bytes."""
    return type(f"ChunkedBackend{alignment}", (ChunkedBackend,), {"alignment": alignment})
