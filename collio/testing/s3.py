"""An S3-protocol server for tests and benchmarks, and a proxy that injects faults.

* :func:`start_moto` runs moto's S3 server (``moto[server]``) on 127.0.0.1 with a
  free port, in a thread of this process; :func:`serve_moto` runs it in a child
  process (benchmarks: the server then does not share this process's GIL).
* :class:`FaultProxy` forwards every request to such a server and answers chosen
  ones (e.g. the UploadPart of part 3) with an S3 error instead: the client sees a
  real HTTP 500 or 503 and its retries are the real ones.

Nothing here is imported by ``import collio``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import http.server
import importlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "FaultProxy",
    "fake_credentials",
    "serve_moto",
    "set_min_part_size",
    "shared_moto",
    "shared_proxy",
    "start_moto",
    "stored",
]

_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te"}


def stored(comm: Any, url: str, bucket: str, key: str) -> tuple[bytes | None, list[str]]:
    """Collective: the object's bytes (None if absent) and the keys of the bucket's open
    multipart uploads, read by rank 0 with boto3 (bypassing collio), on every rank."""
    from ..collective import Attempt, bcast_outcome

    out, step = None, Attempt()
    if comm.Get_rank() == 0:
        import boto3

        with step:  # (rank 0's failure raised on every rank: none left in the bcast)
            c = boto3.client("s3", endpoint_url=url)
            try:
                data: bytes | None = c.get_object(Bucket=bucket, Key=key)["Body"].read()
            except c.exceptions.NoSuchKey:
                data = None
            ups = [u["Key"] for u in c.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
            out = (data, ups)
    got: tuple[bytes | None, list[str]] = bcast_outcome(
        comm, out, step.error, what=f"read s3://{bucket}/{key}"
    )
    return got


def fake_credentials() -> None:
    """Credentials and region for a local test server (only where none are set)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def start_moto(host: str = "127.0.0.1") -> tuple[Any, str]:
    """Start moto's S3 server in a thread of this process; returns (server, url).

    Stop it with ``server.stop()``.
    """
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
    server.start()
    h, port = server.get_host_and_port()
    return server, f"http://{h}:{port}"


def set_min_part_size(nbytes: int) -> int:
    """In the process running moto: set its minimum part size; returns the old value."""
    models: Any = importlib.import_module("moto.s3.models")  # read at each completion
    old = int(models.S3_UPLOAD_PART_MIN_SIZE)
    models.S3_UPLOAD_PART_MIN_SIZE = nbytes
    return old


@contextlib.contextmanager
def shared_moto(comm: Any, bucket: str, *, min_part_size: int | None = None) -> Iterator[str]:
    """Collective over `comm`: rank 0 runs moto (with ``bucket``); every rank gets the URL.

    ``min_part_size`` lowers moto's 5 MiB part minimum (in rank 0's process).
    """
    server, url, error = None, None, None
    if comm.Get_rank() == 0:
        try:
            fake_credentials()
            server, url = start_moto()
            if min_part_size is not None:
                set_min_part_size(min_part_size)
            import boto3

            boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
        except Exception as exc:  # noqa: BLE001 - reported on every rank below
            error = repr(exc)
    url, error = comm.bcast((url, error), root=0)
    if error:
        raise RuntimeError(f"moto server did not start: {error}")
    fake_credentials()
    try:
        yield str(url)
    finally:
        comm.Barrier()
        if server is not None:
            server.stop()


@contextlib.contextmanager
def shared_proxy(comm: Any, upstream: str) -> Iterator[tuple[FaultProxy | None, str]]:
    """Collective over `comm`: rank 0 runs a :class:`FaultProxy`; yields (proxy on rank 0, url)."""
    from ..collective import Attempt, bcast_outcome

    proxy, url, step = None, None, Attempt()
    if comm.Get_rank() == 0:
        with step:
            proxy = FaultProxy(upstream)
            url = proxy.start()
    url = bcast_outcome(comm, url, step.error, what="start the fault proxy")
    try:
        yield proxy, str(url)
    finally:
        comm.Barrier()
        if proxy is not None:
            proxy.stop()


def serve_moto(
    host: str = "127.0.0.1", timeout: float = 30.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Start moto's S3 server in a child process; returns (process, url).

    Stop it with ``proc.terminate(); proc.wait()``; it also ends when this process does.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    code = (
        "import logging, os, time; from moto.server import ThreadedMotoServer as S; "
        "logging.getLogger('werkzeug').setLevel(logging.ERROR); "
        f"s = S(ip_address={host!r}, port={port}, verbose=False); s.start()\n"
        f"while os.getppid() == {os.getpid()}: time.sleep(1)  # ends with its parent"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return proc, f"http://{host}:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"moto server did not start on {host}:{port}")


def classify(method: str, path: str, headers: Any) -> tuple[str, int | None]:
    """The S3 operation of a path-style request, and its part number if any."""
    query = parse_qs(urlsplit(path).query, keep_blank_values=True)
    part = int(query["partNumber"][0]) if "partNumber" in query else None
    if method == "PUT" and part is not None:
        return ("UploadPartCopy" if headers.get("x-amz-copy-source") else "UploadPart"), part
    table = {
        ("POST", "uploads"): "CreateMultipartUpload",
        ("POST", "uploadId"): "CompleteMultipartUpload",
        ("DELETE", "uploadId"): "AbortMultipartUpload",
        ("GET", "uploads"): "ListMultipartUploads",
    }
    for (m, q), name in table.items():
        if method == m and q in query:
            return name, None
    simple = {"GET": "GetObject", "HEAD": "HeadObject", "PUT": "PutObject", "DELETE": "Delete"}
    return simple.get(method, method), None


@dataclasses.dataclass
class _Rule:
    op: str
    part: int | None
    times: int | None
    status: int
    code: str
    message: str


class FaultProxy:
    """An HTTP proxy in front of an S3 server that fails chosen requests.

    >>> proxy = FaultProxy(upstream_url); url = proxy.start()
    >>> proxy.fail("UploadPart", part=3, times=None)     # refuse part 3 for good
    >>> proxy.fail("UploadPart", part=2, times=1, status=503, code="SlowDown")

    ``log`` lists ``(operation, part, status, request bytes)`` of every request.
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rules: list[_Rule] = []
        self.log: list[tuple[str, int | None, int, int]] = []
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self, host: str = "127.0.0.1") -> str:
        """Listen on a free port; returns the proxy's URL."""
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._server = http.server.ThreadingHTTPServer((host, 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://{host}:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def fail(
        self,
        op: str,
        *,
        part: int | None = None,
        times: int | None = 1,
        status: int = 500,
        code: str = "InternalError",
        message: str = "injected by FaultProxy",
    ) -> None:
        """Answer the next ``times`` matching requests (None: all) with ``status``."""
        with self._lock:
            self.rules.append(_Rule(op, part, times, status, code, message))

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self.log.clear()

    def count(self, op: str, *, part: int | None = None, status: int | None = None) -> int:
        """How many logged requests match."""
        with self._lock:
            return sum(
                1
                for o, p, s, _ in self.log
                if o == op and (part is None or p == part) and (status is None or s == status)
            )

    def _take(self, op: str, part: int | None) -> _Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.op == op and rule.part in (None, part) and rule.times != 0:
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
        return None

    def _record(self, op: str, part: int | None, status: int, nbytes: int) -> None:
        with self._lock:
            self.log.append((op, part, status, nbytes))


class _Handler(http.server.BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._body()
        op, part = classify(self.command, self.path, self.headers)
        rule = self.proxy._take(op, part)
        if rule is not None:
            xml = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{rule.code}</Code>'
                f"<Message>{rule.message}</Message><RequestId>0</RequestId></Error>"
            ).encode()
            self.proxy._record(op, part, rule.status, len(body))
            self.send_response(rule.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(*self.proxy.upstream, timeout=300)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.proxy._record(op, part, resp.status, len(body))
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            length = resp.getheader("Content-Length") if self.command == "HEAD" else len(data)
            self.send_header("Content-Length", str(length or 0))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle
