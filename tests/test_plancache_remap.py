"""A batch's kept plan serving the same file runs from other arrays: the plan moved to
the new buffer offsets is the one made for them anew.  Local, no MPI."""

from __future__ import annotations

import numpy as np

from collio.aggregators import plan_sender
from collio.context import Plan
from collio.plancache import PlanCache
from collio.runs import Runs

BOUNDS = np.array([1000, 5096, 9192, 13288], np.int64)
WINDOW = 1536


def _runs(mem: list[int], shift: int = 0) -> Runs:
    """Seven runs in file order, apart, some crossing domain and window bounds, at the
    buffer offsets ``mem``."""
    file = np.array([1000, 2900, 4700, 5500, 8000, 9100, 12000], np.int64) + shift
    length = np.array([700, 1700, 700, 2000, 1100, 800, 1288], np.int64)
    return Runs(file, length, np.array(mem, np.int64))


def _plan(runs: Runs, shift: int = 0) -> Plan:
    sender = plan_sender(runs, BOUNDS + shift, WINDOW)
    return Plan(BOUNDS + shift, WINDOW, sender, sender.gwin.copy(), None, 1)


A = [0, 700, 2400, 3300, 5300, 6400, 7200]
B = [9000, 100, 40000, 2500, 60000, 20000, 30000]


def test_a_batch_plan_serves_other_arrays_moved_or_not():
    """Stored for runs over arrays A, found for the same file runs over arrays B (moved
    by 4096 or not): its sender's pieces are those of a plan made for B."""
    for shift in (0, 4096):
        cache = PlanCache()
        first = _runs(A)
        cache.store(("k",), BOUNDS, first, _plan(first), ("p",), cost=1, remap=True)
        other = _runs(B, shift)
        epoch, d = cache.candidate(("p",), other)
        assert (epoch, d) == (cache.epoch, shift)
        got = cache.take(epoch, ("k",), BOUNDS + shift, d, other)
        want = _plan(other, shift).sender
        for name in ("file", "length", "mem"):
            np.testing.assert_array_equal(getattr(got.sender.pieces, name),
                                          getattr(want.pieces, name), err_msg=name)  # fmt: skip
        np.testing.assert_array_equal(got.sender.gstart, want.gstart)
        np.testing.assert_array_equal(got.sender.gdom, want.gdom)
        assert got.sender_shapes() is not _plan(first).sender_shapes()


def test_a_single_call_plan_is_not_found_for_other_arrays():
    """Without ``remap`` (a single call's plan) other buffer offsets find nothing."""
    cache = PlanCache()
    first = _runs(A)
    cache.store(("k",), BOUNDS, first, _plan(first), ("p",), cost=1)
    assert cache.candidate(("p",), _runs(B)) == (-1, 0)
    assert cache.candidate(("p",), _runs(A, 4096))[0] == cache.epoch


def test_runs_that_overlap_are_not_remapped():
    """A read's runs may name a file byte twice: a piece's run is then not one, so such
    an entry serves only its own buffer offsets."""
    cache = PlanCache()
    runs = Runs(np.array([1000, 1200], np.int64), np.array([400, 400], np.int64),
                np.array([0, 400], np.int64))  # fmt: skip
    cache.store(("k",), BOUNDS, runs, _plan(runs), ("p",), cost=1, remap=True)
    other = Runs(runs.file, runs.length, np.array([800, 0], np.int64))
    assert cache.candidate(("p",), other) == (-1, 0)
