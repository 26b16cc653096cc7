"""A batch's item signatures and the short key the ranks' digest of them hashes.

Item ``k`` of every rank describes the same global array, so a batch's signature is
its items' signatures in order.  The ranks compare a digest of its ``repr``; 200 full
signature tuples printed cost as much as the rest of a batch's local check, so the
repr is a key built from numpy arrays: the distinct signatures but for their offsets,
then which one each item has and its offset, as hex of int64 arrays.  Pure: no MPI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ItemSigs", "array_sigs", "key_of", "sig_key", "split_sig"]

_I64_MAX = 2**63 - 1


class ItemSigs(tuple):  # type: ignore[type-arg]
    """The items' signatures, one per item, as a tuple whose ``repr`` (what the ranks'
    digest of a call's signature hashes) is :func:`sig_key` of them; equal sequences
    have equal keys whichever way they were made."""

    _key: str

    def __new__(cls, sigs: Any, key: str | None = None) -> ItemSigs:
        self = super().__new__(cls, sigs)
        self._key = sig_key(self) if key is None else key
        return self

    def __repr__(self) -> str:
        return self._key

    def __reduce__(self) -> Any:  # (sent whole to every rank when the ranks disagree)
        return (ItemSigs, (tuple(self), self._key))


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
    """The key of items whose signatures are ``prefixes[which[k]]`` at ``offsets[k]``."""
    ids = np.asarray(which, np.int64).tobytes().hex()
    offs = np.asarray(offsets, np.int64).tobytes().hex()
    return f"items[{'; '.join(prefixes)}] {ids} {offs}"


def sig_key(sigs: Sequence[Any]) -> str:
    """The canonical short key of a sequence of item signatures (see :class:`ItemSigs`)."""
    seen: dict[str, int] = {}
    which, offsets = [], []
    for sig in sigs:  # (the per-item path; a box batch makes the key from its arrays)
        prefix, offset = split_sig(sig)
        which.append(seen.setdefault(prefix, len(seen)))
        offsets.append(offset)
    return key_of(list(seen), which, offsets)


def array_sigs(heads: Sequence[tuple[Any, ...]], group: Any, offsets: Any) -> ItemSigs:
    """The signatures of array layouts whose signature but for the offset is
    ``heads[group[k]]`` (the first four fields of :meth:`ArrayLayout.signature`) and whose
    offset is ``offsets[k]`` (non-negative int64), and their key, in a few C-level passes
    (no Python per item: a batch of 200 pays it on every call)."""
    seen: dict[str, int] = {}
    ids = np.fromiter((seen.setdefault(repr(h), len(seen)) for h in heads), np.int64, len(heads))
    which = ids[group]
    offs = offsets.tolist()
    # (each signature is its head plus a 1-tuple of its offset: tuple + tuple, in C)
    sigs = map(tuple.__add__, map(heads.__getitem__, group.tolist()), zip(offs))
    return ItemSigs(sigs, key_of(list(seen), which, offsets))
