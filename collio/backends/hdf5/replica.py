"""The agreement that every rank's HDF5 library wrote the same metadata, and its publication.

Every rank's library makes the same metadata calls against its own
:class:`~collio.backends.hdf5.vfile.VFile`; at each collective point each rank flushes
its library and digests what it wrote since the previous point (with the call's own
key: offset, shape, ...).  The digests travel in the head of the call; when they match,
rank 0 writes the overlay to the real file (*publishes*), else every rank raises the
same :class:`~collio.errors.MismatchError` naming what differs, and the file refuses
further calls (it keeps rank 0's metadata).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import h5py
from mpi4py import MPI

from ...collective import Attempt, agree, digest, raise_agreed
from ...errors import MismatchError, ModeError
from .vfile import VFile

__all__ = ["Replica"]


class Replica:
    """One rank's view of an HDF5 file's metadata (owned by the file's VFile)."""

    def __init__(self, vf: VFile) -> None:
        self.path = vf.path
        self._vfile = weakref.ref(vf)
        #: Set alike on every rank when the ranks' metadata differed or a chunk write
        #: failed: every later call raises it, on every rank.
        self.diverged: str | None = None
        #: Seconds this rank spent where chunked writes serialise (ChunkedBackend.flush).
        self.timings: dict[str, float] = {"allocate_chunks": 0.0, "write_chunks": 0.0}

    def refusal(self, call: str) -> MismatchError:
        """The error every rank raises for ``call`` once the ranks diverged (raised alike:
        :attr:`diverged` is set collectively), named by this call, not the one that
        failed."""
        return MismatchError(
            f"{call}: {self.path!r} takes no more calls after an earlier one failed on "
            f"every rank; close it and open it again (the earlier error: {self.diverged})"
        )

    @property
    def alive(self) -> bool:
        """Local: HDF5 still holds the file's VFile (it may be closed already)."""
        return self._vfile() is not None

    @property
    def vfile(self) -> VFile:
        vf = self._vfile()
        if vf is None or vf.fd < 0:
            raise ModeError(f"{self.path!r} is closed")
        return vf

    def flushed(
        self, obj: Any, key: Callable[[], tuple[Any, ...]] | None
    ) -> tuple[Attempt, tuple[Any, ...], int]:
        """Local, changes nothing others see: flush this rank's library into its overlay and
        digest what it wrote since the last point, with the call's key (error recorded)."""
        step = Attempt()
        h = -1
        k: tuple[Any, ...] = ()
        with step:
            vf = self.vfile
            k = key() if key is not None else ()
            if vf.error is not None:
                raise vf.error
            self.flush_library(obj)
            h = digest((vf.epoch_digest(), k))
        return step, k, h

    def flush_library(self, obj: Any) -> None:
        """Local: HDF5 writes its cached metadata into the overlay (rank 0 holds it back)."""
        vf = self.vfile
        vf.in_sync = True
        try:
            h5py.h5f.flush(obj.id)
        finally:
            vf.in_sync = False

    def settle(
        self,
        comm: MPI.Comm,
        obj: Any,
        call: str,
        step: Attempt,
        key: tuple[Any, ...],
        failed: bool,
        differ: bool,
        then: Callable[[], bool] | None = None,
    ) -> None:
        """Collective over `comm`, after the head carried errors and digests: raise what it
        found on every rank, else run ``then`` (an allocation every rank makes alike; it
        returns whether it changed the metadata) and let rank 0 publish."""
        if failed:
            raise_agreed(comm, step.error, what=call)
        if differ:
            self._diverge(comm, obj, call, key)
        step = Attempt()
        with step:
            vf = self.vfile
            vf.new_epoch()
            if then is not None and then():  # written now, digested at the next point
                self.flush_library(obj)
            vf.filled()  # (rank 0 wrote them when it made the datasets: read from the disk)
            vf.publish()
        agree(comm, step.error, what=f"{call}: write metadata")
        # rank 0 wrote the overlay (the same everywhere: the digests matched) and all ranks
        # are past that: replicas read from the disk from now on, so raw data HDF5 wrote
        # itself (fill values, data=, edge chunks on resize) cannot shadow what the
        # aggregators write there later
        self.vfile.pages.clear()

    def _diverge(self, comm: MPI.Comm, obj: Any, what: str, key: tuple[Any, ...]) -> None:
        """Collective: name what differs from rank 0, remember it, raise everywhere."""
        vf = self._vfile()
        mine = (vf.epoch_digest() if vf else b"", key, inventory(obj), what)
        every = comm.allgather(mine)
        ref = every[0]
        what = ref[3]  # rank 0's call names the error on every rank (the same message)
        bad = [r for r, e in enumerate(every) if (e[0], e[1], e[3]) != (ref[0], ref[1], ref[3])]
        parts = [_difference(r, every[r], ref) for r in bad[:4]]
        msg = (
            f"{what}: ranks made different metadata calls on {self.path!r}: "
            + "; ".join(parts)
            + "; metadata calls must be the same, in the same order, on every rank"
            + " (the file keeps rank 0's metadata)"
        )
        self.diverged = msg
        if vf is not None:
            try:
                vf.publish()
            except OSError:
                pass  # the mismatch is the error every rank reports
        raise MismatchError(msg, ranks=tuple(bad))


def _difference(r: int, mine: tuple[Any, ...], ref: tuple[Any, ...]) -> str:
    """What rank ``r``'s metadata has that rank 0's lacks, and the reverse."""
    _, k, inv, call = mine
    if (k, call) != (ref[1], ref[3]):
        return f"rank {r} called {call} with {k}, rank 0 {ref[3]} with {ref[1]}"
    extra = sorted(set(inv.items()) - set(ref[2].items()))
    missing = sorted(set(ref[2].items()) - set(inv.items()))
    text = "; ".join(
        [f"has {n} ({d})" for n, d in extra[:3]]
        + [f"lacks {n} ({d}) that rank 0 has" for n, d in missing[:3]]
    )
    if text:
        return f"rank {r} {text}"
    return (
        f"rank {r} wrote other metadata than rank 0"
        " (same objects: another order, option or attribute value)"
    )


def inventory(obj: Any) -> dict[str, str]:
    """Objects and attributes of the file this rank sees (for error messages only)."""
    out: dict[str, str] = {}
    try:
        root = obj.file

        def visit(name: str, o: Any) -> None:
            if isinstance(o, h5py.Dataset):
                out["/" + name] = f"dataset {o.shape} {o.dtype}"
            else:
                out["/" + name] = "group"
            for a in o.attrs:
                out[f"/{name}@{a}"] = "attribute"

        for a in root.attrs:
            out[f"/@{a}"] = "attribute"
        root.visititems(visit)
    except Exception as exc:  # noqa: BLE001 - a broken replica is itself the news
        out["?"] = f"unreadable: {exc}"
    return out
