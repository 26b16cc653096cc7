"""Parallel ``.npy`` files: numpy's own header, every rank's piece at the data offset.

Rank 0 makes the header with :mod:`numpy.lib.format` (the version numpy itself
would choose, padded so the data starts on numpy's alignment); every rank
writes its piece collectively after it.  ``np.load(path)`` and
``np.load(path, mmap_mode="r")`` then return the global array, in C or Fortran
order.  :func:`load_npy` reads the header on rank 0 and checks it against
every rank's layout before reading.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from mpi4py import MPI

from .collective import Attempt, agree
from .errors import LayoutError, MismatchError
from .file import File
from .file import open as _open
from .layouts.arrays import ArrayLayout, array_layout
from .layouts.base import Segments

__all__ = ["save_npy", "load_npy", "npy_header"]

_fmt = np.lib.format


def _private(name: str) -> Any:
    """numpy's own writer/reader of any format version (3.0: utf-8 field names), which
    np.save and np.load use; private (numpy.lib._format_impl in numpy 2, .format before)."""
    impl = getattr(np.lib, "_format_impl", _fmt)
    fn = getattr(impl, name, None)
    if fn is None:  # pragma: no cover - a numpy without it
        raise LayoutError(f"this numpy ({np.__version__}) offers no {name} for .npy format 3.0")
    return fn


#: magic (6) + version (2) + header length (2 in version 1.0, 4 in 2.0 and 3.0)
_PREFIX = 12


def npy_header(shape: tuple[int, ...], dtype: Any, order: str = "C") -> bytes:
    """The ``.npy`` header numpy writes for an array of this shape, dtype and order."""
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise LayoutError(f"dtype {dt} holds Python objects; .npy files of those need pickle")
    d = {"descr": _fmt.dtype_to_descr(dt), "fortran_order": order == "F", "shape": tuple(shape)}
    buf = io.BytesIO()
    try:
        _fmt.write_array_header_1_0(buf, d)
    except UnicodeEncodeError:  # field names beyond latin-1: version 3.0 (utf-8), as np.save
        buf = io.BytesIO()
        _private("_write_array_header")(buf, d, (3, 0))
    except ValueError:  # too long for version 1.0
        buf = io.BytesIO()
        try:
            _fmt.write_array_header_2_0(buf, d)
        except UnicodeEncodeError:
            buf = io.BytesIO()
            _private("_write_array_header")(buf, d, (3, 0))
    return buf.getvalue()


def _check(layout: Any) -> ArrayLayout:
    checked = array_layout(layout, "a .npy file")
    if checked.offset:
        raise LayoutError(f"layout offset {checked.offset}: .npy data starts after the header")
    return checked


def _at(layout: ArrayLayout, offset: int) -> ArrayLayout:
    """The same piece with the array's first element at byte ``offset``."""
    return ArrayLayout(layout.global_shape, layout.dims, layout.dtype, layout.order, offset)


def _describe(sig: tuple[Any, ...]) -> str:
    _, shape, dtype, order, _ = sig
    return f"shape {tuple(shape)} dtype {dtype} order {order}"


def save_npy(
    path: Any,
    data: Any,
    layout: Any,
    *,
    comm: MPI.Intracomm | None = None,
    hints: Any = None,
    backend: str | None = None,
    **options: Any,
) -> None:
    """Collective over `comm`: write the global array as a ``.npy`` file.

    Parameters
    ----------
    path
        The target (what :func:`collio.open` accepts).
    data, layout
        This rank's piece and its array layout (offset 0); together the ranks'
        pieces must cover the array exactly once.
    comm, hints, backend, **options
        As for :func:`collio.open` (default ``MPI.COMM_WORLD``).
    """
    base = MPI.COMM_WORLD if comm is None else comm
    step = Attempt()
    header = b""
    sig: Any = None
    covered = 0
    with step:  # checked before the file is opened: a bad layout leaves the target alone
        lay = _check(layout)
        sig, covered = lay.signature(), lay.nbytes
        if base.Get_rank() == 0:
            header = npy_header(lay.global_shape, lay.dtype, lay.order)
    agree(base, step.error, what="save_npy")
    _agree_signature(base, sig, covered, "save_npy")
    hlen = int(base.bcast(len(header), root=0))
    mine = Segments([0], [hlen]) if base.Get_rank() == 0 else Segments([], [])
    with _open(path, "w", comm=base, hints=hints, backend=backend, **options) as f:
        f.write_all(np.frombuffer(header, np.uint8), mine)
        f.write_all(data, _at(layout, hlen))


def _agree_signature(comm: MPI.Intracomm, sig: Any, covered: int, what: str) -> None:
    """Collective: every rank has rank 0's array, and the pieces add up to all of it."""
    ref = comm.bcast(sig, root=0)
    err: Exception | None = None
    if sig != ref:
        err = MismatchError(f"array {_describe(sig)} differs from rank 0's {_describe(ref)}")
    agree(comm, err, what=what)
    total = comm.allreduce(covered, op=MPI.SUM)
    need = int(np.prod(ref[1], dtype=np.int64)) * np.dtype(ref[2]).itemsize
    if total != need:
        agree(
            comm,
            LayoutError(f"the ranks' pieces hold {total} bytes; the array has {need}"),
            what=what,
        )


def _read_header(f: File) -> tuple[tuple[int, ...], np.dtype[Any], bool, int]:
    """Collective over ``f.comm``: rank 0 reads and parses the header; every rank gets it."""
    comm = f.comm
    root = comm.Get_rank() == 0
    head = f.read_all(Segments([0], [_PREFIX]) if root else Segments([], []))
    step = Attempt()
    total = 0
    with step:
        if root:
            fp = io.BytesIO(head.tobytes())
            major, _ = _fmt.read_magic(fp)
            width = 2 if major == 1 else 4
            total = 8 + width + int.from_bytes(head[8 : 8 + width].tobytes(), "little")
    agree(comm, step.error, what="load_npy: header")
    total = int(comm.bcast(total, root=0))
    head = f.read_all(Segments([0], [total]) if root else Segments([], []))
    step = Attempt()
    info: Any = None
    with step:
        if root:
            fp = io.BytesIO(head.tobytes())
            version = _fmt.read_magic(fp)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise LayoutError(f".npy format version {version} is not supported")
            shape, fortran, dtype = _private("_read_array_header")(fp, version)
            need = total + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if f.backend.size() < need:
                raise LayoutError(f"file has {f.backend.size()} bytes; header says {need}")
            info = (tuple(int(n) for n in shape), dtype, bool(fortran), total)
    agree(comm, step.error, what="load_npy: header")
    result: tuple[tuple[int, ...], np.dtype[Any], bool, int] = comm.bcast(info, root=0)
    return result


def load_npy(
    path: Any,
    layout: Any,
    *,
    comm: MPI.Intracomm | None = None,
    out: Any = None,
    hints: Any = None,
    backend: str | None = None,
    **options: Any,
) -> Any:
    """Collective over `comm`: read this rank's piece of a ``.npy`` file.

    The header (read on rank 0) must match every rank's layout: global shape,
    dtype (byte order included) and order; otherwise every rank raises the
    same :class:`~collio.LayoutError`.  Returns the piece (``out`` if given).
    """
    with _open(path, "r", comm=comm, hints=hints, backend=backend, **options) as f:
        shape, dtype, fortran, offset = _read_header(f)
        step = Attempt()
        with step:
            lay = _check(layout)
            order = "F" if fortran else "C"
            if (lay.global_shape, lay.dtype, lay.order) != (shape, dtype, order):
                raise LayoutError(
                    f"file holds shape {shape} dtype {_fmt.dtype_to_descr(dtype)} order {order}; "
                    f"layout has shape {lay.global_shape} dtype "
                    f"{_fmt.dtype_to_descr(lay.dtype)} order {lay.order}"
                )
        agree(f.comm, step.error, what="load_npy")
        return f.read_all(_at(layout, offset), out)
