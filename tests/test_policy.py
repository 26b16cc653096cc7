"""The decisions engine and simulator share (collio.policy), and the records their facts
travel in (collio.facts): pure, no MPI."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from collio import policy
from collio.aggregators.domains import window_size
from collio.bench.patterns import make_workload
from collio.facts import NOT_COMPARED, Facts, How, fact, record
from collio.hints import Hints
from collio.policy import Path, PathFacts
from collio.sim import simulator


@record
class _Every(Facts):
    lo: int = fact(How.MIN)
    hi: int = fact(How.MAX)
    some: bool = fact(How.ANY)
    every: bool = fact(How.ALL)
    same: int | None = fact(How.SAME)
    equal: int | None = fact(How.EQUAL)


def _agree(records):
    """What a MAX allreduce of the ranks' slots gives, done with numpy."""
    slots = np.array([r.to_array() for r in records])
    return type(records[0]).agreed(slots.max(axis=0))


def test_each_rule_reduces_as_named():
    ranks = [_Every(5, 9, False, True, 3, 7), _Every(2, 4, True, True, 3, NOT_COMPARED),
             _Every(8, 12, False, False, 3, 7)]  # fmt: skip
    assert _Every.width() == len(ranks[0].slots()) == 8
    assert _agree(ranks) == _Every(lo=2, hi=12, some=True, every=False, same=3, equal=7)
    # values that differ: None; no rank compares: NOT_COMPARED
    differ = [dataclasses.replace(ranks[0], same=-1, equal=0), ranks[1], ranks[2]]
    assert (_agree(differ).same, _agree(differ).equal) == (None, None)
    alone = [dataclasses.replace(r, equal=NOT_COMPARED) for r in ranks]
    assert _agree(alone).equal == NOT_COMPARED
    assert _agree([ranks[0]]) == ranks[0]  # one rank agrees with itself
    assert _Every.agreed([*ranks[0].slots(), 99, 99]) == ranks[0]  # (extra slots ignored)


def test_a_patch_and_a_reader_act_as_the_whole_record():
    """A repeat packs only the facts that change into a kept record's slots, and reads
    a few agreed facts without the record: both as slots() and agreed() would."""
    kept = _Every(5, 9, False, True, 3, 7)
    assert _Every.index() == {"lo": 0, "hi": 1, "some": 2, "every": 3, "same": 4, "equal": 6}
    patch = _Every.patcher("lo", "every", "same", "equal")
    read = _Every.reader("equal", "lo", "some", "same")
    for new in (dataclasses.replace(kept, lo=1, every=False, same=-4, equal=NOT_COMPARED),
                dataclasses.replace(kept, lo=7, every=True, same=2, equal=11)):  # fmt: skip
        slots = kept.slots()
        patch(slots, new.lo, new.every, new.same, new.equal)
        assert slots == new.slots()
    ranks = [_Every(5, 9, False, True, 3, 7), _Every(2, 4, True, True, 4, NOT_COMPARED)]
    maxima = np.array([r.to_array() for r in ranks]).max(axis=0).tolist()
    whole = _Every.agreed(maxima)
    assert read(maxima) == (whole.equal, whole.lo, whole.some, whole.same) == (7, 2, True, None)


def _choose(facts, mode="automatic", independent=True, disjoint=True, split=None, vouched=False,
            runs=True):  # fmt: skip
    asked = []

    def ask_runs():
        asked.append("runs")
        return runs

    def ask_disjoint():
        asked.append("disjoint")
        return disjoint

    def ask_split():
        asked.append("split")
        return split

    path = policy.choose_path(facts, mode=mode, independent=independent,
                              disjoint=ask_disjoint, split=ask_split, vouched=vouched,
                              runs_disjoint=ask_runs)  # fmt: skip
    return path, asked


#: a call whose runs are not few and large on some rank (never compared run by run)
BIG = PathFacts(lo=0, hi=100, small=False, mapped=False, checked=policy.CHECKED_MAX_RUNS + 1)
MAPS = dataclasses.replace(BIG, mapped=True)
COARSE = dataclasses.replace(BIG, checked=200)  # at most 200 runs of 64 KiB or more


@pytest.mark.parametrize(
    ("facts", "kw", "want"),
    [
        (dataclasses.replace(BIG, hi=0), {}, (Path.NONE, [])),
        (MAPS, {}, (Path.MAPPED, [])),
        (BIG, {}, (Path.DIRECT, ["disjoint"])),
        (BIG, {"disjoint": False}, (Path.TWO_PHASE, ["disjoint"])),
        (dataclasses.replace(BIG, small=True), {}, (Path.TWO_PHASE, [])),
        (dataclasses.replace(BIG, small=True), {"mode": "disable"}, (Path.DIRECT, ["disjoint"])),
        (BIG, {"mode": "enable"}, (Path.TWO_PHASE, [])),
        (BIG, {"independent": False}, (Path.TWO_PHASE, ["split"])),
        (BIG, {"independent": False, "split": True}, (Path.DIRECT, ["split"])),
        (BIG, {"independent": False, "split": False}, (Path.OWN, ["split"])),
        (BIG, {"independent": False, "mode": "enable", "split": True}, (Path.TWO_PHASE, [])),
        # a backend that is not independent never maps
        (MAPS, {"independent": False}, (Path.TWO_PHASE, ["split"])),
        # the caller's word that the ranks' runs are disjoint: no question asked, small
        # runs or not; the hint forcing the shuffle and a backend that is not
        # independent still decide
        (BIG, {"vouched": True, "disjoint": False}, (Path.DIRECT, [])),
        (dataclasses.replace(BIG, small=True), {"vouched": True}, (Path.DIRECT, [])),
        (MAPS, {"vouched": True}, (Path.MAPPED, [])),
        (BIG, {"vouched": True, "mode": "enable"}, (Path.TWO_PHASE, [])),
        (BIG, {"vouched": True, "independent": False}, (Path.TWO_PHASE, ["split"])),
        # few large runs on every rank (COARSE): compared run by run when the extents
        # interleave or the runs are many; the hint forcing the shuffle and a backend that
        # is not independent still decide, and disjoint extents need no run check
        (COARSE, {"disjoint": False}, (Path.DIRECT, ["disjoint", "runs"])),
        (COARSE, {"disjoint": False, "runs": False}, (Path.TWO_PHASE, ["disjoint", "runs"])),
        (COARSE, {}, (Path.DIRECT, ["disjoint"])),
        (dataclasses.replace(COARSE, small=True), {}, (Path.DIRECT, ["runs"])),
        (dataclasses.replace(COARSE, small=True), {"runs": False}, (Path.TWO_PHASE, ["runs"])),
        (COARSE, {"disjoint": False, "mode": "disable"}, (Path.DIRECT, ["disjoint", "runs"])),
        (COARSE, {"mode": "enable"}, (Path.TWO_PHASE, [])),
        (COARSE, {"independent": False}, (Path.TWO_PHASE, ["split"])),
        (dataclasses.replace(COARSE, mapped=True), {}, (Path.MAPPED, [])),
        # the most runs that are compared, and one more (the fact of a rank that is not
        # coarse): not compared
        (dataclasses.replace(COARSE, small=True, checked=policy.CHECKED_MAX_RUNS), {},
         (Path.DIRECT, ["runs"])),
        (dataclasses.replace(BIG, small=True), {}, (Path.TWO_PHASE, [])),
        (BIG, {"disjoint": False}, (Path.TWO_PHASE, ["disjoint"])),
    ],
)  # fmt: skip
def test_choose_path_asks_only_what_decides(facts, kw, want):
    assert _choose(facts, **kw) == want


def test_rules_work_on_one_rank_and_on_every_rank():
    nruns = np.array([16, 17, 17, 100])
    nbytes = np.array([16, 17 << 22, (17 << 22) - 1, 100])
    small = policy.many_small_runs(nruns, nbytes, 1 << 22)
    assert small.tolist() == [False, False, True, True]
    one = [
        policy.many_small_runs(int(a), int(b), 1 << 22) for a, b in zip(nruns, nbytes, strict=True)
    ]
    assert one == small.tolist() and all(isinstance(v, bool) for v in one)
    copyable = policy.copyable(np.array([16, 17, 17]), np.array([9, 8, 9]))
    assert copyable.tolist() == [True, True, False]
    lengths = np.arange(1, 18, dtype=np.int64)  # 17 runs of 17 lengths
    assert not policy.copyable_lengths(lengths)
    assert policy.copyable_lengths(lengths[:16]) and policy.copyable_lengths(lengths % 8 + 1)
    assert policy.extents_disjoint(np.array([10, 0, 5, 7]), np.array([20, 5, 5, 10]))
    assert not policy.extents_disjoint(np.array([0, 4]), np.array([5, 9]))
    # few large runs: an empty rank, up to CHECKED_MAX_RUNS runs of at least the minimum
    most, least = policy.CHECKED_MAX_RUNS, policy.CHECKED_MIN_RUN
    assert policy.few_large_runs(0, 0) and policy.few_large_runs(most, least)
    assert not policy.few_large_runs(most + 1, 1 << 30)
    assert not policy.few_large_runs(2, least - 1)
    # the agreed fact: the most runs of any rank, above the most when one rank's are not
    nruns, shortest = np.array([0, 3, most, 3, most + 1]), np.array([0, least, least, 9, least])
    checked = policy.checked_runs(nruns, shortest)
    assert checked.tolist() == [0, 3, most, most + 1, most + 1]
    assert [int(policy.checked_runs(int(a), int(b))) for a, b in zip(nruns, shortest,
            strict=True)] == checked.tolist()  # fmt: skip


def test_round_window_caps_and_shrinks():
    bounds = np.array([0, 64 << 30], np.int64)
    assert policy.round_window(Hints(cb_buffer_size=3 << 30), bounds, align=1, nranks=4,
                               floor=0) == policy.MAX_WINDOW  # fmt: skip
    # min_rounds: the largest domain in about that many rounds, whole 64 KiB units
    shrunk = policy.round_window(Hints(min_rounds=4), np.array([0, 8 << 20, 10 << 20]), align=1,
                                 nranks=4, floor=0)  # fmt: skip
    assert shrunk == 2 << 20
    assert policy.round_window(Hints(min_rounds=4), np.array([0, 8 << 20]), align=3 << 20,
                               nranks=4, floor=0) == 3 << 20  # fmt: skip
    assert policy.domain_alignment(4096, Hints(striping_unit=6144)) == 12288


def test_round_window_spreads_a_short_tail():
    """A domain a little over the smallest window takes one round, not a full one and a
    sliver; a tail of half a window or more, or a wider window past cb_buffer_size,
    keeps its round."""
    mib = 1 << 20
    h = Hints()  # min_rounds 8: domains under 8 MiB shrink to the 1 MiB floor
    three = np.array([0, 1_090_000, 2_180_000, 3_276_800], np.int64)  # 200 x 4 KiB x 4 ranks

    def rounds(hints: Hints, bounds: np.ndarray, align: int = 1) -> int:
        w = policy.round_window(hints, bounds, align=align, nranks=4, floor=0)
        assert w % align == 0 and w <= hints.cb_buffer_size
        return int((-(-np.diff(bounds) // w)).max())

    assert window_size(h.cb_buffer_size, 1, 1_096_800, h.min_rounds, 4) == mib
    assert rounds(h, three) == 1
    w = policy.round_window(h, three, align=1, nranks=4, floor=0)
    assert w % policy.TAIL_UNIT == 0 and w - policy.TAIL_UNIT < 1_096_800 <= w
    # 2.3 windows: the tail spread over two rounds; 1.6 windows: its own round
    assert rounds(h, np.array([0, 23 * mib // 10], np.int64)) == 2
    assert rounds(h, np.array([0, 16 * mib // 10], np.int64)) == 2
    # never above cb_buffer_size (ROMIO's one buffer per round), whatever the tail
    assert rounds(Hints(cb_buffer_size=mib), three) == 2
    # whole alignment units: 1.1 stripes of 3 MiB in one window of two stripes
    assert rounds(h, np.array([0, 33 * mib // 10], np.int64), align=3 * mib) == 1
    assert policy.round_window(h, np.array([0, 33 * mib // 10]), align=3 * mib, nranks=4,
                               floor=0) == 6 * mib  # fmt: skip
    for largest in (1, mib - 1, mib + 1, 7 * mib + 5, 40 * mib + 3):
        for window, align in ((mib, 1), (mib, 4096), (3 * mib, 3 * mib)):
            got = policy.whole_tail(window, largest, 16 * mib, align)
            assert got % align == 0 and window <= got <= max(window, 16 * mib)
            n, m = -(-largest // window), -(-largest // got)
            if (largest - (n - 1) * window) * 2 >= window or n < 2:
                assert got == window
            else:  # (whole units may save a round or two more on long domains)
                assert m <= n - 1 and got <= window + window // (n - 1) + max(align, 1 << 16)


def test_two_level_reads_take_fewer_rounds():
    """A two-level read's window gives each domain at most TWO_LEVEL_READ_ROUNDS rounds
    (min_rounds permitting); its write and one level keep min_rounds."""
    bounds = np.array([0, 16 << 20, 32 << 20], np.int64)
    h = Hints()  # min_rounds 8, cb_buffer_size 16 MiB
    assert h.min_rounds > policy.TWO_LEVEL_READ_ROUNDS

    def window(sources: int, writing: bool, hints: Hints = h) -> int:
        return policy.round_window(hints, bounds, align=1, nranks=8, floor=0,
                                   sources=sources, writing=writing)  # fmt: skip

    assert window(0, True) == window(0, False) == window(2, True) == 2 << 20
    assert window(2, False) == (16 << 20) // policy.TWO_LEVEL_READ_ROUNDS
    # fewer rounds asked for are kept
    assert window(2, False, Hints(min_rounds=2)) == window(2, True, Hints(min_rounds=2)) == 8 << 20


@pytest.mark.parametrize("pattern", ["ior", "colblock", "rowblock", "block2d", "cyclic", "cube"])
@pytest.mark.parametrize("p", [1, 3, 4, 6])
def test_simulated_facts_are_what_each_rank_contributes(pattern, p):
    """The simulator's facts for its virtual ranks equal what each rank's check computes
    from its layout's runs (as the engine does, before agreeing)."""
    work = make_workload(pattern, p, size="40", block_size=800, transfer=100, segments=20,
                         cyclic_block=3)  # fmt: skip
    h = Hints(direct_threshold=64)
    runs = [work.layout(r).runs() for r in range(p)]
    blocks, owner = simulator.batched_blocks(work)
    got = simulator._facts(simulator.squeeze(blocks), owner, work,
                           simulator.SimConfig(hints=h, writing=False, local_fs=True))  # fmt: skip
    assert got.agreed.lo == min(int(r.file.min()) for r in runs)
    assert got.agreed.hi == max(int((r.file + r.length).max()) for r in runs)
    small = [bool(policy.many_small_runs(len(r), r.nbytes, 64)) for r in runs]
    assert got.agreed.small == any(small)
    assert got.agreed.mapped == all(policy.copyable_lengths(r.length) for r in runs)
    assert np.array_equal(got.rlo, [int(r.file.min()) for r in runs])


def test_the_checked_facts_fit_the_head_of_a_call():
    """Every call's first allreduce has the same length on every rank, whatever the call
    (ranks in different calls must meet in it): a call's own facts must fit."""
    from collio.checkfacts import Checked
    from collio.collective import HEAD_SLOTS

    assert Checked.width() <= HEAD_SLOTS - 3
