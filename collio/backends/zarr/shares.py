"""Whether ranks keep the zarr units they alone touch, and the aggregators' shares if so (pure)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["keep_own"]

I64 = npt.NDArray[np.int64]


def keep_own(
    own: I64, total: int, naggs: int, slack: float = 1.25, agg_own: I64 | None = None
) -> npt.NDArray[np.float64] | None:
    """Should ranks keep the units they alone touch?  The aggregators' shares if so, else None.

    ``own[r]`` is the bytes rank ``r`` alone touches, ``total`` the call's bytes,
    ``agg_own[d]`` what the rank owning domain ``d`` keeps (default: ``own[d]``).
    Kept, each rank stores its own units and the shared rest is cut so that
    aggregators with less of their own take more (water filling: every
    aggregator ends at the same load ``T`` or above it with no share); shuffled,
    the aggregators share everything evenly but all of it crosses MPI.  Keep
    unless the slowest rank's work would exceed an even share by more than
    ``slack`` (a skewed decomposition; codecs make balance matter most).
    """
    if total <= 0 or not int(own.sum()) or naggs < 1:
        return None
    a = (own[:naggs] if agg_own is None else agg_own).astype(np.float64)
    shared = float(total - int(own.sum()))
    order = np.sort(a)
    # the level T with sum(max(0, T - a)) == shared: try filling the k lightest
    k = np.arange(1, len(order) + 1)
    levels = (shared + np.cumsum(order)) / k
    fits = levels >= order
    level = float(levels[np.flatnonzero(fits)[-1]])
    caps = np.maximum(level - a, 0.0)
    share = total / naggs
    if max(float(own.max()), level) > slack * share:
        return None
    return caps
