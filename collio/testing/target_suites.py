"""The conformance suite's tests by what a target holds: bytes (files, memory, objects),
checked against ROMIO's file for the same decomposition, or an array (zarr, an HDF5
dataset), which refuses byte runs.  The tests every backend passes, and how a backend's
test module uses these classes, are in :mod:`collio.testing.backend_suite`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collio
from collio import layouts

from .backend_suite import F8, SHAPE, BackendTests, _layout, _piece, _same_everywhere, global_array
from .romio import romio_write

__all__ = ["ArrayBackendTests", "ByteBackendTests"]


class ByteBackendTests(BackendTests):
    """Backends whose target holds bytes: ``stored`` returns ``bytes``."""

    def as_array(self, content: Any) -> np.ndarray[Any, Any]:
        assert isinstance(content, bytes), type(content)
        assert len(content) == 8 * SHAPE[0] * SHAPE[1], len(content)
        return np.frombuffer(content, F8).reshape(SHAPE)

    @pytest.mark.parametrize("order", ["C", "F"])
    def test_same_bytes_as_romio(
        self,
        comm: MPI.Intracomm,
        target: Any,
        open_options: Any,
        mpi_tmp_path: Path,
        order: str,
    ) -> None:
        """Every decomposition: the target holds exactly what ``MPI.File.Write_all``
        (ROMIO) writes into a file for the same layout and data."""
        glob = global_array(seed=10)
        for kind in ("colblock", "block", "cyclic"):
            lay = _layout(kind, comm, order)
            theirs = str(mpi_tmp_path / f"romio-{kind}-{order}.bin")
            romio_write(theirs, _piece(glob, lay), lay, comm)
            with self.open(target, "w", comm, open_options) as f:
                f.write_all(_piece(glob, lay), lay)
            comm.Barrier()
            with open(theirs, "rb") as fh:
                romio = fh.read()
            assert romio == glob.tobytes(order="F" if order == "F" else "C")
            assert self.bypass(target, comm, open_options) == romio, (kind, order)

    def test_byte_runs_and_update(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        """Raw byte runs (``Segments``), unsorted and of uneven lengths, some empty: the
        target holds them in place; a later 'r+' rewrites a few and keeps the rest."""
        size = 8 * SHAPE[0] * SHAPE[1]
        image = np.random.default_rng(11).integers(0, 256, size, np.uint8)
        cuts = np.sort(np.random.default_rng(12).choice(np.arange(1, size), 90, replace=False))
        starts, ends = np.r_[0, cuts], np.r_[cuts, size]
        mine = np.random.default_rng(comm.rank).permutation(
            np.arange(comm.rank, len(starts), comm.size)
        )
        offs = np.r_[starts[mine], 0, size // 2]  # two empty runs as well
        lens = np.r_[ends[mine] - starts[mine], 0, 0]
        data = np.concatenate([image[a:b] for a, b in zip(offs, offs + lens, strict=True)])
        with self.open(target, "w", comm, open_options) as f:
            f.write_all(data, layouts.Segments(offs, lens))
        assert self.bypass(target, comm, open_options) == image.tobytes()
        offs2 = np.arange(comm.rank, size // 100, comm.size) * 100 + 3
        with self.open(target, "r+", comm, open_options, hints={"cb_buffer_size": 4096}) as f:
            f.write_all(
                np.full(len(offs2) * 10, 0xAB, np.uint8),
                layouts.Segments(offs2, np.full(len(offs2), 10)),
            )
        everyone = np.arange(size // 100) * 100 + 3
        image[(everyone[:, None] + np.arange(10)).ravel()] = 0xAB
        assert self.bypass(target, comm, open_options) == image.tobytes()
        with self.open(target, "r", comm, open_options) as f:
            back = f.read_all(layouts.Segments(offs, lens))
        np.testing.assert_array_equal(back, image[_byte_index(offs, lens)])

    def test_reads_past_the_end_are_zeros(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        glob = global_array(seed=13)
        size = glob.nbytes
        self.write(target, comm, open_options, glob)
        raw = np.frombuffer(glob.tobytes(), np.uint8)
        offs = np.array([size - 100, size + 50 + 10 * comm.rank])
        lens = np.array([300, 20])
        with self.open(target, "r", comm, open_options, hints={"romio_cb_read": "enable"}) as f:
            two_phase = f.read_all(layouts.Segments(offs, lens))
        with self.open(target, "r", comm, open_options, hints={"romio_cb_read": "disable"}) as f:
            direct = f.read_all(layouts.Segments(offs, lens))
        want = np.zeros(320, np.uint8)
        want[:100] = raw[-100:]
        np.testing.assert_array_equal(two_phase, want)
        np.testing.assert_array_equal(direct, want)
        assert self.bypass(target, comm, open_options) == glob.tobytes()  # nothing grew


def _byte_index(offs: Any, lens: Any) -> np.ndarray[Any, Any]:
    """File offset of every byte of the runs, in the order given."""
    offs, lens = np.asarray(offs, np.int64), np.asarray(lens, np.int64)
    first = np.repeat(offs - np.r_[0, np.cumsum(lens)[:-1]], lens)
    return np.asarray(first + np.arange(int(lens.sum())), np.int64)


class ArrayBackendTests(BackendTests):
    """Backends whose target holds an array (zarr, HDF5): ``stored`` returns the array."""

    def as_array(self, content: Any) -> np.ndarray[Any, Any]:
        arr = np.asarray(content)
        assert arr.shape == SHAPE and arr.dtype == np.dtype(F8), (arr.shape, arr.dtype)
        return arr

    def test_byte_segments_are_refused_on_every_rank(
        self, comm: MPI.Intracomm, target: Any, open_options: Any
    ) -> None:
        glob = global_array(seed=14)
        lay = _layout("block", comm)
        with self.open(target, "w", comm, open_options) as f:
            with pytest.raises(collio.LayoutError, match="array layout") as info:
                f.write_all(np.zeros(8, np.uint8), layouts.Segments([8 * comm.rank], [8]))
            _same_everywhere(comm, info.value)
            f.write_all(_piece(glob, lay), lay)  # the file goes on
        self.assert_stored(target, comm, open_options, glob)
