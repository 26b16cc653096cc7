"""Which plans the cache keeps: at most KEEP, at most MAX_BYTES together, least recently
used dropped first, nothing kept whose cost is not agreed (None).  Local, no MPI."""

from __future__ import annotations

import numpy as np

from collio import plancache
from collio.plancache import PlanCache
from collio.runs import Runs, read_only


class _Plan:
    def __init__(self, tag: int) -> None:
        self.tag = tag


def _store(cache: PlanCache, tag: int, cost: int | None) -> None:
    runs = Runs(np.array([tag * 10], np.int64), np.array([8], np.int64), np.zeros(1, np.int64))
    cache.store(("k", tag), np.array([0, 8], np.int64), runs, _Plan(tag), ("p",), cost=cost)


def _tags(cache: PlanCache) -> list[int]:
    return [e.plan.tag for e in cache.entries]


def test_the_least_recently_used_go_past_keep():
    cache = PlanCache()
    for tag in range(plancache.KEEP + 3):
        _store(cache, tag, 100)
    assert _tags(cache) == list(range(3, plancache.KEEP + 3))
    first = cache.entries[0]
    bounds = np.array([0, 8], np.int64)
    assert cache.take(first.epoch, first.key, bounds).tag == 3  # used: now the newest
    _store(cache, 99, 100)
    assert _tags(cache) == [*range(5, plancache.KEEP + 3), 3, 99]


def test_the_kept_plans_hold_at_most_max_bytes_together(monkeypatch):
    monkeypatch.setattr(plancache, "MAX_BYTES", 1000)
    cache = PlanCache()
    for tag, cost in enumerate((400, 300, 200)):
        _store(cache, tag, cost)
    assert _tags(cache) == [0, 1, 2]
    _store(cache, 3, 250)  # 1150 > 1000: the oldest goes
    assert _tags(cache) == [1, 2, 3]
    _store(cache, 4, 1000)  # alone at the bound: every other goes
    assert _tags(cache) == [4]


def test_a_plan_some_rank_cannot_keep_is_not_kept():
    cache = PlanCache()
    _store(cache, 0, 10)
    _store(cache, 1, None)
    assert _tags(cache) == [0]
    assert cache.epoch == 2  # (counted all the same: epochs stay equal on every rank)


def _layout_runs() -> Runs:
    file = np.array([0, 64, 128, 192], np.int64)
    return read_only(Runs(file, np.full(4, 16, np.int64), np.arange(0, 64, 16, dtype=np.int64)))


def test_moved_runs_know_their_shift_from_the_runs_they_were_moved_from():
    base = _layout_runs()
    a, b = base.moved(256), base.moved(1024).moved(-24)
    assert a.shift_from(base) == 256 and b.shift_from(base) == 1000
    assert b.shift_from(a) == 744 and a.shift_from(b) == -744
    assert base.shift_from(base) == 0
    assert np.array_equal(b.file, base.file + 1000)  # (the shift is the files' distance)
    # runs not moved from one another: unknown, compared by the cache instead
    other = Runs(base.file + 8, base.length.copy(), base.mem.copy())
    assert other.shift_from(base) is None and base.shift_from(a) is None
    writable = Runs(base.file.copy(), base.length.copy(), base.mem.copy())
    assert writable.moved(8)._origin is None  # (its arrays may change: no shortcut)


def test_the_cache_finds_moved_runs_as_it_finds_equal_ones():
    """The shortcut and the comparison give the same (epoch, shift), and runs that are
    not a shift of the kept ones are found by neither."""
    base = _layout_runs()
    cache = PlanCache()
    cache.store(("k",), np.array([0, 256], np.int64), base, _Plan(0), ("p",), cost=10)
    epoch = cache.entries[0].epoch
    moved = base.moved(4096)
    copied = Runs(moved.file.copy(), moved.length.copy(), moved.mem.copy())
    assert cache.candidate(("p",), moved) == (epoch, 4096)
    assert cache.candidate(("p",), copied) == (epoch, 4096)
    bent = Runs(copied.file + np.array([0, 0, 0, 8]), copied.length, copied.mem)
    assert cache.candidate(("p",), bent) == (-1, 0)
