"""Which bytes each checksum covers, and which rank computes or verifies it.  Pure numpy.

An array's extents are cut at a fixed grid (:data:`BLOCK`) and at the edges of the
saving ranks' pieces, wherever a piece is one contiguous range of the array's
bytes (a row-sharded tensor is).  So each saving rank checksums its extents from
its own memory, with no exchange and no reading back; and a load at the same
decomposition verifies everything from the arrays it has just read.  A resharded
load reads again only the extents that no single rank's piece covers whole.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

__all__ = ["BLOCK", "Plan", "assign", "box_spans", "cut", "cut_all", "deal_all", "disjoint",
           "ends_of", "owners", "owners_all", "plan", "span"]  # fmt: skip

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

#: Extent size where no piece edge cuts: a resharded load re-reads at most one extent
#: per piece edge, and the table holds one row per extent.
BLOCK = 4 << 20


def span(file: I64, length: I64, mem: I64) -> tuple[int, int, bool]:
    """(lo, hi, contiguous) of a piece's sorted runs, relative to its array's start:
    contiguous when the runs are one range of the file held in the same order in memory."""
    if len(length) == 0:
        return 0, 0, True
    lo, hi = int(file[0]), int(file[-1] + length[-1])
    same = bool(np.array_equal(mem, file - lo))
    return lo, hi, same and int(length.sum()) == hi - lo


def box_span(
    global_shape: tuple[int, ...],
    start: tuple[int, ...],
    shape: tuple[int, ...],
    itemsize: int,
    order: str,
) -> tuple[int, int, bool] | None:
    """(lo, hi, contiguous) of one box by arithmetic, when it is one range (None: ask its
    runs): a row shard is, and flattening hundreds of layouts costs more than the save's
    other planning together."""
    g, st, sh = (global_shape, start, shape) if order == "C" else (
        global_shape[::-1], start[::-1], shape[::-1])  # fmt: skip
    n = 1
    for c in sh:
        n *= c
    if n == 0:
        return 0, 0, True
    k = next((i for i, c in enumerate(sh) if c != 1), len(sh))  # leading dims of one index
    if any(sh[i] != g[i] for i in range(k + 1, len(g))):
        return None
    lo, stride = 0, itemsize
    for i in range(len(g) - 1, -1, -1):
        lo += st[i] * stride
        stride *= g[i]
    return lo, lo + n * itemsize, True


def box_spans(shape: I64, start: I64, count: I64, itemsize: I64) -> I64:
    """:func:`box_span` of many boxes at once, as ``(lo, hi, contiguous, bytes)`` rows: the
    ``(n, d)`` global shapes, starts and counts in memory order (an 'F' array's reversed),
    padded in front with dimensions of shape 1.  ``lo`` and ``hi`` bound the box's first
    and last byte (its runs' span) when it is not one range."""
    n = count.prod(axis=1)
    d = shape.shape[1]
    stride = np.ones_like(shape)
    if d > 1:
        stride[:, :-1] = np.cumprod(shape[:, :0:-1], axis=1)[:, ::-1]
    stride *= itemsize[:, None]
    lo = (start * stride).sum(axis=1)
    hi = ((start + count - 1) * stride).sum(axis=1) + itemsize
    many = count != 1
    first = np.where(many.any(axis=1), many.argmax(axis=1), d)  # (leading dims of one index)
    cut = (count != shape) & (np.arange(d)[None, :] > first[:, None])
    empty = n == 0
    out = np.empty((len(n), 4), np.int64)
    out[:, 0] = np.where(empty, 0, lo)
    out[:, 1] = np.where(empty, 0, hi)
    out[:, 2] = empty | ~cut.any(axis=1)
    out[:, 3] = n * itemsize
    return out


def disjoint(lo: I64, hi: I64) -> npt.NDArray[np.bool_]:
    """Per column of ``(rank, array)`` ranges ``[lo, hi)``: whether no two ranks' non-empty
    ranges of that array overlap.  All arrays at once: a sort of each column."""
    empty = hi <= lo
    lo, hi = np.where(empty, -1, lo), np.where(empty, -1, hi)  # (empty ones sort first)
    order = np.argsort(lo, axis=0, kind="stable")
    slo, shi = np.take_along_axis(lo, order, 0), np.take_along_axis(hi, order, 0)
    out: npt.NDArray[np.bool_] = np.asarray((shi[:-1] <= slo[1:]).all(axis=0), bool)
    return out


def cut(nbytes: int, lo: I64, hi: I64, block: int = BLOCK) -> I64:
    """Extent starts of an array of ``nbytes``: a ``block`` grid and the pieces' edges."""
    if nbytes == 0:
        return np.zeros(0, np.int64)
    # pieces come in rank order, usually sorted already: a stable sort (timsort on
    # int64) merges sorted runs in linear time where np.unique's quicksort would not
    edges = np.concatenate([np.arange(0, nbytes, block, dtype=np.int64), lo, hi])
    edges = np.sort(edges[(edges >= 0) & (edges < nbytes)], kind="stable")
    keep = np.ones(len(edges), bool)
    keep[1:] = edges[1:] != edges[:-1]
    return edges[keep]


def owners(starts: I64, nbytes: int, lo: I64, hi: I64, contiguous: npt.NDArray[np.bool_]) -> I64:
    """For each extent, a rank whose contiguous piece ``[lo, hi)`` covers it whole, else -1.

    Where several pieces cover an extent (a whole array on every rank), the extents are
    dealt round-robin among them, so that no rank checksums everything.
    """
    ends = np.append(starts[1:], nbytes)
    out = np.full(len(starts), -1, np.int64)
    ranks = np.flatnonzero(contiguous & (hi > lo))
    if len(ranks) == 0 or len(starts) == 0:
        return out
    rlo, rhi = lo[ranks], hi[ranks]
    if np.all(rlo == rlo[0]) and np.all(rhi == rhi[0]) and len(ranks) > 1:
        inside = (starts >= rlo[0]) & (ends <= rhi[0])
        out[inside] = ranks[np.arange(len(starts))[inside] % len(ranks)]
        return out
    if bool((rlo[1:] >= rlo[:-1]).all()):  # rank order is file order (row shards)
        slo, shi, sr = rlo, rhi, ranks
    else:
        order = np.argsort(rlo, kind="stable")
        slo, shi, sr = rlo[order], rhi[order], ranks[order]
    k = np.searchsorted(slo, starts, side="right") - 1
    ok = k >= 0
    kk = np.where(ok, k, 0)
    ok &= shi[kk] >= ends
    out[ok] = sr[kk[ok]]
    return out


def deal(uncovered: npt.NDArray[np.bool_], size: int) -> I64:
    """Ranks for the extents no piece covers, round-robin: one rank reads each back."""
    out = np.full(len(uncovered), -1, np.int64)
    out[uncovered] = np.arange(int(uncovered.sum())) % max(size, 1)
    return out


def cut_all(
    nbytes: I64, offsets: I64, lo: I64, hi: I64, contiguous: Bools, block: int = BLOCK
) -> I64:
    """:func:`cut` of every array at once; the extents' starts as file offsets, sorted.

    ``nbytes`` and ``offsets`` per array (ascending, each array's bytes before the
    next one's offset), ``lo``, ``hi`` and ``contiguous`` per ``(rank, array)``.  The
    arrays are disjoint in the file, so one sort of file offsets cuts them all."""
    grid = -(-nbytes // block)
    first = np.concatenate([[0], np.cumsum(grid)]).astype(np.int64)
    at = np.arange(int(first[-1]), dtype=np.int64)
    aid = np.repeat(np.arange(len(nbytes)), grid)
    cells = offsets[aid] + (at - first[aid]) * block
    n = np.broadcast_to(nbytes, lo.shape)
    edges = [cells]
    for e in (lo, hi):
        keep = contiguous & (e >= 0) & (e < n)
        edges.append((e + offsets)[keep])
    return np.unique(np.concatenate(edges))


def owners_all(
    starts: I64, ends: I64, aid: I64, offsets: I64, lo: I64, hi: I64, contiguous: Bools
) -> I64:
    """:func:`owners` of every array at once: ``starts``/``ends`` are the extents' file
    offsets, ``aid`` each extent's array; ``lo``, ``hi`` per ``(rank, array)``."""
    out = np.full(len(starts), -1, np.int64)
    valid = contiguous & (hi > lo)
    count = valid.sum(axis=0)
    big = np.iinfo(np.int64).max
    lmin, lmax = np.where(valid, lo, big).min(axis=0), np.where(valid, lo, -1).max(axis=0)
    hmin, hmax = np.where(valid, hi, big).min(axis=0), np.where(valid, hi, -1).max(axis=0)
    same = (count > 1) & (lmin == lmax) & (hmin == hmax)  # a whole array on several ranks
    # (several pieces cover such an extent: dealt among them, so that no rank does them all)
    ranks = np.argsort(~valid, axis=0, kind="stable")  # each array's valid ranks first
    ex = same[aid]
    if ex.any():
        a = aid[ex]
        rel_s, rel_e = starts[ex] - offsets[a], ends[ex] - offsets[a]
        inside = (rel_s >= lmin[a]) & (rel_e <= hmax[a])
        first = np.searchsorted(aid, np.arange(len(offsets)))  # (aid is sorted)
        j = np.flatnonzero(ex)[inside]
        k = (j - first[aid[j]]) % count[aid[j]]
        got = out[ex]
        got[inside] = ranks[k, aid[j]]
        out[ex] = got
    pieces = valid & ~same  # other arrays: a piece that covers the extent whole
    arr, rk = np.nonzero(pieces.T)  # (array-major, rank order within: ties as owners())
    if len(arr) and (~ex).any():
        plo, phi = offsets[arr] + lo[rk, arr], offsets[arr] + hi[rk, arr]
        order = np.argsort(plo, kind="stable")
        plo, phi, prk = plo[order], phi[order], rk[order]
        sel = np.flatnonzero(~ex)
        k = np.searchsorted(plo, starts[sel], side="right") - 1
        ok = k >= 0
        kk = np.where(ok, k, 0)
        ok &= phi[kk] >= ends[sel]
        out[sel[ok]] = prk[kk[ok]]
    return out


def deal_all(uncovered: Bools, size: int) -> I64:
    """Ranks for the extents no piece covers, round-robin over all arrays' extents."""
    out = np.full(len(uncovered), -1, np.int64)
    out[uncovered] = np.arange(int(uncovered.sum())) % max(size, 1)
    return out


def ends_of(starts: I64, aid: I64, nbytes: I64) -> I64:
    """Where each extent ends (relative, as ``starts``): the next one's start in its
    array, the array's size for its last one."""
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    last = np.ones(len(starts), bool)
    last[:-1] = aid[1:] != aid[:-1]
    ends[last] = nbytes[aid[last]]
    return ends


_NONE = np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """Every extent of a set of arrays (in array order), and which rank checks it."""

    starts: I64  # within its array
    ends: I64
    aid: I64  # its array's index
    owner: I64  # the rank that checksums it from its piece in memory, or -1
    reader: I64  # the rank that reads it from the file for its checksum, or -1
    #: extents checked from parts held by several ranks (a load's: see :func:`parts`),
    #: and those parts, by extent then offset: (extent, lo, hi within the array, rank)
    joined: I64 = dataclasses.field(default_factory=lambda: _NONE)
    part: tuple[I64, I64, I64, I64] = (_NONE, _NONE, _NONE, _NONE)

    def counts(self, narrays: int) -> I64:
        return np.bincount(self.aid, minlength=narrays).astype(np.int64)


def assign(
    starts: I64, aid: I64, nbytes: I64, offsets: I64, spans: I64, *, join: bool = False
) -> Plan:
    """The owner (or reader) of every extent, from every rank's ``(lo, hi, contiguous,
    bytes)`` of each array (``spans``, indexed ``(rank, array)``); with ``join``, the
    extents no piece holds whole but the pieces of several ranks do are checked from
    those parts (:func:`parts`) and read by no rank."""
    ends = ends_of(starts, aid, nbytes)
    lo, hi, contig = spans[:, :, 0], spans[:, :, 1], spans[:, :, 2].astype(bool)
    base = offsets[aid]
    owner = owners_all(base + starts, base + ends, aid, offsets, lo, hi, contig)
    pending = owner < 0
    if not join or not pending.any():
        return Plan(starts, ends, aid, owner, deal_all(pending, spans.shape[0]))
    joined, (pe, plo, phi, prk) = parts(
        base + starts, base + ends, aid, offsets, lo, hi, contig, pending
    )
    pending[joined] = False
    pb = offsets[aid[pe]]
    return Plan(starts, ends, aid, owner, deal_all(pending, spans.shape[0]), joined,
                (pe, plo - pb, phi - pb, prk))  # fmt: skip


def parts(
    starts: I64,
    ends: I64,
    aid: I64,
    offsets: I64,
    lo: I64,
    hi: I64,
    contiguous: Bools,
    pending: Bools,
) -> tuple[I64, tuple[I64, I64, I64, I64]]:
    """The ``pending`` extents (file offsets) that the ranks' pieces hold whole between
    them, in arrays whose every piece is one range and no two overlap (row shards
    loaded at another rank count: an extent across a piece edge); and their parts,
    (extent, lo, hi, rank) in file offsets, by extent then offset.  Each byte of such
    an extent is in one piece: its rank checksums that part."""
    valid = hi > lo
    split = contiguous.all(axis=0) & disjoint(lo, hi)
    arr, rk = np.nonzero((valid & split[None, :]).T)
    plo, phi = offsets[arr] + lo[rk, arr], offsets[arr] + hi[rk, arr]
    order = np.argsort(plo, kind="stable")  # (disjoint: their ends are sorted too)
    plo, phi, prk = plo[order], phi[order], rk[order]
    ext = np.flatnonzero(pending & split[aid])
    s, e = starts[ext], ends[ext]
    a = np.searchsorted(phi, s, side="right")  # the first piece that ends after s
    count = np.maximum(np.searchsorted(plo, e, side="left") - a, 0)
    at = np.repeat(np.arange(len(ext)), count)
    idx = np.repeat(a - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
    p_lo, p_hi = np.maximum(plo[idx], s[at]), np.minimum(phi[idx], e[at])
    held = np.bincount(at, weights=(p_hi - p_lo).astype(float), minlength=len(ext))
    whole = (count > 0) & (held == (e - s))
    keep = whole[at]
    return ext[whole], (ext[at][keep], p_lo[keep], p_hi[keep], prk[idx][keep])


def plan(nbytes: I64, offsets: I64, spans: I64, block: int = BLOCK) -> Plan:
    """A save's extents (cut as :func:`cut` cuts, every array at once) and their ranks."""
    contig = spans[:, :, 2].astype(bool)
    cuts = cut_all(nbytes, offsets, spans[:, :, 0], spans[:, :, 1], contig, block)
    # (an empty array shares its offset with the next: the last array at or before wins)
    aid = np.searchsorted(offsets, cuts, side="right") - 1
    return assign(cuts - offsets[aid], aid, nbytes, offsets, spans)
