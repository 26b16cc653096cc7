"""boto3 plumbing for the S3 backend: clients, error translation, zero-copy bodies, GETs.

Credentials and region come the usual boto3 way (environment, ``~/.aws``, instance
roles); nothing here stores, logs or prints them, and error texts are scrubbed of
them in case a server echoes one.
"""

from __future__ import annotations

import concurrent.futures
import errno
import io
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions
import numpy as np
import numpy.typing as npt

from ...errors import BackendError, CollioError
from ...redact import redact_text, redact_url
from .plan import S3Target

__all__ = [
    "BufferReader",
    "RangeStream",
    "Requests",
    "client_for",
    "get_into",
    "s3_error",
]

U8 = npt.NDArray[np.uint8]
T = TypeVar("T")
# bytes per read from a response body: urllib3's readinto reads into a temporary of
# this size, and a thread's malloc arena keeps what it freed (1 MiB: +4 MiB per thread)
_CHUNK = 256 << 10
_clients: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()
_ERRNO = {
    "NoSuchBucket": errno.ENOENT,
    "NoSuchKey": errno.ENOENT,
    "NoSuchUpload": errno.ENOENT,
    "404": errno.ENOENT,
    "NotFound": errno.ENOENT,
    "AccessDenied": errno.EACCES,
    "403": errno.EACCES,
    "Forbidden": errno.EACCES,
    "InvalidAccessKeyId": errno.EACCES,
    "SignatureDoesNotMatch": errno.EACCES,
    "PreconditionFailed": errno.ESTALE,
    "412": errno.ESTALE,
    "EntityTooSmall": errno.EINVAL,
    "EntityTooLarge": errno.EFBIG,
    "InvalidPart": errno.EINVAL,
    "SlowDown": errno.EAGAIN,
    "503": errno.EAGAIN,
}


def client_for(
    endpoint_url: str | None,
    region_name: str | None,
    attempts: int,
    pool: int,
    *,
    connect_timeout: float = 10.0,
    read_timeout: float = 20.0,
    mode: str = "standard",
) -> Any:
    """A boto3 S3 client, one per process and settings (clients are thread-safe).

    Retries use botocore's ``standard`` mode by default: exponential backoff with
    jitter on throttling (``SlowDown``, 503), 5xx answers, dropped connections and
    timeouts, up to ``attempts`` tries per request.  The timeouts bound how long a
    server that stops answering holds a request (see ``S3Options.stall_bound``).
    """
    key = (endpoint_url, region_name, attempts, pool, connect_timeout, read_timeout, mode)
    with _lock:
        found = _clients.get(key)
        if found is None:
            config = botocore.config.Config(
                retries={"mode": mode, "total_max_attempts": attempts},
                max_pool_connections=pool,
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
            )
            session = boto3.session.Session()  # a private session: thread-safe creation
            try:
                found = session.client(
                    "s3", endpoint_url=endpoint_url, region_name=region_name, config=config
                )
            except Exception as exc:  # (botocore quotes the endpoint: redact it)
                raise BackendError(
                    f"cannot make an S3 client for {redact_url(endpoint_url)}: "
                    f"{redact_text(str(exc), endpoint_url)}",
                    errno=errno.EINVAL,
                ) from None
            _clients[key] = found
    return found


def _secrets(client: Any) -> list[str]:
    try:
        creds = client._request_signer._credentials  # noqa: SLF001 - only to scrub messages
        frozen = creds.get_frozen_credentials() if creds is not None else None
    except Exception:  # noqa: BLE001 - scrubbing must never fail
        return []
    if frozen is None:
        return []
    return [s for s in (frozen.access_key, frozen.secret_key, frozen.token) if s]


def s3_error(exc: BaseException, what: str, client: Any = None) -> CollioError:
    """Turn a boto3/botocore/OS error into a :class:`BackendError` whose text says ``what``.

    The text carries the S3 error code, the HTTP status and the number of attempts,
    never credentials.
    """
    if isinstance(exc, CollioError):
        return exc
    code: int | None = errno.EIO
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        meta = exc.response.get("ResponseMetadata", {})
        name = str(err.get("Code", "") or "error")
        status = meta.get("HTTPStatusCode")
        text = f"{name} (HTTP {status})"
        if err.get("Message") and err.get("Message") != name:
            text += f": {err['Message']}"
        tries = int(meta.get("RetryAttempts", 0)) + 1
        if tries > 1:
            text += f", after {tries} attempts"
        code = _ERRNO.get(name, errno.EIO if (status or 500) >= 500 else errno.EINVAL)
    elif isinstance(exc, botocore.exceptions.NoCredentialsError):
        text, code = "no credentials found (environment, ~/.aws, instance role)", errno.EACCES
    elif isinstance(exc, botocore.exceptions.EndpointConnectionError):
        text, code = f"cannot connect: {exc}", errno.ECONNREFUSED
    elif isinstance(exc, OSError):
        text, code = (exc.strerror or str(exc)), exc.errno
    else:
        text = f"{type(exc).__name__}: {exc}"
    for secret in _secrets(client) if client is not None else []:
        text = text.replace(secret, "***")
    return BackendError(f"{what}: {redact_text(text, _endpoint(client))}", errno=code)


def _endpoint(client: Any) -> str | None:
    """The endpoint URL ``client`` was made with (its credentials are hidden from texts)."""
    try:
        return str(client.meta.endpoint_url) if client is not None else None
    except Exception:  # noqa: BLE001 - scrubbing must never fail
        return None


class BufferReader(io.RawIOBase):
    """A seekable file over a numpy buffer: boto3 streams a part from it without a copy.

    :meth:`read` returns ``memoryview`` slices of the buffer, not new ``bytes``:
    what botocore does with a body (hash it, send it with ``socket.sendall``)
    takes any bytes-like object, so a part costs no allocation per chunk (each
    upload thread would otherwise keep megabytes of freed chunks in its malloc
    arena).  botocore rewinds it (``seek``) to resend a part on retry.
    """

    def __init__(self, buf: U8) -> None:
        super().__init__()
        self._view = memoryview(buf).cast("B")  # type: ignore[arg-type]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> Any:
        end = (
            len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        )
        chunk = self._view[self._pos : end]
        self._pos = max(self._pos, end)
        return chunk

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        b[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _get(client: Any, t: S3Target, start: int, end: int, etag: str | None) -> Any:
    kw: dict[str, Any] = {"Bucket": t.bucket, "Key": t.key, "Range": f"bytes={start}-{end - 1}"}
    if etag:
        kw["IfMatch"] = etag
    return client.get_object(**kw)["Body"]


def _read_body(body: Any, out: U8) -> int:
    """Receive a response body straight into ``out`` (``readinto``); returns the bytes read."""
    view = memoryview(out).cast("B")  # type: ignore[arg-type]
    done, total = 0, len(view)
    while done < total:
        n = body.readinto(view[done : min(total, done + _CHUNK)])
        if not n:
            break
        done += n
    return done


def get_into(client: Any, t: S3Target, start: int, out: U8, etag: str | None) -> None:
    """One ranged GET of ``len(out)`` bytes from ``start`` into ``out``.

    ``etag`` (If-Match) makes the GET fail rather than mix two versions of the object.
    """
    if not len(out):
        return
    body = _get(client, t, start, start + len(out), etag)
    try:
        got = _read_body(body, out)
    finally:
        body.close()
    if got != len(out):
        raise BackendError(
            f"short read of {t.url}: {got} of {len(out)} bytes at offset {start}", errno=errno.EIO
        )


class RangeStream:
    """One ranged GET read in order, window after window (few requests, no read-ahead).

    A connection dropped while reading the body is reopened at the current offset, up
    to ``attempts`` times.  A GET that fails to open is not tried again here: botocore
    already made its ``attempts`` (retrying those too would multiply the time a frozen
    server holds the read).
    """

    def __init__(self, client: Any, t: S3Target, etag: str | None, attempts: int) -> None:
        self.client, self.t, self.etag, self.attempts = client, t, etag, attempts
        self.pos = self.end = -1
        self.body: Any = None

    def read_into(self, start: int, out: U8, *, gap: int, end: int) -> None:
        """Fill ``out`` with the bytes at ``start``.

        Reads on from the open GET when ``start`` is at most ``gap`` bytes ahead of
        it; otherwise opens a new GET of ``[start, end)``.
        """
        stop = start + len(out)
        for attempt in range(self.attempts):
            near = self.body is not None and self.pos <= start <= self.pos + gap
            if not near or stop > self.end:
                self._open(start, max(end, stop))  # (botocore retried it already)
            try:
                self._skip(start - self.pos)
                got = _read_body(self.body, out)
                self.pos += got
                if got != len(out):
                    raise BackendError(f"short read of {self.t.url} at offset {start}")
                return
            except (botocore.exceptions.BotoCoreError, OSError, BackendError):
                self.close()
                if attempt + 1 == self.attempts:
                    raise
                time.sleep(min(2.0, 0.1 * 2**attempt))

    def _open(self, start: int, end: int) -> None:
        self.close()
        self.end = end
        self.body = _get(self.client, self.t, start, end, self.etag)
        self.pos = start

    def _skip(self, n: int) -> None:
        while n > 0:
            got = len(self.body.read(min(n, _CHUNK)))
            if not got:
                raise BackendError(f"short read of {self.t.url} at offset {self.pos}")
            self.pos += got
            n -= got

    def close(self) -> None:
        if self.body is not None:
            try:
                self.body.close()
            except Exception:  # noqa: BLE001 - closing a dead connection
                pass
        self.body = None
        self.pos = -1


class Requests:
    """This rank's request threads: run a batch, wait for all of it, raise the first error.

    ``failed`` stays True once any request failed (the upload must not complete).
    """

    def __init__(self, threads: int, client: Any) -> None:
        self.threads, self.client = threads, client
        self.failed = False
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def run(
        self, fn: Callable[[Any], T], jobs: Sequence[Any], what: Callable[[Any], str]
    ) -> list[T]:
        """``[fn(job) for job in jobs]``, concurrently; errors name ``what(job)``."""
        if not jobs:
            return []
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.threads, thread_name_prefix="collio-s3"
            )
        futs = [self._pool.submit(fn, job) for job in jobs]
        concurrent.futures.wait(futs)  # never return while a thread still uses a buffer
        out: list[T] = []
        for job, fut in zip(jobs, futs, strict=True):
            exc = fut.exception()
            if exc is not None:
                self.failed = True
                raise s3_error(exc, what(job), self.client) from exc
            out.append(fut.result())
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
