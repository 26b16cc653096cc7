"""``import collio`` imports numpy and mpi4py only; a backend's missing package is named.

Each check runs in a fresh interpreter, since this one has imported everything by now.
"""

from __future__ import annotations

import pytest

from collio.testing.jobs import python

OPTIONAL = ("h5py", "zarr", "boto3", "botocore", "s3fs", "hdf5plugin")


def test_import_collio_imports_no_optional_package():
    """Not at import, nor when listing the backends (entry points are not loaded)."""
    code = (
        "import sys, collio; collio.known_backends()\n"
        f"print([m for m in {OPTIONAL!r} if m in sys.modules])"
    )
    out = python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("backend", "package", "extra"), [("s3", "boto3", "s3"), ("zarr", "zarr", "zarr")]
)
def test_missing_package_gives_install_hint(backend, package, extra):
    code = (
        f"import sys; sys.modules[{package!r}] = None  # what an environment without it sees\n"
        "import collio\n"
        f"try:\n    collio.get_backend({backend!r})\n"
        "except collio.BackendUnavailableError as e:\n    print(e)\n"
    )
    out = python(code)
    assert out.returncode == 0, out.stderr
    assert f"pip install -e '.[{extra}]'" in out.stdout and package in out.stdout
