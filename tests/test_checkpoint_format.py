"""The checkpoint's pure parts: extent planning, the trailer, and the simulator's model."""

from __future__ import annotations

import numpy as np
import pytest

from collio import ChecksumError, layouts
from collio.checkpoint import extents, format
from collio.checkpoint.save import span_of
from collio.sim.checkpoint import checkpoint_plan, checkpoint_workload


def test_cut_at_the_grid_and_every_piece_edge() -> None:
    lo = np.array([0, 10, 25], np.int64)
    hi = np.array([10, 25, 40], np.int64)
    assert extents.cut(40, lo, hi, block=16).tolist() == [0, 10, 16, 25, 32]
    assert extents.cut(0, lo, hi).tolist() == []


def test_owners_cover_whole_extents_only() -> None:
    starts = np.array([0, 10, 16, 25, 32], np.int64)
    lo, hi = np.array([0, 10, 25], np.int64), np.array([10, 25, 40], np.int64)
    every = np.ones(3, bool)
    assert extents.owners(starts, 40, lo, hi, every).tolist() == [0, 1, 1, 2, 2]
    # a load in other pieces: [0, 20) and [20, 40) cover no extent that straddles 20
    lo2, hi2 = np.array([0, 20], np.int64), np.array([20, 40], np.int64)
    got = extents.owners(starts, 40, lo2, hi2, np.ones(2, bool))
    assert got.tolist() == [0, 0, -1, 1, 1]
    assert extents.deal(got < 0, 2).tolist() == [-1, -1, 0, -1, -1]
    # the whole array on every rank: dealt round-robin
    full = extents.owners(starts, 40, np.zeros(2, np.int64), np.full(2, 40), np.ones(2, bool))
    assert full.tolist() == [0, 1, 0, 1, 0]


@pytest.mark.parametrize(
    "lay",
    [
        layouts.Subarray((6, 5, 4), (2, 0, 0), (3, 5, 4), "<f8"),
        layouts.Subarray((6, 5, 4), (2, 1, 0), (1, 3, 4), "<i2"),
        layouts.Subarray((6, 5, 4), (2, 1, 0), (2, 3, 4), "<i2"),
        layouts.Subarray((6, 5), (0, 1), (6, 2), "<f4", order="F"),
        layouts.Subarray((6, 5), (1, 1), (2, 2), "<f4", order="F"),
        layouts.Subarray((6, 5), (0, 0), (0, 5), "<f4"),
        layouts.block_cyclic((8, 8), "<f8", block=2, grid=(2, 1), rank=1, size=2),
    ],
)
def test_span_by_arithmetic_matches_the_runs(lay: layouts.Subarray) -> None:
    runs = lay.runs()
    assert span_of(lay) == extents.span(runs.file, runs.length, runs.mem)


def test_trailer_refuses_what_is_not_a_checkpoint() -> None:
    raw = format.trailer_bytes(5000, 100, 7)
    assert format.parse_trailer(raw, 5164, "x") == (5000, 100, 7)
    with pytest.raises(ChecksumError, match="does not end"):
        format.parse_trailer(raw, 5165, "x")
    with pytest.raises(ChecksumError, match="no checkpoint trailer"):
        format.parse_trailer(b"\0" * format.TRAILER.size, 5164, "x")
    with pytest.raises(ChecksumError, match="too short"):
        format.parse_trailer(raw, 100, "x")


def test_place_aligns_every_array() -> None:
    offsets, end = format.place([1, 4096, 0, 5000])
    assert offsets.tolist() == [4096, 8192, 12288, 12288]
    assert end == 20480


def test_simulated_save_plans_one_extent_per_piece() -> None:
    work = checkpoint_workload(1024, 10, 10 * 1024 * 8192)
    plan = checkpoint_plan(work, 1024, 10)
    assert plan["extents"] == 10 * 1024 and plan["arrays"] == 10
