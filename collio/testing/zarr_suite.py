"""The shared conformance suite, specialised for the zarr backend.

Subclass :class:`ZarrBackendTests` and provide ``target`` (a path every rank
agrees on); override ``open_options`` to try other chunkings, shards or codecs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from collio import layouts

from .backend_suite import SHAPE, BackendTests, _global

__all__ = ["ZarrBackendTests"]


class ZarrBackendTests(BackendTests):
    """:class:`BackendTests` on zarr arrays shaped like the suite's global array."""

    backend = "zarr"
    byte_addressable = False

    @pytest.fixture
    def open_options(self) -> dict[str, Any]:
        # chunks that no decomposition of the suite lines up with
        return {"shape": SHAPE, "dtype": "<f8", "chunks": (10, 7)}

    def test_update_in_place_keeps_the_rest(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        """The base test's rewrite of every third row, as an array layout.

        The base version writes the rows as raw byte ``Segments``; a zarr array has
        no flat byte addresses, so the same rows are given by their indices.
        Every chunk those rows cross is covered in part, so each is read, merged
        and rewritten by its one owner.
        """
        glob = _global(seed=5)
        lay = layouts.block(SHAPE, "<f8", comm=comm)
        with self.open(target, "w", comm, open_options) as f:
            f.write_all(np.ascontiguousarray(glob[lay.slices]), lay)
        rows = np.arange(0, SHAPE[0], 3)
        mine = rows[comm.rank :: comm.size]
        new = glob.copy()
        new[rows] = -1.0
        dims = [
            layouts.DimSet(3 * comm.rank, 1, 3 * comm.size, len(mine)),
            layouts.DimSet.interval(0, SHAPE[1]),
        ]
        lay2 = layouts.ArrayLayout(SHAPE, dims, "<f8")
        with self.open(target, "r+", comm, open_options, hints={"cb_buffer_size": 4096}) as f:
            f.write_all(np.full(lay2.local_shape, -1.0), lay2)
        np.testing.assert_array_equal(self.read_whole(target, comm, open_options), new)

    def test_byte_segments_are_refused_on_every_rank(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        import collio

        with self.open(target, "w", comm, open_options) as f:
            with pytest.raises(collio.LayoutError, match="needs an array layout") as info:
                f.write_all(np.zeros(8, np.uint8), layouts.Segments([8 * comm.rank], [8]))
        texts = comm.allgather(str(info.value))
        assert texts == [texts[0]] * comm.size
