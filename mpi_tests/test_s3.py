"""The S3 backend under mpiexec, against moto's real S3 protocol on 127.0.0.1.

Rank 0 runs the server (and, for faults, a proxy that answers chosen requests with
HTTP 500/503); every check reads the stored object back independently with boto3.
"""

from __future__ import annotations

import uuid
from collections import Counter

import numpy as np
import pytest
from helpers import local_piece, raises_everywhere, reference, segments_for
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends.s3.plan import MIN_PART_SIZE
from collio.testing.jobs import python
from collio.testing.target_suites import ByteBackendTests

boto3 = pytest.importorskip("boto3")
s3testing = pytest.importorskip("collio.testing.s3")

BUCKET = "collio-mpi"
MIN = 1024  # test-only part minimum (moto lowered to match)
COMM = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def server():
    with s3testing.shared_moto(COMM, BUCKET, min_part_size=MIN) as url:
        yield url


@pytest.fixture(scope="module")
def faulty(server):
    """(proxy on rank 0 / None elsewhere, proxy url)."""
    with s3testing.shared_proxy(COMM, server) as pair:
        yield pair


@pytest.fixture
def key():
    return COMM.bcast(f"mpi/{uuid.uuid4().hex}.bin" if COMM.rank == 0 else None, root=0)


def _opts(url, **kw):
    return {"endpoint_url": url, "min_part_size": MIN, **kw}


def _stored(url, key):
    """The object's bytes (None if absent) and the open multipart uploads, on every rank."""
    return s3testing.stored(COMM, url, BUCKET, key)


def _put(url, key, data):
    if COMM.rank == 0:
        boto3.client("s3", endpoint_url=url).put_object(Bucket=BUCKET, Key=key, Body=data)
    COMM.Barrier()


def _raises_everywhere(exc_type, fn):
    return raises_everywhere(COMM, exc_type, fn)


class TestS3(ByteBackendTests):
    backend = "s3"

    @pytest.fixture
    def target(self, server, key):
        return f"s3://{BUCKET}/{key}"

    @pytest.fixture
    def open_options(self, server):
        return _opts(server)

    def stored(self, target, open_options):
        client = boto3.client("s3", endpoint_url=open_options["endpoint_url"])
        try:
            return client.get_object(Bucket=BUCKET, Key=target.split("/", 3)[3])["Body"].read()
        except client.exceptions.NoSuchKey:
            return None


# ------------------------------------------------------------ bytes stored
def _layout(kind, shape):
    if kind == "colblock":
        return layouts.block(shape, "<f8", comm=COMM, grid=(1, COMM.size))
    return layouts.block_cyclic(
        shape, "<f8", block=(3, 2), grid=layouts.dims_create(COMM.size, 2), comm=COMM
    )


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("kind", "hints", "nparts"),
    [
        ("colblock", {}, 1),
        ("cyclic", {"cb_buffer_size": 2048}, 12),
        ("colblock", {"cb_buffer_size": 3000, "cb_nodes": 2}, 9),
    ],
)
def test_array_bytes_equal_reference(server, key, kind, hints, nparts):
    shape = (37, 41)  # 12136 bytes: not a multiple of any part size here
    glob = reference(shape, "<f8", seed=11)
    lay = _layout(kind, shape)
    with collio.open(f"s3://{BUCKET}/{key}", "w", hints=hints, **_opts(server)) as f:
        f.write_all(local_piece(glob, lay), lay)
        info = dict(f.backend.describe())
    assert info["parts"] == nparts and info["size"] == glob.nbytes
    data, uploads = _stored(server, key)
    assert data == glob.tobytes() and key not in uploads
    with collio.open(f"s3://{BUCKET}/{key}", "r", hints=hints, **_opts(server)) as f:
        back = f.read_all(lay)
    np.testing.assert_array_equal(back, local_piece(glob, lay))


@pytest.mark.mpi
def test_rounds_keep_the_parts_uploaded_at_once(server, key):
    """min_rounds does not shrink a round below cb_buffer_size's worth of parts."""
    shape = (512, 1024)  # 4 MiB: min_rounds alone would give 1 MiB rounds
    glob = reference(shape, "<f8", seed=5)
    lay = _layout("colblock", shape)
    hints = {"cb_buffer_size": 2 << 20}
    with collio.open(f"s3://{BUCKET}/{key}", "w", hints=hints, **_opts(server)) as f:
        f.write_all(local_piece(glob, lay), lay)
        part = dict(f.backend.describe())["part_size"]
        window = f.stats.last_call["window"]
    assert part < (1 << 20) and window == (2 << 20) // part * part
    data, _ = _stored(server, key)
    assert data == glob.tobytes()


@pytest.mark.mpi
@pytest.mark.parametrize("hints", [{}, {"cb_nodes": 2}, {"cb_config_list": "*:*"}])
def test_reads_use_one_aggregator_per_node_unless_the_hints_choose(server, key, hints):
    shape = (64, 96)
    glob = reference(shape, "<f8", seed=21)
    lay = _layout("cyclic", shape)
    with collio.open(f"s3://{BUCKET}/{key}", "w", **_opts(server)) as f:
        f.write_all(local_piece(glob, lay), lay)
        assert f.aggregators == tuple(range(COMM.size))  # uploads: every rank
    with collio.open(f"s3://{BUCKET}/{key}", "r", hints=hints, **_opts(server)) as f:
        back = f.read_all(lay, out=None)
        used = f.stats.hints
        local = f.stats.local
        aggs = f.aggregators
    np.testing.assert_array_equal(back, local_piece(glob, lay))
    if hints:  # the user's choice holds for reads too
        assert "read_aggregator_ranks" not in used
        assert (local["domain"] >= 0) == (COMM.rank in aggs)  # ... and those ranks read
    else:  # one node here: rank 0 reads the whole object and sends the pieces
        assert used["read_aggregator_ranks"] == [0]
        assert (local["domain"] == 0) == (COMM.rank == 0)


@pytest.mark.mpi
def test_segments_with_an_empty_rank(server, key):
    size = 20_011
    raw = reference((size,), np.uint8, seed=4)
    lay = segments_for(COMM, size)  # rank 1 holds nothing; runs unsorted, some empty
    mine = np.concatenate([raw[o : o + n] for o, n in zip(lay.offsets, lay.lengths, strict=True)])
    with collio.open(
        f"s3://{BUCKET}/{key}", "w", hints={"cb_buffer_size": 4096}, **_opts(server)
    ) as f:
        f.write_all(mine, lay)
    assert _stored(server, key)[0] == raw.tobytes()
    for get_concurrency in (1, 3):  # one streamed GET per aggregator, or 3 per window
        opts = _opts(server, get_concurrency=get_concurrency)
        with collio.open(f"s3://{BUCKET}/{key}", "r", hints={"cb_buffer_size": 3000}, **opts) as f:
            np.testing.assert_array_equal(f.read_all(lay), mine)


@pytest.mark.mpi
def test_holes_are_zeros_in_w(server, key):
    """Bytes no rank writes (whole parts and pieces of parts) read back as zeros."""
    base, lens = np.array([100, 3000, 9000, 16 * 1024 + 50]), [5, 50, 3, 7]
    lay = layouts.Segments(base + 64 * COMM.rank, lens)
    hints = {"cb_buffer_size": 2048}
    with collio.open(f"s3://{BUCKET}/{key}", "w", hints=hints, **_opts(server)) as f:
        f.write_all(np.full(65, COMM.rank + 1, np.uint8), lay)
    want = np.zeros(16 * 1024 + 57 + 64 * (COMM.size - 1), np.uint8)
    for r in range(COMM.size):
        for o, n in zip((base + 64 * r).tolist(), lens, strict=True):
            want[o : o + n] = r + 1
    assert _stored(server, key)[0] == want.tobytes()


# ------------------------------------------------------------- r+ updates
@pytest.mark.mpi
def test_update_copies_untouched_parts_server_side(faulty, key):
    proxy, url = faulty
    old = reference((40 * 1024,), np.uint8, seed=8).tobytes()
    _put(url, key, old)
    if proxy is not None:
        proxy.clear()
    COMM.Barrier()
    # every rank rewrites 10 bytes in part 2 and part 29 (of 40 parts of 1024 bytes)
    offs = np.array([1500, 29_100]) + 10 * COMM.rank
    with collio.open(
        f"s3://{BUCKET}/{key}", "r+", hints={"cb_buffer_size": 2048}, **_opts(url, part_size=1024)
    ) as f:
        f.write_all(np.full(20, 0xEE, np.uint8), layouts.Segments(offs, [10, 10]))
    want = bytearray(old)
    for r in range(COMM.size):
        for o in (1500 + 10 * r, 29_100 + 10 * r):
            want[o : o + 10] = b"\xee" * 10
    counts = COMM.bcast(
        (proxy.count("UploadPartCopy"), proxy.count("UploadPart"), proxy.count("GetObject"))
        if proxy is not None
        else None
    )
    assert counts == (38, 2, 2)  # one GET for the holes of each touched part, no more
    data, uploads = _stored(url, key)
    assert data == bytes(want) and key not in uploads


@pytest.mark.mpi
def test_update_that_grows_the_object(server, key):
    old = reference((3000,), np.uint8, seed=9).tobytes()
    _put(server, key, old)
    lay = layouts.Segments([5000 + 4 * COMM.rank], [4])
    with collio.open(
        f"s3://{BUCKET}/{key}", "r+", hints={"cb_buffer_size": 2048}, **_opts(server)
    ) as f:
        f.write_all(np.full(4, 7, np.uint8), lay)
    want = old + bytes(2000) + b"\x07" * (4 * COMM.size)
    assert _stored(server, key)[0] == want


@pytest.mark.mpi
def test_update_with_nothing_written_keeps_the_object(server, key):
    _put(server, key, b"old bytes")
    with collio.open(f"s3://{BUCKET}/{key}", "r+", **_opts(server)) as f:
        f.write_all(np.zeros(0, np.uint8), layouts.Segments([], []))
    assert _stored(server, key) == (b"old bytes", [])


# ---------------------------------------------- several calls, size, growth
@pytest.mark.mpi
def test_size_option_lets_calls_fill_separate_parts(server, key):
    size = 8 * 1024
    halves = [(0, size // 2), (size // 2, size)]
    raw = reference((size,), np.uint8, seed=3)
    opts = _opts(server, size=size, part_size=1024)
    with collio.open(f"s3://{BUCKET}/{key}", "w", **opts) as f:
        for lo, hi in halves:
            cut = np.linspace(lo, hi, COMM.size + 1).astype(int)
            a, b = int(cut[COMM.rank]), int(cut[COMM.rank + 1])
            f.write_all(raw[a:b], layouts.Segments([a], [b - a]))
    assert _stored(server, key)[0] == raw.tobytes()


@pytest.mark.mpi
@pytest.mark.parametrize("what", ["same-part", "growth"])
def test_second_call_that_s3_cannot_do_is_refused_everywhere(server, key, what):
    _put(server, key, b"previous")
    with collio.open(f"s3://{BUCKET}/{key}", "w", **_opts(server, part_size=1024)) as f:
        f.write_all(np.ones(10, np.uint8), layouts.Segments([4000 + 10 * COMM.rank], [10]))
        second = [3500, 4100 + 10 * COMM.size][what == "growth"] + 10 * COMM.rank
        err = _raises_everywhere(
            collio.LayoutError,
            lambda: f.write_all(np.ones(10, np.uint8), layouts.Segments([second], [10])),
        )
        _raises_everywhere(
            collio.ModeError, lambda: f.write_all(np.ones(0, np.uint8), layouts.Segments([], []))
        )
    text = "was uploaded by an earlier write_all" if what == "same-part" else "pass size="
    assert text in str(err)
    assert _stored(server, key) == (b"previous", [])


# ------------------------------------------------------------------ faults
@pytest.mark.mpi
def test_refused_part_aborts_everywhere_and_keeps_old_object(faulty, key):
    proxy, url = faulty
    _put(url, key, b"previous object")
    if proxy is not None:
        proxy.clear()
        proxy.fail("UploadPart", part=3, times=None)
    COMM.Barrier()
    glob = reference((40, 30), "<f8", seed=2)
    lay = _layout("colblock", glob.shape)
    opts = _opts(url, retries=2)

    def write():
        with collio.open(f"s3://{BUCKET}/{key}", "w", hints={"cb_buffer_size": 2048}, **opts) as f:
            f.write_all(local_piece(glob, lay), lay)

    err = _raises_everywhere(collio.BackendError, write)
    assert "upload of part 3 (bytes [2048, 3072))" in str(
        err
    ) and "InternalError (HTTP 500)" in str(err)
    assert "after 2 attempts" in str(err) and err.errno == 5
    if proxy is not None:
        proxy.clear()
    assert _stored(url, key) == (b"previous object", [])
    # the same processes go on: a new write through the proxy succeeds
    with collio.open(f"s3://{BUCKET}/{key}", "w", hints={"cb_buffer_size": 2048}, **opts) as f:
        f.write_all(local_piece(glob, lay), lay)
    assert _stored(url, key) == (glob.tobytes(), [])


@pytest.mark.mpi
def test_transient_errors_are_retried(server, faulty, key):
    proxy, url = faulty
    if proxy is not None:
        proxy.clear()
        proxy.fail("UploadPart", part=2, times=2)  # 500 twice, then fine
        proxy.fail("UploadPart", part=4, times=1, status=503, code="SlowDown")
        proxy.fail("GetObject", times=1, status=503, code="SlowDown")
    COMM.Barrier()
    raw = reference((6000,), np.uint8, seed=6)  # 6 parts of 1024 bytes
    cut = np.linspace(0, 6000, COMM.size + 1).astype(int)
    a, b = int(cut[COMM.rank]), int(cut[COMM.rank + 1])
    lay, mine = layouts.Segments([a], [b - a]), raw[a:b]
    opts = _opts(url, retries=4)
    with collio.open(f"s3://{BUCKET}/{key}", "w", hints={"cb_buffer_size": 2048}, **opts) as f:
        f.write_all(mine, lay)
    # checked straight at the server: through the proxy, boto3 here would take the
    # GetObject fault (and retry it) and collio's read below would never meet it
    assert _stored(server, key) == (raw.tobytes(), [])
    # rank 0 marks the proxy's log between the write and the read; the others wait for it
    mark = COMM.bcast(len(proxy.log) if proxy is not None else None)
    with collio.open(f"s3://{BUCKET}/{key}", "r", **opts) as f:
        np.testing.assert_array_equal(f.read_all(lay), mine)

    def outcome():
        log = [(op, part, status) for op, part, status, _ in proxy.log]
        write, read = ([e for e in part if e[2] >= 400] for part in (log[:mark], log[mark:]))
        stored = sorted(p for op, p, st in log if op == "UploadPart" and st == 200)
        return Counter(write), stored, Counter(read)

    write_faults, parts, read_faults = COMM.bcast(outcome() if proxy is not None else None)
    # every injected fault happened, once, to collio, and no other request failed:
    # the write met two 500s and one 503 and stored each of its 6 parts exactly once;
    # the read met the other 503
    assert write_faults == {("UploadPart", 2, 500): 2, ("UploadPart", 4, 503): 1}
    assert parts == [1, 2, 3, 4, 5, 6]
    assert read_faults == {("GetObject", None, 503): 1}


def _write_ten(url, key):
    """Each rank writes its 10 bytes of the object, one retry per request."""
    with collio.open(f"s3://{BUCKET}/{key}", "w", **_opts(url, retries=1)) as f:
        f.write_all(np.ones(10, np.uint8), layouts.Segments([10 * COMM.rank], [10]))


@pytest.mark.mpi
def test_refused_completion_aborts_and_keeps_old_object(faulty, key):
    proxy, url = faulty
    _put(url, key, b"old")
    if proxy is not None:
        proxy.clear()
        proxy.fail("CompleteMultipartUpload", times=None)
    COMM.Barrier()
    err = _raises_everywhere(collio.CommitError, lambda: _write_ten(url, key))
    assert "completing" in str(err) and "InternalError (HTTP 500)" in str(err)
    if proxy is not None:
        proxy.clear()
    assert _stored(url, key) == (b"old", [])


@pytest.mark.mpi
def test_refused_completion_and_abort_reports_both(faulty, key):
    """The completion refused, then the abort too: every rank raises the completion's
    error, the abort's (the upload's parts stay) in ``err.close_error``, agreed."""
    proxy, url = faulty
    _put(url, key, b"old")
    if proxy is not None:
        proxy.clear()
        proxy.fail("CompleteMultipartUpload", times=None)
        proxy.fail("AbortMultipartUpload", times=None)
    COMM.Barrier()
    err = _raises_everywhere(collio.CommitError, lambda: _write_ten(url, key))
    assert "completing" in str(err) and "InternalError (HTTP 500)" in str(err)
    later = err.close_error
    texts = COMM.allgather((type(later).__name__, str(later)))
    assert texts == [texts[0]] * COMM.size, texts
    assert texts[0][0] == "CommitError" and "abort: rank 0: " in texts[0][1], texts[0]
    assert "the upload's parts stay" in texts[0][1], texts[0]
    if proxy is not None:
        proxy.clear()
    data, uploads = _stored(url, key)
    assert data == b"old" and uploads.count(key) == 1, uploads
    if COMM.rank == 0:  # (the parts left behind, removed as a lifecycle rule would)
        c = boto3.client("s3", endpoint_url=url)
        for u in c.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []):
            if u["Key"] == key:
                c.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=u["UploadId"])
    COMM.Barrier()


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["w", "r", "r+"])
def test_missing_bucket_or_key_fails_everywhere(server, mode):
    bucket = "no-such-bucket" if mode == "w" else BUCKET
    err = _raises_everywhere(
        collio.BackendError,
        lambda: collio.open(f"s3://{bucket}/nothing/here", mode, **_opts(server)),
    )
    assert err.errno == 2 and err.ranks == (0,)
    assert ("NoSuchBucket" if mode == "w" else "no such key 'nothing/here'") in str(err)


@pytest.mark.mpi(min_size=2)
def test_ranks_naming_different_keys_fail_everywhere(server):
    bad = COMM.rank == COMM.size - 1
    target = f"s3://{BUCKET}/k{int(bad)}"
    err = _raises_everywhere(
        collio.MismatchError, lambda: collio.open(target, "w", **_opts(server))
    )
    # collio.open compares the URLs in its first agreement, before the backend runs
    assert f"rank {COMM.size - 1}: open arguments" in str(err) and "/k1'" in str(err)


@pytest.mark.mpi
def test_read_all_in_w_mode_is_refused(server, key):
    with collio.open(f"s3://{BUCKET}/{key}", "w", **_opts(server)) as f:
        err = _raises_everywhere(collio.ModeError, lambda: f.read_all(layouts.Segments([0], [1])))
    assert "not possible on this s3 target in mode 'w'" in str(err)


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("target", "prefix", "text"),
    [
        (f"s3://{BUCKET}/jobs/7/../../x", "jobs/7", "has a '..' segment"),
        (f"s3://{BUCKET}/jobs/8/x", "jobs/7", "is outside prefix 'jobs/7/'"),
        (f"s3://{BUCKET}/", None, "the key is empty"),
    ],
)
def test_bad_key_fails_everywhere(server, target, prefix, text):
    err = _raises_everywhere(
        collio.BackendError, lambda: collio.open(target, "w", **_opts(server, prefix=prefix))
    )
    assert text in str(err) and err.errno == 22
    assert _stored(server, "x")[1] == []  # no upload was started


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("nbytes", "hints", "nparts"),
    [
        (5000, {}, 1),
        (10 * 1024 + 7, {"cb_buffer_size": 2048}, 11),
        (8192, {"cb_buffer_size": 4096}, 8),
    ],
)
def test_one_rank_holds_the_object_parts_and_etag(server, key, nbytes, hints, nparts):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, np.uint8)
    mine = nbytes if COMM.rank == 0 else 0
    with collio.open(f"s3://{BUCKET}/{key}", "w", hints=hints, **_opts(server)) as f:
        f.write_all(data[:mine], layouts.Segments([0], [mine]))
        info = dict(f.backend.describe())
    assert info["parts"] == nparts and info["size"] == nbytes
    stored, uploads = _stored(server, key)
    assert stored == data.tobytes() and uploads == []
    etag = None
    if COMM.rank == 0:
        etag = boto3.client("s3", endpoint_url=server).head_object(Bucket=BUCKET, Key=key)["ETag"]
    assert COMM.bcast(etag, root=0).endswith(f'-{nparts}"')


@pytest.mark.mpi
def test_real_5mib_minimum(server, key):
    """S3's own rule: moto back at 5 MiB, the backend's default minimum."""
    old = s3testing.set_min_part_size(MIN_PART_SIZE) if COMM.rank == 0 else None
    COMM.Barrier()
    try:
        nbytes = 11 * (1 << 20) + 7
        data = np.random.default_rng(5).integers(0, 256, nbytes, np.uint8)
        lay = layouts.Segments([0], [nbytes if COMM.rank == 0 else 0])
        url = f"s3://{BUCKET}/{key}"
        with collio.open(url, "w", endpoint_url=server) as f:
            f.write_all(data[: lay.nbytes], lay)
            assert f.backend.describe()["part_size"] >= MIN_PART_SIZE
            assert f.backend.describe()["parts"] == 3
        assert _stored(server, key)[0] == data.tobytes()
        whole = layouts.Segments([0], [nbytes])
        with collio.open(url, "r", endpoint_url=server) as f:
            np.testing.assert_array_equal(f.read_all(whole), data)
    finally:
        COMM.Barrier()
        if COMM.rank == 0:
            s3testing.set_min_part_size(old)


_LEAK = """
import sys, collio, numpy as np
from collio import layouts
url, bucket, minimum = sys.argv[1], sys.argv[2], int(sys.argv[3])
opts = dict(endpoint_url=url, min_part_size=minimum)
msgs = []
for tgt, mode in ((f"s3://{bucket}/denied", "w"), ("s3://no-such-bucket/x", "r"),
                  (f"s3://{bucket}/missing", "r")):
    try:
        collio.open(tgt, mode, **opts)
    except collio.CollioError as e:
        msgs.append(str(e))
with collio.open(f"s3://{bucket}/ok", "w", **opts) as f:
    f.write_all(np.zeros(10, np.uint8), layouts.Segments([0], [10]))
    msgs.append(repr(f.stats.as_dict()))
print("\\n".join(msgs))
"""


@pytest.mark.mpi
def test_credentials_never_in_messages_or_stats(faulty):
    """A process of its own with fresh credentials: an access denied naming the key id, a
    missing bucket, a missing key, a good write; no message or stat shows either secret."""
    proxy, url = faulty
    secret, access = "SECRET" + uuid.uuid4().hex, "AKIA" + uuid.uuid4().hex[:16].upper()
    result = None
    if COMM.rank == 0:
        proxy.fail("CreateMultipartUpload", times=1, status=403, code="AccessDenied",
                   message=f"no {access}")  # fmt: skip
        creds = {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
        out = python(_LEAK, url, BUCKET, str(MIN), env=creds)
        result = (out.returncode, out.stdout, out.stderr)
    code, stdout, stderr = COMM.bcast(result, root=0)
    assert code == 0, stderr
    assert "no such bucket" in stdout and "no such key" in stdout
    assert "AccessDenied (HTTP 403): no ***" in stdout
    assert secret not in stdout + stderr and access not in stdout + stderr


@pytest.mark.mpi
def test_striping_unit_is_refused(server, key):
    err = _raises_everywhere(
        collio.HintError,
        lambda: collio.open(
            f"s3://{BUCKET}/{key}", "w", hints={"striping_unit": 1 << 20}, **_opts(server)
        ),
    )
    assert "striping_unit does not apply" in str(err)
