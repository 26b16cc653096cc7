"""Keyword options of the S3 backend, parsed and checked once (same on every rank)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import HintError, ModeError
from ...hints import parse_size
from .plan import MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE, PartPlan, plan_part_size

__all__ = ["S3Options"]


@dataclasses.dataclass(frozen=True, slots=True)
class S3Options:
    """What ``collio.open("s3://bucket/key", mode, **options)`` accepts.

    Attributes
    ----------
    endpoint_url
        Any S3-compatible store (MinIO, Ceph, moto); None for AWS.
    region_name
        None: the usual boto3 lookup (``AWS_DEFAULT_REGION``, ``~/.aws/config``).
    size
        Object size in 'w'/'r+': fixes the part plan at open, so several
        ``write_all`` calls may fill it.  Default: the end of the first ``write_all``
        (in 'r+' at least the old size); later calls may not write past it.
    part_size
        Force the part size (default: planned from the size and ``cb_buffer_size``).
    min_part_size
        Smallest part but the last: S3's 5 MiB.  Lower it only for a store that
        accepts smaller parts (tests against moto with ``S3_UPLOAD_PART_MIN_SIZE``).
    max_concurrency
        Requests in flight per rank (parts of a window, GET pieces, copies).
    get_concurrency
        GETs per read window: 1 streams one GET per aggregator through its domain
        (fewest requests); k > 1 splits each window into k concurrent ranged GETs.
    retries
        Attempts per request (botocore "standard" mode: backoff with jitter on
        throttling, 5xx and dropped connections).
    prefix
        Keys must lie under this prefix.
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    size: int | None = None
    part_size: int | None = None
    min_part_size: int = MIN_PART_SIZE
    max_concurrency: int = 8
    get_concurrency: int = 1
    retries: int = 5
    prefix: str | None = None

    @classmethod
    def parse(cls, options: dict[str, Any]) -> S3Options:
        """Check names and values; sizes accept ``16m``-style strings."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ModeError(f"s3 backend: unknown options {unknown}; known: {sorted(names)}")
        values: dict[str, Any] = {}
        for key, value in options.items():
            if value is None:
                continue
            if key in ("size", "part_size", "min_part_size"):
                values[key] = parse_size(value, key)
            elif key in ("max_concurrency", "get_concurrency", "retries"):
                values[key] = int(value)
            else:
                values[key] = str(value)
        opts = cls(**values)
        opts._check()
        return opts

    def _check(self) -> None:
        for key in ("max_concurrency", "get_concurrency", "retries", "min_part_size"):
            if getattr(self, key) < 1:
                raise HintError(f"s3 option {key}={getattr(self, key)} must be >= 1")
        if self.size is not None and self.size < 0:
            raise HintError(f"s3 option size={self.size} must be >= 0")
        if self.part_size is not None and not 1 <= self.part_size <= MAX_PART_SIZE:
            raise HintError(f"s3 option part_size={self.part_size} must be in [1, {MAX_PART_SIZE}]")

    def plan(self, size: int, cb_buffer_size: int) -> PartPlan:
        """The parts of an object of ``size`` bytes (S3's rules checked)."""
        part = self.part_size or plan_part_size(
            size,
            cb_buffer_size,
            concurrency=self.max_concurrency,
            min_part=self.min_part_size,
        )
        plan = PartPlan(size, part)
        if plan.nparts > 1 and part < self.min_part_size:
            raise HintError(
                f"s3 part size {part} is below the minimum {self.min_part_size} "
                f"for an object of {size} bytes ({plan.nparts} parts)"
            )
        if plan.nparts > MAX_PARTS:
            raise HintError(
                f"s3 part size {part} gives {plan.nparts} parts for {size} bytes; "
                f"at most {MAX_PARTS} are allowed"
            )
        return plan
