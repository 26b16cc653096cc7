"""The shared conformance suite, specialised for the hdf5 backend (one dataset per file).

Subclass :class:`Hdf5BackendTests` and provide ``target`` (a path every rank agrees
on); override ``open_options`` for chunked or compressed datasets.  The bypass reader
is stock h5py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from mpi4py import MPI

import collio

from .backend_suite import F8, SHAPE, global_array
from .target_suites import ArrayBackendTests

__all__ = ["Hdf5BackendTests"]


class Hdf5BackendTests(ArrayBackendTests):
    """:class:`ArrayBackendTests` on an HDF5 dataset shaped like the suite's global array."""

    backend = "hdf5"

    @pytest.fixture
    def open_options(self) -> dict[str, Any]:
        return {"dataset": "x", "shape": SHAPE, "dtype": F8}

    def stored(self, target: Any, open_options: dict[str, Any]) -> Any:
        import h5py

        if not os.path.exists(target):
            return None
        with h5py.File(target, "r") as f:
            return f[open_options["dataset"]][...]

    def test_missing_dataset_fails_everywhere(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        """A file without the dataset: every rank raises the same error naming it."""
        self.write(target, comm, open_options, global_array(seed=16))
        other = {**open_options, "dataset": "nope"}
        with pytest.raises(collio.BackendError, match="no dataset 'nope'") as info:
            self.open(target, "r", comm, other)
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size
