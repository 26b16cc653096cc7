"""Shared pieces of the MPI tests: global reference arrays and layouts per rank."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from collio import layouts
from collio.backends.mapped import fs_name
from collio.layouts import BlockCyclic, Layout, Segments, Subarray


def fs_of(path: str) -> str | None:
    """The local file system ``path`` (a file or directory) is on, as collio names it
    (:func:`collio.backends.mapped.fs_name`), or None for any other kind."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return fs_name(fd)
    finally:
        os.close(fd)


def on_local_fs(path: str) -> bool:
    """Whether ``path`` (a file or directory) is on a file system collio maps reads from
    (hint ``mapped_reads=automatic``)."""
    return fs_of(path) is not None


def read_file(path: str) -> bytes | None:
    """A plain read of the whole file, bypassing collio (None if there is none)."""
    if not os.path.exists(path):
        return None
    with open(path, "rb") as fh:
        return fh.read()


def fail_fsync_on_last_rank(comm: MPI.Comm, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last rank's fsyncs (and fdatasyncs, where no writeback is started) fail with
    ``EIO`` ("injected fsync error") until ``monkeypatch.undo()``."""
    if comm.Get_rank() != comm.Get_size() - 1:
        return
    from collio.backends import fsync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "injected fsync error")

    monkeypatch.setattr(os, "fsync", failing)
    monkeypatch.setattr(fsync, "fdatasync", failing)


def raises_everywhere(comm: MPI.Comm, exc_type: Any, fn: Any, *, match: str | None = None) -> Any:
    """Run fn on every rank; all must raise exc_type with the same type and message."""
    with pytest.raises(exc_type) as info:
        fn()
    msgs = comm.allgather((type(info.value).__name__, str(info.value)))
    assert msgs == [msgs[0]] * comm.size, msgs
    if match:
        assert match in str(info.value), str(info.value)
    return info.value


def reference(shape: tuple[int, ...], dtype: Any, seed: int = 7) -> np.ndarray[Any, Any]:
    """A deterministic global array every rank can build."""
    n = int(np.prod(shape))
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "fc":  # no NaNs: comparisons stay meaningful
        return rng.standard_normal(n).astype(dtype).reshape(shape)
    raw = rng.integers(0, 256, n * np.dtype(dtype).itemsize, np.uint8)
    return raw.view(dtype).reshape(shape)


def local_piece(glob: np.ndarray[Any, Any], lay: Layout) -> np.ndarray[Any, Any]:
    """The rank's piece of the global array, in the layout's memory order."""
    if isinstance(lay, Subarray):
        piece = glob[lay.slices]
    elif isinstance(lay, BlockCyclic):
        piece = glob[np.ix_(*lay.indices)]
    else:
        raise TypeError(type(lay))
    return np.asfortranarray(piece) if lay.order == "F" else np.ascontiguousarray(piece)


def mismatch_message(comm: MPI.Comm, first: str, rest: str, *, files: bool = False) -> str:
    """The MismatchError of rank 0 calling ``first`` while every other rank calls ``rest``."""
    shown = ", ".join(f"rank {r}: {rest}" for r in range(1, min(comm.size, 9)))
    what = "operations on different files" if files else "different collective operations"
    return f"ranks called {what}: rank 0 {first}; {shown} (every rank must make the same call)"


def file_image(glob: np.ndarray[Any, Any], order: str, offset: int = 0) -> bytes:
    """The bytes a file holding ``glob`` in ``order`` from ``offset`` must have."""
    return b"\0" * offset + glob.tobytes(order=order)


def all_layouts(comm: MPI.Comm, shape: tuple[int, ...], dtype: Any) -> list[tuple[str, Layout]]:
    """Every decomposition MPI can express, for this rank, C and Fortran order."""
    p = comm.size
    out: list[tuple[str, Layout]] = []
    for order in ("C", "F"):
        nd = len(shape)
        out.append((f"block-{order}", layouts.block(shape, dtype, comm=comm, order=order)))
        grid = (1,) * (nd - 1) + (p,)
        out.append(
            (f"colblock-{order}", layouts.block(shape, dtype, comm=comm, grid=grid, order=order))
        )
        grid = (p,) + (1,) * (nd - 1)
        out.append(
            (f"rowblock-{order}", layouts.block(shape, dtype, comm=comm, grid=grid, order=order))
        )
        dims = layouts.dims_create(p, nd)
        for blk in (2, 3):
            out.append(
                (
                    f"cyclic{blk}-{order}",
                    layouts.block_cyclic(
                        shape, dtype, block=blk, grid=dims, comm=comm, order=order
                    ),
                )
            )
    return out


def segments_for(comm: MPI.Comm, size: int, seed: int = 3) -> Segments:
    """Uneven, unsorted, partly empty byte runs; rank 1 (if any) holds none."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, size), size // 7, replace=False))
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [size]))
    owner = rng.integers(0, comm.size, len(starts))
    if comm.size > 1:
        owner[owner == 1] = 0
    mine = np.flatnonzero(owner == comm.rank)
    rng2 = np.random.default_rng(comm.rank)
    mine = rng2.permutation(mine)
    offs = starts[mine]
    lens = ends[mine] - starts[mine]
    # a few empty runs as well
    offs = np.concatenate((offs, [0, size // 2]))
    lens = np.concatenate((lens, [0, 0]))
    return Segments(offs, lens)


def prefill(comm: MPI.Comm, paths: list[str], nbytes: int) -> None:
    """The same random bytes in every file (rank 0 writes, everyone waits): holes then
    keep them in both files a comparison writes, where ROMIO's are undefined."""
    size = comm.allreduce(nbytes, op=MPI.MAX)
    if comm.rank == 0:
        pattern = np.random.default_rng(99).integers(0, 256, size, dtype=np.uint8).tobytes()
        for p in paths:
            with open(p, "wb") as fh:
                fh.write(pattern)
    comm.Barrier()


def collio_calls(fn: Any, seen: set[str] | None = None) -> tuple[set[str], Any]:
    """The names of the collio functions that ``fn()`` ran (into ``seen`` as they run,
    so a call that raises still reports them: what took the call), and what it returned."""
    seen = set() if seen is None else seen

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and "collio" in frame.f_code.co_filename:
            seen.add(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        got = fn()
    finally:
        sys.setprofile(None)
    return seen, got


def items_image(comm: MPI.Comm, items: Any, before: bytes | None = None) -> bytes:
    """The bytes every rank's ``(data, Segments of one run)`` items make (numpy), over a
    file's ``before`` bytes (None: a new file, which ends where the last run does)."""
    every = [x for mine in comm.allgather([(int(lay.offsets[0]), d) for d, lay in items])
             for x in mine]  # fmt: skip
    end = max(at + len(d) for at, d in every)
    want = np.zeros(end, np.uint8)
    if before is not None:
        raw = np.frombuffer(before, np.uint8)
        want = np.zeros(max(end, len(raw)), np.uint8)
        want[: len(raw)] = raw
    for at, d in every:
        want[at : at + len(d)] = d
    return want.tobytes()


def romio_items(path: str, comm: MPI.Comm, items: Any) -> None:
    """Every ``(data, Segments of one run)`` item through ROMIO: one ``Write_at_all`` each."""
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    try:
        for data, lay in items:
            fh.Write_at_all(int(lay.offsets[0]), [data, MPI.BYTE])
    finally:
        fh.Close()


def assert_items_as_romio(comm: MPI.Comm, ours: str, romio: str, items: Any) -> None:
    """Collective: ROMIO writes the same ``(data, Segments of one run)`` items to
    ``romio`` (:func:`romio_items`); collio's file ``ours`` and ROMIO's both hold, byte
    for byte, the image numpy makes of them (:func:`items_image`)."""
    romio_items(romio, comm, items)
    comm.Barrier()
    want = items_image(comm, items)
    assert read_file(ours) == want
    assert read_file(romio) == want


@contextlib.contextmanager
def file_limit(on: bool, nbytes: int) -> Iterator[None]:
    """On this rank (if ``on``), writes past ``nbytes`` fail (EFBIG: SIGXFSZ ignored);
    the limit as it was afterwards."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    if on:
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)


def assert_rows_load(comm: MPI.Comm, path: str) -> None:
    """The row-sharded checkpoint at ``path`` (:func:`collio.testing.checkpoint.rows_state`,
    its first scale) loads on every rank, each piece byte for byte."""
    import collio.checkpoint as ckpt
    from collio.testing import checkpoint as model

    spec = model.rows_layouts(comm.rank, comm.size)
    got = ckpt.load(path, dict(spec), comm=comm)
    for name, lay in spec.items():
        want = np.ascontiguousarray(model.rows_reference(name)[lay.slices])  # type: ignore[attr-defined]
        assert got[name].tobytes() == want.tobytes(), (comm.rank, name)


def column_step(
    comm: MPI.Comm, s: int, rows: int, cols: int, *, turn: int = 0
) -> tuple[np.ndarray[Any, Any], Any, bytes]:
    """Step ``s`` of a time series of column blocks: rank r's columns (the block
    ``(r + turn) % p``) of a (rows, cols * p) float64 array stored right after step
    ``s - 1`` from byte 0, its :class:`~collio.layouts.Subarray`, and the step's bytes
    as the file holds them."""
    from collio.layouts import Subarray

    p = comm.Get_size()
    b = (comm.Get_rank() + turn) % p
    glob = np.arange(rows * cols * p, dtype=np.float64).reshape(rows, cols * p) + 1e4 * s
    lay = Subarray(glob.shape, (0, b * cols), (rows, cols), "<f8", offset=s * glob.nbytes)
    return np.ascontiguousarray(glob[:, b * cols : (b + 1) * cols]), lay, glob.tobytes()
