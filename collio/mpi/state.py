"""What :class:`collio.mpi.File` holds, declared once for the classes its calls live in.

:class:`~collio.mpi.access.DataAccess` (data calls) and :class:`~collio.mpi.viewing.Views`
(views, pointers) are parts of one class; they read this state and call these helpers,
which :class:`~collio.mpi.file.File` sets and defines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from mpi4py import MPI

from ..core import FileCore
from ..view import FileView
from .amode import Amode
from .errors import FileError
from .positions import SharedPointer
from .requests import Request, Worker

__all__ = ["State"]


class State:
    """The state of an open :class:`collio.mpi.File` and the helpers every call uses."""

    _core: FileCore
    _comm: MPI.Intracomm  # the file's own communicator (a lane of collio's duplicate)
    _view: FileView
    _types: tuple[int, MPI.Datatype, MPI.Datatype]  # Get_view's (disp, etype, filetype)
    _pos: int  # the individual file pointer, in etypes
    _shared: SharedPointer
    _amode: Amode
    _atomic: bool
    _worker: Worker
    _split: Request | None  # the split collective begun, not yet ended

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def _raise(self, exc: FileError) -> None:
        raise NotImplementedError

    def _convert(self, exc: BaseException) -> FileError:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _exclusive(self, call: str) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def _agreed(
        self, call: str, refusal: BaseException | None, own: Sequence[int] = ()
    ) -> tuple[int, ...]:
        raise NotImplementedError

    def _by_rank0(self, call: str, action: Any) -> Any:
        raise NotImplementedError
