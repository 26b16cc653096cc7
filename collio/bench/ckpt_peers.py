"""The checkpoint benchmark's model state and the ways of saving it that collio is measured
against: a file per rank (PyTorch DCP's FileSystemWriter), ``np.save`` per piece, and the
ceiling (each rank's share of the bytes as one pwrite into one file)."""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import layouts
from ..checkpoint.writer import algo
from ..layouts.arrays import ArrayLayout

__all__ = ["ceiling_map", "ceiling_read", "ceiling_write", "empty_piece", "model_spec",
           "model_state", "npsave_read", "npsave_write", "per_rank_read",
           "per_rank_write"]  # fmt: skip

D = 512  # model width: (D, D) float32 attention matrices are 1 MiB, (D, 4D) MLPs 4 MiB
VOCAB = 32000  # (VOCAB, D) float32 embedding: 62.5 MiB, the largest array


def _shapes(total: int) -> list[tuple[str, tuple[int, ...], str, bool]]:
    """(name, shape, dtype, replicated) of a transformer-like state of about ``total`` bytes."""
    out: list[tuple[str, tuple[int, ...], str, bool]] = []
    emb = min(VOCAB, max(total // (4 * D) // 4, 8))
    out.append(("embed", (emb, D), "<f4", False))
    layer = 4 * D * D * 4 + 2 * 4 * D * D * 4
    for k in range(max((total - emb * D * 4) // layer, 1)):
        p = f"layers/{k}/"
        out += [(p + n, (D, D), "<f4", False) for n in ("q", "k", "v", "o")]
        out += [(p + "up", (D, 4 * D), "<f4", False), (p + "down", (4 * D, D), "<f4", False)]
        out += [(p + n + "_bias", (D,), "<f8", False) for n in ("q", "k", "v", "o", "down")]
        out += [(p + "up_bias", (4 * D,), "<f4", False)]
        out += [(p + "norm1", (D,), "<f8", True), (p + "norm2", (D,), "<f8", True)]
    out.append(("final_norm", (D,), "<f8", True))
    return out


def model_state(
    total: int, comm: MPI.Intracomm
) -> tuple[dict[str, Any], dict[str, ArrayLayout | None]]:
    """This rank's state (row shards, replicated norms) and the layouts that load it back."""
    state: dict[str, Any] = {}
    spec: dict[str, ArrayLayout | None] = {}
    rng = np.random.default_rng(comm.Get_rank())
    for name, shape, dtype, replicated in _shapes(total):
        if replicated:
            state[name] = np.ones(shape, dtype)
            spec[name] = None
            continue
        grid = (comm.Get_size(),) + (1,) * (len(shape) - 1)
        lay = layouts.block(shape, dtype, comm=comm, grid=grid)
        state[name] = (rng.random(lay.local_shape, np.float32).astype(dtype), lay)
        spec[name] = lay
    return state, spec


def model_spec(total: int, comm: Any) -> dict[str, ArrayLayout | None]:
    """The row-shard layouts of the same state over ``comm`` (another job size, say)."""
    spec: dict[str, ArrayLayout | None] = {}
    for name, shape, dtype, replicated in _shapes(total):
        grid = (comm.Get_size(),) + (1,) * (len(shape) - 1)
        spec[name] = None if replicated else layouts.block(shape, dtype, comm=comm, grid=grid)
    return spec


def empty_piece(entry: Any, lay: ArrayLayout | None) -> np.ndarray[Any, Any]:
    """An array, every page touched, to load ``lay``'s piece of a state ``entry`` into."""
    like = entry if lay is None else np.empty(lay.local_shape, lay.dtype)
    return np.ones_like(like)


def pieces(state: dict[str, Any], comm: MPI.Intracomm) -> list[np.ndarray[Any, Any]]:
    """This rank's arrays as a file-per-rank checkpointer holds them (replicated: rank 0)."""
    out = []
    for value in state.values():
        if isinstance(value, tuple):
            out.append(value[0])
        elif comm.Get_rank() == 0:
            out.append(value)
    return out


def _fsync_write(path: str, bufs: list[Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.writev(fd, bufs)  # one request for all pieces, no copy (as a buffered torch.save)
        os.fsync(fd)
    finally:
        os.close(fd)


def per_rank_write(d: str, state: dict[str, Any], comm: MPI.Intracomm) -> None:
    """Each rank's pieces into its own file, one write + fsync; rank 0 adds the metadata."""
    arrs = pieces(state, comm)
    _fsync_write(os.path.join(d, f"__{comm.Get_rank()}_0.distcp"), [a.data for a in arrs])
    meta = comm.gather([(a.shape, a.dtype.str) for a in arrs], root=0)
    if comm.Get_rank() == 0:
        _fsync_write(os.path.join(d, ".metadata"), [pickle.dumps((list(state), meta))])


def per_rank_read(d: str, state: dict[str, Any], comm: MPI.Intracomm) -> int:
    """Each rank reads its own file back into new arrays; returns the bytes read."""
    arrs = [np.empty_like(a) for a in pieces(state, comm)]
    with open(os.path.join(d, ".metadata"), "rb") as fh:
        pickle.load(fh)
    fd = os.open(os.path.join(d, f"__{comm.Get_rank()}_0.distcp"), os.O_RDONLY)
    try:
        return os.preadv(fd, [a.data for a in arrs], 0)
    finally:
        os.close(fd)


def npsave_write(d: str, state: dict[str, Any], comm: MPI.Intracomm) -> None:
    """``np.save`` of every piece to its own file (fsync'd), a directory per rank."""
    mine = os.path.join(d, f"rank{comm.Get_rank()}")
    os.makedirs(mine, exist_ok=True)
    for k, arr in enumerate(pieces(state, comm)):
        with open(os.path.join(mine, f"{k}.npy"), "wb") as fh:
            np.save(fh, arr)
            fh.flush()
            os.fsync(fh.fileno())


def npsave_read(d: str, state: dict[str, Any], comm: MPI.Intracomm) -> int:
    mine = os.path.join(d, f"rank{comm.Get_rank()}")
    return sum(
        int(np.load(os.path.join(mine, f"{k}.npy")).nbytes) for k in range(len(pieces(state, comm)))
    )


def share(total: int, comm: MPI.Intracomm) -> tuple[int, int]:
    """(offset, length) of this rank's equal share of ``total`` bytes."""
    p, r = comm.Get_size(), comm.Get_rank()
    lo, hi = total * r // p, total * (r + 1) // p
    return lo, hi - lo


def ceiling_write(
    path: str, buf: np.ndarray[Any, Any], total: int, comm: MPI.Intracomm, *, new: bool = True
) -> None:
    """Each rank's share of the bytes as one pwrite + fsync into one file (no layout):
    a new file (rank 0 truncates it first: its blocks are freed, and the writes
    allocate them again), or without ``new`` into the blocks the file has (the bound of
    a save that writes into the blocks of a checkpoint it replaced before: hint
    ``free_replaced=reuse``)."""
    if comm.Get_rank() == 0:
        trunc = os.O_TRUNC if new else 0
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | trunc, 0o644))
    comm.Barrier()
    plain_write(path, buf, total, comm.Get_rank(), comm.Get_size())


def plain_write(path: str, buf: np.ndarray[Any, Any], total: int, rank: int, size: int) -> None:
    """The ceiling's write of one rank, no MPI (a thread's own work): its share as one
    pwrite + fsync into the file that rank 0 made empty before."""
    off = total * rank // size
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, buf.data, off)
        os.fsync(fd)
    finally:
        os.close(fd)


def ceiling_read(path: str, buf: Any, total: int, comm: MPI.Intracomm) -> int:
    """Each rank's share of the ceiling's file read back by one ``preadv`` into ``buf``
    (memory the job already touched: the bound for a load into its arrays), or into a
    list of arrays (new ones shaped as the rank's pieces: what a load that makes new
    arrays has to beat)."""
    off, _ = share(total, comm)
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.preadv(fd, [b.data for b in buf] if isinstance(buf, list) else [buf.data], off)
    finally:
        os.close(fd)


def ceiling_read_crc(
    path: str, buf: np.ndarray[Any, Any], total: int, comm: MPI.Intracomm, chunk: int = 0
) -> int:
    """:func:`ceiling_read` into touched memory, verified as a load must: the checksum (a
    save's) of the bytes read, after the one ``preadv``, or (``chunk``) of each ``chunk``
    bytes right after their own read, while they are in the cache (what a load does)."""
    fn = algo().fn
    if not chunk:
        ceiling_read(path, buf, total, comm)
        return int(fn(buf.data))
    off, n = share(total, comm)
    fd = os.open(path, os.O_RDONLY)
    view, crc = buf.data, 0
    try:
        for a in range(0, n, chunk):
            part = view[a : min(a + chunk, n)]
            os.preadv(fd, [part], off + a)
            crc = fn(part, crc)
    finally:
        os.close(fd)
    return crc


def ceiling_map(path: str, total: int, comm: MPI.Intracomm) -> int:
    """Each rank's share of the ceiling's file privately mapped and its checksum taken, the
    least a load that returns mapped arrays does (its checksum pass faults every page in);
    the map is gone when this returns."""
    import mmap

    off, n = share(total, comm)
    if n == 0:
        return 0
    base = off - off % mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        m = mmap.mmap(fd, n + off - base, mmap.MAP_PRIVATE, offset=base)
    finally:
        os.close(fd)
    with memoryview(m) as view:
        crc = int(algo().of(view[off - base :]))
    m.close()
    return crc
