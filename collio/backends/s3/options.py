"""Keyword options of the S3 backend, parsed and checked once (same on every rank)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import HintError, ModeError
from ...hints import parse_size
from ...redact import redact_url
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
        throttling, 5xx, dropped connections and timeouts); or botocore's own form,
        ``{"total_max_attempts": n}`` or ``{"max_attempts": n - 1}``, with ``"mode"``
        (``standard``, ``adaptive`` or ``legacy``).
    connect_timeout, read_timeout
        Seconds (botocore's names) to wait for a connection, and for a server to send
        anything once a request is sent.  With the defaults, a server that stops
        answering makes every request fail after ``retries`` timeouts plus backoff
        (:attr:`stall_bound`, under two minutes with the abort at close), and every
        rank raises the same :class:`~collio.errors.BackendError`.
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
    retries: int = 4
    retry_mode: str = "standard"
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    prefix: str | None = None

    def __repr__(self) -> str:
        """As the dataclass's, the endpoint without user info (it is in error messages)."""
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown["endpoint_url"] = redact_url(self.endpoint_url)
        return f"S3Options({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def client(self, attempts: int, pool: int) -> Any:
        """The boto3 client for these options, with ``attempts`` tries per request."""
        from .client import client_for  # (boto3 only when a client is made)

        return client_for(
            self.endpoint_url,
            self.region_name,
            attempts,
            pool,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            mode=self.retry_mode,
        )

    @property
    def stall_bound(self) -> float:
        """Seconds after which a server that stops answering has failed a write and its
        abort: every attempt of a request waits its timeout, botocore's backoff between
        attempts (at most 2**k seconds before the k-th retry) and, at close, one attempt
        to abort the upload."""
        wait = max(self.connect_timeout, self.read_timeout)
        backoff = sum(min(20.0, 2.0**k) for k in range(self.retries - 1))
        return self.retries * wait + backoff + wait

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
            elif key == "retries":
                values.update(_retries(value))
            elif key in ("max_concurrency", "get_concurrency"):
                values[key] = _count(value, key)
            elif key in ("connect_timeout", "read_timeout"):
                values[key] = _seconds(value, key)
            else:
                values[key] = str(value)
        opts = cls(**values)
        opts._check()
        return opts

    def _check(self) -> None:
        if self.retry_mode not in ("standard", "adaptive", "legacy"):
            raise HintError(
                f"s3 option retries mode {self.retry_mode!r}: standard, adaptive or legacy"
            )
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


def _count(value: Any, key: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise HintError(f"s3 option {key}={value!r} is not an integer") from None


def _seconds(value: Any, key: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise HintError(f"s3 option {key}={value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise HintError(f"s3 option {key}={value!r} must be > 0 seconds")
    return seconds


def _retries(value: Any) -> dict[str, Any]:
    """``retries=4`` or botocore's ``{"total_max_attempts": 4, "mode": "standard"}``."""
    if not isinstance(value, dict):
        return {"retries": _count(value, "retries")}
    unknown = sorted(set(value) - {"total_max_attempts", "max_attempts", "mode"})
    if unknown:
        raise HintError(f"s3 option retries: unknown keys {unknown} (botocore's retries config)")
    out: dict[str, Any] = {}
    if "total_max_attempts" in value:
        out["retries"] = _count(value["total_max_attempts"], "retries total_max_attempts")
    elif "max_attempts" in value:
        out["retries"] = _count(value["max_attempts"], "retries max_attempts") + 1
    if "mode" in value:
        out["retry_mode"] = str(value["mode"])
    return out
