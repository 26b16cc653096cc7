"""``collio.checkpoint`` to ONE S3 object, against moto's server on 127.0.0.1."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio import layouts
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
def test_pieces_that_s3_cannot_checksum_are_refused_before_writing(server: str) -> None:
    target = _target()
    opts = {"endpoint_url": server, "min_part_size": MIN}
    lay = layouts.block((16, 16), "<f8", grid=(1, COMM.size), comm=COMM)
    glob = np.arange(256.0).reshape(16, 16)
    state = {"cols": (np.ascontiguousarray(glob[lay.slices]), lay)}
    if COMM.size == 1:  # one rank's columns are the whole array: one range, saved
        ckpt.save(target, state, **opts)
        back = ckpt.load(target, {"cols": None}, endpoint_url=server)
        np.testing.assert_array_equal(back["cols"], glob)
        return
    raises_everywhere(
        COMM, collio.LayoutError, lambda: ckpt.save(target, state, **opts), match="contiguous"
    )
    assert _object(server, target) == (None, [])
