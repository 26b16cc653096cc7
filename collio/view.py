"""MPI file views: ``File.set_view(disp, etype, filetype)``, then ``write_all(buf)``.

A :class:`FileView` keeps the filetype flattened (never the handle: the caller
may free its types right after ``set_view``, as MPI allows).  Each call turns
the buffer into a :class:`BufferLayout`: the view's file runs for the bytes
from the rank's file pointer on, paired with the buffer's memory runs (a
memory datatype, ``[buf, count, memtype]``, may scatter them).  Every check of
the buffer happens in :meth:`BufferLayout.validate`, inside the collective call,
so a bad buffer on one rank raises the same error on every rank.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from . import datatypes
from .collective import Attempt, call_head, raise_agreed
from .errors import LayoutError, MismatchError
from .layouts.base import TOP, Layout, refuse_objects
from .layouts.strided import Blocks
from .layouts.typemap import Flat, Pair, stream_runs, zip_runs
from .runs import Runs, first_overlap, merge, read_only, sort

__all__ = [
    "FileView", "BufferLayout", "DEFAULT_VIEW", "buffer_size", "make_view", "check_filetype",
]  # fmt: skip


#: The most bytes of arrays a memo keeps for one view: its filetype's runs (the views
#: :func:`make_view` keeps) or one call's runs (:attr:`FileView.runs_memo`); larger ones
#: are made anew each time.  The views kept hold at most ``VIEWS_KEPT * 2 * MEMO_BYTES``
#: (16 MiB) beyond what open files hold; the default view's memo holds one run.
MEMO_BYTES = 2 << 20
#: How many views :func:`make_view` keeps to hand out again (least recently used dropped).
VIEWS_KEPT = 4


@dataclasses.dataclass(frozen=True, slots=True)
class FileView:
    """``disp`` bytes, then ``filetype`` tiled; positions count ``etype_size``-byte etypes.

    ``runs_memo`` keeps the runs of the last call through the view from a contiguous
    buffer (:meth:`BufferLayout.validate`), read-only: the next such call with the same
    position and size gets the same object, which the engine's checks and the plan cache
    recognise by identity (a program writes the same piece through a view call after call).
    """

    disp: int
    etype_size: int
    filetype: Flat
    # (start byte, bytes, buffer offset, runs, first overlapping run): one entry, replaced
    # whole (a worker thread's call may read it while this thread's call replaces it)
    runs_memo: list[tuple[int, int, int, Runs, int] | None] = dataclasses.field(
        init=False, default_factory=lambda: [None], compare=False, repr=False
    )

    def stream(self, start: int, total: int, mem0: int) -> tuple[Runs, int]:
        """Local: the runs of ``total`` stream bytes from byte ``start`` of the view, held
        by a contiguous buffer from its byte ``mem0``, and the first run overlapping an
        earlier one (-1: none); the same read-only object as the last call's when equal."""
        seen = self.runs_memo[0]
        if seen is not None and seen[1] == total and seen[2] == mem0:
            if seen[0] == start:
                return seen[3], seen[4]
            size = self.filetype.size
            if size and (start - seen[0]) % size == 0:
                # whole tiles further (a time series' next step): the same runs, each
                # moved by as many extents, so sorted, merged and overlapping alike
                d = (start - seen[0]) // size * self.filetype.extent
                r = seen[3]
                file = r.file + d
                file.flags.writeable = False  # (length and mem are the read-only same)
                runs = Runs(file, r.length, r.mem)
                self.runs_memo[0] = (start, total, mem0, runs, seen[4])
                return runs, seen[4]
        mem = (np.array([mem0], np.int64), np.array([total], np.int64))
        f_runs = stream_runs(self.filetype, self.disp, start, total)
        runs = read_only(merge(sort(zip_runs(f_runs, mem))) if total else Runs.empty())
        bad = first_overlap(runs.file, runs.length)
        if 3 * runs.file.nbytes <= MEMO_BYTES:
            self.runs_memo[0] = (start, total, mem0, runs, bad)
        return runs, bad


#: What a file opened without ``set_view`` has: displacement 0, etype and filetype bytes.
DEFAULT_VIEW = FileView(0, 1, Flat.leaf([(0, 1)], 0, 1))


def check_filetype(ft: Flat) -> str | None:
    """Why ``ft`` cannot be a filetype (MPI's rules), or None.

    Displacements must be non-negative and non-decreasing, also from one tile
    to the next.  Runs that overlap without going backwards are accepted here;
    writing through them is an :class:`~collio.OverlapError`.
    """
    if not ft.nruns:
        return None
    if ft.extent <= 0:
        return f"filetype extent {ft.extent} must be positive"
    low = int(ft.off.min())
    if low < 0:
        return f"filetype has negative displacement {low}"
    back = np.flatnonzero(np.diff(ft.off) < 0)
    if len(back):
        i = int(back[0])
        return (
            f"filetype displacements decrease: byte {int(ft.off[i + 1])} comes after "
            f"byte {int(ft.off[i])}"
        )
    if int(ft.off[-1]) > int(ft.off[0]) + ft.extent:
        return (
            f"filetype displacements decrease from one tile to the next: extent {ft.extent} "
            f"is less than the span {int(ft.off[-1] - ft.off[0])} of its displacements"
        )
    return None


def make_view(
    comm: MPI.Comm,
    file: tuple[int, str],
    disp: Any,
    etype: Any,
    filetype: Any,
    datarep: str,
    *,
    refusal: BaseException | None = None,
) -> FileView:
    """Collective over `comm`: check and flatten a view; the same error on every rank.

    One agreement (:func:`~collio.collective.call_head`, as ``set_view`` of ``file``)
    carries the errors and the etype sizes, which must be equal; the checks before it
    are local (decoding a datatype asks MPI only about the type).  ``refusal`` is an
    error the caller's own checks found (a front end's rules), agreed as the view's are.
    """
    step = Attempt()
    view = DEFAULT_VIEW
    with step:
        if refusal is not None:
            raise refusal
        if datarep != "native":
            raise LayoutError(f"datarep {datarep!r} is not supported (only 'native')")
        if isinstance(disp, bool) or not isinstance(disp, (int, np.integer)):
            raise LayoutError(f"displacement must be an integer, not {disp!r}")
        if disp < 0:
            raise LayoutError(f"displacement {int(disp)} is negative")
        et = datatypes.flatten(MPI.BYTE if etype is None else etype)
        ft = et if filetype is None else datatypes.flatten(filetype)
        if et.size <= 0:
            raise LayoutError("etype has no data")
        if ft.size % et.size:
            raise LayoutError(
                f"filetype holds {ft.size} bytes, not a whole number of {et.size}-byte etypes"
            )
        view = _kept_view(int(disp), et.size, ft)
    size = view.etype_size
    failed, out = call_head(comm, "set_view", file, step.error is not None, [size, -size])
    if failed:
        raise_agreed(comm, step.error, what="set_view")
    if out[0] != -out[1]:  # every rank knows: each names itself, as agree() would
        low, high = int(-out[1]), int(out[0])
        msg = f"etype sizes differ between ranks: from {low} to {high} bytes"
        raise_agreed(comm, MismatchError(msg), what="set_view")
    return view


_VIEWS: list[FileView] = []  # most recently used last (see VIEWS_KEPT)
_VIEWS_LOCK = threading.Lock()  # (files of several threads set views)


def _same_flat(a: Flat, b: Flat) -> bool:
    if a is b:
        return True
    return (
        (a.lb, a.extent, a.size, a.nruns) == (b.lb, b.extent, b.size, b.nruns)
        and np.array_equal(a.off, b.off)
        and np.array_equal(a.length, b.length)
    )


def _kept_view(disp: int, etype_size: int, ft: Flat) -> FileView:
    """Local: the checked view of these values, the same object as an earlier
    :func:`make_view`'s of equal ones (so its runs memo serves the new view too); a
    filetype MPI refuses raises :class:`~collio.LayoutError`.

    A datatype's typemap is decoded once and kept on the type, so the same type gives the
    same :class:`Flat` (found by identity); an equal type made anew is compared by content.
    """
    with _VIEWS_LOCK:
        for i, v in enumerate(_VIEWS):
            if v.disp == disp and v.etype_size == etype_size and _same_flat(v.filetype, ft):
                _VIEWS.append(_VIEWS.pop(i))
                return v
    bad = check_filetype(ft)
    if bad:
        raise LayoutError(bad)
    view = FileView(disp, etype_size, ft)
    if ft.off.nbytes + ft.length.nbytes <= MEMO_BYTES:
        with _VIEWS_LOCK:
            _VIEWS.append(view)
            del _VIEWS[:-VIEWS_KEPT]
    return view


def _as_bytes(buf: Any) -> npt.NDArray[np.uint8]:
    """The memory of ``buf`` as a flat uint8 array (a view, never a copy)."""
    if isinstance(buf, np.ndarray):
        if type(buf) is np.ndarray and buf.ndim == 1 and buf.dtype == np.uint8:
            if buf.flags.c_contiguous:
                return buf  # (already what the view of it would be)
        if not (buf.flags.c_contiguous or buf.flags.f_contiguous):
            raise LayoutError("buffer must be contiguous in memory")
        refuse_objects(buf.dtype)
        return buf.reshape(-1, order="A").view(np.uint8) if buf.size else np.zeros(0, np.uint8)
    if buf is None:
        raise LayoutError("no buffer given")
    try:
        return np.frombuffer(buf, np.uint8)
    except (BufferError, TypeError, ValueError) as exc:  # (a strided memoryview, a list)
        kind = type(buf).__name__
        raise LayoutError(f"buffer ({kind}) is not contiguous memory: {exc}") from None


def _parse(spec: Any) -> tuple[Any, int | None, int, Any]:
    """mpi4py's buffer forms: ``buf``, ``[buf, type]``, ``[buf, count, type]``,
    ``[buf, (count, displ), type]``; returns (buf, count or None, displ, type or None)."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, 0, None
    if len(spec) == 2:
        return spec[0], None, 0, spec[1]
    if len(spec) == 3:
        count, displ = spec[1], 0
        if isinstance(count, (list, tuple)):
            if len(count) != 2:
                raise LayoutError(f"buffer count {count!r} is not a count or (count, displ)")
            count, displ = count
        try:  # (integers, as mpi4py takes them: int() would cut 1.5 to 1)
            return spec[0], operator.index(count), operator.index(displ), spec[2]
        except TypeError:
            raise LayoutError(f"buffer count {spec[1]!r} is not an integer") from None
    raise LayoutError(f"buffer specification has {len(spec)} items; expected 1 to 3")


def _memtype(code: Any) -> MPI.Datatype:
    if isinstance(code, MPI.Datatype):
        return code
    if isinstance(code, str):
        try:
            return MPI.Datatype.fromcode(code)
        except (KeyError, ValueError):
            pass
    raise LayoutError(f"{code!r} is not an MPI datatype")


def buffer_size(spec: Any) -> int:
    """Local: the data bytes of an mpi4py buffer specification (how far it moves a file
    pointer, times the etype size); raises :class:`~collio.LayoutError` as a call would."""
    buf, count, displ, mtype = _parse(spec)
    mem = _as_bytes(buf)
    if mtype is None:
        return len(mem)
    return int(BufferLayout.memory_runs(mem, count, displ, mtype)[1].sum())


class BufferLayout(Layout):
    """One rank's buffer written (read) through a file view from etype ``position``.

    ``as_bytes``/``allocate`` return the buffer's own memory, so reads fill it in
    place.  :attr:`etypes` says how far the file pointer moves.
    """

    __slots__ = ("view", "position", "spec", "writing", "_mem", "etypes", "_nbytes", "_given")

    def __init__(self, view: FileView, position: int, spec: Any, *, writing: bool) -> None:
        super().__init__()
        self.view = view
        self._given: Any = position  # converted in validate(), inside the agreed checks
        self.position = 0
        self.spec = spec
        self.writing = writing
        self._mem: npt.NDArray[np.uint8] | None = None
        self.etypes = 0
        self._nbytes = 0

    @property
    def buffer(self) -> Any:
        """The user's buffer object (what ``read_all`` returns)."""
        return _parse(self.spec)[0]

    @staticmethod
    def buffer_of(spec: Any) -> Any:
        """The buffer object of an mpi4py buffer specification (``buf``, ``[buf, type]``,
        ...): what ``read_all`` returns."""
        return spec if type(spec) is np.ndarray else _parse(spec)[0]

    @property
    def data_bytes(self) -> int:
        """The bytes the call moves (after :meth:`validate`)."""
        return self._nbytes

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(np.uint8)

    @property
    def local_shape(self) -> tuple[int, ...]:
        return (0 if self._mem is None else len(self._mem),)

    def validate(self) -> None:
        try:  # (an integer, as MPI_Offset is: int() would cut 1.5 to 1 and read "3")
            self.position = operator.index(self._given)
        except TypeError as exc:
            raise LayoutError(f"offset {self._given!r} is not an integer") from exc
        spec = self.spec
        plain = type(spec) is np.ndarray  # (the common form: no memory runs)
        if plain:
            buf = spec
        else:
            buf, count, displ, mtype = _parse(spec)
        mem = _as_bytes(buf)
        if not self.writing and not mem.flags.writeable:
            raise LayoutError("the buffer to read into is read-only")
        if plain:
            m0, total, contiguous = 0, len(mem), True
        else:
            m_runs = self.memory_runs(mem, count, displ, mtype)
            total = int(m_runs[1].sum())
            contiguous = len(m_runs[0]) == 1
            m0 = int(m_runs[0][0]) if contiguous else 0
        view = self.view
        if total % view.etype_size:
            raise LayoutError(
                f"buffer holds {total} bytes, not a whole number of {view.etype_size}-byte etypes"
            )
        if self.position < 0:
            raise LayoutError(f"offset {self.position} is negative")
        if total and not view.filetype.size:
            raise LayoutError("the file view holds no data (its filetype is empty)")
        start = self.position * view.etype_size
        if total:  # (the runs are int64: a stream reaching past the top would wrap)
            ft = view.filetype
            end = view.disp + (start + total - 1) // ft.size * ft.extent
            end += int((ft.off + ft.length).max())
            if end > TOP:
                raise LayoutError(
                    f"the call reaches byte {end}, past the largest offset {TOP} "
                    f"(view displacement {view.disp}, offset {self.position})"
                )
        if contiguous:  # a contiguous buffer: the view's runs, kept for the next call
            self._runs, bad = view.stream(start, total, m0)
            self._overlap = (self._runs, bad)
        else:
            f_runs = stream_runs(view.filetype, view.disp, start, total)
            self._runs = merge(sort(zip_runs(f_runs, m_runs))) if total else Runs.empty()
        self._mem = mem
        self._nbytes = total
        self.etypes = total // view.etype_size

    @staticmethod
    def memory_runs(mem: npt.NDArray[np.uint8], count: int | None, displ: int, mtype: Any) -> Pair:
        """Where the data of ``[mem, (count, displ), mtype]`` lies in ``mem``, in order."""
        if mtype is None:
            return np.zeros(1, np.int64), np.array([len(mem)], np.int64)
        flat = datatypes.flatten(_memtype(mtype))
        if count is None:
            if flat.extent <= 0 or len(mem) % flat.extent:
                raise LayoutError(
                    f"cannot infer count: buffer of {len(mem)} bytes is not a multiple of "
                    f"the datatype extent {flat.extent}"
                )
            count = len(mem) // flat.extent
        if count < 0:
            raise LayoutError(f"count {count} is negative")
        off, length = stream_runs(flat, displ * flat.extent, 0, count * flat.size)
        if len(off) and (int(off.min()) < 0 or int((off + length).max()) > len(mem)):
            raise LayoutError(
                f"memory datatype reaches bytes [{int(off.min())}, {int((off + length).max())}) "
                f"outside the buffer of {len(mem)} bytes"
            )
        if not len(off):
            return np.zeros(1, np.int64), np.zeros(1, np.int64)
        return off, length

    def runs(self) -> Runs:
        if self._runs is None:
            self.validate()
        assert self._runs is not None
        return self._runs

    def blocks(self) -> Blocks:
        r = self.runs()
        ones = np.ones((len(r), 1), np.int64)
        return Blocks.build(r.file, r.mem, ones, ones, ones, r.length)

    def as_bytes(self, data: Any) -> npt.NDArray[np.uint8]:
        assert self._mem is not None, "validate() first"
        return self._mem

    def allocate(self, out: Any = None) -> tuple[np.ndarray[Any, Any], npt.NDArray[np.uint8]]:
        assert self._mem is not None, "validate() first"
        return self._mem, self._mem
