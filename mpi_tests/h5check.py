"""Check an HDF5 file the way a user would: stock h5py in a separate process, and h5dump."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import numpy as np
from mpi4py import MPI

from collio.testing.jobs import python

H5DUMP = shutil.which("h5dump")

VERIFY = r"""
import importlib, json, sys
import h5py, numpy as np
path, npz, attrs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for module in json.loads(sys.argv[4]):  # e.g. hdf5plugin: registers its filters with HDF5
    importlib.import_module(module)
ref = np.load(npz)
with h5py.File(path, "r") as f:
    for key in ref.files:
        name = key.replace("|", "/")
        got = f[name][...]
        assert got.dtype == ref[key].dtype, (name, got.dtype, ref[key].dtype)
        assert np.array_equal(got, ref[key]), f"{name} differs from the reference"
    for where, values in attrs.items():
        for k, v in values.items():
            got = f[where].attrs[k]
            got = got.tolist() if hasattr(got, "tolist") else got
            assert got == v, (where, k, got, v)
print("ok", len(ref.files))
"""


def check_file(
    comm: MPI.Comm,
    path: str,
    expected: dict[str, np.ndarray[Any, Any]],
    attrs: dict[str, dict[str, Any]] | None = None,
    *,
    h5dump: bool = True,
    plugins: tuple[str, ...] = (),
) -> None:
    """Collective: rank 0 opens ``path`` with stock h5py in a fresh process and with h5dump.

    Every rank asserts on rank 0's findings, so all pass or fail together.
    ``h5dump=False`` for files in HDF5 2.0's newest format, which Debian's h5dump 1.10
    cannot read (nor files that h5py itself writes with ``libver='latest'``).
    ``plugins`` are modules the reader imports first, as a user of such a file would
    (``"hdf5plugin"`` for Zstd, Blosc, ...).
    """
    comm.Barrier()  # every rank closed its file
    result: tuple[int, str] | None = None
    if comm.rank == 0:
        npz = path + ".expected.npz"
        np.savez(npz, **{k.replace("/", "|"): v for k, v in expected.items()})
        proc = python(VERIFY, path, npz, json.dumps(attrs or {}), json.dumps(plugins))
        code, text = proc.returncode, proc.stdout + proc.stderr
        if code == 0 and H5DUMP is not None and h5dump:
            dump = subprocess.run([H5DUMP, "-H", path], capture_output=True, text=True, timeout=60)
            code, text = dump.returncode, text + dump.stdout[-2000:] + dump.stderr[-2000:]
            for name in expected:
                if name.rsplit("/", 1)[-1] not in dump.stdout:
                    code, text = 1, f"h5dump -H does not list {name}:\n{dump.stdout}"
        os.unlink(npz)
        result = (code, text)
    code, text = comm.bcast(result, root=0)
    assert code == 0, text
