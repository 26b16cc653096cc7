"""The multipart upload's requests: parts, server-side copies, completion, abort.

Plain functions of a boto3 client, run on whichever rank owns the work; the
backend decides who calls what and agrees on the outcome.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import CommitError
from .client import BufferReader, get_into, s3_error
from .plan import PartPlan, S3Target

__all__ = ["abort", "complete", "create", "fill_part", "head", "upload_part"]

U8 = npt.NDArray[np.uint8]


def head(client: Any, t: S3Target) -> tuple[int, str]:
    """(size, ETag) of the object; a clear ENOENT error for a missing bucket or key."""
    import botocore.exceptions

    try:
        found = client.head_object(Bucket=t.bucket, Key=t.key)
    except botocore.exceptions.ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status != 404:
            raise s3_error(exc, f"{t.url}: cannot read the object's size", client) from exc
        try:
            client.head_bucket(Bucket=t.bucket)
        except botocore.exceptions.ClientError as exc2:
            raise s3_error(exc2, f"{t.url}: no such bucket {t.bucket!r}", client) from exc2
        raise s3_error(exc, f"{t.url}: no such key {t.key!r} in bucket {t.bucket!r}") from exc
    except Exception as exc:  # (an unreachable or malformed endpoint: a BackendError too)
        raise s3_error(exc, f"{t.url}: cannot read the object's size", client) from exc
    return int(found["ContentLength"]), str(found["ETag"])


def create(client: Any, t: S3Target) -> str:
    """Start a multipart upload; returns its UploadId."""
    try:
        return str(client.create_multipart_upload(Bucket=t.bucket, Key=t.key)["UploadId"])
    except Exception as exc:
        raise s3_error(exc, f"{t.url}: cannot start a multipart upload", client) from exc


def upload_part(client: Any, t: S3Target, upload_id: str, i: int, data: U8) -> str:
    """Upload ``data`` as part ``i`` (0-based; S3 number ``i + 1``) without copying it."""
    reply = client.upload_part(
        Bucket=t.bucket,
        Key=t.key,
        UploadId=upload_id,
        PartNumber=i + 1,
        Body=BufferReader(data),
        ContentLength=len(data),
    )
    return str(reply["ETag"])


def fill_part(
    client: Any,
    t: S3Target,
    upload_id: str,
    plan: PartPlan,
    i: int,
    old: tuple[int, str | None],
    zeros: U8,
) -> str:
    """Upload part ``i``, which no rank wrote: the old bytes, or zeros past the old end.

    A part that lies inside the old object is copied server-side (UploadPartCopy,
    guarded by the old ETag), without downloading it.
    """
    a, b = plan.bounds(i)
    old_size, old_etag = old
    if b <= old_size:
        kw: dict[str, Any] = {}
        if old_etag:
            kw["CopySourceIfMatch"] = old_etag
        reply = client.upload_part_copy(
            Bucket=t.bucket,
            Key=t.key,
            UploadId=upload_id,
            PartNumber=i + 1,
            CopySource={"Bucket": t.bucket, "Key": t.key},
            CopySourceRange=f"bytes={a}-{b - 1}",
            **kw,
        )
        return str(reply["CopyPartResult"]["ETag"])
    if a < old_size:  # the part holding the old end: old bytes, then zeros
        buf = np.zeros(b - a, np.uint8)
        get_into(client, t, a, buf[: old_size - a], old_etag)
        return upload_part(client, t, upload_id, i, buf)
    return upload_part(client, t, upload_id, i, zeros[: b - a])


def complete(client: Any, t: S3Target, upload_id: str, etags: dict[int, str], nparts: int) -> None:
    """Make the object visible: complete the upload (an empty object is a plain PUT)."""
    if nparts == 0:
        abort(client, t, upload_id)
        client.put_object(Bucket=t.bucket, Key=t.key, Body=b"")
        return
    missing = sorted(set(range(1, nparts + 1)) - set(etags))
    if missing or len(etags) != nparts:
        raise CommitError(
            f"{t.url}: cannot complete: {len(missing)} of {nparts} parts missing "
            f"(first {missing[:5]}), {len(etags)} uploaded"
        )
    parts = [{"PartNumber": n, "ETag": etags[n]} for n in sorted(etags)]
    client.complete_multipart_upload(
        Bucket=t.bucket, Key=t.key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )


def abort(client: Any, t: S3Target, upload_id: str) -> None:
    """Abort the upload (its parts are deleted); an already finished upload is fine."""
    import botocore.exceptions

    try:
        client.abort_multipart_upload(Bucket=t.bucket, Key=t.key, UploadId=upload_id)
    except botocore.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
            raise
