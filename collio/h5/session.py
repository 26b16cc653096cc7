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
import numpy as np
from mpi4py import MPI

from ..aggregators import choose_aggregators
from ..collective import Attempt, agree, agree_same, raise_agreed
from ..comms import private
from ..errors import MismatchError, ModeError
from ..hints import Hints
from ..stats import Stats
from .vfile import VFile

__all__ = ["Session", "set_fapl", "session_of"]

_MODES = ("r", "r+", "w", "w-", "x", "a")
_BY_FILENO: weakref.WeakValueDictionary[Any, Session] = weakref.WeakValueDictionary()
_PENDING: dict[str, list[weakref.ref[Session]]] = {}


class Session:
    """What collio keeps for one open file on one rank (owned by its VFile)."""

    def __init__(self, comm: MPI.Comm, hints: Hints, mode: str, path: str, vf: VFile) -> None:
        self.comm = comm
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
        self, obj: Any, *, what: str, key: Callable[[], tuple[Any, ...]] | None = None
    ) -> None:
        """Collective over `comm`: flush metadata, check every rank made the same calls.

        The digest covers what each library wrote since the previous checkpoint.
        Then rank 0 writes the agreed metadata to the real file.  Raises
        :class:`~collio.errors.MismatchError` on every rank when the metadata
        digests (or the call's ``key``: dataset, offset, shape) differ.
        """
        if self.diverged is not None:  # set collectively: every rank raises alike
            raise MismatchError(self.diverged)
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
            h = _hash63(repr((vf.hash63(), k, what)))  # (a read beside a write differs)
        vec = np.array([1 if step.error else 0, h, -h], np.int64)
        out = np.empty_like(vec)
        self.comm.Allreduce([vec, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX)
        if out[0]:
            raise_agreed(self.comm, step.error, what=what)
        if out[1] != -out[2]:
            self._diverge(obj, what, k)
        step = Attempt()
        with step:
            assert vf is not None
            vf.new_epoch()
            vf.publish()
        agree(self.comm, step.error, what=f"{what}: write metadata")
        # rank 0 wrote every byte of the overlay (the same on every rank: the digests
        # matched) and all ranks are past that: replicas read it from the disk from now on,
        # so raw data HDF5 wrote itself (fill values, data=, edge chunks on resize) can no
        # longer shadow what the aggregators write there later
        assert vf is not None
        vf.pages.clear()

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

    def sync(self, obj: Any) -> None:
        """Collective over `comm`: checkpoint, then fsync rank 0's metadata and the data."""
        self.checkpoint(obj, what="flush")
        step = Attempt()
        with step:
            self.vfile.sync()
            for be in self.backends.values():
                be.sync()
        agree(self.comm, step.error, what="flush")


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
    base = MPI.COMM_WORLD if comm is None else comm
    priv = private(base)  # type: ignore[arg-type]
    fcomm = priv.comm
    if path is None or access is None:
        found = _open_args()
        path = found[0] if path is None else path
        access = found[1] if access is None else access
    mode = str(access)
    path = os.fsdecode(path)
    step = Attempt()
    parsed = Hints()
    mine = None
    with step:
        if mode not in _MODES:
            raise ModeError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
        parsed = Hints.coerce(hints, warn=fcomm.Get_rank() == 0)
        mine = (mode, parsed, path)
    # the same file, mode and hints on every rank (rank 0 alone creates or truncates)
    agree_same(fcomm, step.error, mine, what="open", describe=lambda v: f"h5 open arguments {v!r}")
    size = 0
    step = Attempt()
    if fcomm.Get_rank() == 0:
        with step:
            size = _prepare(path, mode)
    agree(fcomm, step.error, what=f"open {path!r}")
    size = fcomm.bcast(size, root=0)
    step = Attempt()
    fd = -1
    with step:
        fd = os.open(path, os.O_RDONLY if mode == "r" else os.O_RDWR)
    try:
        agree(fcomm, step.error, what=f"open {path!r}")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    vf = VFile(path, fd, size, root=fcomm.Get_rank() == 0)
    session = Session(fcomm, parsed, "r" if mode == "r" else "r+", path, vf)
    session.aggregators = choose_aggregators(
        priv.nodes, cb_nodes=parsed.cb_nodes, per_node=parsed.per_node()
    )
    vf.session = session  # type: ignore[attr-defined]  # the VFile owns its session
    vf.owner = priv  # the file keeps collio's duplicate alive, as collio.File does
    priv.acquire()
    refs = _PENDING.setdefault(os.path.realpath(path), [])
    refs[:] = [r for r in refs if r() is not None]
    refs.append(weakref.ref(session))
    plist.set_fileobj_driver(h5py.h5fd.fileobj_driver, vf)


def _prepare(path: str, mode: str) -> int:
    """On rank 0: create, truncate or check the file; return the size ranks start from."""
    exists = os.path.isfile(path)
    if mode in ("r", "r+") and not exists:
        raise FileNotFoundError(2, "no such file", path)
    if mode in ("w-", "x") and os.path.exists(path):
        raise FileExistsError(17, "file exists", path)
    if mode in ("w", "w-", "x") or (mode == "a" and not exists):
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o666)
        os.close(fd)
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
