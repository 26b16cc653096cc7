"""What each call of the size sweep moves: one step of a time series, in one of two patterns.

Step ``k`` of a size holds every rank's piece once, and steps follow each other in the
file, so each call writes bytes no earlier call wrote (as a time series appends one step
after the other).  Every float64 of a sweep file holds its own element index plus one, so
any region read back is checked against ``np.arange`` without a stored copy, and a step
written in the wrong place, or not at all, shows.

``contiguous``
    Rank r's ``size`` bytes at ``r * size`` within the step: one run per rank.
``strided``
    The step is a ``(runs, ranks * c)`` float64 matrix in C order and rank r holds the
    columns ``[r * c, (r + 1) * c)``: ``runs`` runs per rank, interleaved across ranks
    (column blocks).  A size of fewer than ``runs`` elements has one run per element.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from ...layouts import Subarray

__all__ = ["DTYPE", "ITEMSIZE", "PATTERNS", "Step", "as_bytes", "check_sizes", "expected", "words"]

PATTERNS = ("contiguous", "strided")
DTYPE = "<f8"
ITEMSIZE = 8
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """The steps of one pattern and size (bytes per rank per call) for ``nranks`` ranks."""

    pattern: str
    size: int
    nranks: int
    runs: int = 64

    @property
    def elements(self) -> int:
        """float64 elements per rank per step."""
        return self.size // ITEMSIZE

    @property
    def rows(self) -> int:
        """Runs per rank: 1 for ``contiguous``."""
        return 1 if self.pattern == "contiguous" else min(self.runs, self.elements)

    @property
    def cols(self) -> int:
        """Elements per run."""
        return self.elements // self.rows

    @property
    def step_bytes(self) -> int:
        """Bytes of one step (every rank's piece)."""
        return self.size * self.nranks

    @property
    def step_elements(self) -> int:
        return self.elements * self.nranks

    @property
    def local_shape(self) -> tuple[int, ...]:
        return (self.elements,) if self.pattern == "contiguous" else (self.rows, self.cols)

    def describe(self) -> str:
        if self.pattern == "contiguous":
            return f"contiguous, {self.size} B per rank"
        return f"strided, {self.rows} runs of {self.cols * ITEMSIZE} B per rank"

    def layout(self, rank: int, step: int) -> Subarray:
        """Rank ``rank``'s piece of step ``step`` as collio's layout."""
        offset = step * self.step_bytes
        n = self.elements
        if self.pattern == "contiguous":
            return Subarray((n * self.nranks,), (n * rank,), (n,), DTYPE, offset=offset)
        shape = (self.rows, self.cols * self.nranks)
        return Subarray(shape, (0, rank * self.cols), (self.rows, self.cols), DTYPE, offset=offset)

    def byte_offset(self, rank: int, step: int) -> int:
        """Where rank ``rank``'s piece of a contiguous step starts in the file."""
        return step * self.step_bytes + rank * self.size

    def first(self, rank: int) -> F64:
        """Rank ``rank``'s data of step 0 (step k adds ``k * step_elements``)."""
        if self.pattern == "contiguous":
            pos: I64 = rank * self.elements + np.arange(self.elements, dtype=np.int64)
        else:
            rows = np.arange(self.rows, dtype=np.int64)[:, None] * (self.cols * self.nranks)
            pos = rows + rank * self.cols + np.arange(self.cols, dtype=np.int64)[None, :]
        return (pos + 1).astype(np.float64)

    def share(self, rank: int) -> tuple[int, int]:
        """The elements ``[lo, hi)`` of a step that rank ``rank`` checks in a written file."""
        n = self.step_elements
        return n * rank // self.nranks, n * (rank + 1) // self.nranks


def expected(lo: int, hi: int) -> F64:
    """What the file's float64 elements ``[lo, hi)`` hold."""
    return np.arange(lo + 1, hi + 1, dtype=np.float64)


def check_sizes(sizes: list[int], runs: int) -> None:
    """Raise ValueError for a size the patterns cannot split (pure, the same on every rank)."""
    if runs < 1:
        raise ValueError(f"--runs {runs}: at least one run per rank")
    for size in sizes:
        if size < ITEMSIZE or size % ITEMSIZE:
            raise ValueError(f"size {size}: the sweep moves float64, give multiples of 8 bytes")
        rows = min(runs, size // ITEMSIZE)
        if (size // ITEMSIZE) % rows:
            raise ValueError(
                f"size {size}: strided splits it into {rows} runs; give a multiple of "
                f"{rows * ITEMSIZE} bytes"
            )


def as_bytes(arr: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """A contiguous array's bytes (ROMIO's buffers)."""
    return arr.reshape(-1).view(np.uint8)


def words(arr: npt.NDArray[Any]) -> npt.NDArray[np.uint64]:
    """A contiguous float64 array's elements as 8-byte words: compared bit for bit, so
    every byte counts and a NaN left by a read that never happened differs."""
    return arr.reshape(-1).view(np.uint64)
