"""Views and file pointers of :class:`collio.mpi.File`: ``Set_view``/``Get_view``, the
individual pointer (``Seek``, ``Get_position``) and the shared one (``Seek_shared``,
``Get_position_shared``), ``Get_byte_offset`` and ``Get_type_extent``.

Positions count etypes of the view, as MPI's do; the individual pointer is a number on
each rank, the shared one a :class:`~collio.mpi.positions.SharedPointer`, which rank 0
moves inside collective calls (after the call's head, the others waiting for its outcome);
``Set_view`` starts it at 0 in a file not made yet, with no message.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np
from mpi4py import MPI

from ..collective import same_slots, settle_same
from ..view import make_view
from .errors import ErrArg, ErrUnsupportedDatarep
from .positions import byte_offset, end_position
from .state import State

__all__ = ["Views"]

_WHENCE = (MPI.SEEK_SET, MPI.SEEK_CUR, MPI.SEEK_END)


class Views(State):
    """The view and pointer calls on :class:`collio.mpi.File`'s state."""

    def Set_view(
        self,
        disp: int = 0,
        etype: MPI.Datatype = MPI.BYTE,
        filetype: MPI.Datatype | None = None,
        datarep: str = "native",
        info: MPI.Info = MPI.INFO_NULL,
    ) -> None:
        """Collective: see the file through ``disp``, ``etype``, ``filetype``; both file
        pointers go to 0.  With ``MODE_SEQUENTIAL``, ``disp`` must be
        ``MPI.DISPLACEMENT_CURRENT`` (the shared pointer's byte)."""
        with self._errors():
            self._check_open()
            self._worker.drain()
            refusal: BaseException | None = None
            if datarep not in ("native", "internal"):
                refusal = ErrUnsupportedDatarep(
                    f"datarep {datarep!r}: collio reads and writes native"
                )
            if self._amode.sequential:
                if disp != MPI.DISPLACEMENT_CURRENT:
                    refusal = refusal or ErrArg(
                        "Set_view: disp must be MPI.DISPLACEMENT_CURRENT in MODE_SEQUENTIAL"
                    )
                else:  # (every rank must see the same byte: read it after a head)
                    self._agreed("Set_view", refusal)
                    disp = int(self._by_rank0("Set_view", self._shared_byte))
            elif disp == MPI.DISPLACEMENT_CURRENT:
                refusal = refusal or ErrArg(
                    "Set_view: MPI.DISPLACEMENT_CURRENT needs MODE_SEQUENTIAL"
                )
            ft = etype if filetype is None else filetype
            # the view's one agreement stays here, not deferred into the next call's head:
            # a rank whose view fails raises in Set_view, so every rank must hear of it
            # before returning from it; an independent call after it would write through
            # a view never agreed; and the shared pointer restarts only once every rank is
            # past its calls before the view
            with self._exclusive("Set_view"):
                try:
                    view = make_view(
                        self._comm, self._core.ctx.file, disp, etype, ft, "native", refusal=refusal
                    )
                except BaseException as exc:
                    self._core.failed(exc)
                    raise
            self._view, self._pos = view, 0
            old = self._shared.restart()  # (every rank is past make_view's agreement)
            if self._comm.Get_rank() == 0:
                # a file an error leaves behind is never read again: its name is the view's
                with contextlib.suppress(OSError):
                    os.unlink(old)
            self._keep_types(int(disp), etype, ft)

    def _shared_byte(self) -> int:
        return byte_offset(self._view, self._shared.get())

    def _keep_types(self, disp: int, etype: MPI.Datatype, filetype: MPI.Datatype) -> None:
        """Keep the view's types for ``Get_view`` (duplicates: the caller may free its own)."""
        self._free_types()
        keep = [t if t.is_predefined else t.Dup() for t in (etype, filetype)]
        self._types = (disp, keep[0], keep[1])

    def _free_types(self) -> None:
        for t in self._types[1:]:
            if isinstance(t, MPI.Datatype) and not t.is_predefined and t != MPI.DATATYPE_NULL:
                t.Free()
        self._types = (0, MPI.BYTE, MPI.BYTE)

    def Get_view(self) -> tuple[int, MPI.Datatype, MPI.Datatype, str]:
        """Local: (disp, etype, filetype, datarep); derived types are new (free them)."""
        with self._errors():
            self._check_open()
            disp, et, ft = self._types
            return disp, *(t if t.is_predefined else t.Dup() for t in (et, ft)), "native"  # type: ignore[return-value]

    def Seek(self, offset: int, whence: int = MPI.SEEK_SET) -> None:
        """Local: move the individual file pointer (etypes of the view)."""
        with self._errors():
            self._check_open()
            refusal = self._amode.refuse("Seek", writing=None)
            if refusal is not None:
                raise refusal
            self._pos = self._seek(offset, whence, self._pos)

    def _seek(self, offset: Any, whence: Any, current: int) -> int:
        if whence not in _WHENCE:
            raise ErrArg(f"invalid whence argument {whence!r}")
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
            raise ErrArg(f"invalid offset argument {offset!r}")
        base = {MPI.SEEK_SET: 0, MPI.SEEK_CUR: current}.get(whence)
        if base is None:
            base = end_position(self._view, self._core.ctx.backend.size())
        if base + offset < 0:
            raise ErrArg(f"invalid offset argument: position {base + int(offset)} is negative")
        return int(base + offset)

    def Get_position(self) -> int:
        with self._errors():
            self._check_open()
            refusal = self._amode.refuse("Get_position", writing=None)
            if refusal is not None:
                raise refusal
            return self._pos

    def Seek_shared(self, offset: int, whence: int = MPI.SEEK_SET) -> None:
        """Collective: move the shared file pointer; every rank passes the same values."""
        with self._errors():
            self._check_open()
            refusal = self._amode.refuse("Seek_shared", writing=None)
            if refusal is None and whence not in _WHENCE:
                refusal = ErrArg(f"Seek_shared: invalid whence argument {whence!r}")
            if refusal is None and not isinstance(offset, (int, np.integer)):
                # refused into the agreement: raised here, by this rank alone, the others
                # would wait in it
                refusal = ErrArg(f"Seek_shared: offset must be an integer, not {offset!r}")
            value = (int(offset), int(whence)) if refusal is None else None
            out = self._agreed("Seek_shared", refusal, same_slots(value))
            settle_same(self._comm, value, out, what="Seek_shared")
            self._by_rank0("Seek_shared", lambda: self._shared.set(
                self._seek(offset, whence, self._shared.get())))  # fmt: skip

    def Get_position_shared(self) -> int:
        with self._errors():
            self._check_open()
            refusal = self._amode.refuse("Get_position_shared", writing=None)
            if refusal is not None:
                raise refusal
            return self._shared.get()

    def Get_byte_offset(self, offset: int) -> int:
        """Local: the absolute byte of the view's etype ``offset``."""
        with self._errors():
            self._check_open()
            refusal = self._amode.refuse("Get_byte_offset", writing=None)
            if refusal is not None:
                raise refusal
            if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
                raise ErrArg(f"Get_byte_offset: invalid offset argument {offset!r}")
            return byte_offset(self._view, int(offset))

    def Get_type_extent(self, datatype: MPI.Datatype) -> int:
        """Local: the extent of ``datatype`` in the file (``native``: its extent)."""
        with self._errors():
            self._check_open()
            return int(datatype.Get_extent()[1])
