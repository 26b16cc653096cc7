"""``collio.checkpoint`` to ONE S3 object, against moto's server on 127.0.0.1."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from helpers import raises_everywhere
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio.testing import checkpoint as model

boto3 = pytest.importorskip("boto3")
s3testing = pytest.importorskip("collio.testing.s3")

BUCKET = "collio-ckpt"
MIN = 1024  # test-only part minimum (moto lowered to match)
COMM = MPI.COMM_WORLD
ROWS = ("embed", "ffn/w2", "tiny", "norm")  # pieces that are one range of their array


@pytest.fixture(scope="module")
def server() -> Any:
    with s3testing.shared_moto(COMM, BUCKET, min_part_size=MIN) as url:
        yield url


@pytest.fixture(scope="module")
def faulty(server: str) -> Any:
    with s3testing.shared_proxy(COMM, server) as pair:
        yield pair


def _target() -> str:
    key = COMM.bcast(f"ckpt/{uuid.uuid4().hex}.ckpt" if COMM.rank == 0 else None, root=0)
    return f"s3://{BUCKET}/{key}"


def _state() -> dict[str, Any]:
    lays = model.save_layouts(COMM.rank, COMM.size)
    out: dict[str, Any] = {n: (model.piece(n, lays[n]), lays[n]) for n in ROWS}
    out.update({n: model.reference(n) for n in model.REPLICATED})
    return out


def _object(url: str, target: str) -> tuple[bytes | None, list[str]]:
    return s3testing.stored(COMM, url, BUCKET, target.split("/", 3)[3])


@pytest.mark.mpi
def test_save_to_one_object_then_load_resharded(server: str) -> None:
    target = _target()
    opts = {"endpoint_url": server, "min_part_size": MIN}
    ckpt.save(target, _state(), metadata={"step": 3}, hints={"cb_buffer_size": 4096}, **opts)
    meta = ckpt.info(target, endpoint_url=server)  # ranged GETs, no MPI
    assert meta.metadata == {"step": 3} and sorted(meta) == sorted([*ROWS, *model.REPLICATED])
    data, uploads = _object(server, target)
    assert data is not None and uploads == []
    for name in ROWS:  # the object holds each array at its runs
        want = model.reference(name)
        got = b"".join(data[off : off + n] for off, n in meta.file_runs(name))
        assert got == want.tobytes(), name
    full = model.load_spec(COMM.rank, COMM.size)
    spec = {n: full[n] for n in (*ROWS, *model.REPLICATED)}
    got = ckpt.load(target, spec, **opts)
    for name, lay in spec.items():
        assert got[name].tobytes() == model.expected(name, lay).tobytes(), name


@pytest.mark.mpi
def test_refused_part_keeps_the_previous_checkpoint(faulty: Any) -> None:
    proxy, url = faulty
    target = _target()
    opts = {"endpoint_url": url, "min_part_size": MIN, "retries": 2}
    hints = {"cb_buffer_size": 4096}
    ckpt.save(target, _state(), metadata={"step": 1}, hints=hints, **opts)
    before = _object(url, target)
    if proxy is not None:
        proxy.fail("UploadPart", part=2, times=None)
    COMM.Barrier()
    try:
        err = raises_everywhere(
            COMM,
            collio.BackendError,
            lambda: ckpt.save(target, _state(), metadata={"step": 2}, hints=hints, **opts),
        )
        assert "part 2" in str(err)
    finally:
        if proxy is not None:
            proxy.clear()
    assert _object(url, target) == before
    assert ckpt.info(target, endpoint_url=url).metadata == {"step": 1}


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["save", "async_save"])
def test_every_decomposition_to_one_object_loads_in_others(server: str, how: str) -> None:
    """The whole test state (row shards, 2-D blocks, block-cyclic, subarrays, replicated)
    to one object: pieces that several ranks interleave are summed by the aggregators
    from the windows they upload (an upload cannot be read back), the index goes after
    them in parts of its own.  The object holds every array at its runs, and loads in
    other decompositions byte for byte; no upload is left."""
    target = _target()
    # (the backend named, as collio.open takes it; small domains: every rank an aggregator,
    # so extents are summed from windows of several ranks)
    opts = {"endpoint_url": server, "min_part_size": MIN, "backend": "s3"}
    hints = {"cb_buffer_size": 4096, "cb_min_domain": 0}
    h = getattr(ckpt, how)(target, model.save_state(COMM.rank, COMM.size),
                           metadata={"step": 5}, hints=hints, **opts)  # fmt: skip
    if h is not None:
        h.wait()
    meta = ckpt.info(target, endpoint_url=server)
    assert meta.metadata == {"step": 5}
    data, uploads = _object(server, target)
    assert data is not None and uploads == []
    for name in meta:
        want = model.reference(name)
        got = b"".join(data[off : off + n] for off, n in meta.file_runs(name))
        assert got == want.tobytes(order=meta[name]["order"]), name
    for spec in (model.load_spec(COMM.rank, COMM.size),
                 dict(model.save_layouts(COMM.rank, COMM.size))):  # fmt: skip
        got = ckpt.load(target, spec, **opts)
        for name, lay in spec.items():
            want = model.expected(name, lay)
            assert got[name].tobytes(order="A") == want.tobytes(order="A"), (COMM.rank, name)


@pytest.mark.mpi
def test_a_flipped_byte_of_an_interleaved_array_in_the_object_is_named(server: str) -> None:
    """A byte of the block-cyclic array flipped in the stored object (its checksum made
    from the upload's windows): every rank's load raises the same ChecksumError naming
    that array; a load of the others still works."""
    target = _target()
    opts = {"endpoint_url": server, "min_part_size": MIN}
    ckpt.save(target, model.save_state(COMM.rank, COMM.size), hints={"cb_buffer_size": 4096},
              **opts)  # fmt: skip
    meta = ckpt.info(target, endpoint_url=server)
    off, n = meta.file_runs("ffn/w")[0]
    if COMM.rank == 0:
        client = boto3.client("s3", endpoint_url=server)
        key = target.split("/", 3)[3]
        body = bytearray(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        body[off + n // 2] ^= 0x40
        client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    COMM.Barrier()
    spec = model.load_spec(COMM.rank, COMM.size)
    err = raises_everywhere(COMM, collio.ChecksumError, lambda: ckpt.load(target, spec, **opts))
    assert err.names == ("ffn/w",), err.names
    rest = {k: v for k, v in spec.items() if k != "ffn/w"}
    got = ckpt.load(target, rest, **opts)
    for name, lay in rest.items():
        assert got[name].tobytes(order="A") == model.expected(name, lay).tobytes(order="A")


@pytest.mark.mpi
def test_a_window_sum_failing_on_one_rank_is_agreed(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last rank's sums of the windows it uploads fail, with an error that does not
    pickle: every rank raises it, naming that rank, none is left waiting, and the
    previous checkpoint stays whole in the object."""
    import threading

    if COMM.size == 1:
        pytest.skip("one rank's pieces are each one range: no window is summed")

    from collio.checkpoint import writer

    target = _target()
    opts = {"endpoint_url": server, "min_part_size": MIN, "backend": "s3"}
    hints = {"cb_buffer_size": 4096, "cb_min_domain": 0}  # (every rank an aggregator)
    ckpt.save(target, model.save_state(COMM.rank, COMM.size), metadata={"step": 1},
              hints=hints, **opts)  # fmt: skip
    before = _object(server, target)
    if COMM.rank == COMM.size - 1:

        def failing(self: Any, offset: int, buf: Any) -> None:
            self.error = self.error or RuntimeError("injected window sum failure",
                                                    threading.Lock())  # fmt: skip

        monkeypatch.setattr(writer._Seen, "__call__", failing)
    err = raises_everywhere(
        COMM, collio.CollioError,
        lambda: ckpt.save(target, model.save_state(COMM.rank, COMM.size),
                          metadata={"step": 2}, hints=hints, **opts),
    )  # fmt: skip
    monkeypatch.undo()
    assert f"rank {COMM.size - 1}" in str(err) and "injected window sum failure" in str(err)
    assert _object(server, target) == before
    assert ckpt.info(target, endpoint_url=server).metadata == {"step": 1}
