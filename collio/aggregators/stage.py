"""The intra-node stage of two-level aggregation (pure: numpy in, numpy out).

A local aggregator receives the pieces of the ranks of its group (each rank's
pieces already cut at file domains and round windows, :func:`plan_sender`), puts
them in file order and sends them on to the file-domain aggregators as if they
were its own runs.  Its "buffer" is virtual: piece ``i`` in file order sits at
virtual position ``v[i]`` (the bytes before it), so runs that touch in the file
merge into one.  Per round it holds only that round's bytes, in a staging buffer
where each of its messages to a domain aggregator is one contiguous slice.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from ..runs import Runs, displacements, merge
from .plan import SenderPlan

__all__ = [
    "MIN_SLOTS",
    "Staging",
    "by_round",
    "holders",
    "leader_runs",
    "round_bytes",
    "slots",
    "staging",
    "subplan",
]

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]
#: Fewest staging slots of a local group: a round filling, one in flight, one more.
MIN_SLOTS = 3
#: The slots of a group take up to this many ``cb_buffer_size``\ s (more than
#: :data:`MIN_SLOTS` when rounds are small): each slot more lets the group's ranks copy
#: one more round ahead of the local aggregator's sends, instead of waiting for them.
SLOT_BUFFERS = 4


def leader_runs(file: I64, length: I64) -> tuple[Runs, I64]:
    """A local aggregator's runs from the pieces it received, and each piece's virtual
    position (in the order received).

    Pieces are put in file order (stable), each at its own virtual position, and
    neighbours contiguous in the file are merged.
    """
    order = np.argsort(file, kind="stable")
    ln = length[order]
    v = displacements(ln)
    vpos = np.empty(len(order), np.int64)
    vpos[order] = v
    return merge(Runs(file[order], ln.astype(np.int64), v)), vpos


@dataclasses.dataclass(frozen=True, slots=True)
class Staging:
    """Where a local aggregator's pieces sit in its per-round staging buffer.

    ``sender`` is its stage-two plan with each piece's ``mem`` its position in the
    staging buffer of its round; ``spos``/``sround`` are the staging position and the
    round of every piece it received (in the order received); ``size`` is the largest
    round's staging bytes.
    """

    sender: SenderPlan
    spos: I64
    sround: I64
    size: int


def round_bytes(sp: SenderPlan, sround: I64, nrounds: int, staged: Mask | None = None) -> I64:
    """Bytes of each of the ``nrounds`` rounds of a sender plan (``sround``: its groups'),
    of its ``staged`` groups only when given."""
    if not sp.ngroups:
        return np.zeros(nrounds, np.int64)
    gtot = np.add.reduceat(sp.pieces.length, sp.gstart[:-1])
    if staged is not None:
        gtot = np.where(staged, gtot, 0)
    return np.bincount(sround, weights=gtot, minlength=nrounds)[:nrounds].astype(np.int64)


def subplan(sp: SenderPlan, keep: Mask) -> tuple[SenderPlan, npt.NDArray[np.intp]]:
    """The groups ``keep`` marks of a sender plan, and the indices of their pieces."""
    gsize = np.diff(sp.gstart)
    picks = np.flatnonzero(np.repeat(keep, gsize))
    start = np.concatenate(([0], np.cumsum(gsize[keep]))).astype(np.int64)
    per_dom = np.bincount(sp.gdom[keep], weights=gsize[keep], minlength=len(sp.per_dom))
    sub = SenderPlan(sp.pieces.take(picks), start, sp.gdom[keep], sp.gwin[keep],
                     per_dom.astype(np.int64))  # fmt: skip
    return sub, picks


def staging(
    sp: SenderPlan, sround: I64, vpos: I64, base: I64 | None = None, staged: Mask | None = None
) -> Staging:
    """Lay out each round's groups one after another in the staging buffer, from
    ``base[k]`` in round ``k`` (0 when None: the ranks of a local group that hold parts
    of its stage-two plan lay theirs out one after another in the same slot).

    ``sp`` is the stage-two sender plan over virtual positions, ``sround`` the round
    of each of its groups, ``vpos`` virtual positions of received pieces (a received
    piece lies inside one piece of ``sp``: both are cut at the same domain bounds and
    windows).  ``staged``: the groups that go through the staging (None: all); the
    others' pieces keep their memory (the rank's own buffer), and no ``vpos`` is theirs.
    """
    if staged is not None and not bool(staged.all()):
        sub, picks = subplan(sp, staged)
        lay = staging(sub, sround[staged], vpos, base)
        mem = sp.pieces.mem.copy()
        mem[picks] = lay.sender.pieces.mem
        p = sp.pieces
        whole = dataclasses.replace(sp, pieces=Runs(p.file, p.length, mem))
        return Staging(whole, lay.spos, lay.sround, lay.size)
    p = sp.pieces
    ng = sp.ngroups
    gsize = np.diff(sp.gstart)
    gof = np.repeat(np.arange(ng, dtype=np.int64), gsize)
    csum = displacements(p.length)
    within = csum - csum[sp.gstart[:-1]][gof] if len(p) else csum
    gtot = np.bincount(gof, weights=p.length, minlength=ng).astype(np.int64)
    # each round's groups in group order, from 0
    gorder = np.argsort(sround, kind="stable")
    start_sorted = displacements(gtot[gorder])
    round_sorted = sround[gorder]
    first = np.searchsorted(round_sorted, round_sorted, side="left")
    gstage = np.empty(ng, np.int64)
    gstage[gorder] = start_sorted - start_sorted[first] if ng else start_sorted
    if base is not None and ng:
        gstage += base[sround]
    mem = gstage[gof] + within
    per_round = np.bincount(sround, weights=gtot).astype(np.int64) if ng else np.zeros(0, np.int64)
    if base is not None and ng:
        per_round = per_round + base[: len(per_round)]
    # the piece of ``sp`` holding each received piece: by virtual position
    jorder = np.argsort(p.mem, kind="stable")
    at = np.searchsorted(p.mem[jorder], vpos, side="right") - 1
    j = jorder[np.maximum(at, 0)] if len(p) else np.zeros(0, np.int64)
    spos = mem[j] + (vpos - p.mem[j]) if len(j) else np.zeros(0, np.int64)
    srnd = sround[gof[j]] if len(j) else np.zeros(0, np.int64)
    laid = dataclasses.replace(sp, pieces=Runs(p.file, p.length, mem))
    size = int(per_round.max(initial=0))
    return Staging(laid, spos.astype(np.int64), srnd.astype(np.int64), size)


def holders(domains: I64, members: I64) -> I64:
    """The rank of a local group (``members``, sorted) that sends (writes) or receives
    (reads) the group's message of each file domain in ``domains``: domain ``d``'s is
    ``members[d % len(members)]``, so the group's messages, and the copies MPI makes
    for them, spread over its ranks, while each aggregator still hears from one rank
    per group."""
    return members[domains % len(members)]


def by_round(rounds: I64, nrounds: int, key: I64 | None = None) -> tuple[I64, I64]:
    """Indices ordered by round (then by ``key``, then as given), and where each of the
    ``nrounds`` rounds starts (``nrounds + 1`` entries)."""
    idx = np.arange(len(rounds), dtype=np.int64)
    order = np.lexsort((idx, rounds) if key is None else (idx, key, rounds)).astype(np.int64)
    counts = np.bincount(rounds, minlength=nrounds)[:nrounds]
    return order, np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def slots(slot_bytes: int, nrounds: int, cb_buffer_size: int) -> int:
    """Staging slots of a local group whose rounds take ``slot_bytes`` each: as many as
    :data:`SLOT_BUFFERS` x ``cb_buffer_size`` holds, at least :data:`MIN_SLOTS`, and no
    more than the call's rounds and one (then no rank ever waits for a free slot)."""
    fit = SLOT_BUFFERS * int(cb_buffer_size) // max(int(slot_bytes), 1)
    return int(max(MIN_SLOTS, min(fit, int(nrounds) + 1)))
