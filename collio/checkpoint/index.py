"""A checkpoint's index as a reader finds it: the trailer, the JSON document and the
extent table, each checked; and :func:`info`, which needs no MPI."""

from __future__ import annotations

import collections.abc
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..backends.localfile import open_regular
from ..errors import ChecksumError, CollioError, classify, make_error
from ..redact import redact_url
from . import format
from .crc import for_version

__all__ = ["Info", "info", "parse", "parse_crc"]


class Info(collections.abc.Mapping[str, dict[str, Any]]):
    """A checkpoint's arrays by name (shape, dtype, order, offset, nbytes, replicated)
    and ``metadata``, the user's JSON values."""

    def __init__(self, index: format.Index) -> None:
        self.index = index
        self.metadata = index.metadata
        self._arrays = {
            name: {**entry, "shape": tuple(entry["shape"]), "dtype": index.dtype(name)}
            for name, entry in index.arrays.items()
        }

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def file_runs(
        self, name: str, start: int = 0, stop: int | None = None
    ) -> list[tuple[int, int]]:
        """Where bytes ``[start, stop)`` of array ``name`` (all of it by default) are in
        the file: ``(offset, length)`` runs in the array's order (one for an array stored
        whole: ``np.memmap`` at that offset reads it)."""
        nbytes = int(self.index.arrays[name]["nbytes"])
        stop = nbytes if stop is None else stop
        if not 0 <= start <= stop <= nbytes:
            raise IndexError(f"array {name!r} of {nbytes} bytes: no bytes [{start}, {stop})")
        offs, chunks = self.index.places([name])
        file, length, _, _ = chunks.runs(offs + start, np.array([stop - start], np.int64))
        return list(zip(file.tolist(), length.tolist(), strict=True))

    def file_offset(self, name: str, at: int = 0) -> int:
        """Where byte ``at`` of array ``name`` is in the file."""
        return self.file_runs(name, at, at + 1)[0][0]

    def __repr__(self) -> str:
        return f"<checkpoint info: {len(self)} arrays, metadata={self.metadata!r}>"


def parse(read: Any, size: int, where: str) -> format.Index:
    """The index of a target of ``size`` bytes, ``read(offset, length)`` giving its bytes."""
    return parse_crc(read, size, where)[0]


def parse_crc(read: Any, size: int, where: str) -> tuple[format.Index, int]:
    """:func:`parse`, and the index's checksum (as the trailer gives it)."""
    tail = format.TRAILER.size
    off, length, crc, version = format.parse_trailer(
        read(size - tail, tail) if size >= tail else b"", size, where
    )
    doc = read(off, length)
    if for_version(version).of(doc) != crc:
        raise ChecksumError(f"{where}: the index's checksum differs")
    try:
        parsed = json.loads(doc)  # (once: the table's place and the arrays are both in it)
        toff, tlen = format.Index.table_span(parsed)
        return format.Index.from_doc(parsed, read(toff, tlen), where, version), crc
    except ChecksumError:  # (a ValueError, said already)
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ChecksumError(f"{where}: unreadable index: {exc}") from None


def info(target: Any, **options: Any) -> Info:
    """Local, no MPI: what the checkpoint at ``target`` holds (a path, or ``s3://``:
    ranged GETs, ``options`` as :func:`collio.open` takes for S3)."""
    text = os.fspath(target)
    if text.startswith("s3://"):
        return Info(_parse_s3(text, options))
    try:  # (as a load opens it: a regular file alone, never waiting on a FIFO)
        fd = open_regular(text, os.O_RDONLY)
    except CollioError:
        raise
    except OSError as exc:  # (the error a load raises for it: a BackendError)
        name, message, code = classify(exc)
        raise make_error(name, f"checkpoint.info: {message}", errno=code) from None
    with open(fd, "rb") as fp:
        size = os.fstat(fp.fileno()).st_size

        def read(offset: int, length: int) -> bytes:
            fp.seek(offset)
            return fp.read(length)

        return Info(parse(read, size, text))


def _parse_s3(url: str, options: dict[str, Any]) -> format.Index:
    from ..backends.s3.client import client_for, s3_error
    from ..backends.s3.options import S3Options

    opts = S3Options(**{k: v for k, v in options.items() if k in {"endpoint_url", "region_name"}})
    client = client_for(opts.endpoint_url, opts.region_name, 3, 4)
    bucket, _, key = url[len("s3://") :].partition("/")
    where = redact_url(url)
    try:  # (S3's errors as a load raises them: a BackendError naming the object)
        size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except Exception as exc:  # noqa: BLE001 - botocore's, turned into collio's
        raise s3_error(exc, f"checkpoint.info: {where}", client) from None

    def read(offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        rng = f"bytes={offset}-{offset + length - 1}"
        try:
            body: bytes = client.get_object(Bucket=bucket, Key=key, Range=rng)["Body"].read()
        except Exception as exc:  # noqa: BLE001 - as above
            raise s3_error(exc, f"checkpoint.info: {where}", client) from None
        return body

    return parse(read, size, where)
