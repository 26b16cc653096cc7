"""The shared conformance suite, specialised for the zarr backend.

Subclass :class:`ZarrBackendTests` and provide ``target`` (a path every rank agrees
on); override ``open_options`` to try other chunkings, shards or codecs.  The bypass
reader is plain zarr.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from collio import layouts

from .backend_suite import F8, SHAPE, global_array
from .target_suites import ArrayBackendTests

__all__ = ["ZarrBackendTests"]


class ZarrBackendTests(ArrayBackendTests):
    """:class:`ArrayBackendTests` on zarr arrays shaped like the suite's global array."""

    backend = "zarr"

    @pytest.fixture
    def open_options(self) -> dict[str, Any]:
        # chunks that no decomposition of the suite lines up with
        return {"shape": SHAPE, "dtype": F8, "chunks": (10, 7)}

    def stored(self, target: Any, open_options: dict[str, Any]) -> Any:
        import zarr

        try:
            return zarr.open_array(target, mode="r")[...]
        except FileNotFoundError:  # zarr's ArrayNotFoundError and NodeNotFoundError too
            return None

    def test_never_written_elements_read_as_the_fill_value(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        """Not ``sparse``: rows 0-19 are never written and read as ``fill_value``."""
        glob = global_array(seed=15)
        lower = layouts.block((SHAPE[0] - 20, SHAPE[1]), F8, comm=comm, grid=(comm.size, 1))
        lay = layouts.Subarray(SHAPE, (20 + lower.start[0], 0), lower.shape, F8)
        want = glob.copy()
        want[:20] = -2.5
        opts = {**open_options, "fill_value": -2.5}
        with self.open(target, "w", comm, opts) as f:
            f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        self.assert_stored(target, comm, open_options, want)
        whole = layouts.block(SHAPE, F8, comm=comm)
        with self.open(target, "r", comm, open_options) as f:
            np.testing.assert_array_equal(f.read_all(whole), want[whole.slices])
