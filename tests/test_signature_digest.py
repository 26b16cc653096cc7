"""A call's check keeps the last layout signature's digest only for immutable signatures,
and digests an array's signature without its offset, which the head compares apart."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI  # noqa: F401  (as every mpi4py program starts)

from collio.checkfacts import digest_kept as _digest
from collio.checkfacts import placed
from collio.collective import digest
from collio.facts import NOT_COMPARED
from collio.layouts import Subarray


def test_a_signature_changed_in_place_is_digested_anew() -> None:
    shape = [64, 64]
    sig = ("custom", shape)
    first = _digest(sig)
    assert first == (digest(sig), 0)
    shape[1] = 65  # the same tuple object, other contents
    assert _digest(sig) == (digest(("custom", [64, 65])), 0) != first


def test_an_equal_immutable_signature_gets_the_kept_digest() -> None:
    a = ("array", (64, 64), "<f8", "C")
    b = ("array", (64, 64), "<f8", "C")
    assert _digest(a) == _digest(b) == (digest(b), 0)
    assert _digest(("array", (64, 65), "<f8", "C"))[0] != digest(b)


def test_a_time_series_digests_alike_and_its_offsets_apart() -> None:
    """The steps of a time series (one global array, a new offset each) have one digest,
    so a repeat is guessed; the head's fact still tells the offsets apart."""
    steps = [Subarray((8, 8), (0, 0), (8, 4), np.float64, offset=k * 512) for k in range(3)]
    got = [_digest(lay.signature()) for lay in steps]
    assert [off for _, off in got] == [0, 512, 1024]
    d = got[0][0]
    assert all(g[0] == d for g in got)
    assert d == digest(steps[2].signature()[:4])
    assert len({placed(d, off) for _, off in got}) == 3
    other = _digest(Subarray((8, 9), (0, 0), (8, 4), np.float64, offset=512).signature())
    assert other[0] != d and placed(*other) != placed(d, 512)
    assert placed(NOT_COMPARED, 512) == NOT_COMPARED  # (not compared stays so)


def test_a_signature_holding_an_array_is_digested_whole() -> None:
    """A user's signature of five fields whose first is an array is not taken for an
    array layout's (whose == would be elementwise): digested whole, at offset 0."""
    sig = (np.arange(3), (4, 4), "<f8", "C", 0)
    assert _digest(sig) == (digest(sig), 0)
