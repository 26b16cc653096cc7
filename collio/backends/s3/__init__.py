"""The S3 backend: one object written by a multipart upload whose parts the aggregators own.

``collio.open("s3://bucket/key", mode, endpoint_url=..., **options)``; the backend
class is :class:`collio.backends.s3.backend.S3Backend`, imported (with boto3) only
when used.  :mod:`.plan` holds the pure rules (part sizes, key checks) and
imports neither boto3 nor MPI.
"""

from .plan import MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE, PartPlan, parse_target, plan_part_size

__all__ = [
    "MAX_PARTS",
    "MAX_PART_SIZE",
    "MIN_PART_SIZE",
    "PartPlan",
    "parse_target",
    "plan_part_size",
]
