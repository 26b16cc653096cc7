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
from .save import item, spans
from .state import whole

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


def _layouts(index: format.Index, spec: Mapping[str, Any]) -> list[tuple[str, ArrayLayout]]:
    """Each requested name with this rank's piece (offset 0), checked against the index."""
    if not isinstance(spec, Mapping):
        raise LayoutError(f"spec must map names to layouts or None, not {type(spec).__name__}")
    out = []
    for name in sorted(spec):
        entry = index.arrays.get(name)
        if entry is None:
            raise LayoutError(f"array {name!r} is not in the checkpoint")
        shape, dtype, order = tuple(entry["shape"]), index.dtype(name), entry["order"]
        lay = spec[name]
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
        out.append((name, lay))
    return out


def _verify(
    comm: MPI.Comm,
    f: File,
    index: format.Index,
    wanted: list[tuple[str, ArrayLayout]],
    arrays: list[Any],
    every: I64,
) -> list[str]:
    """Collective: check every extent of the arrays read, each on one rank; the names
    whose bytes differ from what was saved (the same list on every rank)."""
    import crc32c

    rank, size = comm.Get_rank(), comm.Get_size()
    bad: set[str] = set()
    back: list[tuple[str, I64, I64, npt.NDArray[np.uint32]]] = []
    any_back = False  # (the same on every rank: every rank deals the same extents)
    for k, (name, lay) in enumerate(wanted):
        starts, crcs = index.extents(name)
        n = lay.global_nbytes
        lo, hi, contig = every[:, k, 0], every[:, k, 1], every[:, k, 2].astype(bool)
        owner = extents.owners(starts, n, lo, hi, contig)
        reader = extents.deal(owner < 0, size)
        any_back = any_back or bool((reader >= 0).any())
        ends = np.append(starts[1:], n)
        own = np.flatnonzero(owner == rank)
        if len(own):
            buf = lay.as_bytes(arrays[k]).data
            base = int(lo[rank])
            for j in own.tolist():
                if crc32c.crc32c(buf[starts[j] - base : ends[j] - base]) != crcs[j]:
                    bad.add(name)
                    break
        rd = np.flatnonzero(reader == rank)
        if len(rd):
            off = int(index.arrays[name]["offset"])
            back.append((name, off + starts[rd], ends[rd] - starts[rd], crcs[rd]))
    if any_back:
        offs = np.concatenate([np.zeros(0, np.int64), *[b[1] for b in back]])
        lens = np.concatenate([np.zeros(0, np.int64), *[b[2] for b in back]])
        buf = f.read_all(Segments(offs, lens)).data
        pos = 0
        for name, _, ln, cs in back:
            for length, c in zip(ln.tolist(), cs.tolist(), strict=True):
                if crc32c.crc32c(buf[pos : pos + length]) != c:
                    bad.add(name)
                pos += length
    found: list[set[str]] = comm.allgather(bad)
    return sorted(set().union(*found))


def _read(f: File, wanted: list[tuple[str, ArrayLayout]], offs: list[int], every: I64) -> list[Any]:
    """Collective: every piece in one read_all_many, a piece that is one range as raw bytes
    into its array (no flattening), any other through its layout."""
    arrays, lays, outs = [], [], []
    flat = [bool(x) for x in np.atleast_1d(every[:, :, 2].all(axis=0))]
    for (_, lay), off, fl in zip(wanted, offs, flat, strict=True):
        arr = np.empty(lay.local_shape, lay.dtype, order="F" if lay.order == "F" else "C")
        src, one = item(arr, lay, off, fl)
        arrays.append(arr)
        lays.append(one)
        outs.append(src if isinstance(one, Segments) else arr)
    f.read_all_many(lays, out=outs)
    return arrays


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
    None (the whole array on every rank).  Every extent read is verified against its
    checksum; a difference raises :class:`~collio.ChecksumError` on every rank, naming
    the arrays (``names``), after the others were read.  An unknown name, or a layout
    whose global shape, dtype or order differs from the stored array, raises the same
    :class:`~collio.LayoutError` on every rank before any data is read.
    """
    base = MPI.COMM_WORLD if comm is None else comm
    with _open(target, "r", comm=base, hints=hints, **options) as f:
        index = _read_index(f)
        step = Attempt()
        wanted: list[tuple[str, ArrayLayout]] = []
        with step:  # (a layout's runs may be built here first: a rank's error is agreed)
            wanted = _layouts(index, spec)
            mine = spans([lay for _, lay in wanted])
        agree(f.comm, step.error, what="checkpoint.load")
        offs = [int(index.arrays[name]["offset"]) for name, _ in wanted]
        every = np.empty((f.comm.Get_size(), *mine.shape), np.int64)
        f.comm.Allgather(mine, every)
        got = _read(f, wanted, offs, every)
        bad = _verify(f.comm, f, index, wanted, got, every)
    if bad:
        err = ChecksumError(
            f"{len(bad)} arrays differ from their checksums: {', '.join(map(repr, bad))}"
        )
        err.names = tuple(bad)
        raise err
    return {
        name: arr.reshape(()) if index.arrays[name]["shape"] == [] else arr
        for (name, _), arr in zip(wanted, got, strict=True)
    }
