"""Chunk-major byte space of a chunked dataset: pure numpy, no h5py, no MPI.

A chunked dataset of shape ``S`` with chunks ``C`` is seen by the engine as a byte
space where chunk ``c`` (its linear index on the chunk grid, C order) owns
``[c * B, (c + 1) * B)`` with ``B = prod(C) * itemsize``; inside, elements sit in
C order of the *full* chunk (edge chunks are padded, as HDF5 stores them).  File
domains aligned to ``B`` give every chunk exactly one aggregator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..runs import Runs, merge, sort, split_at, split_grid

__all__ = ["ChunkGrid", "to_chunk_space", "bytes_per_chunk"]

I64 = npt.NDArray[np.int64]


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkGrid:
    """The chunk grid of a dataset: shape, chunk shape and item size (bytes)."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    itemsize: int

    @classmethod
    def of(cls, shape: Sequence[int], chunks: Sequence[int], itemsize: int) -> ChunkGrid:
        return cls(tuple(int(s) for s in shape), tuple(int(c) for c in chunks), int(itemsize))

    @property
    def grid(self) -> tuple[int, ...]:
        """Chunks per dimension."""
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks, strict=True))

    @property
    def nchunks(self) -> int:
        return int(np.prod(self.grid, dtype=np.int64))

    @property
    def chunk_nbytes(self) -> int:
        return int(np.prod(self.chunks, dtype=np.int64)) * self.itemsize

    def coords(self, index: int) -> tuple[int, ...]:
        """Element coordinates of the first element of chunk ``index`` (HDF5's chunk offset)."""
        pos = np.unravel_index(int(index), self.grid)
        return tuple(int(p) * c for p, c in zip(pos, self.chunks, strict=True))

    def index_of(self, offsets: Sequence[int]) -> int:
        """Linear index of the chunk whose first element is at ``offsets``."""
        pos = tuple(int(o) // c for o, c in zip(offsets, self.chunks, strict=True))
        return int(np.ravel_multi_index(pos, self.grid))

    def in_extent(self, index: I64) -> I64:
        """Bytes of each chunk that lie inside the dataset (edge chunks hold fewer)."""
        pos = np.unravel_index(np.asarray(index, np.int64), self.grid)
        n = np.full(len(index), self.itemsize, np.int64)
        for p, c, s in zip(pos, self.chunks, self.shape, strict=True):
            n *= np.minimum(c, s - p.astype(np.int64) * c)
        return n


def to_chunk_space(runs: Runs, g: ChunkGrid) -> Runs:
    """Map runs of the C-order dataset byte space into chunk-major space (vectorised).

    Each run is cut at row ends and at chunk-column boundaries, then every piece is
    placed in its chunk.  The result is sorted by chunk-space offset and merged.
    """
    if not len(runs) or not g.shape:
        return runs
    row = g.shape[-1] * g.itemsize
    cw = g.chunks[-1] * g.itemsize
    zeros = np.zeros(len(runs), np.int64)
    pieces, rows = split_grid(runs, zeros, row)
    if row % cw == 0:  # chunk columns line up with rows: one regular grid
        pieces, cols = split_grid(pieces, np.zeros(len(pieces), np.int64), cw)
        rows = pieces.file // row
        cols = cols - rows * (row // cw)
    else:
        pieces, cols = split_grid(pieces, rows * row, cw)
        rows = pieces.file // row
    within_col = pieces.file - rows * row - cols * cw
    lead = g.shape[:-1]
    if lead:
        idx = np.unravel_index(rows, lead)
        cpos = [i // c for i, c in zip(idx, g.chunks[:-1], strict=True)]
        wpos = [i % c for i, c in zip(idx, g.chunks[:-1], strict=True)]
        chunk = np.ravel_multi_index((*cpos, cols), g.grid).astype(np.int64)
        inner = np.ravel_multi_index(wpos, g.chunks[:-1]).astype(np.int64) if wpos else rows * 0
    else:
        chunk, inner = cols.astype(np.int64), np.zeros(len(cols), np.int64)
    file = chunk * g.chunk_nbytes + inner * cw + within_col
    return merge(sort(Runs(file.astype(np.int64), pieces.length, pieces.mem)))


def bytes_per_chunk(cover: Runs, chunk_nbytes: int, first: int, count: int) -> I64:
    """Bytes of ``cover`` (absolute chunk-space runs) in chunks ``first .. first+count-1``."""
    bounds = (first + np.arange(1, count, dtype=np.int64)) * chunk_nbytes
    pieces, bins = split_at(cover, bounds)
    return np.bincount(bins, weights=pieces.length, minlength=count)[:count].astype(np.int64)
