"""A call's check keeps the last layout signature's digest only for immutable signatures."""

from __future__ import annotations

from mpi4py import MPI  # noqa: F401  (as every mpi4py program starts)

from collio.checkfacts import digest_kept as _digest
from collio.collective import digest


def test_a_signature_changed_in_place_is_digested_anew() -> None:
    shape = [64, 64]
    sig = ("custom", shape)
    first = _digest(sig)
    assert first == digest(sig)
    shape[1] = 65  # the same tuple object, other contents
    assert _digest(sig) == digest(("custom", [64, 65])) != first


def test_an_equal_immutable_signature_gets_the_kept_digest() -> None:
    a = ("array", (64, 64), "<f8", "C")
    b = ("array", (64, 64), "<f8", "C")
    assert _digest(a) == _digest(b) == digest(b)
    assert _digest(("array", (64, 65), "<f8", "C")) != digest(b)
