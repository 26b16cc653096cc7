"""The APIs of the size sweep: one file kept open, one call per step, or a batch of steps.

A caller splits each call in two: :meth:`Caller.target` (not timed) builds what the call
takes, as a program has it at hand before it calls (collio's layout, ROMIO's offset and
buffer), and :meth:`Caller.write` / :meth:`Caller.read` (timed) make the call itself.

``collio``-family callers use collio's ``write_all`` / ``read_all`` with the backend and
extra hints of the registered API of the same name; ROMIO callers use ``MPI.File``:
``Write_at_all`` at each step's byte offset for contiguous steps, and for strided ones a
file view set once at open (a subarray whose extent is one step, so the view tiles the
steps) and ``Write_all``, whose file pointer moves on by one step per call.  A batch is
the same calls in a Python loop, one per array, as a program without a batch call
writes them; ``collio-many`` is the batch as one ``write_all_many`` / ``read_all_many``.
``ceiling`` is what no collective call that agrees its outcome can beat: each rank moves
its call's (batch's) bytes with one ``pwritev`` / ``preadv`` into (out of) a contiguous
range of its own, then the ranks agree whether every request succeeded (one allreduce,
as every collio call agrees its errors after its I/O): a batch's time shows the cost of
the page cache it fills, a small call's the least its agreement costs.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

import collio

from ...testing.romio import filetype
from ..apis import _info, api_hints, file_hints, get_api
from ..builtin import CollioApi, MpiioApi
from .work import Step, as_bytes

__all__ = ["BATCH_API", "CEILING_API", "Caller", "check_api", "make_caller", "many_unavailable"]

#: The batch as one collective call (``collio.File.write_all_many``).
BATCH_API = "collio-many"
#: The batch as one ``pwritev`` / ``preadv`` per rank (:class:`CeilingCaller`).
CEILING_API = "ceiling"
#: Most buffers one vectored request takes.
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class Caller:
    """One API of the sweep on one file; every method is collective over ``comm``."""

    family: ClassVar[str] = "abstract"

    def __init__(self, name: str, comm: MPI.Intracomm, hints: dict[str, str]) -> None:
        self.name, self.comm, self.hints = name, comm, hints
        self.used: dict[str, Any] = dict(hints)

    def open(self, path: str, mode: str, work: Step | None) -> None:
        """Open ``path`` ("w", "r" or "r+") for the steps of ``work`` (None: no I/O)."""
        raise NotImplementedError

    def target(self, work: Step, step: int, buf: npt.NDArray[Any]) -> Any:
        """What a call on step ``step`` takes, with ``buf`` the data or the output."""
        raise NotImplementedError

    def write(self, arg: Any) -> None:
        raise NotImplementedError

    def read(self, arg: Any) -> None:
        raise NotImplementedError

    def batch_target(self, work: Step, steps: range, bufs: list[npt.NDArray[Any]]) -> Any:
        """What a batch of the steps ``steps`` takes, one buffer each."""
        return [self.target(work, k, b) for k, b in zip(steps, bufs, strict=True)]

    def write_batch(self, arg: Any) -> None:
        for one in arg:  # one call per array: what a program without a batch call does
            self.write(one)

    def read_batch(self, arg: Any) -> None:
        for one in arg:
            self.read(one)

    def sync(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def path(self) -> str | None:
        """The way collio moved the last call's bytes (``stats.last_call``), or None."""
        return None


class CollioCaller(Caller):
    """collio's ``write_all`` / ``read_all``."""

    family: ClassVar[str] = "collio"
    backend: str | None = None

    def open(self, path: str, mode: str, work: Step | None) -> None:
        self.f = collio.open(
            path, mode, comm=self.comm, hints=self.hints or None, backend=self.backend
        )

    def target(self, work: Step, step: int, buf: npt.NDArray[Any]) -> Any:
        return buf, work.layout(self.comm.rank, step)

    def write(self, arg: Any) -> None:
        self.f.write_all(*arg)

    def read(self, arg: Any) -> None:
        buf, layout = arg
        self.f.read_all(layout, out=buf)

    def sync(self) -> None:
        self.f.sync()

    def close(self) -> None:
        writing = self.f.mode != "r"
        self.f.close()
        if writing:
            self.used = dict(self.f.stats.hints)

    def path(self) -> str | None:
        found = self.f.stats.last_call.get("path")
        return None if found is None else str(found)


class ManyCaller(CollioCaller):
    """A batch as one collective call: ``write_all_many(items)`` / ``read_all_many(layouts)``."""

    def batch_target(self, work: Step, steps: range, bufs: list[npt.NDArray[Any]]) -> Any:
        rank = self.comm.rank
        return [(b, work.layout(rank, k)) for k, b in zip(steps, bufs, strict=True)]

    def write_batch(self, arg: Any) -> None:
        self.f.write_all_many(arg)  # type: ignore[attr-defined]

    def read_batch(self, arg: Any) -> None:
        outs = [b for b, _ in arg]
        self.f.read_all_many([lay for _, lay in arg], out=outs)  # type: ignore[attr-defined]


class RomioCaller(Caller):
    """ROMIO through mpi4py: ``Write_at_all`` (contiguous) or a view and ``Write_all``."""

    family: ClassVar[str] = "romio"

    def open(self, path: str, mode: str, work: Step | None) -> None:
        amode = {"w": MPI.MODE_CREATE | MPI.MODE_WRONLY, "r": MPI.MODE_RDONLY}
        info = _info(self.hints)
        try:
            self.fh = MPI.File.Open(self.comm, path, amode.get(mode, MPI.MODE_RDWR), info)
        finally:
            info.Free()
        self.types: tuple[MPI.Datatype, ...] = ()
        self.viewed = work is not None and work.pattern != "contiguous"
        self.next = 0
        if work is not None and self.viewed:
            et, ft, disp = filetype(work.layout(self.comm.rank, 0), self.comm)
            self.types = (et, ft)
            self.fh.Set_view(disp, et, ft)

    def target(self, work: Step, step: int, buf: npt.NDArray[Any]) -> Any:
        if self.viewed:  # the file pointer is at the next step: calls come in step order
            if step != self.next:
                raise RuntimeError(f"{self.name}: step {step} after step {self.next - 1}")
            self.next += 1
            return None, [as_bytes(buf), MPI.BYTE]
        return work.byte_offset(self.comm.rank, step), [as_bytes(buf), MPI.BYTE]

    def write(self, arg: Any) -> None:
        offset, buf = arg
        if offset is None:
            self.fh.Write_all(buf)
        else:
            self.fh.Write_at_all(offset, buf)

    def read(self, arg: Any) -> None:
        offset, buf = arg
        if offset is None:
            self.fh.Read_all(buf)
        else:
            self.fh.Read_at_all(offset, buf)

    def sync(self) -> None:
        self.fh.Sync()

    def close(self) -> None:
        self.used = file_hints(self.fh)
        self.fh.Close()
        for t in self.types:
            t.Free()
        self.types = ()


class CeilingCaller(Caller):
    """A call's (a batch's) bytes as one ``pwritev`` (``preadv``) per rank, of its buffers
    as they are, at a range of the rank's own: call (batch) ``b`` of rank ``r`` at
    ``(b * ranks + r) * count * size``, then one allreduce of whether every rank's
    request succeeded.  Its file is not the sweep's layout (no step is where
    :mod:`.work` puts it), so only what it reads back is checked."""

    family: ClassVar[str] = "ceiling"

    def open(self, path: str, mode: str, work: Step | None) -> None:
        flags = os.O_RDWR | os.O_CREAT if mode != "r" else os.O_RDONLY
        self.fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        # (the agreement, set up once as collio's heads are: a persistent allreduce
        # where MPI has them, one allreduce per call where it has not)
        self.ok = np.ones(1, np.int64)
        self.agreed = np.ones(1, np.int64)
        self.req: Any = None
        if hasattr(self.comm, "Allreduce_init"):
            self.req = self.comm.Allreduce_init(self.ok, self.agreed, MPI.MIN)

    def target(self, work: Step, step: int, buf: npt.NDArray[Any]) -> Any:
        return (step * self.comm.size + self.comm.rank) * work.size, [as_bytes(buf)]

    def write(self, arg: Any) -> None:
        self._each(os.pwritev, *arg)

    def read(self, arg: Any) -> None:
        self._each(os.preadv, *arg)

    def batch_target(self, work: Step, steps: range, bufs: list[npt.NDArray[Any]]) -> Any:
        n = len(steps)
        first = (steps.start // n * self.comm.size + self.comm.rank) * n * work.size
        return first, [as_bytes(b) for b in bufs]

    def write_batch(self, arg: Any) -> None:
        self._each(os.pwritev, *arg)

    def read_batch(self, arg: Any) -> None:
        self._each(os.preadv, *arg)

    def _each(self, move: Any, offset: int, bufs: list[Any]) -> None:
        """One request of all ``bufs`` (one per ``IOV_MAX`` of them), then the ranks'
        agreement; OSError on every rank if a request failed or was short on any."""
        error: BaseException | None = None
        try:
            step = _IOV_MAX
            for k in range(0, len(bufs), step):
                part = bufs[k : k + step]
                want = sum(len(b) for b in part)
                if move(self.fd, part, offset) != want:
                    raise OSError(f"{self.name}: short request at byte {offset}")
                offset += want
        except OSError as exc:
            error = exc
        self.ok[0] = error is None
        if self.req is None:
            self.comm.Allreduce(self.ok, self.agreed, MPI.MIN)
        else:
            self.req.Start()
            self.req.Wait()
        if error is not None:
            raise error
        if not self.agreed[0]:
            raise OSError(f"{self.name}: a request failed on another rank")

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
        if self.req is not None:
            self.req.Free()
            self.req = None


def many_unavailable() -> str | None:
    """Why the batch cannot be one call with this collio, or None."""
    if hasattr(collio.File, "write_all_many") and hasattr(collio.File, "read_all_many"):
        return None
    return "collio.File has no write_all_many / read_all_many"


def check_api(name: str) -> None:
    """Raise ValueError for an API the sweep cannot run (pure, the same on every rank)."""
    if name == BATCH_API:
        return
    api = get_api(name)
    if issubclass(api, CollioApi) and api.target is CollioApi.target:
        return
    if issubclass(api, MpiioApi) and api.collective:
        return
    raise ValueError(
        f"--sweep runs collio's collective APIs on a flat file and ROMIO's collective ones "
        f"(e.g. collio, collio-mpiio, mpiio, mpiio-tuned), not {name!r}"
    )


def make_caller(name: str, comm: MPI.Intracomm, given: dict[str, str]) -> Caller:
    """The caller of API ``name`` (see :func:`check_api`) with the user's hints and its own.

    A ``collio`` API runs with its registered backend and extra hints, a ROMIO one with
    its extra hints (``mpiio-tuned``'s ``cb_nodes`` and ``cb_config_list``).
    """
    if name == BATCH_API:
        return ManyCaller(name, comm, api_hints(CollioApi, given, comm.size))
    if name == CEILING_API:
        return CeilingCaller(name, comm, {})
    api = get_api(name)
    hints = api_hints(api, given, comm.size)
    if issubclass(api, CollioApi):
        caller = CollioCaller(name, comm, hints)
        caller.backend = api.backend
        return caller
    return RomioCaller(name, comm, hints)
