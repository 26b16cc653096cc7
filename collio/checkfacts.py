"""The facts a call's head agrees on (:class:`Checked`), and how a rank finds its own.

Pure: no MPI.  The head is the one agreement before any byte moves
(:mod:`collio.check`); its record names every fact once (:mod:`collio.facts`).
"""

from __future__ import annotations

from typing import Any

from .collective import digest
from .facts import NOT_COMPARED, How, fact, record
from .itemsigs import ItemSigs
from .policy import PathFacts

__all__ = ["PLACED", "Checked", "digest_kept", "moved", "moved_by", "placed", "unzigzag", "zigzag"]


@record
class Checked(PathFacts):
    """The facts of a call's check, carried by its :func:`call_head` (beside the path's)."""

    sig: int | None = fact(How.EQUAL)  # digest of the global array (None: ranks differ)
    plan: int | None = fact(How.SAME)  # the kept plan's epoch found (-1: none; None: differ)
    # some rank's extent changed since the ranks compared them, other than all of them
    # moving by the same ``shift`` (a time series: that keeps the answer; see _moved)
    moved: bool = fact(How.ANY)
    shift: int | None = fact(How.EQUAL)
    items: int | None = fact(How.EQUAL)  # a batch's items (None: ranks pass different counts)
    # how far every rank's runs lie from the kept plan's (zigzag coded; None: ranks differ)
    plan_shift: int | None = fact(How.EQUAL)
    # every rank's caller vouched that no two ranks' runs overlap (a checkpoint's plan,
    # which proved it from every rank's pieces): each rank may do its own I/O, however
    # the ranks' extents interleave
    vouched: bool = fact(How.ALL)
    # every rank repeated its last call and did its I/O before this agreement
    # (collio.speculate); the target's size before the call (the smallest any rank that
    # wrote found); every failure was one of I/O; every rank's requests were its last
    # call's; the slowest I/O and call so far (nanoseconds)
    guessed: bool = fact(How.ALL)
    size: int = fact(How.MIN)
    io_only: bool = fact(How.ALL)
    same: bool = fact(How.ALL)
    t_io: int = fact(How.MAX)
    t_total: int = fact(How.MAX)


#: the last signature digested (without its offset) and its digest (one entry, replaced whole)
_SIG: list[tuple[Any, int]] = [(None, digest(None))]
#: :func:`placed` keeps the sum of a digest and an offset below every slot's limit
PLACED = (1 << 62) - 1


def digest_kept(sig: Any) -> tuple[int, int]:
    """:func:`digest` of a layout's signature without the byte offset where its array
    starts, kept for the next call with an equal one, and that offset (0: a signature
    without one).  A time series writes the same global array at a new offset each
    step: its calls digest alike (a tuple compare instead of a repr and a hash), so a
    repeat is guessed (:func:`collio.speculate.attempt`), and the head still compares
    the offsets (:func:`placed`)."""
    what, offset = sig, 0
    # (an array layout's signature: ("array", shape, dtype, order, offset); a batch's:
    # ("items", ItemSigs), whose first item's offset is its own, so that a batch moved
    # whole digests alike too)
    # (types first: a user's signature may hold arrays, whose == is elementwise)
    if type(sig) is tuple and len(sig) in (2, 5) and type(sig[0]) is str:
        if len(sig) == 5 and sig[0] == "array" and type(sig[4]) is int:
            what, offset = sig[:4], sig[4]
        elif len(sig) == 2 and sig[0] == "items" and type(sig[1]) is ItemSigs:
            rel, offset = sig[1].placement()
            what = ("items", rel)
    seen = _SIG[0]
    try:  # (equal values digest alike here: the ranks compare with == when digests differ)
        if type(what) is type(seen[0]) and bool(what == seen[0]):
            return seen[1], offset
    except (TypeError, ValueError):  # (a user's signature holding arrays)
        pass
    got = digest(what)
    # (only a signature of immutable values is kept: == takes an element for equal to
    # itself by identity, so a list or array changed in place would get the old digest)
    _SIG[0] = (what, got) if _frozen(what) else (None, digest(None))
    return got, offset


def placed(d: int, offset: int) -> int:
    """The head's ``sig`` fact of the global array digested ``d`` (:func:`digest_kept`)
    starting at byte ``offset``: equal on two ranks with equal digests only when the
    offsets are equal too (below 2**62); a signature not compared stays so."""
    return d if d < 0 else (d + offset) & PLACED


_SCALARS = (int, float, str, bytes, bool, type(None))


def _frozen(value: Any) -> bool:
    """Local: whether ``value`` is a scalar or a tuple of such, nested (a signature's few
    fields, checked when it is kept, not on every call)."""
    if type(value) is tuple:
        return all(_frozen(v) for v in value)
    return type(value) in _SCALARS


def zigzag(d: int) -> int:
    """A shift as a non-negative fact (:data:`How.EQUAL` compares those)."""
    return 2 * d if d >= 0 else -2 * d - 1


def unzigzag(z: int) -> int:
    return z // 2 if z % 2 == 0 else -(z + 1) // 2


def moved(before: tuple[int, int, bool] | None, lo: int, hi: int) -> dict[str, Any]:
    """This rank's ``moved`` and ``shift`` facts (:func:`moved_by`), by name."""
    m, shift = moved_by(before, lo, hi)
    return {"moved": m, "shift": shift}


def moved_by(before: tuple[int, int, bool] | None, lo: int, hi: int) -> tuple[bool, int]:
    """This rank's ``moved`` and ``shift`` facts: its extent moved by ``shift`` (zigzag
    coded, so never negative) keeping its width, or it is empty now as then
    (``NOT_COMPARED``), or ``moved``."""
    if before is None:
        return True, NOT_COMPARED
    plo, phi = before[0], before[1]
    if hi <= lo and phi <= plo:
        return False, NOT_COMPARED
    if hi <= lo or phi <= plo or hi - lo != phi - plo:
        return True, NOT_COMPARED
    d = lo - plo  # (zigzag, inline: every repeated call asks)
    return False, 2 * d if d >= 0 else -2 * d - 1
