"""Where an array's bytes are in the file: its chunks.  Pure numpy, no I/O.

A version 2 checkpoint stores an array as chunks, each ``(start within the array,
file offset)``, the chunk running to the next one's start (the last to the array's
size): a row-sharded array is one chunk per saving rank, each in that rank's region of
the file; an array stored whole (every array of version 1) is one chunk.

Checksums, extents and the load's plans all stay in *array* space: each array is
given a place in one virtual space (:func:`.format.place` of the arrays' sizes, the
places version 1 stores arrays at), where its bytes are contiguous.  :class:`Chunks`
maps ranges of that space to the file's runs; it is the one place a file offset is
computed from an array offset.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from ..runs import displacements

__all__ = ["ChunkedReads", "Chunks", "Mapper"]

I64 = npt.NDArray[np.int64]


@dataclasses.dataclass(frozen=True, slots=True)
class Chunks:
    """Chunks in virtual order: each ``[vstart, vstart + length)`` of the virtual space
    is ``[fstart, fstart + length)`` of the file.  Non-empty, disjoint, sorted."""

    vstart: I64
    fstart: I64
    length: I64

    @classmethod
    def of_runs(cls, vstart: I64, fstart: I64, length: I64) -> Chunks:
        """The map of virtual runs (ascending, disjoint) stored at ``fstart``; neighbours
        adjacent both in the virtual space and in the file are one chunk (an array stored
        whole is one, however many extents it has)."""
        keep = length > 0
        v, f, n = vstart[keep], fstart[keep], length[keep]
        if not len(v):  # (arrays of no bytes alone: no chunk, and no last run to end one)
            return cls(v, f, n)
        new = np.ones(len(v), bool)
        new[1:] = (v[1:] != v[:-1] + n[:-1]) | (f[1:] != f[:-1] + n[:-1])
        head = np.flatnonzero(new)
        ends = np.append(head[1:], len(v)) - 1
        return cls(v[head], f[head], v[ends] + n[ends] - v[head])

    def runs(self, lo: I64, length: I64) -> tuple[I64, I64, I64, I64]:
        """The virtual ranges ``[lo, lo + length)`` (each inside some arrays' bytes) as
        file runs, split at the chunks' edges: (file offset, length, range, offset
        within the range) of each, ranges in the order given, each one's runs in order."""
        n = len(lo)
        if n == 0 or len(self.vstart) == 0:
            z = np.zeros(0, np.int64)
            return z, z, z, z
        hi = lo + length
        c0 = np.searchsorted(self.vstart, lo, side="right") - 1
        c1 = np.searchsorted(self.vstart, hi - 1, side="right") - 1
        count = np.where(length > 0, c1 - c0 + 1, 0)
        src = np.repeat(np.arange(n, dtype=np.int64), count)
        c = (
            np.repeat(c0, count)
            + np.arange(int(count.sum()), dtype=np.int64)
            - np.repeat(displacements(count), count)
        )
        s = np.maximum(lo[src], self.vstart[c])
        e = np.minimum(hi[src], self.vstart[c] + self.length[c])
        if len(c) and (int(c.min()) < 0 or bool((e <= s).any())):
            raise ValueError("checkpoint: a range outside the arrays' chunks")
        return self.fstart[c] + (s - self.vstart[c]), e - s, src, s - lo[src]

    def within(self, lo: I64, hi: I64) -> tuple[npt.NDArray[np.bool_], I64]:
        """Per virtual range ``[lo, hi)`` (non-empty): whether it lies in one chunk (is one
        range of the file), and its file offset where it does (else -1)."""
        if len(self.vstart) == 0:
            return np.zeros(len(lo), bool), np.full(len(lo), -1, np.int64)
        c = np.searchsorted(self.vstart, lo, side="right") - 1
        cc = np.maximum(c, 0)
        one = (c >= 0) & (hi <= self.vstart[cc] + self.length[cc])
        return one, np.where(one, self.fstart[cc] + lo - self.vstart[cc], -1)

    def reads(self) -> Mapper:
        """A per-call mapper for a reader's loop (see :class:`Mapper`)."""
        return Mapper(self)


class Mapper:
    """:meth:`Chunks.runs` of one range at a time, for loops that already make one read
    per step (bisect on lists: a numpy call per step would cost more than the step)."""

    __slots__ = ("_v", "_f", "_n")

    def __init__(self, chunks: Chunks) -> None:
        self._v: list[int] = chunks.vstart.tolist()
        self._f: list[int] = chunks.fstart.tolist()
        self._n: list[int] = chunks.length.tolist()

    def split(self, lo: int, length: int) -> list[tuple[int, int, int]]:
        """(file offset, length, offset within the range) of the range's runs."""
        out = []
        at, end = lo, lo + length
        c = bisect.bisect_right(self._v, at) - 1
        while at < end:
            if c < 0 or c >= len(self._v) or at >= self._v[c] + self._n[c]:
                raise ValueError("checkpoint: a range outside the arrays' chunks")
            e = min(end, self._v[c] + self._n[c])
            out.append((self._f[c] + at - self._v[c], e - at, at - lo))
            at, c = e, c + 1
        return out


class ChunkedReads:
    """A reader (``read_at(offset, buf)``: a backend, :class:`~.filemap.Reader`) taking
    virtual offsets: each read split at the chunks' edges and read where it is stored."""

    __slots__ = ("be", "chunks", "name", "_map")

    def __init__(self, be: Any, chunks: Chunks) -> None:
        self.be = be
        self.chunks = chunks
        self.name: str = be.name
        # (made at the first read: a load's own reads split all their ranges at once
        # through ``chunks``; only extents read back come here, and most loads have none)
        self._map: Mapper | None = None

    def read_at(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        if self._map is None:
            self._map = self.chunks.reads()
        for at, n, k in self._map.split(offset, len(buf)):
            self.be.read_at(at, buf[k : k + n])
