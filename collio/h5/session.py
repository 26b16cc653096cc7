"""The ``collio`` h5py driver: one :class:`Session` per file open on every rank.

``set_fapl`` is what ``h5py.File(path, mode, driver="collio", comm=comm)`` calls on
every rank before HDF5 opens the file; it is the collective open: rank 0 creates
(or checks) the real file, every rank opens it, and each gets a
:class:`~collio.h5.vfile.VFile` that h5py's ``fileobj`` driver reads and writes.
Because every rank's library uses the same driver and makes the same calls, the
file's objects get the same addresses everywhere (checked at every collective
point through the digest of the metadata each rank wrote).
"""

from __future__ import annotations

import hashlib
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import h5py
from mpi4py import MPI

from ..aggregators import choose_aggregators
from ..backends.localfile import check_target, open_regular
from ..collective import Attempt, agree, call_head, raise_agreed, same_slots, settle_same
from ..comms import exclusive, one_thread, private
from ..errors import MismatchError, ModeError
from ..hints import Hints
from ..stats import Stats, print_at_close
from .vfile import VFile

__all__ = ["Session", "set_fapl", "session_of"]

_MODES = ("r", "r+", "w", "w-", "x", "a")
_BY_FILENO: weakref.WeakValueDictionary[Any, Session] = weakref.WeakValueDictionary()
_PENDING: dict[str, list[weakref.ref[Session]]] = {}


class Session:
    """What collio keeps for one open file on one rank (owned by its VFile)."""

    def __init__(
        self, comm: MPI.Comm, hints: Hints, mode: str, path: str, vf: VFile, file: tuple[int, str]
    ) -> None:
        self.comm = comm
        self.file = file  # serial on the communicator (as collio.File's) and name: call_head
        self.hints = hints
        self.mode = mode  # 'r' or 'r+' (writes allowed)
        self.path = path
        self._vfile = weakref.ref(vf)
        self.diverged: str | None = None
        self.stats = Stats()
        self.aggregators: Any = None
        self.backends: dict[str, Any] = {}
        #: seconds this rank spent where chunked writes serialise (see ChunkedBackend.flush)
        self.timings: dict[str, float] = {"allocate_chunks": 0.0, "write_chunks": 0.0}

    @property
    def vfile(self) -> VFile:
        vf = self._vfile()
        if vf is None or vf.fd < 0:
            raise ModeError(f"{self.path!r} is closed")
        return vf

    @property
    def fd(self) -> int:
        return self.vfile.fd

    # -- collective points ------------------------------------------------------
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
        previous checkpoint, with the call's ``key`` (offset, shape, ...).  Then one
        :func:`~collio.collective.call_head` (``call`` on ``subject``, a dataset, of this
        file) carries the error flag and the digest: ranks in different calls raise the
        same call :class:`~collio.errors.MismatchError` (see :meth:`_after_mismatch`),
        differing digests the same metadata one (the session then refuses more calls).
        Then ``then`` runs (an allocation every rank makes alike; it returns whether it
        changed the metadata) and rank 0 writes the agreed metadata to the real file.
        Nothing before the head communicates or changes what a rank's library holds, so
        after a mismatch every rank's replica is as before the call.
        """
        if self.diverged is not None:  # set collectively: every rank raises alike
            raise MismatchError(self.diverged)
        step, vf, k, h = self._flushed(obj, key)
        try:
            failed, out = call_head(
                self.comm, call, self.file, step.error is not None, (h, -h), subject=subject
            )
        except MismatchError as exc:
            if exc.call_mismatch:
                self._after_mismatch(obj, exc)
            raise
        self._publish(obj, call, step, vf, k, failed, bool(out[0] != -out[1]), then)

    def _flushed(
        self, obj: Any, key: Callable[[], tuple[Any, ...]] | None
    ) -> tuple[Attempt, VFile | None, tuple[Any, ...], int]:
        """Local: flush this rank's library into its overlay and digest what it wrote
        since the last checkpoint, with the call's key; the error (if any) is recorded."""
        step = Attempt()
        h = -1
        vf: VFile | None = None
        k: tuple[Any, ...] = ()
        with step:
            vf = self.vfile
            k = key() if key is not None else ()
            if vf.error is not None:
                raise vf.error
            vf.in_sync = True
            try:
                h5py.h5f.flush(obj.id)
            finally:
                vf.in_sync = False
            h = _hash63(repr((vf.hash63(), k)))
        return step, vf, k, h

    def _publish(
        self,
        obj: Any,
        call: str,
        step: Attempt,
        vf: VFile | None,
        key: tuple[Any, ...],
        failed: bool,
        differ: bool,
        then: Callable[[], bool] | None,
    ) -> None:
        """Collective over `comm`, after the agreement on errors and digests: raise what it
        found on every rank, else run ``then`` and let rank 0 write the metadata."""
        if failed:
            raise_agreed(self.comm, step.error, what=call)
        if differ:
            self._diverge(obj, call, key)
        step = Attempt()
        with step:
            assert vf is not None
            vf.new_epoch()
            if then is not None and then():  # written now, digested at the next call
                vf.in_sync = True
                try:
                    h5py.h5f.flush(obj.id)
                finally:
                    vf.in_sync = False
            vf.publish()
        agree(self.comm, step.error, what=f"{call}: write metadata")
        # rank 0 wrote every byte of the overlay (the same on every rank: the digests
        # matched) and all ranks are past that: replicas read it from the disk from now on,
        # so raw data HDF5 wrote itself (fill values, data=, edge chunks on resize) can no
        # longer shadow what the aggregators write there later
        assert vf is not None
        vf.pages.clear()

    def _after_mismatch(self, obj: Any, exc: MismatchError) -> None:
        """Collective over `comm`: what every rank does after the same call mismatch.

        Calls on different files (or an open beside a call) change nothing here.  On
        this file, nothing was written yet and every replica is as before its call:
        the file stays usable, unless some rank called ``close``, which will not call
        again; then the file is closed on every rank as ``close`` closes it (metadata
        checked and written, data and metadata fsynced), and a failure of that goes
        into ``exc.close_error`` (agreed: the same everywhere).
        """
        if not exc.one_file or "close" not in exc.calls:
            return
        try:
            step, vf, k, h = self._flushed(obj, None)  # again: a rank may have failed before
            # every rank is in this close now: the agreement a close starts with
            failed, out = call_head(self.comm, "close", self.file, step.error is not None, (h, -h))
            self._publish(obj, "close", step, vf, k, failed, bool(out[0] != -out[1]), None)
            self._synced("close")
        except Exception as later:  # exc is the error every rank raises
            exc.close_error = later
        finally:
            self._close_file(obj)

    def _diverge(self, obj: Any, what: str, key: tuple[Any, ...]) -> None:
        """Collective: name what differs from rank 0, remember it, raise everywhere."""
        vf = self._vfile()
        mine = (vf.hash63() if vf else -1, key, _inventory(obj), what)
        every = self.comm.allgather(mine)
        ref = every[0]
        what = ref[3]  # rank 0's call names the error on every rank (the same message)
        bad = [r for r, e in enumerate(every) if (e[0], e[1], e[3]) != (ref[0], ref[1], ref[3])]
        parts = []
        for r in bad[:4]:
            h, k, inv, call = every[r]
            if (k, call) != (ref[1], ref[3]):
                parts.append(f"rank {r} called {call} with {k}, rank 0 {what} with {ref[1]}")
                continue
            extra = sorted(set(inv.items()) - set(ref[2].items()))
            missing = sorted(set(ref[2].items()) - set(inv.items()))
            text = "; ".join(
                [f"has {n} ({d})" for n, d in extra[:3]]
                + [f"lacks {n} ({d}) that rank 0 has" for n, d in missing[:3]]
            )
            parts.append(
                f"rank {r} {text}"
                if text
                else f"rank {r} wrote other metadata than rank 0"
                " (same objects: another order, option or attribute value)"
            )
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

    @one_thread
    def sync(self, obj: Any) -> None:
        """Collective over `comm`: checkpoint, then fsync rank 0's metadata and the data."""
        self.checkpoint(obj, call="flush")
        self._synced("flush")

    @one_thread
    def close(self, obj: Any) -> None:
        """Collective over `comm`: as :meth:`sync`, then close the file on every rank.

        A session whose ranks diverged closes locally (every rank refuses its calls
        alike, and rank 0 publishes its own metadata as it lets go of the file).
        """
        if self.diverged is not None:
            self._close_file(obj)
            return
        try:
            self.checkpoint(obj, call="close")
        except MismatchError as exc:
            if not exc.call_mismatch:  # (a call mismatch: _after_mismatch closed it, or not)
                self._close_file(obj)
            raise
        except BaseException:
            self._close_file(obj)
            raise
        rank = self.comm.Get_rank()  # (closing may free a duplicate the user let go of)
        try:
            self._synced("close")
        finally:
            self._close_file(obj)
        print_at_close(self.stats, repr(self.path), rank)

    def _synced(self, what: str) -> None:
        """Collective over `comm`: fsync rank 0's metadata and the data written, agree."""
        step = Attempt()
        with step:
            self.vfile.sync()
            for be in self.backends.values():
                be.sync()
        agree(self.comm, step.error, what=what)

    def _close_file(self, obj: Any) -> None:
        """Local: close the h5py file ``obj`` lives in (every object of it, on this rank),
        then let go of the descriptor: rank 0 publishes what HDF5 wrote at close and
        fsyncs, now rather than whenever Python frees the file object."""
        vf = self._vfile()
        try:
            if obj.id.valid:  # (h5py.File.close: a File's super().close(), not collio's)
                h5py.File.close(obj if isinstance(obj, h5py.File) else obj.file)
        finally:
            if vf is not None:
                vf.release()


def _hash63(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _inventory(obj: Any) -> dict[str, str]:
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


# -------------------------------------------------------------- open (set_fapl)
def set_fapl(
    plist: Any,
    comm: MPI.Comm | None = None,
    hints: Any = None,
    *,
    path: str | bytes | None = None,
    access: str | None = None,
) -> None:
    """Collective over `comm`: h5py's driver hook (``h5py.register_driver``).

    Opens the real file on every rank and installs a :class:`VFile` as the file
    object of h5py's ``fileobj`` driver.  ``path`` and ``access`` (the mode) are
    taken from the calling ``h5py.File`` when not given.
    """
    priv = private(MPI.COMM_WORLD if comm is None else comm)  # type: ignore[arg-type]
    with exclusive(priv.comm, "open"):  # (a second thread's call raises, see comms)
        _set_fapl(plist, comm, hints, path=path, access=access)


def _set_fapl(
    plist: Any,
    comm: MPI.Comm | None,
    hints: Any,
    *,
    path: str | bytes | None,
    access: str | None,
) -> None:
    base = MPI.COMM_WORLD if comm is None else comm
    # collective the first time collio sees `base` only (as in collio.open): then no file
    # is open on it anywhere, so no rank can be in another call on it
    priv = private(base)  # type: ignore[arg-type]
    fcomm = priv.comm
    step = Attempt()
    parsed = Hints()
    mine = None
    mode, name = "", ""
    with step:  # (a rank failing here raises with the others, after the first agreement)
        if path is None or access is None:
            found = _open_args()
            path = found[0] if path is None else path
            access = found[1] if access is None else access
        mode, name = str(access), os.fsdecode(path)  # type: ignore[arg-type]
        if mode not in _MODES:
            raise ModeError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
        parsed = Hints.coerce(hints, warn=fcomm.Get_rank() == 0)
        mine = (mode, parsed, name)
    # the same file, mode and hints on every rank (rank 0 alone creates or truncates), in
    # the first agreement of every call on a file: a rank opening a file beside the
    # others' calls on an open one raises (as they do) instead of hanging.  Files of
    # collio.open and collio.h5 on a communicator share the serial numbers.
    file = (priv.files + 1, repr(name))
    failed, out = call_head(fcomm, "open", file, step.error is not None, same_slots(mine))
    if failed:
        raise_agreed(fcomm, step.error, what="open")
    describe = lambda v: f"h5 open arguments {v!r}"  # noqa: E731
    settle_same(fcomm, mine, out, what="open", describe=describe)
    size = 0
    step = Attempt()
    if fcomm.Get_rank() == 0:
        with step:
            size = _prepare(name, mode)
    agree(fcomm, step.error, what=f"open {name!r}")
    size = fcomm.bcast(size, root=0)
    step = Attempt()
    fd = -1
    with step:
        fd = open_regular(name, os.O_RDONLY if mode == "r" else os.O_RDWR)
    try:
        agree(fcomm, step.error, what=f"open {name!r}")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    vf = VFile(name, fd, size, root=fcomm.Get_rank() == 0)
    session = Session(fcomm, parsed, "r" if mode == "r" else "r+", name, vf, file)
    session.aggregators = choose_aggregators(
        priv.nodes, cb_nodes=parsed.cb_nodes, per_node=parsed.per_node()
    )
    vf.session = session  # type: ignore[attr-defined]  # the VFile owns its session
    vf.owner = priv  # the file keeps collio's duplicate alive, as collio.File does
    priv.acquire()
    priv.files = file[0]
    refs = _PENDING.setdefault(os.path.realpath(name), [])
    refs[:] = [r for r in refs if r() is not None]
    refs.append(weakref.ref(session))
    plist.set_fileobj_driver(h5py.h5fd.fileobj_driver, vf)


def _prepare(path: str, mode: str) -> int:
    """On rank 0: create, truncate or check the file (a regular one: never a FIFO, whose
    open would block); return the size ranks start from."""
    before = check_target(path, "r" if mode in ("r", "r+") else "w")
    if mode in ("w-", "x") and before is not None:
        raise FileExistsError(17, "file exists", path)
    if mode in ("w", "w-", "x") or (mode == "a" and before is None):
        os.close(open_regular(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC))
        return 0
    return os.path.getsize(path)


def _open_args() -> tuple[Any, str]:
    """``name`` and ``mode`` of the ``h5py.File(...)`` call that is asking for the driver."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__init__" and frame.f_globals.get("__name__", "").startswith(
            "h5py"
        ):
            loc = frame.f_locals
            if "name" in loc and "mode" in loc:
                return loc["name"], loc["mode"]
        frame = frame.f_back  # type: ignore[assignment]
    raise ModeError("driver='collio' needs path= and access= when not called from h5py.File")


def session_of(obj: Any) -> Session:
    """The session of the file an h5py object lives in (local, no communication)."""
    fileno = tuple(obj.id.fileno)
    s = _BY_FILENO.get(fileno)
    if s is not None:
        return s
    key = os.path.realpath(os.fsdecode(obj.file.filename))
    refs = _PENDING.get(key, [])
    live = [r() for r in refs]
    live_sessions = [x for x in live if x is not None and x._vfile() is not None]
    if live_sessions:
        s = live_sessions[-1]
        refs[:] = [r for r in refs if r() is not None and r() is not s]
        _BY_FILENO[fileno] = s
        return s
    raise ModeError(
        f"{obj.name!r} is not in a file opened with driver='collio' "
        "(h5py.File(path, mode, driver='collio', comm=comm) or collio.h5.File)"
    )
