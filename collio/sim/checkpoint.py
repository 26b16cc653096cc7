"""A checkpoint save for virtual ranks: the engine's call and the checkpoint's own planning.

A checkpoint of row-sharded arrays is to the engine IOR's segmented pattern: segment
``k`` is array ``k``, each rank's block its row shard (a save stores each rank's blocks
one after another in its own region, but the planning is the same).
The checkpoint adds its extent planning (:mod:`collio.checkpoint.extents`, the same
functions a save calls), done here for every array and virtual rank.  Arrays of equal
size: the model, not a particular network.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..bench.patterns import Workload, make_workload
from ..checkpoint import extents
from ..checkpoint.format import EXTENT

__all__ = ["checkpoint_plan", "checkpoint_workload", "format_checkpoint"]


def checkpoint_workload(ranks: int, arrays: int, total: int) -> Workload:
    """The engine's view of the save: ``arrays`` segments of one aligned block per rank."""
    block = max(total // max(ranks * arrays, 1), 1)
    return make_workload("ior", ranks, block_size=block, transfer=block, segments=arrays)


def checkpoint_plan(work: Workload, ranks: int, arrays: int) -> dict[str, Any]:
    """The checkpoint's planning of every array (extent cuts and owners), timed."""
    block = work.shape[-1] * work.itemsize  # (segments, ranks, block) in the ior pattern
    t0 = time.perf_counter()
    count = 0
    lo = np.arange(ranks, dtype=np.int64) * block
    hi = lo + block
    every = np.ones(ranks, bool)
    for _ in range(arrays):  # as prepare() does: one cut and one owner search per array
        starts = extents.cut(ranks * block, lo, hi)
        owner = extents.owners(starts, ranks * block, lo, hi, every)
        count += len(starts)
        assert (owner >= 0).all()
    return {
        "arrays": arrays,
        "extents": count,
        "index_bytes": count * EXTENT.itemsize + arrays * 200,
        "spans_bytes_per_rank": ranks * arrays * 4 * 8,
        "plan_seconds": time.perf_counter() - t0,
    }


def format_checkpoint(plan: dict[str, Any]) -> str:
    mib = 1 << 20
    return (
        f"checkpoint: {plan['arrays']} arrays, {plan['extents']} checksummed extents "
        f"(index ~{plan['index_bytes'] / mib:.1f} MiB), extent planning "
        f"{plan['plan_seconds']:.1f} s; the agreement on pieces gathers "
        f"{plan['spans_bytes_per_rank'] / mib:.0f} MiB on every rank"
    )
