"""Pure planning for the S3 backend: targets, part sizes, parts and holes of a window.

No boto3 and no MPI here: plain values and numpy arrays in and out, so
the rules S3 imposes on a multipart upload are tested without a server.
"""

from __future__ import annotations

import dataclasses
import errno
import re
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import BackendError
from ...redact import redact_text, shown

__all__ = [
    "MAX_PARTS",
    "MAX_PART_SIZE",
    "MIN_PART_SIZE",
    "PartPlan",
    "S3Target",
    "coalesce",
    "holes",
    "parse_target",
    "plan_part_size",
    "split_ranges",
]

I64 = npt.NDArray[np.int64]
MiB = 1 << 20
#: S3's rules for one multipart upload.
MIN_PART_SIZE = 5 * MiB  # every part but the last
MAX_PART_SIZE = 5 << 30
MAX_PARTS = 10_000
_TIDY = 64 << 10  # part sizes are multiples of this when the rules allow
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


@dataclasses.dataclass(frozen=True, slots=True)
class S3Target:
    """One object: ``s3://bucket/key``."""

    bucket: str
    key: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def _invalid(text: str) -> BackendError:
    return BackendError(text, errno=errno.EINVAL)


def parse_target(target: Any, *, prefix: str | None = None) -> S3Target:
    """Split and validate ``s3://bucket/key``.

    Parameters
    ----------
    target
        The URL given to ``collio.open``.
    prefix
        If given, the key must lie under it (``prefix/...``); a key with a ``..``
        segment is refused in any case, so it cannot climb out of a prefix in tools
        that resolve paths.

    Raises
    ------
    BackendError
        With errno ``EINVAL``, naming what is wrong.
    """
    text = str(target)
    if not text.startswith("s3://"):
        raise _invalid(f"s3 target {shown(text)} must look like s3://bucket/key")
    bucket, _, key = text[len("s3://") :].partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise _invalid(
            f"s3 target {shown(text)}: bucket {redact_text(repr(bucket), text)} is not a valid "
            "bucket name (3-63 characters: lowercase letters, digits, '.', '-')"
        )
    if not key or key.endswith("/"):
        raise _invalid(f"s3 target {shown(text)}: the key is empty or ends with '/'")
    if len(key.encode()) > 1024:
        raise _invalid(f"s3 target {shown(text)}: the key is longer than 1024 bytes")
    if ".." in key.split("/"):
        raise _invalid(f"s3 target {shown(text)}: key {key!r} has a '..' segment")
    if prefix is not None:
        root = str(prefix).strip("/")
        if ".." in root.split("/"):
            raise _invalid(f"s3 prefix {prefix!r} has a '..' segment")
        if root and not key.startswith(root + "/"):
            raise _invalid(f"s3 target {shown(text)}: key {key!r} is outside prefix {root + '/'!r}")
    return S3Target(bucket, key)


def plan_part_size(
    size: int,
    cb_buffer_size: int,
    *,
    concurrency: int = 8,
    min_part: int = MIN_PART_SIZE,
    max_part: int = MAX_PART_SIZE,
    max_parts: int = MAX_PARTS,
) -> int:
    """The part size of an object of ``size`` bytes written in windows of ``cb_buffer_size``.

    A window holds ``k = cb_buffer_size // part`` whole parts, uploaded
    concurrently, so the part is about ``cb_buffer_size / concurrency`` but never
    below ``min_part`` (S3: 5 MiB) nor below ``size / max_parts`` (S3: 10,000
    parts).  It divides ``cb_buffer_size`` nearly evenly, so a window uses almost
    all of its buffer.  When S3's rules need parts larger than ``cb_buffer_size``
    (objects above 10,000 x ``cb_buffer_size``), a window is one part and an
    aggregator's memory grows to twice the part size.

    Raises
    ------
    BackendError
        When no part size satisfies the rules (errno ``EFBIG``).
    """
    if size > max_part * max_parts:
        raise BackendError(
            f"an object of {size} bytes needs more than {max_parts} parts of {max_part} bytes",
            errno=errno.EFBIG,
        )
    lower = max(1, min_part, -(-size // max_parts))
    if lower >= cb_buffer_size:
        return max(lower, min(max_part, -(-lower // _TIDY) * _TIDY))
    want = max(lower, cb_buffer_size // max(1, concurrency))
    part = cb_buffer_size // max(1, cb_buffer_size // want)
    tidy = part - part % _TIDY
    return tidy if tidy >= lower else part


@dataclasses.dataclass(frozen=True, slots=True)
class PartPlan:
    """Parts of one object: part ``i`` (S3 number ``i + 1``) is bytes
    ``[i * part_size, min((i + 1) * part_size, size))``."""

    size: int
    part_size: int

    @property
    def nparts(self) -> int:
        return -(-self.size // self.part_size) if self.size else 0

    def bounds(self, i: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` of part ``i`` (0-based)."""
        return i * self.part_size, min((i + 1) * self.part_size, self.size)

    def touched(self, file: I64, length: I64, lo: int, hi: int) -> I64:
        """0-based indices of the parts in ``[lo, hi)`` that runs ``(file, length)`` touch.

        ``lo`` must be a part boundary; runs are clipped to ``[lo, hi)``.  Vectorised:
        a difference array over the window's parts, so a run spanning many parts
        costs nothing extra.
        """
        first_part = lo // self.part_size
        n = -(-(hi - lo) // self.part_size)
        f, e = np.maximum(file, lo), np.minimum(file + length, hi)
        keep = e > f
        f, e = f[keep], e[keep]
        mark = np.zeros(n + 1, np.int64)
        np.add.at(mark, (f - lo) // self.part_size, 1)
        np.add.at(mark, (e - 1 - lo) // self.part_size + 1, -1)
        return np.flatnonzero(np.cumsum(mark[:n]) > 0).astype(np.int64) + first_part

    def hit_any(self, file: I64, length: I64, done: npt.NDArray[np.bool_]) -> int:
        """A part index touched by runs and marked in ``done``, or -1 (vectorised)."""
        keep = length > 0
        if not keep.any() or not done.any():
            return -1
        first = file[keep] // self.part_size
        last = (file[keep] + length[keep] - 1) // self.part_size
        ids = np.flatnonzero(done).astype(np.int64)
        lo = np.searchsorted(ids, first, side="left")
        hi = np.searchsorted(ids, last, side="right")
        hit = np.flatnonzero(hi > lo)
        return int(ids[lo[hit[0]]]) if len(hit) else -1


def holes(file: I64, length: I64, lo: int, hi: int) -> tuple[I64, I64]:
    """Byte ranges ``[starts, ends)`` of ``[lo, hi)`` that sorted, merged runs leave open."""
    keep = length > 0
    f, e = file[keep], file[keep] + length[keep]
    starts = np.concatenate(([lo], e)).astype(np.int64)
    ends = np.concatenate((f, [hi])).astype(np.int64)
    starts, ends = np.maximum(starts, lo), np.minimum(ends, hi)
    ok = ends > starts
    return starts[ok], ends[ok]


def coalesce(starts: I64, ends: I64, gap: int) -> tuple[I64, I64]:
    """Merge sorted ranges separated by at most ``gap`` bytes (one request reads both)."""
    if len(starts) < 2:
        return starts, ends
    brk = np.flatnonzero(starts[1:] - ends[:-1] > gap) + 1
    first = np.concatenate(([0], brk)).astype(np.int64)
    return starts[first], np.maximum.reduceat(ends, first).astype(np.int64)


def split_ranges(starts: I64, ends: I64, chunk: int) -> tuple[I64, I64]:
    """Cut ranges into pieces of at most ``chunk`` bytes (for concurrent requests)."""
    n = np.maximum(1, -(-(ends - starts) // chunk))
    idx = np.repeat(np.arange(len(starts)), n)
    first = np.zeros(len(starts), np.int64)
    if len(starts) > 1:
        np.cumsum(n[:-1], out=first[1:])
    k = np.arange(len(idx), dtype=np.int64) - first[idx]
    lo = starts[idx] + k * chunk
    return lo.astype(np.int64), np.minimum(lo + chunk, ends[idx]).astype(np.int64)
