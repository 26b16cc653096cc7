"""What one aggregator's plan amounts to: the figures its stats and the simulator report (pure)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .plan import AggregatorPlan, round_requests

__all__ = ["aggregator_summary"]


def aggregator_summary(
    ap: AggregatorPlan, domain: int, dom_lo: int, dom_hi: int, window: int, partial_write: bool
) -> dict[str, Any]:
    """Plain figures of one aggregator's call: bytes, rounds, messages per round, requests.

    ``hole_reads`` are the rounds whose window has bytes no rank writes (the
    aggregator reads the request first, to keep the old content).
    """
    _, req = round_requests(ap, dom_lo, dom_hi, window, partial_write)
    return {
        "domain": domain,
        "bytes": int(ap.length.sum()),
        "rounds": ap.nrounds,
        "messages": np.diff(ap.rstart).tolist(),
        "requests": req.tolist(),
        "hole_reads": req[ap.rcovered < req].tolist(),
    }
