"""A rank's array piece against a chunk grid, for the plain-library baselines (pure numpy).

Plain zarr (or h5py) is called with boxes of the global array.  A rank's piece of
an :class:`~collio.layouts.ArrayLayout` is, per dimension, a sorted set of global
indices (one interval for a block layout, many for block-cyclic); its boxes are the
products of the intervals, and its part of a chunk is the product of its indices
inside the chunk's range in each dimension.  Everything here is per dimension,
vectorised over indices; only the boxes and chunks themselves are iterated, one
library call each, which is what the baselines cost.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..layouts import ArrayLayout

__all__ = ["UnitPart", "boxes", "misaligned", "unit_parts", "units_touched"]

I64 = npt.NDArray[np.int64]


def _runs(idx: I64) -> tuple[I64, I64, I64]:
    """Maximal runs of consecutive indices: (global start, local start, length)."""
    if not len(idx):
        z = np.zeros(0, np.int64)
        return z, z, z
    brk = np.flatnonzero(np.diff(idx) != 1) + 1
    lstart = np.concatenate(([0], brk)).astype(np.int64)
    length = np.diff(np.concatenate((lstart, [len(idx)]))).astype(np.int64)
    return idx[lstart], lstart, length


def boxes(lay: ArrayLayout) -> Iterator[tuple[tuple[slice, ...], tuple[slice, ...]]]:
    """(global box, local box) pairs that together are the rank's piece."""
    per_dim = []
    for d in lay.dims:
        g, lo, n = _runs(d.indices())
        per_dim.append(
            [(slice(a, a + k), slice(b, b + k)) for a, b, k in zip(g.tolist(), lo.tolist(),
                                                                 n.tolist(), strict=True)]
        )  # fmt: skip
    for combo in itertools.product(*per_dim):
        yield tuple(c[0] for c in combo), tuple(c[1] for c in combo)


def units_touched(lay: ArrayLayout, unit: Sequence[int]) -> list[tuple[int, ...]]:
    """Grid coordinates of the chunks (shards) the rank's piece meets."""
    per_dim = [np.unique(d.indices() // u).tolist() for d, u in zip(lay.dims, unit, strict=True)]
    return list(itertools.product(*per_dim))


@dataclasses.dataclass(frozen=True, slots=True)
class UnitPart:
    """The rank's part of one chunk (shard).

    ``region`` is the chunk's box in the global array, ``local`` the rank's
    elements in its own buffer (slices), ``inner`` where they sit inside the chunk
    (a slice per dimension when contiguous, else an index array), ``full`` whether
    the rank holds the whole chunk.
    """

    coords: tuple[int, ...]
    region: tuple[slice, ...]
    local: tuple[slice, ...]
    inner: tuple[Any, ...]
    full: bool

    @property
    def box(self) -> bool:
        """The part is one box (every ``inner`` is a slice)."""
        return all(isinstance(i, slice) for i in self.inner)


def unit_parts(lay: ArrayLayout, unit: Sequence[int]) -> Iterator[UnitPart]:
    """The rank's part of every chunk (shard) it meets, in grid order."""
    shape = lay.global_shape
    per_dim: list[list[tuple[int, slice, slice, Any, bool]]] = []
    for d, u, n in zip(lay.dims, unit, shape, strict=True):
        idx = d.indices()
        ids = np.unique(idx // u)
        lo = np.searchsorted(idx, ids * u)
        hi = np.searchsorted(idx, np.minimum((ids + 1) * u, n))
        entries = []
        for c, a, b in zip(ids.tolist(), lo.tolist(), hi.tolist(), strict=True):
            start, stop = c * u, min((c + 1) * u, n)
            inner = idx[a:b] - start
            contiguous = int(inner[-1]) - int(inner[0]) == b - a - 1
            sel: Any = slice(int(inner[0]), int(inner[-1]) + 1) if contiguous else inner
            entries.append((c, slice(start, stop), slice(a, b), sel, b - a == stop - start))
        per_dim.append(entries)
    for combo in itertools.product(*per_dim):
        yield UnitPart(
            tuple(e[0] for e in combo), tuple(e[1] for e in combo), tuple(e[2] for e in combo),
            tuple(e[3] for e in combo), all(e[4] for e in combo),
        )  # fmt: skip


def misaligned(lay: ArrayLayout, unit: Sequence[int]) -> str | None:
    """How the piece covers a chunk (shard) only in part, or None when it covers each whole.

    When every rank covers every chunk it meets completely (and the ranks tile the
    array), no chunk has two writers: plain zarr is then safe.
    """
    for k, (d, u, n) in enumerate(zip(lay.dims, unit, lay.global_shape, strict=True)):
        idx = d.indices()
        if not len(idx):
            continue
        ids, counts = np.unique(idx // u, return_counts=True)
        extent = np.minimum((ids + 1) * u, n) - ids * u
        bad = np.flatnonzero(counts != extent)
        if len(bad):
            i = int(bad[0])
            c = int(ids[i])
            return (
                f"along dimension {k} it holds {int(counts[i])} of the {int(extent[i])} indices "
                f"[{c * u}, {c * u + int(extent[i])}) of chunk {c}"
            )
    return None
