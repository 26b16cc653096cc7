"""API ``bare``: two-phase I/O written with raw mpi4py and os calls only, without collio.

A floor for any two-phase library's overhead, measured in the same job as collio and the
ceiling: ``mpiexec -n 4 collio-bench --compare collio,bare,ceiling``.  Column blocks only
(``--pattern colblock``).  Each rank aggregates a contiguous 1/p of the file.  Writing,
in each round every rank sends each aggregator its runs of that aggregator's window
(``Isend`` of a contiguous slice, ``Irecv`` with an hindexed type into the round buffer)
and an I/O thread writes the window (``pwrite`` + ``sync_file_range``) while the next
round is exchanged (two buffers); reading is the mirror image.  No checks, no agreement,
no planning, no error handling.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np
from mpi4py import MPI

from ..backends.fsync import SYNC_FILE_RANGE_WRITE, sync_file_range
from ..hints import parse_size
from .apis import Api, open_fd
from .options import BARE
from .patterns import Workload

__all__ = ["BareApi"]


def _geometry(work: Workload, window_text: str) -> tuple[int, int, int, int]:
    """(file row bytes, one rank's run of a row, bytes per aggregator, window bytes)."""
    rows, cols = work.shape
    p = work.nranks
    row = cols * work.itemsize
    run, share = row // p, rows * row // p
    window = min(parse_size(window_text, "window"), share)
    if cols % p or rows % p or share % window or window % row:
        raise ValueError(
            f"bare needs the columns ({cols}) and rows ({rows}) to split over {p} ranks and "
            f"each rank's share ({share} bytes) into whole windows of whole rows "
            f"(-O window={window_text}, rows of {row} bytes)"
        )
    return row, run, share, window


class BareApi(Api):
    """The two-phase pipeline with nothing else (see the module docstring)."""

    name: ClassVar[str] = "bare"
    option_help: ClassVar[dict[str, str]] = BARE

    @classmethod
    def check(cls, work: Workload, options: dict[str, str], writing: bool) -> None:
        if work.pattern != "colblock":
            raise ValueError(f"bare runs --pattern colblock only, not {work.pattern}")
        _geometry(work, options.get("window", "4m"))

    def setup(self) -> None:
        j = self.job
        self.row, run, self.share, self.window = _geometry(j.work, j.option("window", "4m"))
        per_window = self.window // self.row
        p = j.comm.size
        # the bytes of sender s in an aggregator's window: one run of each of its rows
        rows = np.arange(per_window) * self.row
        self.types = [
            MPI.BYTE.Create_hindexed_block(run, (rows + s * run).tolist()).Commit()
            for s in range(p)
        ]
        self.run, self.per_window = run, per_window
        self.bufs = [np.empty(self.window, np.uint8) for _ in range(2)]
        self.pool = ThreadPoolExecutor(1)

    def open(self, writing: bool) -> None:
        self.fd = open_fd(self.job.path, writing)

    def _mine(self, agg: int, k: int, mem: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """This rank's runs in aggregator ``agg``'s k-th window: consecutive in its piece."""
        first = (agg * self.share + k * self.window) // self.row
        return mem[first * self.run : (first + self.per_window) * self.run]

    def _write_window(self, buf: np.ndarray[Any, Any], off: int) -> None:
        os.pwrite(self.fd, memoryview(buf), off)  # type: ignore[arg-type]
        if sync_file_range is not None:
            sync_file_range(self.fd, off, len(buf), SYNC_FILE_RANGE_WRITE)

    def _read_window(self, buf: np.ndarray[Any, Any], off: int) -> None:
        os.preadv(self.fd, [memoryview(buf)], off)  # type: ignore[arg-type]

    def transfer(self, writing: bool) -> None:
        j = self.job
        if writing:
            self._write(np.ascontiguousarray(j.data).reshape(-1).view(np.uint8))
            if j.fsync:
                os.fsync(self.fd)
        else:
            assert j.out.flags.c_contiguous  # received into in place
            self._read(j.out.reshape(-1).view(np.uint8))

    def _write(self, mem: np.ndarray[Any, Any]) -> None:
        comm, r, p = self.job.comm, self.job.comm.rank, self.job.comm.size
        pending: list[Future[None] | None] = [None, None]
        for k in range(self.share // self.window):
            b = k % 2
            if pending[b] is not None:
                pending[b].result()  # type: ignore[union-attr]
            reqs = [comm.Irecv([self.bufs[b], 1, self.types[s]], s, 7) for s in range(p)]
            reqs += [comm.Isend([self._mine(a, k, mem), MPI.BYTE], a, 7) for a in range(p)]
            MPI.Request.Waitall(reqs)
            off = r * self.share + k * self.window
            pending[b] = self.pool.submit(self._write_window, self.bufs[b], off)
        for f in pending:
            if f is not None:
                f.result()

    def _read(self, mem: np.ndarray[Any, Any]) -> None:
        comm, r, p = self.job.comm, self.job.comm.rank, self.job.comm.size
        nwin = self.share // self.window
        ahead = self.pool.submit(self._read_window, self.bufs[0], r * self.share)
        for k in range(nwin):
            b = k % 2
            ahead.result()
            if k + 1 < nwin:  # the next window is read while this one is sent
                off = r * self.share + (k + 1) * self.window
                ahead = self.pool.submit(self._read_window, self.bufs[1 - b], off)
            reqs = [comm.Irecv([self._mine(a, k, mem), MPI.BYTE], a, 7) for a in range(p)]
            reqs += [comm.Isend([self.bufs[b], 1, self.types[s]], s, 7) for s in range(p)]
            MPI.Request.Waitall(reqs)
        ahead.result()

    def close(self) -> None:
        os.close(self.fd)

    def teardown(self) -> None:
        for t in self.types:
            t.Free()
        self.pool.shutdown()

    def hints_used(self) -> dict[str, Any]:
        return {"bare_window": getattr(self, "window", None)}
