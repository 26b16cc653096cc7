"""``load`` and ``info``: the index from the trailer, pieces in any decomposition, verified."""

from __future__ import annotations

import collections.abc
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..collective import Attempt, agree
from ..errors import ChecksumError, LayoutError
from ..file import File
from ..file import open as _open
from ..layouts.arrays import ArrayLayout, array_layout
from ..layouts.base import Segments
from . import extents, format
from .crc import combine as crc_combine
from .save import item, spans
from .state import as_array, whole

__all__ = ["Info", "info", "load"]

I64 = npt.NDArray[np.int64]


class Info(collections.abc.Mapping[str, dict[str, Any]]):
    """A checkpoint's arrays by name (shape, dtype, order, offset, nbytes, replicated)
    and ``metadata``, the user's JSON values."""

    def __init__(self, index: format.Index) -> None:
        self.index = index
        self.metadata = index.metadata
        self._arrays = {
            name: {**entry, "shape": tuple(entry["shape"]), "dtype": index.dtype(name)}
            for name, entry in index.arrays.items()
        }

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        return f"<checkpoint info: {len(self)} arrays, metadata={self.metadata!r}>"


def _parse(read: Any, size: int, where: str) -> format.Index:
    """The index of a target of ``size`` bytes, ``read(offset, length)`` giving its bytes."""
    import crc32c

    tail = format.TRAILER.size
    off, length, crc = format.parse_trailer(
        read(size - tail, tail) if size >= tail else b"", size, where
    )
    doc = read(off, length)
    if crc32c.crc32c(doc) != crc:
        raise ChecksumError(f"{where}: the index's checksum differs")
    try:
        toff, tlen = format.Index.table_span(doc)
        return format.Index.from_bytes(doc, read(toff, tlen), where)
    except (ValueError, KeyError, TypeError) as exc:
        raise ChecksumError(f"{where}: unreadable index: {exc}") from None


def info(target: Any, **options: Any) -> Info:
    """Local, no MPI: what the checkpoint at ``target`` holds (a path, or ``s3://``:
    ranged GETs, ``options`` as :func:`collio.open` takes for S3)."""
    text = os.fspath(target)
    if text.startswith("s3://"):
        return Info(_parse_s3(text, options))
    with open(text, "rb") as fp:
        size = os.fstat(fp.fileno()).st_size

        def read(offset: int, length: int) -> bytes:
            fp.seek(offset)
            return fp.read(length)

        return Info(_parse(read, size, text))


def _parse_s3(url: str, options: dict[str, Any]) -> format.Index:
    from ..backends.s3.client import client_for
    from ..backends.s3.options import S3Options

    opts = S3Options(**{k: v for k, v in options.items() if k in {"endpoint_url", "region_name"}})
    client = client_for(opts.endpoint_url, opts.region_name, 3, 4)
    bucket, _, key = url[len("s3://") :].partition("/")
    size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])

    def read(offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        rng = f"bytes={offset}-{offset + length - 1}"
        body: bytes = client.get_object(Bucket=bucket, Key=key, Range=rng)["Body"].read()
        return body

    return _parse(read, size, url)


def _read_index(f: File) -> format.Index:
    """Collective over ``f.comm``: rank 0 reads and checks the index; every rank gets it."""
    comm = f.comm
    root = comm.Get_rank() == 0
    size = f.backend.size()

    def read(offset: int, length: int) -> bytes:  # rank 0 alone: the backend's own read
        buf = np.empty(max(length, 0), np.uint8)
        f.backend.read_at(offset, buf)
        return buf.tobytes()

    step = Attempt()
    index: Any = None
    with step:
        if root:
            index = _parse(read, size, str(f.target))
    agree(comm, step.error, what="checkpoint.load: index")
    got: format.Index = comm.bcast(index, root=0)
    return got


def _wanted(
    index: format.Index, spec: Mapping[str, Any]
) -> list[tuple[str, ArrayLayout, np.ndarray[Any, Any] | None]]:
    """Each requested name, sorted, with this rank's piece (offset 0) checked against the
    index, and the caller's array to read it into (None: a new one)."""
    if not isinstance(spec, Mapping):
        raise LayoutError(f"spec must map names to layouts or None, not {type(spec).__name__}")
    out = []
    for name in sorted(spec):
        entry = index.arrays.get(name)
        if entry is None:
            raise LayoutError(f"array {name!r} is not in the checkpoint")
        shape, dtype, order = tuple(entry["shape"]), index.dtype(name), entry["order"]
        lay, into = spec[name], None
        if isinstance(lay, tuple) and len(lay) == 2:  # (out, layout or None): in place
            into, lay = _into(name, lay[0]), lay[1]
        if shape == ():  # a 0-d value is stored as one element
            if lay is not None:
                raise LayoutError(f"array {name!r} is 0-d: load it with None, not a layout")
            shape = (1,)
        if lay is None:
            lay = whole(shape, dtype, order)
        lay = array_layout(lay, f"array {name!r}: a spec")
        if (lay.global_shape, lay.dtype, lay.order) != (shape, dtype, order):
            raise LayoutError(
                f"array {name!r}: stored shape {shape} dtype {dtype.str} order {order}; layout "
                f"has shape {lay.global_shape} dtype {lay.dtype.str} order {lay.order}"
            )
        if into is not None:
            if entry["shape"] == [] and into.shape == ():
                into = into.reshape(1)  # (a view: the stored form of a 0-d value)
            try:
                lay.allocate(into)
            except LayoutError as exc:
                raise LayoutError(f"array {name!r}: {exc}") from None
        out.append((name, lay, into))
    return out


def _into(name: str, obj: Any) -> np.ndarray[Any, Any]:
    """A numpy view of the caller's array ``obj`` to read array ``name`` into."""
    try:
        arr = as_array(obj)
    except LayoutError as exc:
        raise LayoutError(f"array {name!r}: {exc}") from None
    if not arr.flags.writeable:
        raise LayoutError(f"array {name!r}: the array to load into is read-only")
    return arr


def _verify(
    comm: MPI.Comm,
    f: File,
    index: format.Index,
    wanted: list[tuple[str, ArrayLayout]],
    arrays: list[Any],
    every: I64,
) -> list[str]:
    """Collective: check every extent of the arrays read, each on one rank; the names
    whose bytes differ from what was saved (the same list on every rank).

    An extent is checked by a rank whose piece holds it whole, from the piece just
    read (a load in the saving decomposition checks everything so); any other extent
    by one rank that reads it once more."""
    import crc32c

    rank = comm.Get_rank()
    x, crcs, offs = _extents(index, wanted, every)
    bad = np.zeros(len(wanted), bool)
    own = np.flatnonzero(x.owner == rank)
    views: dict[int, tuple[memoryview, int]] = {}

    def view(k: int) -> tuple[memoryview, int]:
        """This rank's piece of array ``k`` as bytes, and its first byte in the array."""
        if k not in views:
            views[k] = (wanted[k][1].as_bytes(arrays[k]).data, int(every[rank, k, 0]))
        return views[k]

    rows = zip(x.aid[own].tolist(), x.starts[own].tolist(), x.ends[own].tolist(), strict=True)
    for j, (k, a, b) in zip(own.tolist(), rows, strict=True):
        buf, lo = view(k)
        if crc32c.crc32c(buf[a - lo : b - lo]) != crcs[j]:
            bad[k] = True
    if len(x.joined):  # (the same on every rank: every rank plans alike)
        _check_joined(comm, x, crcs, bad, lambda k: view(k))
    if bool((x.reader >= 0).any()):
        rd = np.flatnonzero(x.reader == rank)
        lens = x.ends[rd] - x.starts[rd]
        got = f.read_all(Segments(offs[x.aid[rd]] + x.starts[rd], lens)).data
        cuts = np.concatenate([[0], np.cumsum(lens)]).tolist()
        for i, j in enumerate(rd.tolist()):
            if crc32c.crc32c(got[cuts[i] : cuts[i + 1]]) != crcs[j]:
                bad[x.aid[j]] = True
    found = np.empty((comm.Get_size(), len(wanted)), bool)
    comm.Allgather(bad, found)
    return [wanted[k][0] for k in np.flatnonzero(found.any(axis=0)).tolist()]


def _extents(
    index: format.Index, wanted: list[tuple[str, ArrayLayout]], every: I64
) -> tuple[extents.Plan, npt.NDArray[np.uint32], I64]:
    """The stored extents of the arrays read (every array's at once), with their
    checksums and the arrays' offsets."""
    parts = [index.extents(name) for name, _ in wanted]
    z = np.zeros(0, np.int64)
    starts = np.concatenate([z, *[p[0] for p in parts]])
    crcs = np.concatenate([np.zeros(0, np.uint32), *[p[1] for p in parts]])
    aid = np.repeat(np.arange(len(wanted)), [len(p[0]) for p in parts]).astype(np.int64)
    nbytes = np.array([lay.global_nbytes for _, lay in wanted], np.int64)
    offs = np.array([int(index.arrays[name]["offset"]) for name, _ in wanted], np.int64)
    return extents.assign(starts, aid, nbytes, offs, every, join=True), crcs, offs


def _check_joined(
    comm: MPI.Comm,
    x: extents.Plan,
    crcs: npt.NDArray[np.uint32],
    bad: npt.NDArray[np.bool_],
    view: Any,
) -> None:
    """Collective: the extents held by several ranks' pieces, from their parts' checksums
    (each rank's own parts from memory, combined on every rank alike); marks ``bad``."""
    import crc32c

    pe, plo, phi, prk = x.part
    got = np.zeros(len(pe), np.uint32)
    mine = np.flatnonzero(prk == comm.Get_rank())
    rows = zip(x.aid[pe[mine]].tolist(), plo[mine].tolist(), phi[mine].tolist(), strict=True)
    for i, (k, a, b) in zip(mine.tolist(), rows, strict=True):
        buf, lo = view(k)
        got[i] = crc32c.crc32c(buf[a - lo : b - lo])
    comm.Allreduce(MPI.IN_PLACE, got, op=MPI.BOR)  # (each part's rank alone gives it)
    first = np.searchsorted(pe, x.joined)
    count = np.diff(np.append(first, len(pe)))
    crc = got[first]
    for j in range(1, int(count.max(initial=1))):
        more = count > j
        at = first[more] + j
        crc[more] = crc_combine(crc[more], got[at], phi[at] - plo[at])
    bad[x.aid[x.joined[crc != crcs[x.joined]]]] = True


def _allocate(lays: list[ArrayLayout], into: list[Any]) -> list[Any]:
    """This rank's arrays: the caller's where given, else each its own allocation.
    (One allocation for them all, in huge pages, faulted in faster on a quiet machine,
    but after a save's writes had filled the page cache its huge pages came slower and
    less steadily, and any array kept would have kept them all.  Reading into arrays the
    job already has costs no page faults at all.)"""
    return [
        np.empty(lay.local_shape, lay.dtype, order="F" if lay.order == "F" else "C")
        if arr is None else arr
        for lay, arr in zip(lays, into, strict=True)
    ]  # fmt: skip


def _read(
    f: File, wanted: list[tuple[str, ArrayLayout]], into: list[Any], offs: list[int], every: I64
) -> list[Any]:
    """Collective: the arrays whose every piece is one range, read by each rank itself
    as raw bytes into its array (no flattening, no exchange: ranks reading the same
    bytes, a whole array on every rank, read them each); then the others through their
    layouts, two-phase."""
    arrays = _allocate([lay for _, lay in wanted], into)
    lays: list[list[Any]] = [[], []]
    outs: list[list[Any]] = [[], []]
    flat = [bool(x) for x in np.atleast_1d(every[:, :, 2].all(axis=0))]
    for (_, lay), off, fl, arr in zip(wanted, offs, flat, arrays, strict=True):
        src, one = item(arr, lay, off, fl)
        lays[fl].append(one)
        outs[fl].append(src if isinstance(one, Segments) else arr)
    if any(flat):  # (flat is the same on every rank: it comes from every rank's spans)
        f.read_all_many(lays[True], out=outs[True], _disjoint=True)
    if not all(flat):
        f.read_all_many(lays[False], out=outs[False])
    return arrays


def _unmapped(hints: Any) -> Any:
    """The user's hints, reads of a local file by ``preadv`` where ``mapped_reads`` is
    left ``automatic``: a load reads few large runs (a piece of an array each) into
    one allocation, which ``preadv`` copies once, where the copy out of a map gathers
    and scatters them (``enable`` still maps)."""
    from ..hints import Hints

    given = Hints.coerce(hints)
    return given.replace(mapped_reads="disable") if given.mapped_reads == "automatic" else given


def load(
    target: Any,
    spec: Mapping[str, Any],
    *,
    comm: MPI.Intracomm | None = None,
    hints: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """Collective over `comm`: read the arrays ``spec`` names, each as this rank's piece.

    ``spec`` maps names to an array layout (any decomposition, any number of ranks) or
    None (the whole array on every rank), or to ``(out, layout or None)``: the piece is
    read into ``out`` in place (a numpy array, or any CPU array with ``__dlpack__`` or
    ``__array_interface__``, of the piece's shape and dtype, contiguous in the layout's
    order, writeable), which the result holds for that name.  Every extent read is
    verified against its checksum; a difference raises :class:`~collio.ChecksumError`
    on every rank, naming the arrays (``names``), after the others were read (an ``out``
    of a named array then holds the bytes read, not the saved ones).  An unknown name, a
    layout whose global shape, dtype or order differs from the stored array, or an
    ``out`` that does not fit raises the same :class:`~collio.LayoutError` on every rank
    before any data is read.
    """
    base = MPI.COMM_WORLD if comm is None else comm
    with _open(target, "r", comm=base, hints=_unmapped(hints), **options) as f:
        index = _read_index(f)
        step = Attempt()
        wanted: list[tuple[str, ArrayLayout]] = []
        into: list[Any] = []
        given: list[Any] = []
        with step:  # (a layout's runs may be built here first: a rank's error is agreed)
            found = _wanted(index, spec)
            wanted = [(name, lay) for name, lay, _ in found]
            into = [arr for _, _, arr in found]
            given = [spec[name][0] if arr is not None else None for name, _, arr in found]
            mine = spans([lay for _, lay in wanted])
        agree(f.comm, step.error, what="checkpoint.load")
        offs = [int(index.arrays[name]["offset"]) for name, _ in wanted]
        every = np.empty((f.comm.Get_size(), *mine.shape), np.int64)
        f.comm.Allgather(mine, every)
        got = _read(f, wanted, into, offs, every)
        bad = _verify(f.comm, f, index, wanted, got, every)
    if bad:
        err = ChecksumError(
            f"{len(bad)} arrays differ from their checksums: {', '.join(map(repr, bad))}"
        )
        err.names = tuple(bad)
        raise err
    return {
        name: obj
        if obj is not None
        else arr.reshape(())
        if index.arrays[name]["shape"] == []
        else arr
        for (name, _), arr, obj in zip(wanted, got, given, strict=True)
    }
