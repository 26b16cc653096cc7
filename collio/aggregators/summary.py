"""What one aggregator's plan amounts to: the figures its stats and the simulator report (pure)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .plan import AggregatorPlan

__all__ = ["round_requests", "aggregator_summary"]

I64 = npt.NDArray[np.int64]


def round_requests(
    ap: AggregatorPlan, dom_lo: int, dom_hi: int, window: int, partial_write: bool
) -> I64:
    """Size of the backend request of each round: the data extent, or the whole window."""
    if partial_write:
        out: I64 = ap.rhi - ap.rlo
        return out
    start = dom_lo + ap.rwin * window
    return np.minimum(start + window, dom_hi) - start


def aggregator_summary(
    ap: AggregatorPlan, domain: int, dom_lo: int, dom_hi: int, window: int, partial_write: bool
) -> dict[str, Any]:
    """Plain figures of one aggregator's call: bytes, rounds, messages per round, requests.

    ``hole_reads`` are the rounds whose window has bytes no rank writes (the
    aggregator reads the request first, to keep the old content).
    """
    req = round_requests(ap, dom_lo, dom_hi, window, partial_write)
    return {
        "domain": domain,
        "bytes": int(ap.length.sum()),
        "rounds": ap.nrounds,
        "messages": np.diff(ap.rstart).tolist(),
        "requests": req.tolist(),
        "hole_reads": req[ap.rcovered < req].tolist(),
    }
