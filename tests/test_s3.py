"""The S3 backend on one rank: pure part planning, key checks, the registry, and a real
S3-protocol server (moto on 127.0.0.1) for the conformance suite and byte checks."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi4py import MPI

import collio
from collio import layouts
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
from collio.testing.backend_suite import BackendTests

boto3 = pytest.importorskip("boto3")
s3testing = pytest.importorskip("collio.testing.s3")

BUCKET = "collio-tests"
MIN = 1024  # test-only part minimum (moto lowered to match); one test uses S3's 5 MiB
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


def test_import_collio_does_not_import_boto3():
    code = "import sys, collio; print('boto3' in sys.modules, 'botocore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_missing_boto3_gives_install_hint():
    code = (
        "import sys; sys.modules['boto3'] = None\n"
        "import collio\n"
        "try:\n    collio.get_backend('s3')\n"
        "except collio.BackendUnavailableError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'collio[s3]'" in out.stdout and "boto3" in out.stdout


# -------------------------------------------------------------- real server
@pytest.fixture(scope="module")
def server():
    with s3testing.shared_moto(MPI.COMM_WORLD, BUCKET, min_part_size=MIN) as url:
        yield url


@pytest.fixture
def client(server):
    return boto3.client("s3", endpoint_url=server)


def _key() -> str:
    return f"one/{uuid.uuid4().hex}.bin"


def _stored(client, key):
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


class TestS3(BackendTests):
    backend = "s3"

    @pytest.fixture
    def target(self, server):
        return f"s3://{BUCKET}/{_key()}"

    @pytest.fixture
    def open_options(self, server):
        return {"endpoint_url": server, "min_part_size": MIN}


@pytest.mark.parametrize(
    ("nbytes", "hints", "nparts"),
    [
        (5000, {}, 1),
        (10 * 1024 + 7, {"cb_buffer_size": 2048}, 11),
        (8192, {"cb_buffer_size": 4096}, 8),
    ],
)
def test_bytes_stored_and_part_count(server, client, nbytes, hints, nparts):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, np.uint8)
    key = _key()
    with collio.open(
        f"s3://{BUCKET}/{key}", "w", hints=hints, endpoint_url=server, min_part_size=MIN
    ) as f:
        f.write_all(data, layouts.Segments([0], [nbytes]))
        info = dict(f.backend.describe())
    assert info["parts"] == nparts and info["size"] == nbytes
    assert _stored(client, key) == data.tobytes()
    assert client.head_object(Bucket=BUCKET, Key=key)["ETag"].endswith(f'-{nparts}"')
    assert not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_real_5mib_minimum(server, client):
    """S3's own rule: moto back at 5 MiB, the backend's default minimum."""
    old = s3testing.set_min_part_size(MIN_PART_SIZE)
    try:
        nbytes = 11 * MiB + 7
        data = np.random.default_rng(5).integers(0, 256, nbytes, np.uint8)
        key = _key()
        with collio.open(f"s3://{BUCKET}/{key}", "w", endpoint_url=server) as f:
            f.write_all(data, layouts.Segments([0], [nbytes]))
            assert f.backend.describe()["part_size"] >= MIN_PART_SIZE
            assert f.backend.describe()["parts"] == 3
        assert _stored(client, key) == data.tobytes()
        with collio.open(f"s3://{BUCKET}/{key}", "r", endpoint_url=server) as f:
            back = f.read_all(layouts.Segments([0], [nbytes]))
        np.testing.assert_array_equal(back, data)
    finally:
        s3testing.set_min_part_size(old)


def test_credentials_never_in_messages_or_stats(server):
    secret, access = "SECRET" + uuid.uuid4().hex, "AKIA" + uuid.uuid4().hex[:16].upper()
    with s3testing.shared_proxy(MPI.COMM_WORLD, server) as (proxy, url):
        env = dict(os.environ, AWS_ACCESS_KEY_ID=access, AWS_SECRET_ACCESS_KEY=secret)
        code = (
            "import collio, numpy as np\n"
            "from collio import layouts\n"
            f"opts = dict(endpoint_url={url!r}, min_part_size={MIN})\n"
            "msgs = []\n"
            f"for tgt, mode in (('s3://{BUCKET}/denied', 'w'), ('s3://no-such-bucket/x', 'r'),"
            f" ('s3://{BUCKET}/missing', 'r')):\n"
            "    try:\n        collio.open(tgt, mode, **opts)\n"
            "    except collio.CollioError as e:\n        msgs.append(str(e))\n"
            f"with collio.open('s3://{BUCKET}/ok', 'w', **opts) as f:\n"
            "    f.write_all(np.zeros(10, np.uint8), layouts.Segments([0], [10]))\n"
            "    msgs.append(repr(f.stats.as_dict()))\n"
            "print('\\n'.join(msgs))\n"
        )
        assert proxy is not None
        proxy.fail(
            "CreateMultipartUpload",
            times=1,
            status=403,
            code="AccessDenied",
            message=f"no {access}",
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
    assert out.returncode == 0, out.stderr
    assert "no such bucket" in out.stdout and "no such key" in out.stdout
    assert "AccessDenied (HTTP 403): no ***" in out.stdout
    assert secret not in out.stdout + out.stderr and access not in out.stdout + out.stderr


def test_striping_unit_is_refused(server):
    with pytest.raises(collio.HintError, match="striping_unit does not apply"):
        collio.open(
            f"s3://{BUCKET}/{_key()}", "w", hints={"striping_unit": 1 << 20}, endpoint_url=server
        )
