"""Brute-force references: which file byte holds which buffer byte, by enumeration."""

from __future__ import annotations

from typing import Any

import numpy as np

from collio.layouts import ArrayLayout, Layout, Segments


def byte_map(layout: Layout) -> np.ndarray[Any, np.dtype[np.int64]]:
    """file_offset[i] of buffer byte i, enumerated element by element."""
    if isinstance(layout, Segments):
        parts = [np.arange(o, o + n) for o, n in zip(layout.offsets, layout.lengths, strict=True)]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    assert isinstance(layout, ArrayLayout)
    g = layout.global_shape
    e = layout.dtype.itemsize
    n = int(np.prod(g))
    pos = np.arange(n, dtype=np.int64).reshape(g, order=layout.order)  # element file index
    idx = [d.indices() for d in layout.dims]
    sub = pos[np.ix_(*idx)] if idx else pos
    flat = sub.reshape(-1, order=layout.order) * e + layout.offset
    return (flat[:, None] + np.arange(e)).reshape(-1)


def runs_map(layout: Layout) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The same map, from collio's flattened runs."""
    r = layout.runs()
    out = np.full(layout.nbytes, -1, np.int64)
    for f, n, m in zip(r.file.tolist(), r.length.tolist(), r.mem.tolist(), strict=True):
        out[m : m + n] = np.arange(f, f + n)
    return out
