"""The S3 backend's pure parts: part planning under S3's rules, holes, key checks.

Objects on a real S3-protocol server are tested in ``mpi_tests/test_s3.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import collio
from collio.backends.s3.plan import (
    MAX_PART_SIZE,
    MAX_PARTS,
    MIN_PART_SIZE,
    PartPlan,
    coalesce,
    holes,
    parse_target,
    plan_part_size,
    split_ranges,
)

MIN = 1024  # a part minimum below S3's, as the tests' moto server is set to
MiB = 1 << 20


# ------------------------------------------------------------------ pure parts
@given(
    size=st.integers(0, 60 << 40),
    buffer=st.integers(1, 1 << 30),
    conc=st.integers(1, 32),
)
def test_part_size_obeys_s3_rules(size, buffer, conc):
    if size > MAX_PART_SIZE * MAX_PARTS:
        with pytest.raises(collio.BackendError):
            plan_part_size(size, buffer, concurrency=conc)
        return
    part = plan_part_size(size, buffer, concurrency=conc)
    plan = PartPlan(size, part)
    assert MIN_PART_SIZE <= part <= MAX_PART_SIZE
    assert plan.nparts <= MAX_PARTS
    if part > buffer:  # only when S3's rules need it: one part per window
        assert (
            part < MIN_PART_SIZE + (64 << 10)
            or part * (MAX_PARTS - 1) < size + (64 << 10) * MAX_PARTS
        )
    else:  # a window (whole parts) uses at least half the buffer
        assert (buffer // part) * part * 2 > buffer


def test_part_size_examples():
    assert plan_part_size(256 * MiB, 16 * MiB) == 5 * MiB + 5 * (64 << 10)  # 3 per window
    assert plan_part_size(256 * MiB, 64 * MiB) == 8 * MiB  # 8 per window
    assert plan_part_size(1 << 40, 16 * MiB) == 107392 << 10  # 9,999 parts of ~105 MiB
    assert plan_part_size(10_000, 2048, min_part=MIN) == 1024


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=12))
def test_touched_holes_coalesce_match_brute_force(pairs):
    size, part, lo, hi = 400, 32, 64, 352
    mask = np.zeros(size, bool)
    for f, n in pairs:
        mask[f : f + n] = True
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    file, length = edges[0::2].astype(np.int64), (edges[1::2] - edges[0::2]).astype(np.int64)
    plan = PartPlan(size, part)
    want = sorted({i // part for i in np.flatnonzero(mask[lo:hi]) + lo})
    assert plan.touched(file, length, lo, hi).tolist() == want
    s, e = holes(file, length, lo, hi)
    gaps = np.zeros(size, bool)
    for a, b in zip(s.tolist(), e.tolist(), strict=True):
        gaps[a:b] = True
    np.testing.assert_array_equal(gaps[lo:hi], ~mask[lo:hi])
    assert not gaps[:lo].any() and not gaps[hi:].any()
    cs, ce = coalesce(file, file + length, 5)
    assert (cs[1:] - ce[:-1] > 5).all() and cs.tolist() == sorted(cs.tolist())
    covered = np.zeros(size, bool)
    for a, b in zip(cs.tolist(), ce.tolist(), strict=True):
        covered[a:b] = True
    assert covered[mask].all()
    done = np.zeros(plan.nparts, bool)
    done[3] = True
    hit = plan.hit_any(file, length, done)
    touches3 = bool(mask[96:128].any())
    assert hit == (3 if touches3 else -1)


def test_split_ranges():
    s, e = split_ranges(np.array([0, 100], np.int64), np.array([25, 110], np.int64), 10)
    assert list(zip(s.tolist(), e.tolist(), strict=True)) == [
        (0, 10), (10, 20), (20, 25), (100, 110),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("target", "prefix", "problem"),
    [
        ("s3://bkt/", None, "empty"),
        ("s3://bkt", None, "empty"),
        ("s3://bkt/a/../../etc/x", None, "'..'"),
        ("s3://bkt/jobs/7/../8/x", "jobs/7", "'..'"),
        ("s3://bkt/jobs/8/x", "jobs/7/", "outside prefix 'jobs/7/'"),
        ("s3://bkt/jobs/70/x", "jobs/7", "outside prefix"),
        ("s3://Bad_Bucket/x", None, "not a valid bucket"),
        ("s3://bkt/dir/", None, "ends with '/'"),
        ("/tmp/x", None, "must look like s3://bucket/key"),
    ],
)
def test_bad_keys_are_refused(target, prefix, problem):
    with pytest.raises(collio.BackendError) as info:
        parse_target(target, prefix=prefix)
    assert problem in str(info.value) and info.value.errno == 22


def test_good_key_under_prefix():
    t = parse_target("s3://bkt/jobs/7/ckpt..1/x.bin", prefix="/jobs/7/")
    assert (t.bucket, t.key, t.url) == (
        "bkt",
        "jobs/7/ckpt..1/x.bin",
        "s3://bkt/jobs/7/ckpt..1/x.bin",
    )
