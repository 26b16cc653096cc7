"""The pure planner against brute force, for simulated ranks (no MPI)."""

from __future__ import annotations

import numpy as np
from brute import byte_map
from hypothesis import given
from hypothesis import strategies as st

from collio import layouts
from collio.aggregators import (
    choose_aggregators,
    file_domains,
    plan_aggregator,
    plan_sender,
    window_size,
)
from collio.aggregators.domains import MIN_SHARE, MIN_WINDOW
from collio.aggregators.nodes import consecutive_nodes
from collio.aggregators.select import storage_aggregators
from collio.runs import Runs, first_overlap, merge, split_at, split_grid


@st.composite
def run_sets(draw):
    n = draw(st.integers(0, 15))
    offs = np.cumsum(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))).astype(np.int64)
    lens = np.array(draw(st.lists(st.integers(1, 25), min_size=n, max_size=n)), np.int64)
    offs = offs + np.concatenate(([0], np.cumsum(lens)[:-1])) if n else offs
    return Runs.sequential(offs, lens)


def _bytes(r: Runs):
    f = [np.arange(a, a + n) for a, n in zip(r.file, r.length, strict=True)]
    m = [np.arange(a, a + n) for a, n in zip(r.mem, r.length, strict=True)]
    if not f:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(f), np.concatenate(m)


@given(run_sets(), st.lists(st.integers(0, 400), max_size=6))
def test_split_at_keeps_bytes_and_bins(runs, cuts):
    bounds = np.unique(np.array(cuts, np.int64))
    pieces, bins = split_at(runs, bounds)
    f0, m0 = _bytes(runs)
    f1, m1 = _bytes(pieces)
    np.testing.assert_array_equal(f1, f0)
    np.testing.assert_array_equal(m1, m0)
    for a, n, b in zip(pieces.file, pieces.length, bins, strict=True):
        lo = bounds[b - 1] if b > 0 else -np.inf
        hi = bounds[b] if b < len(bounds) else np.inf
        assert lo <= a and a + n <= hi


@given(run_sets(), st.integers(1, 40), st.integers(0, 30))
def test_split_grid(runs, period, origin):
    org = np.full(len(runs), origin, np.int64)
    runs = Runs(runs.file + origin, runs.length, runs.mem)
    pieces, k = split_grid(runs, org, period)
    np.testing.assert_array_equal(_bytes(pieces)[0], _bytes(runs)[0])
    assert ((pieces.file - origin) // period == k).all()
    assert ((pieces.file + pieces.length - 1 - origin) // period == k).all()


@given(run_sets())
def test_merge_and_overlap(runs):
    merged = merge(runs)
    np.testing.assert_array_equal(_bytes(merged)[0], _bytes(runs)[0])
    assert first_overlap(runs.file, runs.length) == -1
    if len(runs) >= 2:
        bad = Runs(runs.file, runs.length.copy(), runs.mem)
        bad.length[0] = runs.file[1] - runs.file[0] + 1
        assert first_overlap(bad.file, bad.length) == 1


@given(
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(1, 9),
    st.sampled_from([1, 7, 64, 4096]),
)
def test_file_domains(lo, span, n, align):
    hi = lo + span
    b = file_domains(lo, hi, n, align)
    assert len(b) == n + 1 and b[0] == lo and b[-1] == hi
    assert (np.diff(b) >= 0).all()
    assert all(x % align == 0 for x in b[1:-1] if lo < x < hi)
    if align == 1 and span >= n:
        sizes = np.diff(b)
        assert sizes.max() - sizes.min() <= 1


def test_window_shrinks_to_min_rounds_within_its_bounds():
    MiB = 1 << 20
    # ROMIO's rule: one cb_buffer_size per round, rounded down to the alignment
    assert window_size(16 * MiB, 1) == 16 * MiB
    assert window_size(16 * MiB, 1, 32 * MiB, min_rounds=1) == 16 * MiB
    assert window_size(10 * MiB, 4 * MiB) == 8 * MiB
    # a 32 MiB domain in 8 rounds: 4 MiB windows
    assert window_size(16 * MiB, 1, 32 * MiB, 8) == 4 * MiB
    # never above cb_buffer_size, never below 1 MiB (unless cb_buffer_size is)
    assert window_size(16 * MiB, 1, 1 << 40, 8) == 16 * MiB
    assert window_size(16 * MiB, 1, 2 * MiB, 8) == MIN_WINDOW
    assert window_size(256 * 1024, 1, 2 * MiB, 8) == 256 * 1024
    # whole 64 KiB units, rounded up so the domain takes at most min_rounds rounds
    w = window_size(16 * MiB, 1, 30 * MiB + 5, 8)
    assert w % (1 << 16) == 0 and -(-(30 * MiB + 5) // w) <= 8
    # not below 64 KiB per rank: 64 ranks keep 4 MiB, 65,536 ranks keep cb_buffer_size
    assert window_size(16 * MiB, 1, 32 * MiB, 8, nranks=64) == 4 * MiB
    assert window_size(16 * MiB, 1, 32 * MiB, 8, nranks=128) == 8 * MiB
    assert window_size(16 * MiB, 1, 16 * MiB, 8, nranks=65536) == 16 * MiB
    # an alignment larger than the shrunk window wins (one unit per round)
    assert window_size(16 * MiB, 5 * MiB, 32 * MiB, 8) == 5 * MiB
    assert window_size(16 * MiB, 3 * MiB, 48 * MiB, 8) == 6 * MiB


@given(
    st.integers(1, 1 << 26),
    st.integers(1, 1 << 22),
    st.integers(0, 1 << 32),
    st.integers(1, 64),
    st.integers(1, 1 << 17),
    st.sampled_from([0, 3 << 20, 12 << 20]),
)
def test_window_is_aligned_and_bounded(cb, align, largest, rounds, nranks, floor):
    w = window_size(cb, align, largest, rounds, nranks, floor)
    base = window_size(cb, align)
    assert w % align == 0 and align <= w <= base
    if rounds == 1 or largest == 0:
        assert w == base
        return
    low = max(MIN_WINDOW, nranks * MIN_SHARE, floor)
    share = -(-largest // rounds)
    # never larger than needed for `rounds` rounds (up to the 64 KiB unit and the floors)
    assert w <= max(align, low, share + (1 << 16) - 1)
    # never smaller than the floors allow
    assert w >= min(base, max(align, min(cb, max(low, share)) // align * align))


def test_backend_floor_keeps_whole_upload_windows():
    MiB = 1 << 20
    # S3 with 5 MiB parts and cb 16 MiB: 3 parts per round, whatever min_rounds says
    assert window_size(16 * MiB, 5 * MiB, 64 * MiB, 8, 4, floor=15 * MiB) == 15 * MiB
    assert window_size(16 * MiB, 5 * MiB, 64 * MiB, 8, 4) == 5 * MiB


def test_file_domains_huge_extent_no_overflow():
    b = file_domains(0, 1 << 50, 65536, 1 << 20)
    assert b[-1] == 1 << 50 and (np.diff(b) == (1 << 50) // 65536).all()


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=24),
    st.none() | st.integers(1, 30),
    st.none() | st.integers(1, 4),
)
def test_choose_aggregators(nodes, cb_nodes, per_node):
    nodes = np.array(nodes)
    aggs = choose_aggregators(nodes, cb_nodes=cb_nodes, per_node=per_node)
    assert (np.diff(aggs) > 0).all() and len(aggs) >= 1
    per = np.bincount(nodes[aggs], minlength=nodes.max() + 1)
    if per_node is not None:
        assert per.max() <= per_node
    eligible = sum(min(int((nodes == k).sum()), per_node or 10**9) for k in np.unique(nodes))
    # the default: every rank while they are fewer than storage_aggregators()
    want = len(nodes) if cb_nodes is None else cb_nodes
    assert len(aggs) == max(1, min(want, eligible))
    # spread: no node gets a second aggregator before every node has one
    used = per[np.unique(nodes)]
    assert used.max() - used.min() <= 1 or used.min() == min(
        int((nodes == k).sum()) for k in np.unique(nodes)
    )


def test_default_aggregators_on_several_nodes_follow_nodes_stripes_and_storage():
    """Not one per rank: one per node, per stripe target, and enough for the storage's
    aggregate (128 with the defaults), capped by the ranks; a single node keeps all."""
    assert storage_aggregators() == 128 and storage_aggregators(8, 1e9, 2e9) == 4
    assert len(choose_aggregators(consecutive_nodes(65536, 64))) == 1024
    assert len(choose_aggregators(consecutive_nodes(4096, 64))) == 128
    assert len(choose_aggregators(consecutive_nodes(4096, 64), stripes=300)) == 300
    assert len(choose_aggregators(consecutive_nodes(96, 48))) == 96
    assert len(choose_aggregators(consecutive_nodes(4096, 4096))) == 4096
    # spread over nodes: 2 per node of 64 at 4096 ranks
    aggs = choose_aggregators(consecutive_nodes(4096, 64))
    assert (np.bincount(aggs // 64, minlength=64) == 2).all()


def test_emulated_nodes_never_span_two_machines():
    """COLLIO_RANKS_PER_NODE's groups are cut where MPI's nodes are (what a node shares,
    two-level staging's window, must be on one machine); each named by its lowest rank."""
    from collio.comms import both_nodes

    real = np.array([0, 0, 0, 0, 4, 4, 4, 4])
    emulated = consecutive_nodes(8, 3) * 3  # groups of 3: 0-2, 3-5, 6-7
    assert both_nodes(real, emulated).tolist() == [0, 0, 0, 3, 4, 4, 6, 6]
    one = np.zeros(8, np.int64)  # one machine: the emulated groups as they are
    assert both_nodes(one, emulated).tolist() == emulated.tolist()
    assert both_nodes(real, one).tolist() == real.tolist()


def test_choose_aggregators_spreads_within_node():
    assert choose_aggregators([0] * 8, per_node=2).tolist() == [0, 4]
    assert choose_aggregators([0, 0, 1, 1], cb_nodes=2).tolist() == [0, 2]
    assert choose_aggregators([0, 1, 0, 1], cb_nodes=2).tolist() == [0, 1]


@st.composite
def jobs(draw):
    """p simulated ranks with disjoint layouts of one global array, plus hints."""
    p = draw(st.integers(1, 6))
    g = tuple(draw(st.lists(st.integers(1, 12), min_size=2, max_size=3)))
    kind = draw(st.sampled_from(["block", "cyclic", "col"]))
    dt = draw(st.sampled_from(["u1", "<f8", "<i2"]))
    if kind == "block":
        lays = [layouts.block(g, dt, rank=r, size=p) for r in range(p)]
    elif kind == "col":
        grid = (1,) * (len(g) - 1) + (p,)
        lays = [layouts.block(g, dt, rank=r, size=p, grid=grid) for r in range(p)]
    else:
        grid = layouts.dims_create(p, len(g))
        blk = draw(st.integers(1, 3))
        lays = [layouts.block_cyclic(g, dt, block=blk, grid=grid, rank=r, size=p) for r in range(p)]
    naggs = draw(st.integers(1, p))
    align = draw(st.sampled_from([1, 8, 64]))
    window = window_size(draw(st.integers(1, 300)), align)
    return lays, naggs, align, window


@given(jobs())
def test_sender_and_aggregator_plans_agree(job):
    lays, naggs, align, window = job
    runs = [lay.runs() for lay in lays]
    nonempty = [r for r in runs if len(r)]
    if not nonempty:
        return
    lo = min(r.extent()[0] for r in nonempty)
    hi = max(r.extent()[1] for r in nonempty)
    bounds = file_domains(lo, hi, naggs, align)
    senders = [plan_sender(r, bounds, window) for r in runs]
    owner_of_byte = {}
    for rank, (lay, sp) in enumerate(zip(lays, senders, strict=True)):
        # pieces are the layout's bytes, each inside one domain and one window
        f, m = _bytes(sp.pieces)
        ref = byte_map(lay)
        np.testing.assert_array_equal(ref[m], f)
        for g in range(sp.ngroups):
            piece = sp.group(g)
            d, w = int(sp.gdom[g]), int(sp.gwin[g])
            wlo = bounds[d] + w * window
            assert (piece.file >= max(wlo, bounds[d])).all()
            assert (piece.file + piece.length <= min(wlo + window, bounds[d + 1])).all()
        assert sp.per_dom.sum() == len(sp.pieces)
        for b in f.tolist():
            owner_of_byte[b] = rank
    for d in range(naggs):
        files, lens, srcs = [], [], []
        for rank, sp in enumerate(senders):
            sel = np.flatnonzero(np.searchsorted(bounds[1:-1], sp.pieces.file, side="right") == d)
            files.append(sp.pieces.file[sel])
            lens.append(sp.pieces.length[sel])
            srcs.append(np.full(len(sel), rank))
        file, length, src = (np.concatenate(x).astype(np.int64) for x in (files, lens, srcs))
        ap, overlap = plan_aggregator(file, length, src, int(bounds[d]), window)
        assert overlap == -1
        # rounds are the non-empty windows, in order; extent and coverage per round
        wins = np.unique((file - bounds[d]) // window)
        np.testing.assert_array_equal(ap.rwin, wins)
        for k in range(ap.nrounds):
            sel = (file - bounds[d]) // window == wins[k]
            assert ap.rlo[k] == file[sel].min()
            assert ap.rhi[k] == (file + length)[sel].max()
            assert ap.rcovered[k] == length[sel].sum()
            gs = ap.groups_of_round(k)
            assert sorted(ap.gsrc[gs].tolist()) == sorted(set(src[sel].tolist()))
        # replies: the round of each sender group is the rank of its window
        for rank, sp in enumerate(senders):
            mine = np.flatnonzero(sp.gdom == d)
            theirs = np.flatnonzero(ap.gsrc == rank)
            np.testing.assert_array_equal(np.searchsorted(wins, sp.gwin[mine]), ap.ground[theirs])
    assert len(owner_of_byte) == sum(lay.nbytes for lay in lays)


def test_aggregator_finds_overlap_between_sources():
    file = np.array([0, 100, 104], np.int64)
    length = np.array([8, 8, 8], np.int64)
    src = np.array([0, 1, 2], np.int64)
    _, bad = plan_aggregator(file, length, src, 0, 64)
    assert bad == 2


def test_run_across_an_empty_domain_goes_to_the_right_aggregator():
    """Bounds [0, 0, 64, 64, 140] have empty domains 0 and 2; the run [56, 70) crosses 64.
    Its 0-byte piece in domain 2 must survive the window split: dropped while another run
    is split in two, the counts still match and [64, 70) goes to domain 2, not 3."""
    runs = Runs(np.array([56, 126]), np.array([14, 14]), np.array([0, 14]))
    bounds = np.array([0, 0, 64, 64, 140], np.int64)
    sp = plan_sender(runs, bounds, 64)
    for g in range(sp.ngroups):
        piece, d = sp.group(g), int(sp.gdom[g])
        assert (piece.file >= bounds[d]).all() and (
            piece.file + piece.length <= bounds[d + 1]
        ).all()
    assert sp.per_dom.tolist() == [0, 1, 0, 3]


def _plans(runs: list[Runs], bounds, window: int) -> list:
    """Rank d's Plan of one call (rank d aggregating domain d), as the engine makes it."""
    from collio.context import Plan

    senders = [plan_sender(r, bounds, window) for r in runs]
    doms = [s.gdom.repeat(np.diff(s.gstart)) for s in senders]  # each piece's domain
    out = []
    for d in range(len(bounds) - 1):
        mine = [dm == d for dm in doms]
        file = np.concatenate([s.pieces.file[m] for s, m in zip(senders, mine, strict=True)])
        length = np.concatenate([s.pieces.length[m] for s, m in zip(senders, mine, strict=True)])
        src = np.concatenate([np.full(int(m.sum()), r, np.int64) for r, m in enumerate(mine)])
        ap, _ = plan_aggregator(file, length, src, int(bounds[d]), window)
        plan = Plan(bounds, window, senders[d], senders[d].gwin.copy(), ap, ap.nrounds)
        plan.agg_shapes(), plan.sender_shapes(), plan.by_round()
        out.append(plan)
    return out


@given(st.lists(run_sets(), min_size=1, max_size=4), st.integers(-7, 5000), st.integers(1, 4))
def test_a_plan_moved_by_a_shift_is_the_plan_of_the_moved_runs(sets, shift, naggs):
    """Plan.shifted(d) of a call equals the plan made anew for every rank's runs moved by
    d with its domains moved by d: every array, the message shapes included."""
    naggs = min(naggs, len(sets))
    base = 10_000
    runs = [Runs(r.file + base, r.length, r.mem) for r in sets]
    moved = [Runs(r.file + shift, r.length, r.mem) for r in runs]
    ends = [(int(r.file[0]), int((r.file + r.length).max())) for r in runs if len(r)]
    lo = min((e[0] for e in ends), default=base)
    hi = max((e[1] for e in ends), default=base)
    bounds = np.linspace(lo, max(hi, lo + naggs), naggs + 1).astype(np.int64)
    window = 16
    kept, fresh = _plans(runs, bounds, window), _plans(moved, bounds + shift, window)
    for k, f in zip(kept, fresh, strict=True):
        assert _flat(k.shifted(shift)) == _flat(f)


def _flat(obj):
    """Every array of a plan (nested dataclasses) as lists, for comparison."""
    import dataclasses

    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, tuple):
        return [_flat(x) for x in obj]
    if dataclasses.is_dataclass(obj):
        return {f.name: _flat(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return obj


def test_a_small_call_cuts_domains_of_at_least_the_minimum():
    """Domains never below ``min_domain``: as many as fit, spread over the aggregators,
    the others empty; a call of ``naggs * min_domain`` or more keeps every domain."""
    from collio.aggregators import active_domains, call_domains

    assert [active_domains(4, span, 1000) for span in (0, 999, 1999, 2000, 3999, 4000, 10**9)] == [
        1, 1, 1, 2, 3, 4, 4,
    ]  # fmt: skip
    assert active_domains(4, 10, 0) == 4 and active_domains(1, 10**9, 1) == 1
    bounds, active = call_domains(100, 2600, 4, 1, 1000)  # 2500 bytes: 2 domains of 4
    assert active == 2 and bounds.tolist() == [100, 1350, 1350, 2600, 2600]
    big, active = call_domains(100, 4100, 4, 1, 1000)
    assert active == 4 and np.array_equal(big, file_domains(100, 4100, 4))
    # a rank's runs go to the two aggregators with domains, byte for byte
    runs = Runs(np.array([100, 1300, 2500]), np.array([50, 100, 100]), np.array([0, 50, 150]))
    sp = plan_sender(runs, bounds, window=1 << 20)
    assert sp.per_dom.tolist() == [2, 0, 2, 0]
    assert sp.pieces.file.tolist() == [100, 1300, 1350, 2500]
    assert sp.pieces.length.tolist() == [50, 50, 50, 100]
