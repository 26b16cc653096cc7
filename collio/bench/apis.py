"""The I/O interfaces the benchmark compares, as a name-keyed registry (IOR's ``aiori``).

An API is a small class: ``open`` / ``transfer`` / ``close`` (each timed by the
runner; ``transfer`` writes or reads the rank's piece, with fsync when asked),
plus optional ``setup`` / ``teardown`` and ``hints_used``.  Built-ins:

``collio``        collio's ``write_all`` / ``read_all`` (posix backend; two-phase, but reads
                  on a local file system copy from the mapped file: hint ``mapped_reads``)
``collio-mpiio``  the same, aggregators writing through ``MPI.File`` (mpiio backend)
``mpiio``         ROMIO collective: ``MPI.File`` with a file view, ``Write_all``
``mpiio-tuned``   the same with ``cb_nodes`` = ranks and ``cb_config_list`` = ``*:*``
``mpiio-indep``   ``MPI.File.Write_at`` per piece (independent)
``collio-mpi``    ``mpiio``'s calls on ``collio.mpi.File``, the drop-in ``MPI.File``
``posix``         ``os.pwrite`` per piece (independent)
``ceiling``       each rank writes its 1/p share of the bytes with one ``pwrite``
``collio-direct`` ``collio`` with hint ``direct_write=true`` (``O_DIRECT``)
``collio-noflush`` ``collio`` with hint ``early_flush=false`` (flushed only at ``sync()``)
``collio-shuffle`` ``collio`` with hint ``mapped_reads=disable`` (two-phase reads everywhere)
``ceiling-direct`` the ceiling written with ``O_DIRECT``
``collio-two-level`` ``collio`` with hint ``cb_two_level=enable`` (``-one-level``: ``disable``)
``bare``          two-phase with raw mpi4py and ``pwrite``, no collio (:mod:`collio.bench.bare`)

and, imported only when asked for (zarr, boto3, h5py are optional):

``collio-zarr``   collio's zarr backend (:mod:`collio.bench.zarr_apis`)
``zarr-plain``    each rank assigns its own region with plain zarr (chunk-aligned only)
``zarr-locked``   plain zarr, chunk by chunk under an exclusive ``flock`` per chunk
``collio-s3``     collio's S3 multipart backend (:mod:`collio.bench.s3_apis`)
``s3-gather``     gather to rank 0, which uploads one multipart upload
``s3-ceiling``    rank 0 uploads the same bytes, already in memory, in parts of the same size
``collio-hdf5``   :mod:`collio.h5` into one HDF5 file (:mod:`collio.bench.hdf5_apis`)
``hdf5-gather``   gather to rank 0, which writes with serial h5py
``h5py-mpio``     parallel h5py (``driver="mpio"``, ``dset.collective``), where h5py has MPI

Adding one (another backend, another library) takes one module::

    import collio
    from collio.bench.apis import register_api
    from collio.bench.builtin import CollioApi

    class ZarrApi(CollioApi):
        name = "collio-zarr"
        backend = "zarr"

        def target(self) -> str:
            return self.job.path + ".zarr"

        def written(self):  # -W: read it back (not a flat file)
            with collio.open(self.target(), "r", comm=self.job.comm) as f:
                return f.read_all(self.job.layout)

    register_api("collio-zarr", "mypkg.bench_zarr:ZarrApi")

or an entry point in the ``collio.bench_apis`` group (``name = "module:Class"``);
registered modules are imported only when their API is asked for.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..backends.registry import Entry, Registry, install_hint
from ..hints import parse_size
from ..layouts import ArrayLayout
from ..runs import Runs
from .patterns import Workload

__all__ = ["Api", "Job", "api_hints", "get_api", "known_apis", "register_api", "split_runs"]

I64 = npt.NDArray[np.int64]


@dataclasses.dataclass(slots=True)
class Job:
    """What every API needs: the rank's piece, where it goes, and the user's choices."""

    comm: MPI.Intracomm
    work: Workload
    layout: ArrayLayout
    data: npt.NDArray[Any]
    out: npt.NDArray[Any]
    path: str
    hints: dict[str, str]
    fsync: bool = True
    options: dict[str, str] = dataclasses.field(default_factory=dict)
    keep: bool = False

    def option(self, key: str, default: str) -> str:
        """The ``-O`` option ``key`` (its default when not given)."""
        return self.options.get(key, default)

    @property
    def pieces(self) -> Runs:
        """The independent requests: the layout's runs, cut at ``-t`` when given."""
        return split_runs(self.layout.runs(), self.work.transfer)


def split_runs(runs: Runs, size: int) -> Runs:
    """Cut runs into pieces of at most ``size`` bytes (0: keep them whole); vectorised."""
    if size <= 0 or not len(runs) or int(runs.length.max()) <= size:
        return runs
    n = -(-runs.length // size)
    idx = np.repeat(np.arange(len(runs)), n)
    first = np.concatenate(([0], np.cumsum(n)[:-1]))
    k = np.arange(len(idx), dtype=np.int64) - first[idx]
    length = np.minimum(size, runs.length[idx] - k * size)
    return Runs(runs.file[idx] + k * size, length, runs.mem[idx] + k * size)


class Api:
    """One interface under test; subclasses override the phases they need.

    ``open``, ``transfer`` and ``close`` are called on every rank of ``job.comm``
    in the same order (collective for collective APIs); an exception on some
    ranks is agreed by the runner and raised on all of them.
    """

    name: ClassVar[str] = "abstract"
    #: Places the layout's bytes where they belong, so ``-W`` / ``-R`` can check them.
    verifiable: ClassVar[bool] = True
    #: Extra hints this API adds on top of the user's.
    extra_hints: ClassVar[dict[str, str]] = {}
    #: The ``-O key=value`` options this API reads, with a one-line help each.
    option_help: ClassVar[dict[str, str]] = {}
    #: Its target is not the flat test file: a read-only run (``-r``) first writes it,
    #: untimed, through the API itself.
    own_target: ClassVar[bool] = False
    #: Ranks wait for each other sleeping instead of polling (a local server needs the CPU).
    quiet: ClassVar[bool] = False

    def __init__(self, job: Job) -> None:
        self.job = job

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this API cannot run here (e.g. a library built without MPI), or None."""
        return None

    @classmethod
    def check(cls, work: Workload, options: dict[str, str], writing: bool) -> None:
        """Pure, on every rank alike, before any I/O: raise ValueError to refuse the run."""

    def hints(self) -> dict[str, str]:
        """The hints this API passes: the user's (sizes as plain bytes), then its own."""
        return api_hints(type(self), self.job.hints, self.job.comm.size)

    def setup(self) -> None:
        """Once before the iterations (not timed)."""

    def prepare(self, writing: bool) -> None:
        """Collective, before each timed phase (not timed): e.g. create an empty array."""

    def finish(self, writing: bool) -> None:
        """Collective, after each timed phase and its verification (not timed)."""

    def open(self, writing: bool) -> None:
        raise NotImplementedError

    def transfer(self, writing: bool) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        """Once after the iterations."""

    def hints_used(self) -> dict[str, Any]:
        """The values the library actually used (after the last open)."""
        return self.hints()

    def written(self) -> npt.NDArray[Any] | None:
        """This rank's piece as stored, for ``-W`` (called on every rank, after a write).

        Default: the test file as a flat array (a memmap).  Backends whose target is
        not a flat file (zarr, HDF5, memory) read it back their own way.
        """
        w = self.job.work
        if os.path.getsize(self.job.path) < w.nbytes:
            return np.zeros(0, w.dtype)
        whole = np.memmap(self.job.path, dtype=w.dtype, mode="r", shape=w.shape)
        return w.piece(whole, self.job.comm.rank)

    def read_errors(self) -> int:
        """For ``-R``: elements this rank read wrong (summed over ranks by the runner).

        Default: ``job.out`` against ``job.data``.  An API whose reads do not land
        in every rank's ``job.out`` (one process reading the whole object) counts its
        own, 0 on the ranks that read nothing.
        """
        j = self.job
        return int(np.count_nonzero(j.out != j.data)) if j.out.size else 0


def api_hints(api: type[Api], given: dict[str, str], nranks: int) -> dict[str, str]:
    """The hints ``api`` passes in a job of ``nranks``: ``given`` (sizes as plain bytes),
    then the API's own (``{nranks}`` replaced)."""
    out = {k: _plain(k, v) for k, v in given.items()}
    out.update({k: v.replace("{nranks}", str(nranks)) for k, v in api.extra_hints.items()})
    return out


#: Hints whose values are byte counts or numbers: ROMIO reads them with atoi, so "4m" -> "4194304".
_NUMERIC = re.compile(r"^(cb_buffer_size|cb_nodes|striping_unit|striping_factor|ind_\w+_size)$")


def _plain(key: str, value: str) -> str:
    if _NUMERIC.match(key):
        return str(parse_size(value, key))
    return value


def _info(hints: dict[str, str]) -> MPI.Info:
    info = MPI.Info.Create()
    for k, v in hints.items():
        info.Set(k, str(v))
    return info


def file_hints(fh: MPI.File) -> dict[str, str | None]:
    """The hints an open ``MPI.File`` uses, as ROMIO reports them."""
    info = fh.Get_info()
    try:
        return {info.Get_nthkey(i): info.Get(info.Get_nthkey(i)) for i in range(info.Get_nkeys())}
    finally:
        info.Free()


def _unknown(name: str, known: list[str]) -> Exception:
    return ValueError(f"unknown API {name!r}; known: {', '.join(known)}")


def _missing(name: str, module: str, extra: str | None) -> Exception | None:
    if extra is None:  # not an optional package: a genuine import error
        return None
    top = module.partition(".")[0]
    return ValueError(f"API {name!r} needs {top}, which is not installed: {install_hint(extra)}")


#: The built-in APIs: where each is (under collio.bench) and what it measures.
_BUILTIN = {
    "collio": (
        "builtin:CollioApi",
        "collio write_all/read_all, posix backend (reads mapped on a local fs)",
    ),
    "collio-mpiio": (
        "builtin:CollioMpiioApi",
        "collio two-phase, aggregators write through MPI.File",
    ),
    "mpiio": ("builtin:MpiioApi", "ROMIO collective: file view + Write_all/Read_all"),
    "mpiio-tuned": (
        "builtin:MpiioTunedApi",
        "ROMIO collective, cb_nodes = ranks, cb_config_list = *:*",
    ),
    "mpiio-indep": ("builtin:MpiioIndepApi", "MPI.File.Write_at/Read_at per piece"),
    "collio-mpi": ("builtin:CollioMpiApi", "mpiio's calls on collio.mpi.File (drop-in MPI.File)"),
    "posix": ("builtin:PosixApi", "os.pwrite/preadv per piece"),
    "ceiling": (
        "builtin:CeilingApi",
        "each rank's 1/p share as one contiguous pwrite (not the layout)",
    ),
    "collio-direct": (
        "builtin:CollioDirectApi",
        "collio with hint direct_write=true (O_DIRECT around the page cache)",
    ),
    "collio-noflush": (
        "builtin:CollioNoflushApi",
        "collio with hint early_flush=false (no fdatasync before sync())",
    ),
    "collio-shuffle": (
        "builtin:CollioShuffleApi",
        "collio with hint mapped_reads=disable (reads shuffle on local disks too)",
    ),
    "collio-two-level": (
        "builtin:CollioTwoLevelApi",
        "collio with hint cb_two_level=enable (local aggregators on each node first)",
    ),
    "collio-one-level": (
        "builtin:CollioOneLevelApi",
        "collio with hint cb_two_level=disable (every rank sends to the aggregators)",
    ),
    "ceiling-direct": (
        "builtin:CeilingDirectApi",
        "the ceiling with O_DIRECT writes (around the page cache)",
    ),
    "bare": (
        "bare:BareApi",
        "two-phase with raw mpi4py + pwrite, no collio (colblock only): a floor",
    ),
    "collio-zarr": ("zarr_apis:CollioZarrApi", "collio's zarr backend [zarr]"),
    "zarr-plain": (
        "zarr_apis:ZarrPlainApi",
        "plain zarr, each rank its own region; chunk-aligned only [zarr]",
    ),
    "zarr-locked": (
        "zarr_apis:ZarrLockedApi",
        "plain zarr chunk by chunk under a flock per chunk [zarr]",
    ),
    "collio-s3": ("s3_apis:CollioS3Api", "collio's S3 multipart backend [s3]"),
    "s3-gather": ("s3_apis:S3GatherApi", "gather to rank 0, one multipart upload from there [s3]"),
    "s3-ceiling": (
        "s3_apis:S3CeilingApi",
        "rank 0 uploads the bytes already in memory, same parts [s3]",
    ),
    "collio-hdf5": (
        "hdf5_apis:CollioHdf5Api",
        "collio.h5 into one HDF5 file (contiguous; -O codec=gzip) [hdf5]",
    ),
    "hdf5-gather": ("hdf5_apis:Hdf5GatherApi", "gather to rank 0, serial h5py write [hdf5]"),
    "h5py-mpio": (
        "hdf5_apis:H5pyMpioApi",
        "parallel h5py, dset.collective (needs h5py built with MPI) [hdf5]",
    ),
}
#: Every API ``-a`` / ``--compare`` know.
APIS: Registry[Api] = Registry(
    "collio.bench_apis",
    {name: Entry(f"collio.bench.{path}", None, about) for name, (path, about) in _BUILTIN.items()},
    unknown=_unknown,
    missing=_missing,
)
#: What each built-in measures, by name (``--list-apis``), without importing anything.
ABOUT: dict[str, str] = {name: APIS.about(name) for name in APIS.names()}


def register_api(name: str, path: str | type[Api]) -> None:
    """Make an API known by name.

    Parameters
    ----------
    name
        What ``-a`` / ``--compare`` call it.
    path
        The class, or ``"module:Class"`` imported on first use (lazy, like
        :func:`collio.register_backend`).
    """
    APIS.register(name, path)


def known_apis() -> list[str]:
    return APIS.names()


def get_api(name: str) -> type[Api]:
    """The API class called ``name`` (imports its module on first use).

    Looks in the built-ins and :func:`register_api`, then the ``collio.bench_apis``
    entry-point group.

    Raises
    ------
    ValueError
        No API has that name (the message lists the known ones), or it needs an
        optional package that is not installed (the message says how to install it).
    """
    return APIS.get(name)


def open_fd(path: str, writing: bool) -> int:
    """A plain file descriptor for the independent APIs (creating the file when writing)."""
    return os.open(path, (os.O_RDWR | os.O_CREAT) if writing else os.O_RDONLY, 0o666)
