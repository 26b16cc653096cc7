"""The checkpoint file: pure packing and parsing, no I/O, no MPI (see docs/checkpoint-format.md).

A fixed header, each saving rank's region (its pieces of the arrays it writes itself,
one after another: :func:`place_ranks`), the arrays stored whole (in their own order, C
unless the saver's layouts were Fortran), then a table of checksummed extents, the
JSON index and a fixed trailer.  The index goes last because the checksums are
known only once the data is written, and an S3 object is written once, front to
back: the trailer at the very end is what a reader finds first.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..errors import ChecksumError
from ..runs import displacements
from .crc import BY_VERSION, Algo, for_version

if TYPE_CHECKING:
    from .chunks import Chunks

__all__ = [
    "ALIGN",
    "DATA_START",
    "EXTENT",
    "HEADER",
    "TRAILER",
    "VERSION",
    "Index",
    "header_bytes",
    "parse_trailer",
    "place",
    "place_ranks",
    "trailer_bytes",
]

#: the version a save writes: 3 sums with CRC-32 where 2 summed with CRC-32C (see
#: :mod:`.crc`); its bytes are laid out as 2's
VERSION = 3
#: the versions a reader reads (1: every array stored whole, one chunk each)
READS = tuple(BY_VERSION)
MAGIC = b"COLLIOCK"
#: Arrays and small pieces start on this boundary: page-aligned, so they can be
#: memory-mapped and read with O_DIRECT, and one array's extents never share a
#: file-system block with another's.
ALIGN = 4096
DATA_START = ALIGN
#: The size of a huge page that maps a file's page cache at once (x86-64's 2 MiB).
HUGE_PAGE = 2 << 20
#: A saving rank's piece of this many bytes or more starts at the same offset modulo
#: :data:`HUGE_PAGE` in the file as in its array, leaving a gap (a hole: neither
#: written nor allocated) of less than :data:`HUGE_PAGE` before it.  Then every file
#: run of a piece loaded at another rank count (a row shard across several saving
#: ranks' pieces) can be mapped where it lies at the same offset modulo
#: :data:`HUGE_PAGE` in memory as in the file, so the kernel maps its whole huge pages
#: of the page cache at once, one fault each, where a run at another offset takes one
#: per few pages (4 ranks' rows loaded by 3: 256 faults a load on a rank, not 1241).
#: A piece smaller than a huge page holds no whole one, so it gains nothing for its
#: gap: it keeps the :data:`ALIGN` boundary.  So does a piece that starts within a
#: page of its array (rows of no whole pages): at the same offset within a page in the
#: file, a load across it and the piece before it would take both into that page,
#: which no map can; on the page grid such pieces are read, by readers of files saved
#: before this placement too (which check the offset within a page alone).
PLACE_MIN = HUGE_PAGE
#: magic, version, reserved
HEADER = struct.Struct("<8sI52x")
#: magic, version, index offset, index length, checksum of the index, reserved, magic
TRAILER = struct.Struct("<8sIQQI24x8s")
I64 = npt.NDArray[np.int64]
#: one row of the extent table: start within the array (bytes), checksum of the extent,
#: file offset of its first byte (the extent is one range of the file)
EXTENT = np.dtype([("start", "<u8"), ("crc", "<u4"), ("file", "<u8")])
#: version 1's rows: every array stored whole, each extent at the array's offset + start
EXTENT_V1 = np.dtype([("start", "<u8"), ("crc", "<u4")])


def header_bytes(version: int | None = None) -> bytes:
    return HEADER.pack(MAGIC, VERSION if version is None else version)


def trailer_bytes(
    index_offset: int, index_length: int, index_crc: int, version: int | None = None
) -> bytes:
    v = VERSION if version is None else version
    return TRAILER.pack(MAGIC, v, index_offset, index_length, index_crc, MAGIC)


def parse_trailer(raw: bytes, size: int, where: str) -> tuple[int, int, int, int]:
    """(index offset, length, checksum, format version) from the last bytes of a target
    of ``size`` bytes."""
    if size < DATA_START + TRAILER.size or len(raw) != TRAILER.size:
        raise ChecksumError(f"{where}: {size} bytes is too short for a checkpoint (truncated?)")
    magic, version, off, length, crc, end = TRAILER.unpack(raw)
    if magic != MAGIC or end != MAGIC:
        raise ChecksumError(f"{where}: no checkpoint trailer at its end (truncated or not one)")
    if version not in READS:
        raise ChecksumError(
            f"{where}: checkpoint format version {version}; this reads {', '.join(map(str, READS))}"
        )
    if off + length + TRAILER.size != size:
        raise ChecksumError(f"{where}: index at {off}+{length} does not end at size {size}")
    return int(off), int(length), int(crc), int(version)


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def place(nbytes: Sequence[int] | npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], int]:
    """Offsets of arrays of these sizes, in order from :data:`DATA_START`; and the data end."""
    sizes = np.asarray(nbytes, np.int64)
    room = (-(-sizes // ALIGN)) * ALIGN
    starts = DATA_START + np.concatenate([[0], np.cumsum(room)[:-1]]).astype(np.int64)
    end = int(DATA_START + room.sum())
    return starts[: len(sizes)], end


def place_ranks(
    lo: I64, hi: I64, direct: npt.NDArray[np.bool_], nbytes: I64, huge: bool = True
) -> tuple[I64, I64, int]:
    """Where a save stores each byte (version 2), from every rank's ``(lo, hi)`` of each
    array (``(rank, array)``, relative to the array) and which arrays each rank writes
    itself (``direct``): (file offset of each rank's piece of each direct array, -1 where
    it has none; file offset of each other array, stored whole, -1 for direct ones and
    empty ones; data end).

    Each rank's region holds its pieces, in array order, one after another: a rank
    writes one range of the file, front to back, as a file per rank would be written.
    Ranks writing many pieces interleaved with the others' in one file are slower (each
    write waits on the file's lock).  With ``huge`` (a file, which a load may map) a
    piece of :data:`PLACE_MIN` bytes or more that starts on a page boundary of its
    array starts at the same offset modulo :data:`HUGE_PAGE` in the file as in its
    array, the others (all of them without ``huge``: an S3 object would upload its
    gaps) on an :data:`ALIGN` boundary (see :data:`PLACE_MIN`).  The arrays written
    two-phase follow, whole and in order."""
    sizes = np.where(direct[None, :] & (hi > lo), hi - lo, 0)
    flat = sizes.ravel()  # (rank-major: rank 0's pieces first)
    held = np.flatnonzero(flat > 0)
    n = flat[held]
    first = lo.ravel()[held]
    big = (n >= PLACE_MIN) & (first % ALIGN == 0) & huge
    # (each piece starts at ``want`` modulo its boundary: modulo ALIGN, which divides
    # HUGE_PAGE, every piece's end is known from its own start and size alone)
    want = np.where(big, first % HUGE_PAGE, 0)
    ends = _after(want + n, 0)  # (the end before each piece, modulo ALIGN)
    gap = np.where(big, 0, -ends % ALIGN)
    # (modulo HUGE_PAGE the end before a large piece is known from the last large piece
    # before it, which starts at its ``want``, and the small pieces and gaps since)
    run = displacements(gap + n)  # (from DATA_START, without large gaps)
    last = _after(np.maximum.accumulate(np.where(big, np.arange(len(n)), -1)), -1)
    back = np.maximum(last, 0)
    end = np.where(last >= 0, want[back] + run - run[back], DATA_START + run)
    gap = np.where(big, (want - end) % HUGE_PAGE, gap)
    start = DATA_START + np.cumsum(gap + n) - n
    pieces = np.full(flat.shape, -1, np.int64)
    pieces[held] = start
    after = aligned(int(start[-1] + n[-1])) if len(n) else DATA_START
    rest = np.where(direct, 0, -(-nbytes // ALIGN) * ALIGN)
    whole = np.where(~direct & (nbytes > 0), after + displacements(rest), -1)
    return pieces.reshape(sizes.shape), whole, after + int(rest.sum())


def _after(x: I64, first: int) -> I64:
    """``x`` moved one place on: each element's predecessor's value, ``first`` for the first."""
    out = np.empty(len(x), np.int64)
    out[:1] = first
    out[1:] = x[:-1]
    return out


def extent_files(starts: I64, aid: I64, owner: I64, lo: I64, pieces: I64, whole: I64) -> I64:
    """The file offset of each extent's first byte (``starts`` within array ``aid``),
    from :func:`place_ranks`'s offsets: in its owner's piece (a direct array's extents are
    cut at its pieces' edges, each held by the one piece of its owner), else in the
    array stored whole."""
    o = np.maximum(owner, 0)
    inside = pieces[o, aid] + starts - lo[o, aid]
    return np.where(whole[aid] >= 0, whole[aid] + starts, inside)


def _to_descr(obj: Any) -> Any:
    """JSON gives lists where numpy's descriptors hold tuples."""
    if isinstance(obj, list):
        return [
            tuple(_to_descr(x) for x in item) if isinstance(item, list) else item for item in obj
        ]
    return obj


def dtype_of(descr: Any) -> np.dtype[Any]:
    return np.lib.format.descr_to_dtype(_to_descr(descr))


class Index:
    """What a checkpoint holds: arrays (shape, dtype, order, offset, extents) and metadata."""

    __slots__ = ("arrays", "metadata", "table", "version", "_dtypes")

    def __init__(
        self, arrays: dict[str, dict[str, Any]], metadata: Any, table: npt.NDArray[Any],
        version: int | None = None,
    ) -> None:  # fmt: skip
        self.arrays = arrays
        self.metadata = metadata
        self.table = table
        #: the format version it was read from (a save's: :data:`VERSION`)
        self.version = VERSION if version is None else version
        self._dtypes: dict[str, np.dtype[Any]] = {}  # (by descriptor: a few kinds in all)

    def extents(self, name: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint32]]:
        """(starts, crcs) of one array's extents; extent k ends where k+1 starts."""
        first, count = self.arrays[name]["extents"]
        rows = self.table[first : first + count]
        return rows["start"].astype(np.int64), rows["crc"].astype(np.uint32)

    @property
    def algo(self) -> Algo:
        """The checksum of its extents, table and index (:func:`~.crc.for_version`)."""
        return for_version(self.version)

    def dtype(self, name: str) -> np.dtype[Any]:
        descr = self.arrays[name]["dtype"]
        key = descr if isinstance(descr, str) else repr(descr)
        got = self._dtypes.get(key)
        if got is None:
            got = self._dtypes[key] = dtype_of(descr)
        return got

    def extents_of(
        self, names: list[str]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
        """(starts, crcs, array) of the extents of ``names``, in their order: :meth:`extents`
        of them all at once (one take from the table)."""
        got, aid = self._rows(names)
        return got["start"].astype(np.int64), got["crc"].astype(np.uint32), aid

    def _rows(self, names: list[str]) -> tuple[npt.NDArray[Any], I64]:
        """The extent table's rows of ``names``, in their order, and each row's name."""
        # (fromiter over the entries' pairs: numpy's array of a list of lists costs more)
        arrays = self.arrays
        pairs = chain.from_iterable([arrays[n]["extents"] for n in names])
        span = np.fromiter(pairs, np.int64, 2 * len(names)).reshape(-1, 2)
        first, count = span[:, 0], span[:, 1]
        aid = np.repeat(np.arange(len(names), dtype=np.int64), count)
        rows = np.arange(int(count.sum()), dtype=np.int64) + np.repeat(
            first - displacements(count), count
        )
        return self.table[rows], aid

    def places(self, names: list[str]) -> tuple[I64, Chunks]:
        """The virtual offsets of ``names`` (:func:`place` of their sizes: each array's bytes
        contiguous, as the load's plans want them) and the map of that space to the file
        (:class:`~.chunks.Chunks`, from the extents' file offsets)."""
        got = self.stored(names)
        return got[4], got[5]

    def stored(self, names: list[str]) -> tuple[I64, npt.NDArray[np.uint32], I64, I64, I64, Chunks]:
        """What a load takes from the index for ``names``, from one take of the table:
        :meth:`extents_of` (starts, crcs, array), the arrays' sizes, and :meth:`places`
        (virtual offsets, chunks)."""
        from .chunks import Chunks
        from .extents import ends_of

        arrays = self.arrays
        nbytes = np.fromiter([arrays[n]["nbytes"] for n in names], np.int64, len(names))
        voffs, _ = place(nbytes)
        got, aid = self._rows(names)
        starts = got["start"].astype(np.int64)
        ends = ends_of(starts, aid, nbytes)
        chunks = Chunks.of_runs(voffs[aid] + starts, got["file"].astype(np.int64), ends - starts)
        return starts, got["crc"].astype(np.uint32), aid, nbytes, voffs, chunks

    def to_bytes(self, table_offset: int) -> tuple[bytes, bytes]:
        """(extent table, JSON index) as stored: the table at ``table_offset``, then the JSON
        (the table's checksum under the checksum's name: ``crc32``, ``crc32c`` before 3)."""
        algo = self.algo
        table = np.ascontiguousarray(self.table, EXTENT).tobytes()
        doc = {
            "format": "collio-checkpoint",
            "version": self.version,
            "arrays": self.arrays,
            "extent_table": {
                "offset": table_offset,
                "count": len(self.table),
                algo.name: algo.of(table),
            },
            "metadata": self.metadata,
        }
        return table, json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_doc(
        cls, doc: Mapping[str, Any], table: bytes, where: str, version: int | None = None
    ) -> Index:
        """The index of the parsed JSON document ``doc`` and its extent table's bytes
        (``version``: the trailer's, which the document's must be)."""
        got = doc.get("version", 1)  # (the first writer's documents may have none)
        if type(got) is not int or got not in READS or version not in (None, got):
            raise ChecksumError(
                f"{where}: the index says checkpoint format version {got!r}, the trailer "
                f"{version}; this reads {', '.join(map(str, READS))}"
            )
        version = got
        algo = for_version(version)
        spec = doc["extent_table"]
        if algo.name not in spec:
            raise ChecksumError(
                f"{where}: the index of a version {version} checkpoint holds no "
                f"{algo.name!r} checksum of its extent table"
            )
        if algo.of(table) != spec[algo.name]:
            raise ChecksumError(f"{where}: the extent table's checksum differs")
        rows = np.frombuffer(table, EXTENT) if version != 1 else _from_v1(doc["arrays"], table)
        return cls(doc["arrays"], doc.get("metadata"), rows, version)

    @staticmethod
    def table_span(doc: Mapping[str, Any]) -> tuple[int, int]:
        """(offset, length) of the extent table of the parsed JSON document ``doc``."""
        spec = doc["extent_table"]
        row = EXTENT_V1 if doc.get("version", 1) == 1 else EXTENT
        return int(spec["offset"]), int(spec["count"]) * row.itemsize


def _from_v1(arrays: Mapping[str, Any], table: bytes) -> npt.NDArray[Any]:
    """A version 1 extent table as version 2's rows: every array stored whole at its
    ``offset``, so an extent's file offset is that plus its start."""
    old = np.frombuffer(table, EXTENT_V1)
    rows = np.zeros(len(old), EXTENT)
    rows["start"], rows["crc"] = old["start"], old["crc"]
    span = np.array([a["extents"] for a in arrays.values()], np.int64).reshape(-1, 2)
    offs = np.array([int(a["offset"]) for a in arrays.values()], np.int64)
    order = np.argsort(span[:, 0], kind="stable")
    order = order[span[order, 1] > 0]
    aid = np.repeat(order, span[order, 1])  # (each row's array: the arrays' rows tile the table)
    rows["file"] = offs[aid] + old["start"].astype(np.int64)
    return rows


def describe(
    names: Sequence[str],
    shapes: Sequence[tuple[int, ...]],
    dtypes: Sequence[np.dtype[Any]],
    orders: Sequence[str],
    offsets: npt.NDArray[np.int64],
    replicated: Sequence[bool],
    counts: Sequence[int],
) -> dict[str, dict[str, Any]]:
    """The index's entry of every array, its extents being ``counts[k]`` rows of the table."""
    counts_ = [int(c) for c in counts]
    firsts = np.concatenate([[0], np.cumsum(counts_)[:-1]]).astype(int).tolist() if counts_ else []
    # (a state holds a few dtypes, hundreds of arrays: each described once)
    descr = {dt: np.lib.format.dtype_to_descr(dt) for dt in set(dtypes)}
    return {
        name: {
            "shape": list(shape),
            "dtype": descr[dt],
            "order": order,
            "offset": off,
            "nbytes": math.prod(shape) * dt.itemsize,
            "replicated": bool(rep),
            "extents": [first, count],
        }
        for name, shape, dt, order, off, rep, first, count in zip(
            names,
            shapes,
            dtypes,
            orders,
            np.asarray(offsets).tolist(),
            replicated,
            firsts,
            counts_,
            strict=True,
        )
    }


def check_metadata(metadata: Mapping[str, Any] | None) -> Any:
    """The user's metadata as it will be stored: a mapping with string keys (a JSON
    object, so it comes back as given) of JSON values."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        from ..errors import LayoutError

        what = (f"keys {sorted(repr(k) for k in metadata if not isinstance(k, str))}"
                if isinstance(metadata, Mapping) else type(metadata).__name__)  # fmt: skip
        raise LayoutError(
            f"checkpoint metadata must be a mapping with string keys (a JSON object), not {what}"
        )
    try:  # (no NaN or Infinity: Python writes them, but they are not JSON, and the
        # index is read by JSON parsers that refuse them)
        return json.loads(json.dumps(metadata, allow_nan=False))
    except (TypeError, ValueError) as exc:
        from ..errors import LayoutError

        raise LayoutError(f"checkpoint metadata must be JSON values: {exc}") from None
