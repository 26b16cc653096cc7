"""The zarr backend's targets and creation options as stock zarr takes them: a URL with
credentials (never shown), codecs whose repr varies by process, and options given as None.

Every array is read back by plain zarr, in a process of its own where the metadata matters.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
import traceback

import numpy as np
import pytest
from helpers import raises_everywhere

zarr = pytest.importorskip("zarr")

import collio  # noqa: E402
from collio import layouts  # noqa: E402
from collio.testing.jobs import python  # noqa: E402

#: (made at run time: a traceback quotes this file's source lines)
PW = "hunter2" + "secret"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # (every request would print a line)
        pass


@pytest.fixture
def http_root(comm, mpi_tmp_path):
    """(directory, URL with user:password@) of an HTTP server on rank 0 serving it."""
    root = mpi_tmp_path / "www"
    server, port = None, None
    if comm.rank == 0:
        root.mkdir()
        handler = functools.partial(_Quiet, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
    port = comm.bcast(port, root=0)
    yield root, f"http://reader:{PW}@127.0.0.1:{port}"
    comm.Barrier()
    if server is not None:
        server.shutdown()
        server.server_close()


def _shown_everywhere(comm, text):
    """Whether any rank's ``text`` shows the password (assert on every rank alike)."""
    return any(comm.allgather(PW in text))


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_url_with_credentials_is_never_shown(comm, http_root, monkeypatch, capsys):
    pytest.importorskip("aiohttp")  # (fsspec's HTTP file system)
    root, url = http_root
    n = 4 * comm.size
    if comm.rank == 0:
        zarr.create_array(str(root / "b.zarr"), shape=(n,), dtype="<i4", chunks=(4,))[:] = (
            np.arange(n, dtype="<i4")
        )
    comm.Barrier()
    monkeypatch.setenv("COLLIO_STATS", "1")
    lay = layouts.block((n,), "<i4", comm=comm)
    with collio.open(f"{url}/b.zarr", "r", comm=comm, backend="zarr") as f:
        got = f.read_all(lay)
        shown = repr(f) + str(f.stats.as_dict()) + str(f.backend.describe()) + str(f.stats)
    printed = capsys.readouterr().err  # (the COLLIO_STATS line, on rank 0)
    ok = comm.allgather(got.tolist() == list(range(lay.start[0], lay.start[0] + lay.shape[0])))
    assert all(ok), ok
    assert not _shown_everywhere(comm, shown + printed), shown + printed
    assert comm.bcast("***@127.0.0.1" in printed, root=0), printed
    for mode, opts in (("r", {}), ("w", {"shape": (4,), "dtype": "u1"})):
        err = raises_everywhere(
            comm,
            collio.CollioError,
            lambda mode=mode, opts=opts: collio.open(
                f"{url}/missing.zarr", mode, comm=comm, backend="zarr", **opts
            ),
        )
        text = "".join(traceback.format_exception(err))
        assert not _shown_everywhere(comm, text), text
        assert mode == "w" or "no zarr array at http://***@127.0.0.1" in str(err), str(err)


@pytest.mark.mpi
def test_blosc_codec_with_its_tunable_attributes(comm, mpi_tmp_path):
    """BloscCodec's repr holds a set whose order follows each rank's hash seed; the ranks
    compare the codec's own form, so every run writes."""
    path = str(mpi_tmp_path / "blosc.zarr")
    n = 16 * comm.size
    lay = layouts.block((n,), "<f8", comm=comm)
    codec = zarr.codecs.BloscCodec(cname="zstd", clevel=3)
    with collio.open(path, "w", comm=comm, backend="zarr", shape=(n,), dtype="<f8",
                     chunks=(16,), compressors=codec) as f:  # fmt: skip
        f.write_all(np.full(lay.shape, comm.rank, "<f8"), lay)
    comm.Barrier()
    want = np.repeat(np.arange(comm.size, dtype="<f8"), 16)
    assert np.array_equal(zarr.open_array(path, mode="r")[:], want)


_STOCK = """
import json, sys, zarr
stock, ours, fmt = sys.argv[1], sys.argv[2], int(sys.argv[3])
opts = dict(compressors=None, filters=None, fill_value=None)
zarr.create_array(stock, shape=(8,), dtype="<i4", chunks=(4,), zarr_format=fmt, **opts)
print(json.dumps([dict(zarr.open_array(p, mode="r").metadata.to_dict()) for p in (stock, ours)],
                 default=str))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("zarr_format", [3, 2])
def test_none_options_as_stock_zarr_takes_them(comm, mpi_tmp_path, zarr_format):
    """compressors=None stores no compressor, filters=None no filter, a v2 fill_value=None
    a null fill value: as ``zarr.create_array`` with the same options."""
    ours = str(mpi_tmp_path / f"ours{zarr_format}.zarr")
    lay = layouts.block((8,), "<i4", comm=comm)
    with collio.open(ours, "w", comm=comm, backend="zarr", shape=(8,), dtype="<i4", chunks=(4,),
                     zarr_format=zarr_format, compressors=None, filters=None,
                     fill_value=None) as f:  # fmt: skip
        f.write_all(np.arange(lay.start[0], lay.start[0] + lay.shape[0], dtype="<i4"), lay)
    comm.Barrier()
    result = None
    if comm.rank == 0:
        stock = str(mpi_tmp_path / f"stock{zarr_format}.zarr")
        out = python(_STOCK, stock, ours, str(zarr_format))
        result = (out.returncode, out.stdout, out.stderr)
    code, stdout, stderr = comm.bcast(result, root=0)
    assert code == 0, stderr
    theirs, mine = json.loads(stdout)
    assert mine == theirs
    assert zarr.open_array(ours, mode="r")[:].tolist() == list(range(8))


@pytest.mark.mpi
@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize("layout_dtype", [">i4", "<i4"])
def test_either_byte_order_for_an_array_made_big_endian(
    comm, mpi_tmp_path, zarr_format, layout_dtype
):
    """v3 reports an array made with '>i4' as int32, v2 as '>i4': a layout of either byte
    order writes and reads it, zarr converting each unit."""
    path = str(mpi_tmp_path / f"be{zarr_format}{layout_dtype[0]}.zarr")
    n = 4 * comm.size + 3
    lay = layouts.block((n,), layout_dtype, comm=comm)
    mine = np.arange(lay.start[0], lay.start[0] + lay.shape[0]).astype(layout_dtype)
    with collio.open(path, "w", comm=comm, backend="zarr", shape=(n,), dtype=">i4",
                     chunks=(3,), zarr_format=zarr_format) as f:  # fmt: skip
        f.write_all(mine, lay)
    with collio.open(path, "r", comm=comm, backend="zarr") as f:
        got = f.read_all(lay)
        many = f.read_all_many([lay, lay])
    ok = got.dtype == np.dtype(layout_dtype) and np.array_equal(got, mine)
    ok = ok and all(np.array_equal(m, mine) for m in many)
    assert all(comm.allgather(ok))
    comm.Barrier()
    assert zarr.open_array(path, mode="r")[:].tolist() == list(range(n))
