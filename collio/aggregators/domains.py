"""File domains and round windows (pure)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["file_domains", "window_size", "alignment"]

I64 = npt.NDArray[np.int64]


def alignment(backend_alignment: int, striping_unit: int | None) -> int:
    """Domain boundaries must be multiples of both the backend's unit and the stripe."""
    a = max(1, int(backend_alignment))
    if striping_unit:
        a = math.lcm(a, int(striping_unit))
    return a


def window_size(cb_buffer_size: int, align: int) -> int:
    """Bytes per round: ``cb_buffer_size`` rounded down to the alignment (at least one unit)."""
    return max(align, (int(cb_buffer_size) // align) * align)


def file_domains(lo: int, hi: int, naggs: int, align: int = 1) -> I64:
    """Split ``[lo, hi)`` into ``naggs`` contiguous domains; return ``naggs + 1`` bounds.

    Interior boundaries are at even shares of the extent, rounded down to a
    multiple of ``align`` (absolute file offsets, like ROMIO's stripe-aligned
    domains), so no stripe, chunk or part has two owners.  Trailing domains may be
    empty when the extent is small.
    """
    if naggs < 1:
        raise ValueError(f"naggs={naggs} must be >= 1")
    hi = max(hi, lo)
    i = np.arange(naggs + 1, dtype=np.int64)
    span = hi - lo
    # lo + span*i//naggs without overflow for huge spans
    q, r = divmod(span, naggs)
    cuts = lo + q * i + (r * i) // naggs
    if align > 1:
        cuts = (cuts // align) * align
    cuts = np.clip(cuts, lo, hi)
    cuts[0], cuts[-1] = lo, hi
    return np.maximum.accumulate(cuts).astype(np.int64)
