"""Decompositions of 4 ranks written into zarr arrays by collio, checked by plain zarr.

Every rank's layout is a function of (rank, size), so the check can rebuild all of them
to know what must be where.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from collio import layouts

NRANKS = 4


def reference(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype).reshape(shape)
    return rng.integers(-(10**6), 10**6, n).astype(dtype).reshape(shape)


def grid_boxes(shape, cuts, rank, size):
    """Rank ``rank`` of a row-major rank grid whose boxes end at ``cuts`` per dimension."""
    edges = [[0, *c, n] for c, n in zip(cuts, shape, strict=True)]
    grid = [len(e) - 1 for e in edges]
    assert int(np.prod(grid)) == size, (grid, size)
    coords = np.unravel_index(rank, grid)
    start = [e[c] for e, c in zip(edges, coords, strict=True)]
    ext = [e[c + 1] - e[c] for e, c in zip(edges, coords, strict=True)]
    return start, ext


def boxes(shape, dtype, cuts, origin=None, *, order="C"):
    """A layout function: rank grid of boxes cut at ``cuts`` (inside a box at ``origin``)."""

    def make(rank: int, size: int) -> layouts.Layout:
        sub = shape if origin is None else tuple(o[1] - o[0] for o in origin)
        start, ext = grid_boxes(sub, cuts, rank, size)
        if origin is not None:
            start = [s + o[0] for s, o in zip(start, origin, strict=True)]
        return layouts.Subarray(shape, start, ext, dtype, order=order)

    return make


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]
    dtype: str
    create: Callable[[], dict[str, Any]]
    #: (mode, layout(rank, size), seed) applied in turn
    phases: tuple[tuple[str, Callable[[int, int], layouts.Layout], int], ...]

    @property
    def fill(self) -> Any:
        return self.create().get("fill_value", 0)

    def expected(self, size: int = NRANKS) -> tuple[np.ndarray, np.ndarray]:
        """The array plain zarr must return, and where any rank wrote."""
        out = np.full(self.shape, self.fill, self.dtype)
        mask = np.zeros(self.shape, bool)
        for _, make, seed in self.phases:
            ref = reference(self.shape, self.dtype, seed)
            for r in range(size):
                sel = selection(make(r, size))
                out[sel] = ref[sel]
                mask[sel] = True
        return out, mask


def selection(lay: layouts.Layout) -> Any:
    if isinstance(lay, layouts.Subarray):
        return lay.slices
    assert isinstance(lay, layouts.BlockCyclic)
    return np.ix_(*lay.indices)


def local(lay: layouts.Layout, ref: np.ndarray) -> np.ndarray:
    piece = ref[selection(lay)]
    return np.asfortranarray(piece) if lay.order == "F" else np.ascontiguousarray(piece)


def _codecs(kind: str) -> list[Any]:
    import zarr

    if kind == "zstd":
        return [zarr.codecs.ZstdCodec(level=3)]
    return [zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]


def _cyclic(rank: int, size: int) -> layouts.Layout:
    return layouts.block_cyclic((600, 500), "<f4", block=(7, 5), grid=(2, 2), rank=rank, size=size)


def _empty_rank(rank: int, size: int) -> layouts.Layout:
    rows = [(0, 311), (0, 0), (311, 700), (700, 1000)][rank]
    return layouts.Subarray((1000, 300), (rows[0], 0), (rows[1] - rows[0], 300), "<f8")


def _block(shape, dtype, order="C"):
    return lambda r, s: layouts.block(shape, dtype, rank=r, size=s, order=order)


SQ = (1000, 1000)
CASES = [
    Case("aligned", SQ, "<f8", lambda: {"chunks": (100, 100)},
         (("w", boxes(SQ, "<f8", [[500], [500]]), 1),)),
    Case("misaligned", SQ, "<f8", lambda: {"chunks": (100, 100)},
         (("w", boxes(SQ, "<f8", [[333], [667]]), 2),)),
    Case("cyclic", (600, 500), "<f4", lambda: {"chunks": (64, 48)}, (("w", _cyclic, 3),)),
    Case("zstd", (700, 900), "<f8", lambda: {"chunks": (128, 128), "compressors": _codecs("zstd")},
         (("w", boxes((700, 900), "<f8", [[333], [667]]), 4),)),
    Case("blosc", (500, 600), "<i8", lambda: {"chunks": (64, 100), "compressors": _codecs("blosc")},
         (("w", boxes((500, 600), "<i8", [[251], [333]]), 5),)),
    Case("sharded", (800, 800), "<i4", lambda: {"chunks": (50, 50), "shards": (200, 200)},
         (("w", boxes((800, 800), "<i4", [[333], [467]]), 6),)),
    Case("1d", (100_003,), "<f8", lambda: {"chunks": (4096,)},
         (("w", _block((100_003,), "<f8"), 7),)),
    Case("3d-fortran", (60, 70, 80), "<f8", lambda: {"chunks": (16, 32, 20)},
         (("w", _block((60, 70, 80), "<f8", "F"), 8),)),
    Case("partial", SQ, "<f8", lambda: {"chunks": (100, 100), "fill_value": -1.5},
         (("w", boxes(SQ, "<f8", [[211], [300]], [(150, 620), (230, 710)]), 9),)),
    Case("update", SQ, "<f8", lambda: {"chunks": (100, 100)},
         (("w", boxes(SQ, "<f8", [[500], [500]]), 10),
          ("r+", boxes(SQ, "<f8", [[400], [333]], [(55, 845), (120, 930)]), 11))),
    Case("empty-rank", (1000, 300), "<f8", lambda: {"chunks": (128, 128)},
         (("w", _empty_rank, 12),)),
]  # fmt: skip
BY_NAME = {c.name: c for c in CASES}


def chunk_keys(shape, chunks, mask) -> set[tuple[int, ...]]:
    """Grid coordinates of the chunks that hold at least one written element."""
    grid = [-(-n // c) for n, c in zip(shape, chunks, strict=True)]
    out = set()
    for coords in np.ndindex(*grid):
        sel = tuple(slice(i * c, (i + 1) * c) for i, c in zip(coords, chunks, strict=True))
        if mask[sel].any():
            out.add(tuple(int(i) for i in coords))
    return out
