"""collio.h5's state of one open file on one rank: the file core and the metadata agreement.

A :class:`Session` is made by the driver (:func:`collio.h5.driver.set_fapl`) and owned by
the file's :class:`~collio.backends.hdf5.vfile.VFile`, which HDF5 holds as long as the
file is open: dropping the last h5py object closes the file and frees the session.
Every collective call starts with :meth:`Session.checkpoint`, the head of the call on
the :class:`~collio.core.FileCore` with the digest of the metadata each rank wrote; the
core handles mismatches, ``flush`` and ``close`` as it does for :class:`collio.File`.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..backends.hdf5.replica import Replica
from ..backends.hdf5.storage import FileBackend
from ..backends.hdf5.vfile import VFile
from ..collective import Attempt
from ..comms import one_thread
from ..core import FileCore
from ..errors import ModeError
from ..hints import Hints
from ..stats import Stats

__all__ = ["Session", "session_of"]

_BY_FILENO: weakref.WeakValueDictionary[Any, Session] = weakref.WeakValueDictionary()
_PENDING: dict[str, list[weakref.ref[Session]]] = {}


class Session:
    """What collio keeps for one open HDF5 file on one rank (owned by its VFile)."""

    def __init__(self, core: FileCore, mode: str) -> None:
        self.core = core
        self.backend: FileBackend = core.ctx.backend  # type: ignore[assignment]
        self.replica: Replica = self.backend.replica
        self.path = self.replica.path
        self.mode = mode  # 'r' or 'r+' (writes allowed)

    # -- what the file core and the engine hold ------------------------------------
    @property
    def comm(self) -> MPI.Comm:
        return self.core.comm

    @property
    def hints(self) -> Hints:
        return self.core.ctx.hints

    @property
    def stats(self) -> Stats:
        return self.core.ctx.stats

    @property
    def aggregators(self) -> npt.NDArray[np.int64]:
        return self.core.ctx.aggregators

    @property
    def vfile(self) -> VFile:
        return self.replica.vfile

    @property
    def timings(self) -> dict[str, float]:
        """Seconds this rank spent where chunked writes serialise (ChunkedBackend.flush)."""
        return self.replica.timings

    # -- collective points ------------------------------------------------------------
    def checkpoint(
        self,
        obj: Any,
        *,
        call: str,
        subject: str | None = None,
        key: Callable[[], tuple[Any, ...]] | None = None,
        then: Callable[[], bool] | None = None,
    ) -> None:
        """Collective over `comm`: the first agreement of a call, then the metadata written.

        Locally, each rank flushes its library and digests what it wrote since the
        previous checkpoint, with the call's ``key``; the core's head (``call`` on
        ``subject``, a dataset) carries the error flag and the digest.  Then ``then``
        runs (an allocation every rank makes alike) and rank 0 publishes.  Nothing
        before the head communicates or changes what a rank's library holds, so after
        a call mismatch every rank's replica is as before the call.
        """
        self._refuse_diverged(call)
        point = _Point(self, obj, key, then)
        error, own = point.prepare()
        failed, out = self.core.head(
            call, failed=error is not None, own=own, subject=subject, rider=_Point(self, obj)
        )
        point.settle(call, failed, error, out)

    @one_thread
    def sync(self, obj: Any) -> None:
        """Collective over `comm`: checkpoint, then fsync rank 0's metadata and the data."""
        self._refuse_diverged("flush")
        self.core.sync("flush", rider=_Point(self, obj))

    @one_thread
    def close(self, obj: Any) -> None:
        """Collective over `comm`: as :meth:`sync`, then close the file on every rank.

        A session whose ranks diverged closes locally (every rank refuses its calls
        alike, and rank 0 publishes its own metadata as it lets go of the file).
        """
        if self.replica.diverged is not None:
            self.core.release(_Point(self, obj))
            return
        self.core.close(rider=_Point(self, obj))

    def _refuse_diverged(self, call: str) -> None:
        if self.replica.diverged is not None:  # set collectively: every rank raises alike
            raise self.replica.refusal(call)


class _Point:
    """The metadata agreement riding on a call's head (a :class:`~collio.core.Rider`)."""

    def __init__(
        self,
        session: Session,
        obj: Any,
        key: Callable[[], tuple[Any, ...]] | None = None,
        then: Callable[[], bool] | None = None,
    ) -> None:
        self.session, self.obj, self.key, self.then = session, obj, key, then
        self.step = Attempt()
        self.k: tuple[Any, ...] = ()

    def prepare(self) -> tuple[BaseException | None, Sequence[int]]:
        self.step, self.k, h = self.session.replica.flushed(self.obj, self.key)
        return self.step.error, (h, -h)

    def settle(self, call: str, failed: bool, error: BaseException | None, out: Any) -> None:
        s = self.session
        differ = bool(out[0] != -out[1])
        s.replica.settle(s.comm, self.obj, call, self.step, self.k, failed, differ, self.then)

    def release(self) -> None:
        """Close the h5py file ``obj`` lives in, on this rank (every object of it)."""
        obj = self.obj
        if obj.id.valid:  # (h5py.File.close: a File's super().close(), not collio's)
            h5py.File.close(obj if isinstance(obj, h5py.File) else obj.file)


def remember(session: Session) -> None:
    """Local: let :func:`session_of` find ``session`` by its path until h5py's file id is
    known (h5py makes it after the driver ran)."""
    refs = _PENDING.setdefault(os.path.realpath(session.path), [])
    refs[:] = [r for r in refs if r() is not None]
    refs.append(weakref.ref(session))


def session_of(obj: Any) -> Session:
    """The session of the file an h5py object lives in (local, no communication)."""
    fileno = tuple(obj.id.fileno)
    s = _BY_FILENO.get(fileno)
    if s is not None:
        return s
    key = os.path.realpath(os.fsdecode(obj.file.filename))
    refs = _PENDING.get(key, [])
    live = [r() for r in refs]
    live_sessions = [x for x in live if x is not None and x.replica.alive]
    if live_sessions:
        s = live_sessions[-1]
        refs[:] = [r for r in refs if r() is not None and r() is not s]
        _BY_FILENO[fileno] = s
        return s
    raise ModeError(
        f"{obj.name!r} is not in a file opened with driver='collio' "
        "(h5py.File(path, mode, driver='collio', comm=comm) or collio.h5.File)"
    )
