"""The checkpoint's checksums: which CRC a format version uses (:class:`Algo`), the CRC of
two ranges from the CRC of each (zlib's ``crc32_combine``), for many at once, and the
CRC of consecutive pieces of one buffer.

Version 3 sums with CRC-32 (zlib's polynomial), computed by zlib-ng, whose folding with
carry-less multiplies (VPCLMULQDQ) sums at about twice the rate of the crc32 instruction
that computes CRC-32C on x86-64: a save sums every byte it writes, and a load every byte
it reads.  Versions 1 and 2 sum with CRC-32C, and are still read.  Both are linear CRCs:
a combine is the same for both, by polynomial.

A resharded load holds an extent's bytes in two (or more) ranks' pieces: each rank
checksums its part from memory, and the parts' checksums combine into the extent's,
so no byte is read twice.  ``crc(A + B)`` is ``crc(A)`` advanced over ``len(B)`` zero
bytes, xor ``crc(B)``; the advance is a linear map over GF(2), a 32x32 bit matrix per
power of two of the length, applied a byte at a time by table.  Pure numpy: all
combines of a load at once, a hexadecimal digit of the lengths at a time (four lookups
per digit of the longest length, a table per digit value), a fourth of the steps of
one per bit: a resharded load combines a few hundred checksums, where each step's numpy
calls cost more than their lookups.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BY_VERSION", "CRC32", "CRC32C", "Algo", "combine", "fold", "for_version"]

U32 = npt.NDArray[np.uint32]
#: CRC-32C (Castagnoli), reflected
POLY32C = 0x82F63B78
#: CRC-32 (zlib's, ISO-HDLC), reflected
POLY32 = 0xEDB88320
#: Lengths up to 2**BITS bytes
BITS = 48


def _times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _square(mat: list[int]) -> list[int]:
    return [_times(mat, mat[n]) for n in range(32)]


@functools.cache
def _zeros(poly: int) -> npt.NDArray[np.uint32]:
    """``ops[k][i]``: the image of bit ``i`` of a CRC advanced over ``2**k`` zero bytes."""
    one_bit = [poly] + [1 << n for n in range(31)]
    mat = _square(_square(_square(one_bit)))  # 8 zero bits: one zero byte
    ops = []
    for _ in range(BITS):
        ops.append(mat)
        mat = _square(mat)
    return np.array(ops, np.uint32)


@functools.cache
def _tables(poly: int) -> npt.NDArray[np.uint32]:
    """``tab[k, b, v]``: the image of byte ``b`` of a CRC being ``v``, advanced over ``2**k``
    zero bytes: the xor of the images of ``v``'s bits (an advance is four lookups)."""
    ops = _zeros(poly).reshape(BITS, 4, 8)  # (the images of bit 8 * b + j)
    bits = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)  # (v, j)
    picked = np.where(bits[None, None], ops[:, :, None, :], np.uint32(0))
    tab: U32 = np.bitwise_xor.reduce(picked, axis=-1).astype(np.uint32)
    return tab


def _advance(tab: U32, crc: U32) -> U32:
    out: U32 = tab[0][crc & 0xFF] ^ tab[1][(crc >> 8) & 0xFF]
    out ^= tab[2][(crc >> 16) & 0xFF] ^ tab[3][crc >> 24]
    return out


#: Bits of the length one step of :func:`combine` advances by (a hexadecimal digit)
DIGIT = 4


@functools.cache
def _digit(k: int, poly: int) -> U32:
    """``tab[d, b, v]``: the image of byte ``b`` of a CRC being ``v``, advanced over
    ``d * 16**k`` zero bytes (``d`` 0 to 15; 0 the identity), built once from the
    power-of-two advances of digit ``k``'s bits."""
    tabs = _tables(poly)
    bits = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)  # (v, j)
    img = np.tile(np.uint32(1) << np.arange(32, dtype=np.uint32), (1 << DIGIT, 1))
    for j in range(DIGIT):  # (each digit value's images of the 32 bits)
        on = ((np.arange(1 << DIGIT) >> j) & 1).astype(bool)
        img[on] = _advance(tabs[DIGIT * k + j], img[on])
    ops = img.reshape(1 << DIGIT, 4, 1, 8)  # (the images of bit 8 * b + j)
    picked = np.where(bits[None, None], ops, np.uint32(0))
    tab: U32 = np.bitwise_xor.reduce(picked, axis=-1).astype(np.uint32)
    return tab


@functools.cache
def _flat_digit(k: int, poly: int) -> U32:
    """:func:`_digit`'s table flat: entry ``(d << 10) + (b << 8) + v``."""
    return _digit(k, poly).reshape(-1)


def combine(crc1: U32, crc2: U32, len2: npt.NDArray[np.int64], poly: int) -> U32:
    """The CRC of each ``A + B`` (by the reflected polynomial ``poly``), given ``crc(A)``,
    ``crc(B)`` and ``len(B)``.

    (Each step takes from the flat table at indices summed from the digit and each byte,
    in 64-bit integers (a CRC of 2**31 or more stays positive where an index is
    32 bits): one ``take`` per byte, where indexing the 3-d table took two index
    arrays and a conversion of the CRCs to indices for each lookup.)"""
    out = np.asarray(crc1, np.uint32).astype(np.int64)
    n = np.asarray(len2, np.int64)
    for k in range(BITS // DIGIT):
        if not bool(n.any()):
            break
        tab = _flat_digit(k, poly)
        d = (n & ((1 << DIGIT) - 1)) << 10  # (a zero digit's table is the identity)
        out = (tab.take(d + (out & 0xFF)) ^ tab.take(d + (256 + ((out >> 8) & 0xFF)))
               ^ tab.take(d + (512 + ((out >> 16) & 0xFF)))
               ^ tab.take(d + (768 + (out >> 24)))).astype(np.int64)  # fmt: skip
        n = n >> DIGIT
    got: U32 = out.astype(np.uint32) ^ np.asarray(crc2, np.uint32)
    return got


def fold(got: U32, lens: npt.NDArray[np.int64], first: npt.NDArray[np.int64],
         count: npt.NDArray[np.int64], poly: int) -> U32:  # fmt: skip
    """The CRC of each group of consecutive parts: group ``g`` is parts ``first[g]``
    to ``first[g] + count[g] - 1`` of ``got`` (their CRCs) and ``lens`` (their
    lengths), in order; an empty group's is 0, the CRC of nothing.  One
    :func:`combine` of every group at once per part after the first (groups have few)."""
    crc = np.zeros(len(first), np.uint32)
    some = count > 0
    crc[some] = got[first[some]]
    for j in range(1, int(count.max(initial=1))):
        more = count > j
        at = first[more] + j
        crc[more] = combine(crc[more], got[at], lens[at], poly)
    return crc


class Algo:
    """A format version's checksum: its name in the index, its polynomial (for
    :func:`combine`), and :attr:`fn`, the library's ``fn(data, value)`` (a C-contiguous
    buffer; ``value``, positional, the CRC of the bytes before, to go on from; the GIL
    released while it sums more than a few KiB).  The first of ``modules`` that imports
    gives it, when first used: ``import collio`` needs none; zlib-ng's CRC-32 falls back
    on the standard library's, the same values at a fraction of the speed."""

    __slots__ = ("name", "poly", "_modules", "_fn")

    def __init__(self, name: str, poly: int, *modules: str) -> None:
        self.name, self.poly, self._modules = name, poly, modules
        self._fn: Callable[..., int] | None = None

    @property
    def fn(self) -> Callable[..., int]:
        if self._fn is None:
            for i, where in enumerate(self._modules):
                mod, _, attr = where.rpartition(".")
                try:
                    self._fn = getattr(importlib.import_module(mod), attr)
                    break
                except ImportError:
                    if i == len(self._modules) - 1:
                        raise
        assert self._fn is not None
        return self._fn

    def of(self, data: Any, value: int = 0) -> int:
        return self.fn(data, value)

    def fold(self, got: U32, lens: npt.NDArray[np.int64], first: npt.NDArray[np.int64],
             count: npt.NDArray[np.int64]) -> U32:  # fmt: skip
        return fold(got, lens, first, count, self.poly)

    def of_pieces(self, buf: npt.NDArray[np.uint8], lens: npt.NDArray[np.int64]) -> U32:
        """The CRC of each of the consecutive pieces of ``buf`` of lengths ``lens`` (one
        call of the library per piece: each is an extent, not a byte run)."""
        fn = self.fn
        view = buf.data
        cuts = np.concatenate([[0], np.cumsum(lens)]).tolist()
        return np.asarray(
            [fn(view[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)], np.uint32
        )

    def __repr__(self) -> str:
        return f"<checksum {self.name}>"


#: CRC-32C (Castagnoli): format versions 1 and 2
CRC32C = Algo("crc32c", POLY32C, "crc32c.crc32c")
#: CRC-32 (zlib's): format version 3
CRC32 = Algo("crc32", POLY32, "zlib_ng.zlib_ng.crc32", "zlib.crc32")
#: Each format version's checksum
BY_VERSION = {1: CRC32C, 2: CRC32C, 3: CRC32}


def for_version(version: int) -> Algo:
    """The checksum of a format version (a KeyError for one no reader knows)."""
    return BY_VERSION[version]
