"""The backend registry: names, inferred backends, refused names (no MPI, no I/O)."""

from __future__ import annotations

import pytest

import collio
from collio.backends import infer_backend


def test_unknown_backend_names_the_known_ones():
    with pytest.raises(collio.ModeError, match="unknown backend 'nope'; known: .*memory.*posix"):
        collio.get_backend("nope")


@pytest.mark.parametrize(
    ("target", "backend"),
    [("s3://bkt/x.bin", "s3"), ("mem://x", "memory"), ("/d/field.zarr", "zarr"),
     ("/d/field.zarr/", "zarr"), ("/d/field.bin", "posix")],
)  # fmt: skip
def test_backend_inferred_from_the_path(target, backend):
    assert infer_backend(target) == backend


def test_backend_inferred_from_a_zarr_store(tmp_path):
    zarr = pytest.importorskip("zarr")
    assert infer_backend(zarr.storage.LocalStore(str(tmp_path / "y"))) == "zarr"
