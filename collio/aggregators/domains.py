"""File domains and round windows (pure)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = [
    "active_domains", "call_domains", "file_domains", "spread_domains", "window_size",
    "alignment",
]  # fmt: skip

I64 = npt.NDArray[np.int64]


def alignment(backend_alignment: int, striping_unit: int | None) -> int:
    """Domain boundaries must be multiples of both the backend's unit and the stripe."""
    a = max(1, int(backend_alignment))
    if striping_unit:
        a = math.lcm(a, int(striping_unit))
    return a


#: Smallest window that ``min_rounds`` shrinks rounds to: below it the fixed cost of a
#: round (its agreement and messages) would outweigh what overlap gains.
MIN_WINDOW = 1 << 20
#: ... and not below this many bytes per rank of the communicator: when every rank has
#: bytes in every window (column blocks), each extra round is one more message from
#: each rank to each aggregator, and messages must stay large.  (At 65,536 ranks no
#: shrinking happens: 1 TiB of column blocks keeps 16 MiB rounds.)
MIN_SHARE = 1 << 16
_GRAIN = 1 << 16  # shrunk windows are whole 64 KiB units (page- and stripe-friendly)


def window_size(
    cb_buffer_size: int,
    align: int,
    largest_domain: int = 0,
    min_rounds: int = 1,
    nranks: int = 1,
    floor: int = 0,
) -> int:
    """Bytes per round, a multiple of ``align`` (at least one unit).

    ``cb_buffer_size`` is the largest round.  With ``min_rounds > 1`` the window
    shrinks until the largest domain takes about that many rounds, but not below
    :data:`MIN_WINDOW`, ``nranks`` x :data:`MIN_SHARE` or the backend's ``floor``
    (``Backend.min_window``): the first round's shuffle and the last round's write
    and sync are the parts of a call that nothing overlaps, so they must be a
    small share of it.  ``min_rounds=1`` is ROMIO's rule (one ``cb_buffer_size``
    per round).  Rounding to 64 KiB units and to ``align`` may leave fewer rounds.
    """
    w = int(cb_buffer_size)
    if min_rounds > 1 and largest_domain > 0:
        want = -(-int(largest_domain) // int(min_rounds))
        want = -(-want // _GRAIN) * _GRAIN
        w = min(w, max(MIN_WINDOW, int(nranks) * MIN_SHARE, int(floor), want))
    return max(align, (w // align) * align)


def file_domains(lo: int, hi: int, naggs: int, align: int = 1) -> I64:
    """Split ``[lo, hi)`` into ``naggs`` contiguous domains; return ``naggs + 1`` bounds.

    Interior boundaries are at even shares of the extent, rounded down to a
    multiple of ``align`` (absolute file offsets, like ROMIO's stripe-aligned
    domains), so no stripe, chunk or part has two owners.  Trailing domains may be
    empty when the extent is small.
    """
    if naggs < 1:
        raise ValueError(f"naggs={naggs} must be >= 1")
    hi = max(hi, lo)
    # a time series moves the same extent along the file: the bounds are those of the
    # same extent at lo's offset within an alignment unit, moved by whole units
    m = lo % align if align > 1 else 0
    return _domains_at(hi - lo, naggs, align, m) + (lo - m)


@functools.lru_cache(maxsize=8)
def _domains_at(span: int, naggs: int, align: int, lo: int) -> I64:
    """:func:`file_domains` of ``[lo, lo + span)`` (read-only: kept)."""
    hi = lo + span
    i = np.arange(naggs + 1, dtype=np.int64)
    span = hi - lo
    # lo + span*i//naggs without overflow for huge spans
    q, r = divmod(span, naggs)
    cuts = lo + q * i + (r * i) // naggs
    if align > 1:
        cuts = (cuts // align) * align
    cuts = np.clip(cuts, lo, hi)
    cuts[0], cuts[-1] = lo, hi
    got = np.maximum.accumulate(cuts).astype(np.int64)
    got.flags.writeable = False
    return got


def active_domains(naggs: int, span: int, min_domain: int) -> int:
    """How many of ``naggs`` aggregators take a domain of a call spanning ``span`` bytes:
    as many as domains of at least ``min_domain`` bytes fit (at least one; 0: all).

    A small call over every aggregator sends each of them a message from every rank
    whose bytes it holds; over fewer, fewer messages for the same bytes, as ROMIO's one
    aggregator per node.  A call of ``naggs * min_domain`` bytes or more keeps them all.
    """
    if min_domain <= 0 or naggs <= 1:
        return max(1, naggs)
    return max(1, min(naggs, int(span) // int(min_domain)))


def spread_domains(cuts: I64, naggs: int) -> I64:
    """``naggs + 1`` bounds from the ``k + 1`` bounds ``cuts`` of ``k`` domains: domain
    ``i`` of ``cuts`` goes to aggregator ``i * naggs // k``, the others' domains empty
    (so the active aggregators are spread over the nodes as all of them are)."""
    k = len(cuts) - 1
    if k >= naggs:
        return cuts
    return np.ascontiguousarray(cuts[_spread(k, naggs)], dtype=np.int64)


@functools.lru_cache(maxsize=8)
def _spread(k: int, naggs: int) -> I64:
    """Which of ``k + 1`` cuts each of the ``naggs + 1`` bounds is (read-only: kept, as
    every small call of a time series asks the same)."""
    active = np.arange(k, dtype=np.int64) * naggs // k
    # bounds[j] is the end of the active domains that start before j
    got = np.searchsorted(active, np.arange(naggs + 1, dtype=np.int64), side="left")
    before: I64 = got.astype(np.int64, copy=False)
    before.flags.writeable = False
    return before


def call_domains(
    lo: int,
    hi: int,
    naggs: int,
    align: int,
    min_domain: int,
    cut: Callable[[int, int, int, int], I64] = file_domains,
) -> tuple[I64, int]:
    """A call's ``naggs + 1`` domain bounds over ``[lo, hi)`` and how many domains are not
    empty (:func:`active_domains`), cut by ``cut`` (:func:`file_domains` or a backend's
    ``domain_bounds``) and spread (:func:`spread_domains`): the engine's and the
    simulator's one rule."""
    active = active_domains(naggs, hi - lo, min_domain)
    return spread_domains(cut(lo, hi, active, align), naggs), active
