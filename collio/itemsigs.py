"""A batch's item signatures and the short key the ranks' digest of them hashes.

Item ``k`` of every rank describes the same global array, so a batch's signature is
its items' signatures in order.  The ranks compare a digest of its ``repr``; 200 full
signature tuples printed cost as much as the rest of a batch's local check, so the
repr is a key built from numpy arrays: the distinct signatures but for their offsets,
then the number of items and a 128-bit BLAKE2b hash of which one each item has and its
offset (int64 arrays): the ranks' digest of the key is 56 bits, so the hash in between
weakens nothing, and hashing the arrays' bytes costs a third of printing them for the
digest to hash.  Pure: no MPI.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["ItemSigs", "array_sigs", "key_of", "sig_key", "sig_parts", "split_sig"]

_I64_MAX = 2**63 - 1


class ItemSigs(Sequence[Any]):
    """The items' signatures, one per item, as a sequence whose ``repr`` (what the ranks'
    digest of a call's signature hashes) is :func:`sig_key` of them; equal sequences
    have equal keys whichever way they were made.

    Made from the signatures, or from their key and a function that makes them
    (``make``): the ranks compare the key's digest, and the signatures themselves are
    looked at only when the digests differ (:func:`collio.mismatch.raise_mismatch`), so
    a batch that agrees never builds its items' signature tuples."""

    __slots__ = ("_key", "_sigs", "_make")

    def __init__(
        self, sigs: Any = None, key: str | None = None, *,
        make: Callable[[], Iterable[Any]] | None = None,
    ) -> None:  # fmt: skip
        self._make = make
        if sigs is None and make is None:
            sigs = ()
        self._sigs: tuple[Any, ...] | None = None if sigs is None else tuple(sigs)
        if key is None:
            key = sig_key(self.signatures())
        self._key = key

    def signatures(self) -> tuple[Any, ...]:
        """The signatures, made now if they were not (``make`` is kept: two threads that
        ask at once make equal tuples, and either may stay)."""
        sigs = self._sigs
        if sigs is None:
            assert self._make is not None  # (made with neither: no signatures, ())
            sigs = self._sigs = tuple(self._make())
        return sigs

    def __repr__(self) -> str:
        return self._key

    def placement(self) -> tuple[str, int]:
        """The key without where the first item's array starts, and that offset: equal
        for two batches of the same arrays, one moved whole from the other."""
        rel, at, base = self._key.rpartition(" @")
        if not at or not base.isdigit():  # (a key not made by key_of: compared whole)
            return self._key, 0
        return rel, int(base)

    def __len__(self) -> int:
        return len(self.signatures())

    @overload
    def __getitem__(self, k: int) -> Any: ...
    @overload
    def __getitem__(self, k: slice) -> tuple[Any, ...]: ...
    def __getitem__(self, k: Any) -> Any:
        return self.signatures()[k]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.signatures())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ItemSigs):
            other = other.signatures()
        if not isinstance(other, tuple):
            return NotImplemented
        return self.signatures() == other

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self) -> Any:  # (sent whole to every rank when the ranks disagree)
        return (ItemSigs, (self.signatures(), self._key))


def split_sig(sig: Any) -> tuple[str, int]:
    """An array layout's signature as (repr of all but its offset, offset); any other
    signature whole, offset 0."""
    if (
        type(sig) is tuple
        and len(sig) == 5
        and sig[0] == "array"
        and type(sig[4]) is int
        and 0 <= sig[4] <= _I64_MAX
    ):
        return repr(sig[:4]), sig[4]
    return repr(sig), 0


def key_of(prefixes: Sequence[str], which: Any, offsets: Any) -> str:
    """The key of items whose signatures are ``prefixes[which[k]]`` at ``offsets[k]``:
    the offsets hashed from the first item's, which ends the key (``@offset``), so a
    batch moved whole (a time series' next step) differs from the last one only there
    (:meth:`ItemSigs.placement`)."""
    ids = np.asarray(which, np.int64)
    at = np.asarray(offsets, np.int64)
    base = int(at[0]) if len(at) else 0
    h = hashlib.blake2b(ids.tobytes(), digest_size=16)
    h.update((at - base).tobytes())
    return f"items[{'; '.join(prefixes)}] {len(ids)} {h.hexdigest()} @{base}"


def sig_key(sigs: Sequence[Any]) -> str:
    """The canonical short key of a sequence of item signatures (see :class:`ItemSigs`)."""
    seen: dict[str, int] = {}
    which, offsets = [], []
    for sig in sigs:  # (the per-item path; a box batch makes the key from its arrays)
        prefix, offset = split_sig(sig)
        which.append(seen.setdefault(prefix, len(seen)))
        offsets.append(offset)
    return key_of(list(seen), which, offsets)


def array_sigs(
    heads: Sequence[tuple[Any, ...]], group: Any, offsets: Any,
    parts: tuple[list[str], Any] | None = None,
) -> ItemSigs:  # fmt: skip
    """The signatures of array layouts whose signature but for the offset is
    ``heads[group[k]]`` (the first four fields of :meth:`ArrayLayout.signature`; groups
    numbered in order of their first items) and whose offset is ``offsets[k]``
    (non-negative int64): their key, in a few C-level passes (no Python per item: a
    batch of 200 pays it on every call), and the signatures only if they are asked for.
    ``parts``: :func:`sig_parts` of these heads and groups, found before (they do not
    depend on the offsets: a time series' next batch has them)."""
    prefixes, which = parts if parts is not None else sig_parts(heads, group)

    def make() -> Iterable[Any]:
        # (each signature is its head plus a 1-tuple of its offset: tuple + tuple, in C)
        return map(tuple.__add__, map(heads.__getitem__, group.tolist()), zip(offsets.tolist()))

    return ItemSigs(key=key_of(prefixes, which, offsets), make=make)


def sig_parts(heads: Sequence[tuple[Any, ...]], group: Any) -> tuple[list[str], Any]:
    """What the key of :func:`array_sigs` takes besides the offsets: the distinct heads'
    reprs, and which of them each item has (int64)."""
    seen: dict[str, int] = {}
    ids = np.fromiter((seen.setdefault(repr(h), len(seen)) for h in heads), np.int64, len(heads))
    return list(seen), ids[group]
