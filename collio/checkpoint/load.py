"""``load`` and ``info``: the index from the trailer, pieces in any decomposition, verified."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..backends import get_backend, infer_backend
from ..collective import Attempt, bcast_outcome, call_head, digest, raise_agreed
from ..comms import exclusive, private
from ..errors import ChecksumError, MismatchError
from ..facts import Facts, How, fact, record
from ..file import File
from ..file import open as _open
from ..hints import Hints
from ..layouts.arrays import ArrayLayout
from ..redact import redact_url
from ..waits import sleep_until_done
from . import format
from .asyncsave import settle
from .chunks import ChunkedReads, Chunks
from .filemap import Reader, maps
from .index import Info, parse, parse_crc
from .index import info as _info
from .placed import placed
from .verify import CHUNK, Checks, Stored, Views, alone, read_checked, uncut, verify, verify_alone
from .wanted import Wanted

__all__ = ["CHUNK", "Info", "info", "load"]

I64 = npt.NDArray[np.int64]


def _backend_read(f: File) -> Any:
    def read(offset: int, length: int) -> bytes:  # (the backend's own read)
        buf = np.empty(max(length, 0), np.uint8)
        f.backend.read_at(offset, buf)
        return buf.tobytes()

    return read


def _read_index(f: File) -> format.Index:
    """Collective over ``f.comm``: rank 0 reads and checks the index; every rank gets it
    (an object store: one rank's few ranged GETs)."""
    comm = f.comm
    step = Attempt()
    index: Any = None
    with step:
        if comm.Get_rank() == 0:
            index = parse(_backend_read(f), f.backend.size(), redact_url(str(f.target)))
    # (only rank 0 reads: its outcome broadcast is the agreement)
    got: format.Index = bcast_outcome(comm, index, step.error, what="checkpoint.load: index")
    return got


def _own_index(f: File) -> tuple[format.Index, int]:
    """Local: the index as this rank reads it from a local file (a few reads from the page
    cache, parsed on every rank at once instead of broadcast from one), and its checksum;
    the ranks' errors and checksums are agreed by :func:`_gather_spans`."""
    return parse_crc(_backend_read(f), f.backend.size(), redact_url(str(f.target)))


def _gather_spans(
    comm: MPI.Comm, mine: Any, names: list[str], crc: int, error: BaseException | None
) -> I64:
    """Collective: every rank's spans of its pieces ``(rank, array, (lo, hi, contiguous,
    bytes))`` of the arrays ``names`` (sorted); and first, in one fixed-size gather, the
    agreement on what came before (see :func:`_settle`).  Both waited for sleeping: the
    ranks come from their own reads of the index, some later than others."""
    head = np.array([error is not None or mine is None, crc, len(names), digest(names)], np.int64)
    heads = np.empty((comm.Get_size(), 4), np.int64)
    sleep_until_done(comm.Iallgather([head, MPI.INT64_T], [heads, MPI.INT64_T]))
    _settle(comm, heads, error)
    return _all_spans(comm, mine, len(names))


def _settle(comm: MPI.Comm, heads: I64, error: BaseException | None) -> None:
    """Collective: from every rank's ``(failed, index checksum, count, names digest)``, a
    rank's ``error`` raised on every rank, the index every rank read itself the same
    on all, and the same names asked for on every rank (else array k would be another
    array on another rank, and the spans' gather would not even have one size)."""
    if heads[:, 0].any():
        raise_agreed(comm, error, what="checkpoint.load")
    if len(set(heads[:, 1].tolist())) > 1:
        raise ChecksumError("checkpoint.load: the ranks read different indexes (replaced?)")
    if (heads[:, 2:4] != heads[0, 2:4]).any():
        odd = int(np.flatnonzero((heads[:, 2:4] != heads[0, 2:4]).any(axis=1))[0])
        n, n0 = int(heads[odd, 2]), int(heads[0, 2])
        what = f"{n} arrays, rank 0 for {n0}" if n != n0 else f"other arrays than rank 0 ({n})"
        raise MismatchError(
            f"checkpoint.load: rank {odd}'s spec asks for {what}: every rank's spec must "
            "name the same arrays"
        )


def _all_spans(comm: MPI.Comm, mine: Any, n: int) -> I64:
    """Collective: every rank's ``mine`` (``n`` rows, ``n`` agreed), waited for sleeping."""
    every = np.empty((comm.Get_size(), n, 4), np.int64)
    sleep_until_done(comm.Iallgather([mine, MPI.INT64_T], [every, MPI.INT64_T]))
    return every


def _read(
    f: File | None,
    be: Any,
    rank: int,
    wanted: list[tuple[str, ArrayLayout]],
    arrays: list[Any],
    offs: I64,
    every: I64,
    checks: Checks,
    mapped: npt.NDArray[np.bool_],
    chunks: Chunks,
) -> BaseException | None:
    """Collective: the arrays whose every piece is one range, read by each rank itself
    into its array (no flattening, no exchange: ranks reading the same bytes, a whole
    array on every rank, read them each); then the others through their layouts,
    two-phase, by ``f``; every range ``checks`` holds summed.  Returns this rank's error
    of its own reads, not agreed yet (:func:`~.verify.verify` agrees it with the checksums).

    ``offs`` are the arrays' virtual offsets, ``chunks`` their map to the file, ``be``
    a reader of virtual offsets (:class:`~.chunks.ChunkedReads`).
    With ``be`` (a local file's reader, or the backend of one that reads locally) each
    piece by its own reads, checksummed as it is read; else (an object store) in one
    call of ``f`` of them all, checksummed after.  ``f`` is None where every piece is
    one range: no call of a file is needed.  The pieces ``mapped`` (arrays over a map
    of a local file: :mod:`.filemap`) are not read, only checksummed from the map."""
    flat = np.atleast_1d(every[:, :, 2].all(axis=0)).astype(bool)
    # (each array is contiguous in its layout's order, made here or checked so)
    views = Views(arrays, every[rank, :, 0])
    step = Attempt()
    ids = np.flatnonzero(flat)
    if be is not None and len(ids):
        own = ids[~mapped[ids]]  # (the local reads: no rank waits for another's)
        with step:
            read_checked(be, checks, views, own, offs, every[rank])
    elif len(ids) and f is not None:  # (flat is the same on every rank: from every rank's spans)
        items = [placed(arrays[k], wanted[k][1], int(offs[k]), chunks, True)
                 for k in ids.tolist()]  # fmt: skip
        f.read_all_many([one for _, one in items], out=[src for src, _ in items], _disjoint=True)
    rest = np.flatnonzero(~flat)
    if len(rest) and f is not None:
        items = [placed(arrays[k], wanted[k][1], int(offs[k]), chunks, False)
                 for k in rest.tolist()]  # fmt: skip
        f.read_all_many([one for _, one in items], out=[src for src, _ in items])
    with step:
        checks.from_memory(views)
    return step.error


def _unmapped(hints: Any) -> Any:
    """The user's hints, reads of a local file by ``preadv`` where ``mapped_reads`` is
    left ``automatic``: a load reads few large runs (a piece of an array each) into
    one allocation, which ``preadv`` copies once, where the copy out of a map gathers
    and scatters them (``enable`` still maps)."""
    from ..hints import Hints

    try:
        given = Hints.coerce(hints)
    except Exception:  # noqa: BLE001 - parsed again inside the first agreement: agreed there
        return hints
    return given.replace(mapped_reads="disable") if given.mapped_reads == "automatic" else given


def info(target: Any, **options: Any) -> Info:
    """Local, no MPI: what the checkpoint at ``target`` holds (a path, or ``s3://``:
    ranged GETs, ``options`` as :func:`collio.open` takes for S3); after an
    :func:`~.asyncsave.async_save` of this process still writing it, what that commits."""
    settle(target)
    return _info(target, **options)


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
    None (the whole array on every rank; nested mappings name arrays as a save's state
    does, joined with ``/``), or to ``(out, layout or None)``: the piece is
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
    settle(target)  # (an async save of this process writing it: what it commits is read)
    given_hints = _unmapped(hints)
    if _local(target, given_hints, options):
        return _load_local(target, spec, base, given_hints, options)
    with _open(target, "r", comm=base, hints=given_hints, **options) as f:
        # (an object store's requests go from one rank, and in one call of many ranged
        # GETs at once; mapped_reads=enable maps, in a call; a memory target reads as a
        # local file does)
        direct = not f.backend.remote and given_hints.mapped_reads != "enable"
        index: Any = None if direct else _read_index(f)
        crc = 0
        step = Attempt()
        got = Wanted()
        with step:  # (a layout's runs may be built here first: a rank's error is agreed)
            if direct:
                index, crc = _own_index(f)
            got.find(index, spec)
        every = _gather_spans(f.comm, got.spans, got.names, crc, step.error)
        st = Stored.of(index, got.wanted)
        flags = _read_verified(f, f.backend if direct else None, f.comm, st, got, every)
    return got.result(index, flags)


def _read_verified(
    f: File | None, be: Any, comm: MPI.Comm, st: Stored, got: Wanted, every: I64
) -> npt.NDArray[np.bool_]:
    """Collective: plan the checks (before any byte is read), read, verify; which arrays
    differ (the same on every rank).  ``st``: the index's extents of the arrays read."""
    x, crcs, offs, chunks = st.plan(every), st.crcs, st.offs, st.chunks
    rank = comm.Get_rank()
    checks = Checks(x, rank, st.algo)
    cbe = None if be is None else ChunkedReads(be, chunks)
    error = _read(f, cbe, rank, got.wanted, got.arrays, offs, every, checks, got.mapped, chunks)
    return verify(comm, f, cbe, checks, crcs, offs, len(got.wanted), error, chunks)


def _local(target: Any, hints: Any, options: Mapping[str, Any]) -> bool:
    """Whether a load reads ``target`` as a local file, by the ranks' own reads (see
    :func:`_load_local`): a path of the posix backend, not mapped (``mapped_reads=enable``
    maps, in a call of the file).  Decided from the arguments alone, which every rank
    passes alike (the first agreement of either way of loading tells if not)."""
    return (
        isinstance(target, (str, os.PathLike))
        and infer_backend(target) == "posix"
        and options.get("backend", "posix") == "posix"
        and getattr(hints, "mapped_reads", None) != "enable"
    )


@record
class _Head(Facts):
    """What every rank of a local load must agree on before any byte is read."""

    index_crc: int = fact(How.EQUAL)  # the index's checksum: the same file on every rank
    names: int = fact(How.EQUAL)  # digest of the names asked for
    setup: int = fact(How.EQUAL)  # digest of the target, hints and options
    alone: bool = fact(How.ALL)  # every rank checks its pieces alone (see verify.alone)


def _load_local(
    target: Any, spec: Mapping[str, Any], base: MPI.Intracomm, hints: Any,
    options: Mapping[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Collective over `base`: :func:`load` of a local file.  Each rank reads the index
    and its pieces itself (by ``pread``, each step checksummed right after its read, still
    in the cache).  A file's open and close would add four agreements, which on ranks
    that share cores cost more than the reads: the file is opened as a collio file only
    for pieces that are not one range of their array (two-phase).

    Agreements, each waited for sleeping: before any byte is read (errors, the same
    index, names and arguments on every rank), and the checksums.  Where some rank's
    pieces cut extents (another decomposition than the save's), every rank's spans are
    gathered between the two, to check those extents from their parts."""
    priv = private(base)
    comm = priv.comm
    path = os.fspath(target)
    with exclusive(comm, "checkpoint.load"):
        reader = Reader()
        try:
            step = Attempt()
            got = Wanted()
            index: Any = None
            crc, solo = -1, False
            parsed: Any = None
            st: Any = None
            x: Any = None
            with step:
                # (the ranks compare what a collio file's open compares: the target and
                # the parsed hints, not how each rank spelled the backend's options)
                parsed = Hints.coerce(hints, warn=False)
                kept = {k: v for k, v in options.items() if k != "backend"}
                get_backend("posix").check_options("r", kept)
                reader.open(path)
                index, crc = parse_crc(reader.read, reader.size(), path)
                got.find(index, spec, maps=maps(parsed.checkpoint_map, reader.fd))
                st = Stored.of(index, got.wanted)
                got.map(reader, st.offs, st.chunks, parsed.checkpoint_map == "enable")
                # (this rank's alone: its one piece of an array holds an extent whole or
                # not at all, so no extent is joined from parts, which alone() drops.  A
                # rank whose pieces cut some extent (another decomposition than the
                # save's) plans from every rank's spans after the agreement: its plan
                # alone would never be used)
                if uncut(st, got.spans):
                    x, solo = alone(st.plan(got.spans[None], join=False), got.spans,
                                    comm.Get_rank())  # fmt: skip
            setup = (path, repr(parsed))
            head = _Head(index_crc=crc, names=digest(got.names), setup=digest(setup), alone=solo)
            if _agree_local(comm, (priv.files + 1, path), step.error, head, got.names, setup):
                checks = Checks(x, comm.Get_rank(), st.algo)  # (this rank's spans: its row 0)
                cbe = ChunkedReads(reader, st.chunks)
                error = _read(None, cbe, 0, got.wanted, got.arrays, st.offs, got.spans[None],
                              checks, got.mapped, st.chunks)  # fmt: skip
                flags = verify_alone(comm, cbe, checks, st.crcs, st.offs, len(got.wanted),
                                     error, st.chunks)  # fmt: skip
            else:
                flags = _gathered(comm, target, base, hints, options, reader, st, got)
        finally:
            reader.close()
    return got.result(index, flags)


def _gathered(
    comm: MPI.Comm, target: Any, base: MPI.Intracomm, hints: Any, options: Mapping[str, Any],
    reader: Reader, st: Stored, got: Wanted,
) -> npt.NDArray[np.bool_]:  # fmt: skip
    """Collective: a local load planned from every rank's spans (the extents across
    pieces checked from the ranks' parts), through a collio file where some piece is
    not one range."""
    every = _all_spans(comm, got.spans, len(got.wanted))
    if bool(every[:, :, 2].all()):  # (the same on every rank)
        return _read_verified(None, reader, comm, st, got, every)
    with _open(target, "r", comm=base, hints=hints, **options) as f:
        return _read_verified(f, reader, f.comm, st, got, every)


def _agree_local(
    comm: MPI.Comm, file: tuple[int, str], error: BaseException | None, head: _Head,
    names: list[str], setup: Any,
) -> bool:  # fmt: skip
    """Collective: a local load's first agreement, the head of a call as a file's calls
    have (a rank making another collio call meets it there and every rank raises the same
    :class:`~collio.MismatchError`); only when the ranks differ, one gather of what
    they had, to say how (as :func:`_gather_spans` does).  Returns whether every rank
    checks its pieces alone."""
    failed, out = call_head(
        comm, "open", file, error is not None, head.slots(), patient=True,
        subject="checkpoint.load",
    )  # fmt: skip
    if failed:
        raise_agreed(comm, error, what="checkpoint.load")
    agreed = _Head.agreed(out[: _Head.width()])
    if None not in (agreed.index_crc, agreed.names, agreed.setup):
        return bool(agreed.alone)
    every = comm.allgather(([0, head.index_crc, len(names), head.names, head.setup], setup[0]))
    heads = np.array([h for h, _ in every], np.int64)
    # (the arguments first: other targets read other indexes, which is not a corruption)
    if (heads[:, 4] != heads[0, 4]).any():
        odd = int(np.flatnonzero(heads[:, 4] != heads[0, 4])[0])
        mine, first = every[odd][1], every[0][1]
        what = (f"loads {mine!r}, rank 0 {first!r}" if mine != first else
                f"passes other hints or options than rank 0 for {first!r}")  # fmt: skip
        raise MismatchError(
            f"checkpoint.load: rank {odd} {what}: every rank must load the same target "
            "with the same hints and options",
            ranks=(odd,),
        )
    _settle(comm, heads, None)
    raise MismatchError(  # pragma: no cover - _settle raised for what differed
        "checkpoint.load: the ranks' arguments differ"
    )
