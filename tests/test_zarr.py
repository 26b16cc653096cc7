"""The zarr backend on one rank (no mpiexec): conformance suite, options, errors, details.

Many-rank behaviour is in ``test_zarr_jobs.py`` (mpiexec jobs read back by plain
zarr here) and ``mpi_tests/test_zarr.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

import collio  # noqa: E402
from collio import layouts  # noqa: E402
from collio.testing.zarr_suite import ZarrBackendTests  # noqa: E402


class TestZarr(ZarrBackendTests):
    @pytest.fixture
    def target(self, tmp_path):
        return str(tmp_path / "conformance.zarr")


class TestZarrShardedBlosc(ZarrBackendTests):
    @pytest.fixture
    def target(self, tmp_path):
        return str(tmp_path / "sharded.zarr")

    @pytest.fixture
    def open_options(self):
        codec = zarr.codecs.BloscCodec(cname="lz4", clevel=3, shuffle="shuffle")
        return {
            "shape": (48, 40), "dtype": "<f8", "chunks": (5, 7), "shards": (10, 14),
            "compressors": [codec],
        }  # fmt: skip


def _write(target, glob, lay, mode="w", **opts):
    with collio.open(target, mode, backend="zarr", **opts) as f:
        f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        return f.stats.as_dict()


def test_import_collio_does_not_import_zarr():
    code = "import sys, collio; collio.known_backends(); sys.exit('zarr' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_missing_zarr_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "zarr", None)  # what an environment without zarr sees
    monkeypatch.delitem(sys.modules, "collio.backends.zarr", raising=False)
    monkeypatch.delitem(collio.backends._LOADED, "zarr", raising=False)
    with pytest.raises(collio.BackendUnavailableError, match=r"pip install 'collio\[zarr\]'"):
        collio.get_backend("zarr")


def test_infer_backend_from_path_and_objects(tmp_path):
    from collio.backends import infer_backend

    assert infer_backend(str(tmp_path / "x.zarr")) == "zarr"
    store = zarr.storage.LocalStore(str(tmp_path / "y"))
    assert infer_backend(store) == "zarr"


def test_fortran_and_3d_layouts_and_fill_value(tmp_path):
    shape = (13, 17, 11)
    glob = np.random.default_rng(1).standard_normal(shape)
    path = str(tmp_path / "f.zarr")
    lay = layouts.Subarray(shape, (2, 3, 1), (9, 12, 10), "<f8", order="F")
    opts = {"shape": shape, "dtype": "<f8", "chunks": (4, 5, 3), "fill_value": -7.0}
    with collio.open(path, "w", backend="zarr", **opts) as f:
        f.write_all(np.asfortranarray(glob[lay.slices]), lay)
        back = f.read_all(lay)
        whole = f.read_all(layouts.Subarray(shape, (0, 0, 0), shape, "<f8", order="F"))
    np.testing.assert_array_equal(back, glob[lay.slices])
    want = np.full(shape, -7.0)
    want[lay.slices] = glob[lay.slices]
    np.testing.assert_array_equal(whole, want)  # never-written chunks read as the fill value
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], want)


def test_atomic_commit_and_huge_shards_are_refused(tmp_path):
    path = str(tmp_path / "a.zarr")
    with pytest.raises(collio.ModeError, match="atomic_commit is not supported"):
        collio.open(path, "w", backend="zarr", shape=(4,), dtype="<f8",
                    hints={"atomic_commit": True})  # fmt: skip
    zarr.create_array(path, shape=(1 << 16, 1 << 16), dtype="<f8", chunks=(1 << 14, 1 << 14))
    with pytest.raises(collio.BackendError, match="chunks .16384, 16384. of 2147483648 bytes"):
        collio.open(path, "r", backend="zarr")


def test_variable_size_dtypes_are_refused(tmp_path):
    path = str(tmp_path / "s.zarr")
    zarr.create_array(path, shape=(4,), dtype=str, chunks=(2,))
    with pytest.raises(collio.BackendError, match="variable-size elements"):
        collio.open(path, "r", backend="zarr")


def test_zarr_array_and_store_targets(tmp_path):
    path = str(tmp_path / "a.zarr")
    arr = zarr.create_array(path, shape=(30, 20), dtype="<i4", chunks=(7, 6), fill_value=0)
    glob = np.arange(600, dtype="<i4").reshape(30, 20)
    lay = layouts.Subarray((30, 20), (3, 0), (20, 20), "<i4")
    _write(arr, glob, lay, mode="r+")
    store = zarr.storage.LocalStore(path)
    with collio.open(store, "r", backend="zarr") as f:
        np.testing.assert_array_equal(f.read_all(lay), glob[lay.slices])
    want = np.zeros_like(glob)
    want[3:23] = glob[3:23]
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], want)


def test_array_in_a_group_by_path(tmp_path):
    path = str(tmp_path / "g.zarr")
    zarr.create_group(path)
    glob = np.arange(100.0).reshape(10, 10)
    lay = layouts.Subarray((10, 10), (0, 0), (10, 10), "<f8")
    _write(path, glob, lay, shape=(10, 10), dtype="<f8", chunks=(3, 3), path="sub/data")
    np.testing.assert_array_equal(zarr.open_array(path, path="sub/data", mode="r")[...], glob)


def test_memory_store_on_one_rank(tmp_path):
    store = zarr.storage.MemoryStore()
    glob = np.arange(64.0).reshape(8, 8)
    lay = layouts.Subarray((8, 8), (0, 0), (8, 8), "<f8")
    opts = {"shape": (8, 8), "dtype": "<f8", "chunks": (3, 3), "compressors": None}
    _write(store, glob, lay, **opts)
    np.testing.assert_array_equal(zarr.open_array(store, mode="r")[...], glob)


def test_stats_report_the_units_each_aggregator_owns(tmp_path):
    glob = np.ones((1000, 1000))
    lay = layouts.Subarray((1000, 1000), (0, 0), (1000, 1000), "<f8")
    st = _write(str(tmp_path / "s.zarr"), glob, lay, shape=(1000, 1000), dtype="<f8",
                chunks=(300, 300), hints={"romio_cb_write": "enable"})  # fmt: skip
    assert st["collective_calls"] == 1 and st["direct_calls"] == 0
    be = st["backend"]
    assert be["unit"] == "chunk" and be["unit_nbytes"] == 300 * 300 * 8 and be["units"] == 16
    assert be["domains"] == [{"units": [0, 16], "nbytes": 8 * 10**6}]
    assert st["write_ops"] == 16 and st["bytes_written"] == 8 * 10**6


def test_units_nobody_shares_skip_the_shuffle(tmp_path):
    glob = np.arange(600.0).reshape(20, 30)
    path = str(tmp_path / "d.zarr")
    for start, shape in (((0, 0), (20, 30)), ((3, 4), (9, 13))):  # whole chunks, then partial
        lay = layouts.Subarray((20, 30), start, shape, "<f8")
        st = _write(path, glob, lay, mode="r+" if start[0] else "w", shape=(20, 30), dtype="<f8",
                    chunks=(8, 8), fill_value=0.0)  # fmt: skip
        assert st["direct_calls"] == 1 and st["collective_calls"] == 0
    with collio.open(path, "r", backend="zarr") as f:
        back = f.read_all(layouts.Subarray((20, 30), (0, 0), (20, 30), "<f8"))
        assert f.stats.direct_calls == 1
    np.testing.assert_array_equal(back, glob)
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], glob)


@pytest.mark.parametrize(
    "mode,opts,cls,text",
    [
        ("w", {"shape": (4, 4)}, collio.ModeError, "give shape= and dtype="),
        ("w", {"shape": (4, 4), "dtype": "f8", "bogus": 1}, collio.ModeError, "unknown options"),
        ("r", {}, collio.BackendError, "no zarr array at"),
    ],
)
def test_open_errors(tmp_path, mode, opts, cls, text):
    with pytest.raises(cls, match=text):
        collio.open(str(tmp_path / "missing.zarr"), mode, backend="zarr", **opts)


def test_creation_options_do_not_apply_to_an_existing_array(tmp_path):
    arr = zarr.create_array(str(tmp_path / "x.zarr"), shape=(4,), dtype="<f8", chunks=(2,))
    with pytest.raises(collio.ModeError, match=r"\['fill_value'\] do not apply"):
        collio.open(arr, "r+", backend="zarr", fill_value=3.0)
    with pytest.raises(collio.ModeError, match="path and storage_options"):
        collio.open(arr, "r", backend="zarr", path="a")


def test_expectations_are_checked_on_open(tmp_path):
    path = str(tmp_path / "e.zarr")
    zarr.create_array(path, shape=(10, 10), dtype="<f4", chunks=(5, 5))
    with pytest.raises(collio.MismatchError, match=r"has shape \(10, 10\), but shape=\(10, 11\)"):
        collio.open(path, "r", backend="zarr", shape=(10, 11))
    with pytest.raises(collio.MismatchError, match="has chunks"):
        collio.open(path, "r+", backend="zarr", chunks=4)
    with collio.open(path, "r", backend="zarr", shape=(10, 10), dtype="<f4", chunks=5) as f:
        assert f.backend.describe()["chunks"] == [5, 5]


def test_read_only_store_refuses_writes(tmp_path):
    path = str(tmp_path / "ro.zarr")
    zarr.create_array(path, shape=(4, 4), dtype="<f8", chunks=(2, 2))
    ro = zarr.storage.LocalStore(path, read_only=True)
    for mode in ("r+", "w"):
        opts = {"shape": (4, 4), "dtype": "<f8"} if mode == "w" else {}
        with pytest.raises(collio.BackendError, match="read-only") as info:
            collio.open(ro, mode, backend="zarr", **opts)
        assert info.value.errno == 30  # EROFS
    with collio.open(ro, "r", backend="zarr") as f:
        with pytest.raises(collio.ModeError):
            f.write_all(np.zeros((4, 4)), layouts.Subarray((4, 4), (0, 0), (4, 4), "<f8"))


def test_layout_must_match_the_array(tmp_path):
    path = str(tmp_path / "m.zarr")
    with collio.open(path, "w", backend="zarr", shape=(6, 6), dtype="<f8", chunks=(4, 4)) as f:
        with pytest.raises(collio.LayoutError, match=r"global shape \(6, 7\) does not match"):
            f.write_all(np.zeros((6, 7)), layouts.Subarray((6, 7), (0, 0), (6, 7), "<f8"))
        with pytest.raises(collio.LayoutError, match="dtype int32 does not match"):
            f.read_all(layouts.Subarray((6, 6), (0, 0), (6, 6), "<i4"))
        lay = layouts.Subarray((6, 6), (0, 0), (6, 6), "<f8")
        f.write_all(np.ones((6, 6)), lay)  # the file is still usable after the errors
        np.testing.assert_array_equal(f.read_all(lay), np.ones((6, 6)))
    assert sorted(os.listdir(os.path.join(path, "c"))) == ["0", "1"]
