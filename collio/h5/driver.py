"""The ``collio`` h5py driver: ``h5py.File(path, mode, driver="collio", comm=comm)``.

As every h5py driver, :func:`set_fapl` configures the file access property list and
HDF5 does the rest: here the list gets h5py's ``fileobj`` driver with the
:class:`~collio.backends.hdf5.vfile.VFile` that the file core opened on every rank
(:meth:`collio.core.FileCore.open`, the open agreement :class:`collio.File` makes too).
Because every rank's library then makes the same calls through the same driver, the
file's objects get the same addresses everywhere.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import h5py
from mpi4py import MPI

from ..backends.base import Backend
from ..backends.hdf5.dataset import refuse_atomic
from ..backends.hdf5.storage import FileBackend, open_file
from ..backends.hdf5.vfile import VFile
from ..comms import Private, exclusive, private
from ..core import FileCore
from ..errors import ModeError
from ..hints import Hints
from .session import Session, remember

__all__ = ["MODES", "set_fapl"]

#: h5py's modes.
MODES = ("r", "r+", "w", "w-", "x", "a")


def set_fapl(
    plist: Any,
    comm: MPI.Comm | None = None,
    hints: Any = None,
    *,
    path: str | bytes | None = None,
    access: str | None = None,
) -> None:
    """Collective over `comm`: h5py's driver hook (``h5py.register_driver``).

    Opens the file on every rank (the core's open agreement, then rank 0 creates or
    checks it) and installs its VFile as the file object of h5py's ``fileobj`` driver.
    ``path`` and ``access`` (the mode) are taken from the calling ``h5py.File`` when
    not given.
    """
    # collective only the first time collio sees the communicator (as in collio.open)
    priv = private(MPI.COMM_WORLD if comm is None else comm)  # type: ignore[arg-type]
    with exclusive(priv.comm, "open"):  # (a second thread's call raises, see comms)
        _set_fapl(plist, priv, hints, path, access)


def _set_fapl(plist: Any, priv: Private, hints: Any, path: Any, access: str | None) -> None:
    """Collective over ``priv.comm``: :func:`set_fapl`'s work."""
    name, mode, found = _resolve(path, access)

    def check(parsed: Hints) -> tuple[tuple[Any, ...], None]:
        if found is not None:
            raise found
        refuse_atomic(parsed, mode)
        return (name,), None

    made: list[VFile] = []  # (held here until HDF5 holds it)

    def opener(fcomm: MPI.Intracomm, parsed: Hints, _: None) -> Backend:
        made.append(open_file(fcomm, name, mode))
        return FileBackend(made[0], mode, parsed)

    core = FileCore.open(
        priv, name, mode, hints, modes=MODES, check=check, opener=opener,
        engine_mode="r" if mode == "r" else "r+", label="h5 open arguments",
    )  # fmt: skip
    session = Session(core, "r" if mode == "r" else "r+")
    vf = made[0]
    vf.session = session  # the VFile (held by HDF5 while the file is open) owns its session
    vf.on_release = core.let_go  # a file dropped unclosed still lets go of the duplicate
    remember(session)
    plist.set_fileobj_driver(h5py.h5fd.fileobj_driver, vf)


def _resolve(path: str | bytes | None, access: str | None) -> tuple[str, str, Exception | None]:
    """The file's name and h5py mode, given or those of the ``h5py.File(...)`` call; a
    failure is returned, to be raised inside the open agreement with the other ranks."""
    try:
        if path is None or access is None:
            found = _open_args()
            path = found[0] if path is None else path
            access = found[1] if access is None else access
        return os.fsdecode(path), str(access), None  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - agreed, then raised on every rank
        return "", "r", exc


def _open_args() -> tuple[Any, str]:
    """``name`` and ``mode`` of the ``h5py.File(...)`` call asking for the driver: h5py
    hands a driver only its own keywords, and the file must be open on every rank
    before HDF5 reads its superblock, inside that call."""
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
