"""A piece read through a collio file where its array is stored (:mod:`.chunks`): the
same layout at the array's file offset where the array is one range of the file (one
chunk: every array of version 1, an array written two-phase), else the piece's runs
mapped to the file's and split at the chunks' edges."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..layouts.arrays import ArrayLayout
from ..layouts.base import Segments
from .chunks import Chunks
from .save import item, span_of

__all__ = ["placed"]

I64 = npt.NDArray[np.int64]


def placed(data: Any, lay: ArrayLayout, voff: int, chunks: Chunks, flat: bool) -> tuple[Any, Any]:
    """``(out, layout)`` of the read of ``lay``'s piece of the array at virtual offset
    ``voff`` into ``data`` (as :func:`.save.item`, with ``flat``: every rank's piece of
    the array is one range)."""
    lo, hi, contiguous = span_of(lay)
    if flat and contiguous:
        file, length, _, _ = chunks.runs(np.array([voff + lo], np.int64),
                                         np.array([hi - lo], np.int64))  # fmt: skip
        return lay.as_bytes(data), Segments(file, length)
    n = lay.global_nbytes
    one, start = chunks.within(np.array([voff], np.int64), np.array([voff + max(n, 1)], np.int64))
    if n == 0 or bool(one[0]):
        return item(data, lay, int(start[0]) if n else 0, False)
    runs = lay.runs()
    file, length, src, within = chunks.runs(voff + runs.file, runs.length)
    order = np.argsort(runs.mem[src] + within, kind="stable")  # (memory order: packed)
    return lay.as_bytes(data), Segments(file[order], length[order])
