"""Per-window counts for virtual ranks by arithmetic: bytes, ranks (messages), data extent.

Two exact evaluations, both vectorised over pairs and done in chunks that never
split one rank's boxes (so a rank is counted once per window):

* :func:`explicit`: every (box, window) pair a box spans; general (holes, several
  boxes per rank) and exact, cost = the number of such pairs.  Run on a subset of
  windows it is the simulator's sampling fallback.
* :func:`intervals`: boxes are first cut into sub-boxes whose gaps are all
  smaller than a window (:func:`~collio.sim.batch.explode`); such a sub-box
  touches *every* window between its first and last byte inside a domain, so one
  (sub-box, domain) pair gives a whole interval of windows and a difference array
  counts ranks per window.  Cost = the number of (sub-box, domain) pairs.  When
  the gaps are shorter than every window and the layout has no holes, a sub-box
  touches every window from its first byte to its last, across domains, and
  costs no arithmetic at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from ..layouts.strided import Blocks, count_below
from .batch import explode, max_gap, select

__all__ = ["Grid", "WindowCounts", "explicit", "exploded_intervals", "intervals", "pair_chunks"]

I64 = npt.NDArray[np.int64]
#: Pairs evaluated per numpy pass (bounds memory to a few hundred MiB).
CHUNK = 1 << 21


@dataclasses.dataclass(frozen=True, slots=True)
class Grid:
    """File domains and their windows: window ``w`` is ``[start[w], end[w])`` in ``dom[w]``."""

    bounds: I64
    window: int
    start: I64
    end: I64
    dom: I64
    first: I64  # first window of each domain (len naggs + 1)

    @classmethod
    def build(cls, bounds: I64, window: int) -> Grid:
        size = np.diff(bounds)
        nwin = -(-size // window)
        first = np.concatenate(([0], np.cumsum(nwin))).astype(np.int64)
        dom = np.repeat(np.arange(len(size), dtype=np.int64), nwin)
        k = np.arange(int(first[-1]), dtype=np.int64) - first[dom]
        start = bounds[dom] + k * window
        end = np.minimum(start + window, bounds[dom + 1])
        return cls(bounds, window, start, end, dom, first)

    @property
    def nwindows(self) -> int:
        return len(self.start)

    def index(self, dom: I64, offset: I64) -> I64:
        """Global index of the window of domain ``dom`` holding byte ``offset``."""
        out: I64 = self.first[dom] + (offset - self.bounds[dom]) // self.window
        return out


@dataclasses.dataclass(slots=True)
class WindowCounts:
    """Accumulated per-window figures (rlo/rhi only from :func:`explicit`)."""

    nbytes: I64
    ranks: I64
    runs: I64
    rlo: I64
    rhi: I64
    dom_bytes: I64
    dom_runs: I64
    #: Most bytes one rank has in one round (the k-th windows of every domain), when
    #: every window is evaluated (:func:`explicit`); 0: not known.
    rank_round: int = 0
    #: A two-level call's bytes each local group stages (:func:`explicit` with
    #: ``near``; None: not counted).
    staged: I64 | None = None

    @classmethod
    def zeros(cls, n: int, naggs: int) -> WindowCounts:
        z, zd = np.zeros(n, np.int64), np.zeros(naggs, np.int64)
        big = np.full(n, np.iinfo(np.int64).max)
        return cls(z.copy(), z.copy(), z.copy(), big, z.copy(), zd.copy(), zd.copy())


def pair_chunks(npairs: I64, owner: I64) -> Iterator[slice]:
    """Slices of boxes with about ``CHUNK`` pairs each, cut only where the owner changes."""
    csum = np.cumsum(npairs)
    total = int(csum[-1]) if len(csum) else 0
    want = np.searchsorted(csum, np.arange(CHUNK, total, CHUNK), side="right")
    change = np.flatnonzero(np.diff(owner) != 0) + 1  # first box of each new owner
    cut = change[np.searchsorted(change, want, side="left").clip(0, max(len(change) - 1, 0))]
    edges = np.unique(np.concatenate(([0], cut if len(change) else [], [len(owner)])))
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        yield slice(int(a), int(b))


def _expand(first: I64, last: I64) -> tuple[npt.NDArray[np.intp], I64]:
    """Pairs (box j, item first[j]..last[j]): the box index and the item of each pair."""
    n = np.maximum(last - first + 1, 0)
    rep = np.repeat(np.arange(len(first)), n)
    start = np.concatenate(([0], np.cumsum(n)[:-1])).astype(np.int64)
    item = first[rep] + np.arange(len(rep), dtype=np.int64) - start[rep]
    return rep, item


def _touch(
    blocks: Blocks, box: npt.NDArray[np.intp], lo: I64, hi: I64
) -> tuple[I64, I64, I64, I64]:
    """Bytes of box in [lo, hi), its first and last byte there, and a bound on its runs there.

    Every run of a box is ``runlen`` long, so at most ``ceil(bytes / runlen) + 1``
    of them meet the range (an upper bound for the pieces an aggregator gets).
    """
    c0 = count_below(blocks, box, lo)
    c1 = count_below(blocks, box, hi)
    nb = c1 - c0
    ok = nb > 0
    first = np.where(ok, select(blocks, box, np.where(ok, c0, 0)), 0)
    last = np.where(ok, select(blocks, box, np.where(ok, c1 - 1, 0)), 0)
    rl = blocks.runlen[box]
    nruns = np.where(ok, -(-nb // rl) + 1, 0)
    return nb, first, last, nruns


def explicit(
    blocks: Blocks, owner: I64, grid: Grid, windows: I64, near: tuple[I64, I64] | None = None
) -> WindowCounts:
    """Exact figures of the chosen windows (sorted global indices) from (box, window) pairs.

    ``near``: a two-level call's (each rank's local group, each domain's aggregator's
    group), ``owner`` its ranks: a rank's pieces for an aggregator of its own group are
    its own messages, the others its group's (staged: those alone count in
    ``rank_round``, then a group's, and in ``staged``)."""
    ws, we = grid.start[windows], grid.end[windows]
    naggs = len(grid.bounds) - 1
    out = WindowCounts.zeros(len(windows), naggs)
    b0, b1 = blocks.extent()
    wf = np.searchsorted(we, b0, side="right").astype(np.int64)
    wl = np.searchsorted(ws, b1, side="left").astype(np.int64) - 1
    nranks_all = int(owner.max()) + 1 if len(owner) else 1
    chunk_by = owner
    if near is not None:  # (a group's boxes in one chunk: its messages are counted there)
        nranks_all = len(near[0]) + int(near[0].max(initial=0)) + 1
        chunk_by = near[0][owner]
        out.staged = np.zeros(int(near[0].max(initial=0)) + 1, np.int64)
    nrounds = int(np.diff(grid.first).max(initial=1))
    for part in pair_chunks(np.maximum(wl - wf + 1, 0), chunk_by):
        rep, w = _expand(wf[part], wl[part])
        box = (np.arange(len(blocks))[part])[rep]
        nb, f, last, nr = _touch(blocks, box, ws[w], we[w])
        hit = nb > 0
        w, nb, f, last, nr, who = w[hit], nb[hit], f[hit], last[hit], nr[hit], owner[box[hit]]
        n = len(windows)
        out.nbytes += np.bincount(w, weights=nb, minlength=n).astype(np.int64)
        out.runs += np.bincount(w, weights=nr, minlength=n).astype(np.int64)
        busy = nb
        if near is not None:
            who, busy = _sources(out, near, who, grid.dom[windows[w]], nb)
        keys = np.unique(w * nranks_all + who)
        out.ranks += np.bincount(keys // nranks_all, minlength=n).astype(np.int64)
        if len(who):  # a chunk holds all of its ranks' boxes: their rounds are whole here
            g = windows[w]
            rnd = g - grid.first[grid.dom[g]]
            per = np.unique((who - who.min()) * nrounds + rnd, return_inverse=True)[1]
            mine = np.bincount(per.reshape(-1), weights=busy)
            out.rank_round = max(out.rank_round, int(mine.max()))
        np.minimum.at(out.rlo, w, f)
        np.maximum.at(out.rhi, w, last + 1)
    dom = grid.dom[windows]
    out.dom_bytes = np.bincount(dom, weights=out.nbytes, minlength=naggs).astype(np.int64)
    out.dom_runs = np.bincount(dom, weights=out.runs, minlength=naggs).astype(np.int64)
    return out


def _sources(
    out: WindowCounts, near: tuple[I64, I64], who: I64, dom: I64, nb: I64
) -> tuple[I64, I64]:
    """A two-level call's message source (a read's: destination) of each pair (its
    rank, or past the ranks its group, :func:`explicit`) and its staged bytes (0 for a
    rank's own message); adds the staged bytes of each group to ``out``."""
    assert out.staged is not None
    group, agg_group = near
    mine = group[who]
    staged = mine != agg_group[dom]
    k = len(out.staged)
    out.staged += np.bincount(mine[staged], weights=nb[staged], minlength=k).astype(np.int64)
    src: I64 = np.where(staged, len(group) + mine, who)
    return src, np.where(staged, nb, 0)


def intervals(
    blocks: Blocks,
    owner: I64,
    grid: Grid,
    *,
    dedupe: bool,
    windows: bool = True,
    tiled: bool = False,
    spread: bool = True,
) -> WindowCounts:
    """Exact ranks per window for boxes whose gaps are all < window (see module doc).

    Also the bytes and runs of every domain; ``windows=False`` computes those only.
    ``dedupe`` merges a rank's intervals (several boxes per rank).  A box whose
    largest gap is shorter than every window touches every window from the one of
    its first byte to the one of its last (*through*); for other boxes one
    ``count_below`` per (box, domain bound) gives the bytes of each (box, domain)
    pair and :func:`select` the first and last byte in it.  ``tiled`` (the boxes
    cover the extent without holes) makes a domain's bytes its size, so through
    boxes need no pair at all; their runs per domain are then estimated (unless
    ``spread`` is False: the caller estimates them).
    """
    nw, naggs = grid.nwindows, len(grid.bounds) - 1
    out = WindowCounts.zeros(nw, naggs)
    diff = np.zeros(nw + 1, np.int64)
    b0, b1, d0, d1, through = _spans(blocks, grid)
    quick = through & tiled
    for part in pair_chunks(np.where(quick, 1, d1 - d0 + 2), owner):
        idx = np.arange(len(blocks))[part]
        slow = idx[~quick[idx]]
        box, d, nb, c0 = _domain_pairs(blocks, grid, slow, d0[slow], d1[slow])
        out.dom_bytes += np.bincount(d, weights=nb, minlength=naggs).astype(np.int64)
        nr = -(-nb // blocks.runlen[box]) + 1
        out.dom_runs += np.bincount(d, weights=nr, minlength=naggs).astype(np.int64)
        if not windows:
            continue
        inside = through[box] & (d > d0[box]) & (d < d1[box])
        wf, wl = _pair_windows(blocks, grid, (box, d, nb, c0), inside)
        q = idx[quick[idx]]
        wf = np.concatenate((wf, grid.index(d0[q], b0[q])))
        wl = np.concatenate((wl, grid.index(d1[q], b1[q] - 1)))
        if dedupe:
            wf, wl = _union(np.concatenate((owner[box], owner[q])), wf, wl, nw)
        diff += np.bincount(wf, minlength=nw + 1)
        diff -= np.bincount(wl + 1, minlength=nw + 1)
    out.ranks = np.cumsum(diff)[:nw].astype(np.int64)
    if tiled:
        out.dom_bytes = np.diff(grid.bounds).astype(np.int64)
        if spread:
            out.dom_runs += _spread_runs(blocks, np.flatnonzero(quick), grid)
    return out


def exploded_intervals(
    blocks: Blocks,
    owner: I64,
    grid: Grid,
    levels: npt.NDArray[np.bool_],
    *,
    dedupe: bool,
    tiled: bool,
) -> WindowCounts:
    """:func:`intervals` over the sub-boxes of ``levels``, exploded chunk by chunk.

    Memory stays bounded however many sub-boxes there are (10^8 and more for fine
    block-cyclic or IOR layouts); chunks never split a rank.
    """
    nw, naggs = grid.nwindows, len(grid.bounds) - 1
    out = WindowCounts.zeros(nw, naggs)
    nsub = np.prod(np.where(levels, blocks.counts, 1), axis=1)
    _, _, d0, d1, _ = _spans(blocks, grid)
    inner = Blocks(
        blocks.base, blocks.mem, np.where(levels, 1, blocks.counts), blocks.strides,
        blocks.mstrides, blocks.runlen,
    )  # fmt: skip
    shortest = int((grid.end - grid.start).min()) if nw else 0
    quick = (max_gap(inner) < shortest) & tiled  # its sub-boxes need no pair
    for part in pair_chunks(np.where(quick, nsub, nsub * (d1 - d0 + 2)), owner):
        idx = np.arange(len(blocks))[part]
        sub, sub_owner = explode(take(blocks, idx), owner[idx], levels[idx])
        c = intervals(sub, sub_owner, grid, dedupe=dedupe, tiled=tiled, spread=False)
        out.ranks += c.ranks
        out.dom_bytes += c.dom_bytes
        out.dom_runs += c.dom_runs
    if tiled:
        out.dom_bytes = np.diff(grid.bounds).astype(np.int64)
        out.dom_runs += _spread_runs(blocks, np.flatnonzero(quick), grid)
    return out


def take(blocks: Blocks, idx: npt.NDArray[np.intp]) -> Blocks:
    """The boxes ``idx`` of a batch."""
    return Blocks(*(getattr(blocks, f)[idx] for f in Blocks.__slots__))


def _spans(blocks: Blocks, grid: Grid) -> tuple[I64, I64, I64, I64, npt.NDArray[np.bool_]]:
    """Each box's extent, first and last domain, and whether it goes *through* windows."""
    naggs = len(grid.bounds) - 1
    b0, b1 = blocks.extent()
    d0 = np.clip(np.searchsorted(grid.bounds, b0, side="right") - 1, 0, naggs - 1)
    d1 = np.clip(np.searchsorted(grid.bounds, b1 - 1, side="right") - 1, 0, naggs - 1)
    wlen = grid.end - grid.start
    through = max_gap(blocks) < (int(wlen.min()) if len(wlen) else 0)
    return b0, b1, d0.astype(np.int64), d1.astype(np.int64), through


def _pair_windows(
    blocks: Blocks,
    grid: Grid,
    pairs: tuple[npt.NDArray[np.intp], I64, I64, I64],
    inside: npt.NDArray[np.bool_],
) -> tuple[I64, I64]:
    """First and last window of each (box, domain) pair; ``inside``: the whole domain."""
    box, d, nb, c0 = pairs
    wf, wl = grid.first[d], grid.first[d + 1] - 1
    ends = np.flatnonzero(~inside)
    first = select(blocks, box[ends], c0[ends])
    last = select(blocks, box[ends], c0[ends] + nb[ends] - 1)
    wf[ends], wl[ends] = grid.index(d[ends], first), grid.index(d[ends], last)
    return wf, wl


def _spread_runs(blocks: Blocks, which: npt.NDArray[np.intp], grid: Grid) -> I64:
    """Runs per domain of boxes not evaluated pair by pair: spread evenly over each extent.

    ``G(x) = sum_i rho_i * clip(x - lo_i, 0, hi_i - lo_i)`` with ``rho_i`` runs per
    byte, from sorted extents and prefix sums, plus one cut run per (box, domain).
    """
    lo, hi = (e[which].astype(np.float64) for e in blocks.extent())
    rho = blocks.nruns()[which] / np.maximum(hi - lo, 1.0)
    x = grid.bounds.astype(np.float64)

    def ramp(start: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        order = np.argsort(start)
        r = np.concatenate(([0.0], np.cumsum(rho[order])))
        rs = np.concatenate(([0.0], np.cumsum((rho * start)[order])))
        k = np.searchsorted(start[order], x, side="left")
        out: npt.NDArray[np.float64] = x * r[k] - rs[k]
        return out

    g = ramp(lo) - ramp(hi)
    meets = np.searchsorted(np.sort(lo), x[1:], "left")
    meets -= np.searchsorted(np.sort(hi), x[:-1], "right")
    out: I64 = np.ceil(np.maximum(np.diff(g), 0.0)).astype(np.int64) + np.maximum(meets, 0)
    return out


def _domain_pairs(
    blocks: Blocks, grid: Grid, boxes: npt.NDArray[np.intp], d0: I64, d1: I64
) -> tuple[npt.NDArray[np.intp], I64, I64, I64]:
    """(box, domain, bytes, bytes below the domain) of every pair with bytes.

    Evaluates ``count_below`` once per (box, bound) for bounds ``d0 .. d1 + 1``.
    """
    rep, j = _expand(d0, d1 + 1)
    box = boxes[rep]
    below = count_below(blocks, box, grid.bounds[j])
    pair = np.flatnonzero(j != (d1 + 1)[rep])  # every bound but each box's last
    nb = below[pair + 1] - below[pair]
    hit = pair[nb > 0]
    return box[hit], j[hit], below[hit + 1] - below[hit], below[hit]


def _union(who: I64, wf: I64, wl: I64, nw: int) -> tuple[I64, I64]:
    """Merge each rank's overlapping window intervals (a rank sends one message per window)."""
    if not len(wf):
        return wf, wl
    span = np.int64(nw + 1)
    s, e = who * span + wf, who * span + wl
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.concatenate(([True], s[1:] > reach[:-1]))
    heads = np.flatnonzero(new)
    ends = np.maximum.reduceat(e, heads)
    base = (s[heads] // span) * span
    return s[heads] - base, ends - base
