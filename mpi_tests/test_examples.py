"""Every example in ``examples/`` runs under the suite's ranks and checks its own result."""

from __future__ import annotations

import importlib.util
import os

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
#: The user examples; each has ``main(comm, ...)`` and asserts what it wrote.
NAMES = [
    "solver_restart",
    "h5py_user",
    "zarr_user",
    "s3_user",
    "mpiio_port",
    "parallel_npy",
    "mpi_dropin",
    "checkpoint_loop",
    "small_calls",
]
NEEDS = {"h5py_user": "h5py", "zarr_user": "zarr", "s3_user": "moto.server"}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", f"{EXAMPLES}/{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi
def test_every_example_is_checked():
    scripts = {f[:-3] for f in os.listdir(EXAMPLES) if f.endswith(".py")}
    assert scripts == set(NAMES)


@pytest.mark.mpi
@pytest.mark.parametrize("name", NAMES)
def test_example_runs_and_checks_itself(comm, mpi_tmp_path, name, capsys):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    example = _load(name)
    if name == "s3_user":
        example.main(comm)  # starts its own local S3 server
    else:
        example.main(comm, directory=str(mpi_tmp_path))
    printed = capsys.readouterr().out
    assert (printed != "") is (comm.rank == 0), printed  # rank 0 reports what it checked
