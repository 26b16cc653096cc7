"""HDF5 in ``collio-bench``: collio.h5 beside h5py after a gather, and parallel h5py.

``collio-hdf5``
    :mod:`collio.h5`: ``collio.h5.File`` (the h5py driver ``"collio"``), a dataset
    made by ``collio.h5.create_dataset`` (contiguous, allocated early, never filled;
    chunked when ``-O chunks=`` or ``-O codec=`` is given), ``write_all`` /
    ``read_all``, and the collective close (metadata, fsync).
``hdf5-gather``
    The whole array gathered on rank 0 (straight into place), which writes it with
    serial h5py (``create_dataset(data=...)``, the same chunking and filter) and
    fsyncs; reads: rank 0 reads the dataset with h5py and sends each rank its piece.
``h5py-mpio``
    Parallel h5py (``driver="mpio"``, ``with dset.collective: dset[box] = piece``),
    only where h5py was built with MPI; elsewhere it is left out of the run, saying so.
    Box layouts only (every pattern but ``cyclic``).

Timed from open to a durable close.  collio.h5's close always fsyncs, so with
``--no-fsync`` only the baselines skip it.  ``-W`` reads the file back with plain
h5py on every rank.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import h5py
import numpy as np
import numpy.typing as npt

import collio.h5

from ..backends.fsync import fsync_path
from ..layouts import Subarray
from .apis import Api, Job
from .builtin import CollioApi
from .options import HDF5, parse_shape
from .patterns import Workload
from .rootio import gather_whole, read_on_root

__all__ = ["CollioHdf5Api", "H5pyMpioApi", "Hdf5GatherApi", "dataset_options"]

_CODECS = ("none", "gzip", "lzf")
_DSET = "m"


def dataset_options(work: Workload, options: dict[str, str]) -> dict[str, Any]:
    """``create_dataset`` keywords from ``-O chunks=, codec=, level=`` (ValueError if bad)."""
    codec = options.get("codec", "none")
    if codec not in _CODECS:
        raise ValueError(f"-O codec={codec!r}: hdf5 codecs are {', '.join(_CODECS)}")
    if "chunks" not in options and codec == "none":
        return {}  # contiguous
    nd = len(work.shape)
    chunks = parse_shape(options.get("chunks", "256"), nd, "chunks")
    if 0 in chunks:
        raise ValueError(f"-O chunks={options['chunks']!r}: chunk edges must be >= 1")
    out: dict[str, Any] = {"chunks": tuple(min(c, n) for c, n in zip(chunks, work.shape,
                                                                    strict=True))}  # fmt: skip
    if codec == "gzip":
        out.update(compression="gzip", compression_opts=int(options.get("level", "1")))
    elif codec == "lzf":
        out["compression"] = "lzf"
    return out


class _H5Target:
    """What the three share: the file, the dataset's options, cleanup and -W."""

    name: ClassVar[str]
    job: Job
    own_target: ClassVar[bool] = True
    option_help: ClassVar[dict[str, str]] = HDF5

    @classmethod
    def check(cls, work: Workload, options: dict[str, str], writing: bool) -> None:
        dataset_options(work, options)

    def setup(self) -> None:
        self.create = dataset_options(self.job.work, self.job.options)
        self.file_path = f"{self.job.path}.{self.name}.h5"

    def prepare(self, writing: bool) -> None:
        if writing and self.job.comm.rank == 0 and os.path.exists(self.file_path):
            os.unlink(self.file_path)

    def teardown(self) -> None:
        if self.job.comm.rank == 0 and not self.job.keep and hasattr(self, "target"):
            if os.path.exists(self.file_path):
                os.unlink(self.file_path)

    def written(self) -> npt.NDArray[Any] | None:
        """The rank's piece, read back with plain h5py."""
        j = self.job
        with h5py.File(self.file_path, "r") as f:
            d = f[_DSET]
            if isinstance(j.layout, Subarray):
                return np.asarray(d[j.layout.slices])
            return j.work.piece(d[...], j.comm.rank)

    def dataset_used(self) -> dict[str, Any]:
        c = self.create
        return {"h5_layout": "chunked" if c else "contiguous", "h5_chunks": c.get("chunks"),
                "h5_compression": c.get("compression")}  # fmt: skip


class CollioHdf5Api(_H5Target, CollioApi):
    """collio.h5: metadata on every rank alike, raw data through the two-phase engine."""

    name: ClassVar[str] = "collio-hdf5"

    def target(self) -> str:
        return self.file_path

    def open(self, writing: bool) -> None:
        j = self.job
        w = j.work
        self.f = collio.h5.File(
            self.file_path, "w" if writing else "r", comm=j.comm, hints=self.hints() or None
        )
        if writing:
            self.d = collio.h5.create_dataset(self.f, _DSET, w.shape, w.dtype, **self.create)
        else:
            self.d = self.f[_DSET]

    def transfer(self, writing: bool) -> None:
        j = self.job
        if writing:
            collio.h5.write_all(self.d, j.data, j.layout)
        else:
            collio.h5.read_all(self.d, j.layout, out=j.out)

    def close(self) -> None:
        """Collective: metadata agreed and written, fsync (collio.h5's close is durable)."""
        stats, writing = collio.h5.stats(self.f), self.f.mode != "r"
        self.d = None
        self.f.close()
        self.note(stats, writing)

    def hints_used(self) -> dict[str, Any]:
        return {**super().hints_used(), **self.dataset_used()}


class Hdf5GatherApi(_H5Target, Api):
    """Gather to rank 0, serial h5py write (+ fsync); reads: rank 0 reads, then scatters."""

    name: ClassVar[str] = "hdf5-gather"

    def open(self, writing: bool) -> None:
        pass

    def transfer(self, writing: bool) -> None:
        j = self.job
        if writing:
            whole = gather_whole(j)
            if whole is not None:
                with h5py.File(self.file_path, "w") as f:
                    f.create_dataset(_DSET, data=whole, **self.create)
                if j.fsync:
                    fsync_path(self.file_path)
            return

        def read() -> npt.NDArray[Any]:
            with h5py.File(self.file_path, "r") as f:
                return np.asarray(f[_DSET][...])

        read_on_root(j, read, "hdf5-gather read on rank 0")

    def close(self) -> None:
        pass

    def hints_used(self) -> dict[str, Any]:
        return self.dataset_used()


class H5pyMpioApi(_H5Target, Api):
    """Parallel h5py with ``dset.collective`` (needs h5py built against parallel HDF5)."""

    name: ClassVar[str] = "h5py-mpio"

    @classmethod
    def unavailable(cls) -> str | None:
        if h5py.get_config().mpi:
            return None
        return (
            f"this h5py ({h5py.version.version}, HDF5 {h5py.version.hdf5_version}) was built "
            "without MPI; parallel h5py needs one built against a parallel HDF5 "
            "(HDF5_MPI=ON CC=mpicc pip install --no-binary=h5py h5py)"
        )

    @classmethod
    def check(cls, work: Workload, options: dict[str, str], writing: bool) -> None:
        super().check(work, options, writing)
        if work.block is not None:
            raise ValueError("h5py-mpio: box decompositions only (not the cyclic pattern)")

    def open(self, writing: bool) -> None:
        j, w = self.job, self.job.work
        self.f = h5py.File(self.file_path, "w" if writing else "r", driver="mpio", comm=j.comm)
        if writing:
            self.d = self.f.create_dataset(_DSET, w.shape, w.dtype, **self.create)
        else:
            self.d = self.f[_DSET]

    def transfer(self, writing: bool) -> None:
        j = self.job
        assert isinstance(j.layout, Subarray)
        with self.d.collective:
            if writing:
                self.d[j.layout.slices] = j.data
            else:
                j.out[...] = self.d[j.layout.slices]
        if writing and j.fsync:
            self.f.flush()

    def close(self) -> None:
        self.d = None
        self.f.close()

    def hints_used(self) -> dict[str, Any]:
        return self.dataset_used()
