"""The mpiio backend and .npy headers on one rank (no mpiexec)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import collio
from collio import layouts
from collio.npy import npy_header
from collio.testing.backend_suite import BackendTests


class TestMpiio(BackendTests):
    backend = "mpiio"

    @pytest.fixture
    def target(self, tmp_path):
        return str(tmp_path / "conformance.bin")


def test_mpiio_is_registered_lazily():
    assert "mpiio" in collio.known_backends()
    assert collio.get_backend("mpiio").name == "mpiio"


def test_mpiio_rejects_atomic_commit_and_unknown_options(tmp_path):
    with pytest.raises(collio.ModeError, match="atomic_commit"):
        collio.open(str(tmp_path / "a"), "w", backend="mpiio", hints={"atomic_commit": True})
    with pytest.raises(collio.ModeError, match="unknown options"):
        collio.open(str(tmp_path / "a"), "w", backend="mpiio", bogus=1)


def test_mpiio_reads_past_the_end_as_zeros(tmp_path):
    path = str(tmp_path / "short.bin")
    with open(path, "wb") as fh:
        fh.write(b"\x07" * 10)
    with collio.open(path, "r", backend="mpiio") as f:
        got = f.read_all(layouts.Segments([4], [20]))
    assert got.tobytes() == b"\x07" * 6 + b"\0" * 14


@pytest.mark.parametrize(
    "shape,dtype,order",
    [((3, 4), "<f8", "C"), ((3, 4), ">i2", "F"), ((), "<c16", "C"), ((5,), [("x", "<f4")], "C"),
     ((2,), [(f"field_with_a_long_name_{i}", "<f8") for i in range(3000)], "C"),
     ((3,), [("温度", "<f4"), ("x", "<i2")], "C")],  # utf-8 field names: format 3.0
)  # fmt: skip
def test_header_is_numpys_own(shape, dtype, order):
    arr = np.zeros(shape, dtype, order=order)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "stored array in format 2.0" (3.0)
        np.save(buf, arr)
    head = npy_header(shape, dtype, order)
    assert buf.getvalue()[: len(head)] == head
    assert len(head) % 64 == 0 and len(buf.getvalue()) == len(head) + arr.nbytes


def test_save_and_load_one_rank(tmp_path):
    path = str(tmp_path / "x.npy")
    glob = np.arange(60, dtype="<i8").reshape(5, 12)
    lay = layouts.block(glob.shape, glob.dtype, order="F")
    collio.save_npy(path, np.asfortranarray(glob), lay)
    np.testing.assert_array_equal(np.load(path), glob)
    np.testing.assert_array_equal(np.load(path, mmap_mode="r"), glob)
    np.testing.assert_array_equal(collio.load_npy(path, lay), glob)
    with pytest.raises(collio.LayoutError, match="offset 8"):
        collio.save_npy(path, glob, layouts.Subarray((5, 12), (0, 0), (5, 12), "<i8", offset=8))
    np.testing.assert_array_equal(np.load(path), glob)  # a bad layout leaves the file alone
    with open(path, "r+b") as fh:
        fh.truncate(200)
    with pytest.raises(collio.LayoutError, match="file has 200 bytes"):
        collio.load_npy(path, lay)


def test_utf8_field_names_format_3(tmp_path):
    """Field names beyond latin-1 need .npy format 3.0 both ways, as np.save / np.load."""
    dt = np.dtype([("温度", "<f4"), ("x", "<i2")])
    glob = np.zeros(6, dt)
    glob["温度"], glob["x"] = np.arange(6) / 2, np.arange(6)
    lay = layouts.block(glob.shape, dt)
    path, theirs = str(tmp_path / "t.npy"), str(tmp_path / "theirs.npy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "stored array in format 3.0"
        collio.save_npy(path, glob, lay)
        np.save(theirs, glob)
    with open(path, "rb") as a, open(theirs, "rb") as b:
        assert a.read() == b.read()
    np.testing.assert_array_equal(collio.load_npy(theirs, lay), glob)
