"""The built-in APIs of the registry in :mod:`collio.bench.apis`."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

import collio

from ..backends.fdio import pread_exact, pwrite_all
from ..backends.posix import open_direct, write_split
from ..buffers import PAGE
from ..mpi import File as CollioFile
from ..stats import Stats
from ..testing.romio import filetype
from .apis import Api, _info, file_hints, open_fd

__all__ = [
    "CollioApi",
    "CollioMpiioApi",
    "MpiioApi",
    "MpiioTunedApi",
    "CollioMpiApi",
    "MpiioIndepApi",
    "PosixApi",
    "CeilingApi",
    "CollioDirectApi",
    "CollioNoflushApi",
    "CollioShuffleApi",
    "CeilingDirectApi",
]


def _bytes(arr: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


class CollioApi(Api):
    """collio's collective write_all / read_all; ``backend`` None infers it from the target."""

    name: ClassVar[str] = "collio"
    backend: ClassVar[str | None] = None

    def target(self) -> Any:
        """What ``collio.open`` gets (override for other backends)."""
        return self.job.path

    def open(self, writing: bool) -> None:
        j = self.job
        self.f = collio.open(
            self.target(), "w" if writing else "r", comm=j.comm, hints=self.hints() or None,
            backend=self.backend,
        )  # fmt: skip

    def transfer(self, writing: bool) -> None:
        j = self.job
        if writing:
            self.f.write_all(j.data, j.layout)
            if j.fsync:
                self.f.sync()
        else:
            self.f.read_all(j.layout, out=j.out)

    def close(self) -> None:
        writing = self.f.mode != "r"
        self.f.close()
        self.note(self.f.stats, writing)

    def note(self, stats: Stats, writing: bool) -> None:
        """Keep what the file used, for the report: a write's hints (reads never use
        direct_write), and after a read whether it copied from the map (mapped_reads)."""
        if writing or not hasattr(self, "used"):
            self.used = stats.hints
        if not writing:  # (the mapped path preads a rank's few small runs: no bytes copied)
            self.reads_mapped = stats.mapped_bytes > 0 or stats.last_call.get("path") == "mapped"
        self.stats = stats

    def hints_used(self) -> dict[str, Any]:
        used = dict(getattr(self, "used", self.hints()))
        if hasattr(self, "reads_mapped"):
            used["reads_mapped"] = self.reads_mapped
        return used


class CollioMpiioApi(CollioApi):
    """collio's two-phase planning and shuffle, aggregators writing through ``MPI.File``."""

    name: ClassVar[str] = "collio-mpiio"
    backend: ClassVar[str | None] = "mpiio"


class CollioDirectApi(CollioApi):
    """collio with hint ``direct_write``: aggregators write around the page cache (O_DIRECT)."""

    name: ClassVar[str] = "collio-direct"
    extra_hints: ClassVar[dict[str, str]] = {"direct_write": "true"}


class CollioNoflushApi(CollioApi):
    """collio with hint ``early_flush=false``: nothing flushed before ``sync()``."""

    name: ClassVar[str] = "collio-noflush"
    extra_hints: ClassVar[dict[str, str]] = {"early_flush": "false"}


class CollioShuffleApi(CollioApi):
    """collio with hint ``mapped_reads=disable``: reads keep the two-phase shuffle on a
    local file system too (writes are ``collio``'s)."""

    name: ClassVar[str] = "collio-shuffle"
    extra_hints: ClassVar[dict[str, str]] = {"mapped_reads": "disable"}


class CollioTwoLevelApi(CollioApi):
    """collio with hint ``cb_two_level=enable``: on several nodes (or emulated ones,
    ``COLLIO_RANKS_PER_NODE``) ranks hand their pieces to local aggregators first.  Reads
    shuffle (``mapped_reads=disable``), so that they go through the two levels too."""

    name: ClassVar[str] = "collio-two-level"
    extra_hints: ClassVar[dict[str, str]] = {"cb_two_level": "enable", "mapped_reads": "disable"}


class CollioOneLevelApi(CollioApi):
    """``collio-two-level``'s counterpart, ``cb_two_level=disable``: every rank sends to
    the aggregators (reads shuffle too)."""

    name: ClassVar[str] = "collio-one-level"
    extra_hints: ClassVar[dict[str, str]] = {"cb_two_level": "disable", "mapped_reads": "disable"}


class MpiioApi(Api):
    """ROMIO collective I/O: a file view from the layout, then ``Write_all`` / ``Read_all``."""

    name: ClassVar[str] = "mpiio"
    collective: ClassVar[bool] = True
    #: The class whose ``Open`` makes the file: mpi4py's, or one with its methods.
    file_class: ClassVar[Any] = MPI.File

    def setup(self) -> None:
        self.etype, self.ftype, self.disp = filetype(self.job.layout, self.job.comm)
        self.info = _info(self.hints())

    def open(self, writing: bool) -> None:
        amode = (MPI.MODE_CREATE | MPI.MODE_WRONLY) if writing else MPI.MODE_RDONLY
        self.fh = self.file_class.Open(self.job.comm, self.job.path, amode, self.info)
        if self.collective:
            self.fh.Set_view(self.disp, self.etype, self.ftype)

    def transfer(self, writing: bool) -> None:
        j = self.job
        if writing:
            self.fh.Write_all([_bytes(j.data), MPI.BYTE])
            if j.fsync:
                self.fh.Sync()
        else:
            self.fh.Read_all([_bytes(j.out), MPI.BYTE])

    def close(self) -> None:
        self.used = file_hints(self.fh)
        self.fh.Close()

    def teardown(self) -> None:
        # (what setup made: a bad hint fails it after the types, before the info)
        for made in (getattr(self, k, None) for k in ("etype", "ftype", "info")):
            if made is not None:
                made.Free()

    def hints_used(self) -> dict[str, Any]:
        return dict(getattr(self, "used", self.hints()))


class MpiioTunedApi(MpiioApi):
    """ROMIO tuned as an expert would: every rank aggregates."""

    name: ClassVar[str] = "mpiio-tuned"
    extra_hints: ClassVar[dict[str, str]] = {"cb_nodes": "{nranks}", "cb_config_list": "*:*"}


class CollioMpiApi(MpiioApi):
    """``mpiio``'s very calls on :class:`collio.mpi.File` (the drop-in ``MPI.File``):
    collio's two-phase engine behind MPI-IO's interface."""

    name: ClassVar[str] = "collio-mpi"
    file_class: ClassVar[Any] = CollioFile


class MpiioIndepApi(MpiioApi):
    """``MPI.File.Write_at`` / ``Read_at`` per piece, no file view (independent)."""

    name: ClassVar[str] = "mpiio-indep"
    collective: ClassVar[bool] = False

    def transfer(self, writing: bool) -> None:
        j = self.job
        p = j.pieces
        buf = _bytes(j.data if writing else j.out)
        call = self.fh.Write_at if writing else self.fh.Read_at
        for f, n, m in zip(p.file.tolist(), p.length.tolist(), p.mem.tolist(), strict=True):
            call(f, [buf[m : m + n], MPI.BYTE])  # one request per piece: the point of the API
        if writing and j.fsync:
            self.fh.Sync()


class PosixApi(Api):
    """``os.pwrite`` / ``os.preadv`` per piece on every rank (independent)."""

    name: ClassVar[str] = "posix"

    def open(self, writing: bool) -> None:
        self.fd = open_fd(self.job.path, writing)

    def transfer(self, writing: bool) -> None:
        j = self.job
        p = j.pieces
        buf = memoryview(_bytes(j.data if writing else j.out))  # type: ignore[arg-type]
        for f, n, m in zip(p.file.tolist(), p.length.tolist(), p.mem.tolist(), strict=True):
            if writing:
                if os.pwrite(self.fd, buf[m : m + n], f) != n:  # (one call, as a program's)
                    pwrite_all(self.fd, buf[m : m + n], f)
            elif os.preadv(self.fd, [buf[m : m + n]], f) != n:
                pread_exact(self.fd, buf[m : m + n], f)
        if writing and j.fsync:
            os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)

    def hints_used(self) -> dict[str, Any]:
        return {}


class CeilingApi(PosixApi):
    """What no layout can beat: each rank's 1/p share of the bytes as one contiguous request."""

    name: ClassVar[str] = "ceiling"
    verifiable: ClassVar[bool] = False  # each rank's share, not the layout

    def setup(self) -> None:
        j = self.job
        total, p, r = j.work.nbytes, j.comm.size, j.comm.rank
        self.offset = total * r // p
        self.length = total * (r + 1) // p - self.offset
        self.buf = np.resize(_bytes(j.data), self.length) if self.length else np.zeros(0, np.uint8)

    def transfer(self, writing: bool) -> None:
        view = memoryview(self.buf)  # type: ignore[arg-type]
        if writing:
            pwrite_all(self.fd, view, self.offset)
            if self.job.fsync:
                os.fsync(self.fd)
        else:
            pread_exact(self.fd, view, self.offset)


class CeilingDirectApi(CeilingApi):
    """The ceiling written around the page cache: each rank's share with one ``O_DIRECT``
    pwrite (from a page-aligned buffer; unaligned edges through the page cache) + fsync."""

    name: ClassVar[str] = "ceiling-direct"

    def setup(self) -> None:
        super().setup()
        raw = np.empty(self.length + PAGE, np.uint8)  # the share, at its offset within a page
        skip = (self.offset - raw.ctypes.data) % PAGE
        self.buf = raw[skip : skip + self.length]
        self.buf[:] = np.resize(_bytes(self.job.data), self.length) if self.length else 0

    def open(self, writing: bool) -> None:
        super().open(writing)
        self.dfd = open_direct(self.job.path) if writing else -1

    def transfer(self, writing: bool) -> None:
        if not writing:
            super().transfer(writing)
            return
        write_split(self.fd, self.dfd, self.buf, self.offset)
        if self.job.fsync:
            os.fsync(self.fd)

    def close(self) -> None:
        if self.dfd >= 0:
            os.close(self.dfd)
        super().close()
