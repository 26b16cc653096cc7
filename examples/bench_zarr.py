"""Write a zarr array from every rank: collio next to plain zarr.

    mpiexec -n 4 python examples/bench_zarr.py [--size 4096] [--chunks 512] [--split aligned]
        [--codec none|zstd|blosc] [--shards 0] [-i 5] [-e] [--dir DIR] [--json]

Methods, run in turn in every iteration (the order rotates) on a fresh array each time:

* ``plain``: each rank assigns its own region with plain zarr (``arr[box] = piece``).
  Correct only when the decomposition is chunk-aligned (shard-aligned), so it runs
  only then: it is the baseline the issue sets (collio within 1.2x).
* ``locked``: each rank writes its region chunk by chunk with plain zarr, holding an
  exclusive ``flock`` on a lock file per chunk (shard) while zarr reads, merges and
  writes it.  Correct for any decomposition; the baseline for misaligned ones.
* ``collio``: ``collio.open(..., backend="zarr")`` + ``write_all`` + ``close``.
* ``shuffle`` (``--shuffle``): the same with ``romio_cb_write=enable``, so every chunk
  goes through its aggregator, even those one rank alone touches.

Timed: open, write, (with ``-e``: fsync of the chunk files) and close, between two
barriers; array creation is not timed.  Medians over iterations and same-run ratios
are printed on rank 0; every method's last array is verified against the reference.
The functions are plain (``setup``, ``write_plain``, ``write_locked``,
``write_collio``, ``bench``) so that ``collio-bench`` can call them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import zarr

import collio  # first: it turns on MPICH's single-copy messages before mpi4py starts MPI

# isort: split
from mpi4py import MPI

from collio import layouts

MiB = 1 << 20


@dataclasses.dataclass
class Setup:
    """One benchmark configuration on this rank."""

    comm: Any
    root: str
    shape: tuple[int, int]
    chunks: tuple[int, int]
    shards: tuple[int, int] | None
    codec: str
    lay: layouts.Subarray
    local: np.ndarray
    fsync: bool
    hints: dict[str, Any]

    @property
    def unit(self) -> tuple[int, int]:
        return self.shards or self.chunks

    @property
    def aligned(self) -> bool:
        """Every rank's box starts and ends on unit boundaries (or the array's end)."""
        lay = self.lay
        ok = all(
            s % u == 0 and ((s + n) % u == 0 or s + n == g)
            for s, n, u, g in zip(lay.start, lay.shape, self.unit, self.shape, strict=True)
        )
        return bool(self.comm.allreduce(int(ok), op=MPI.MIN))

    def create_options(self) -> dict[str, Any]:
        comp: Any = None
        if self.codec == "zstd":
            comp = [zarr.codecs.ZstdCodec(level=1)]
        elif self.codec == "blosc":
            comp = [zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]
        opts = {"shape": self.shape, "dtype": "<f8", "chunks": self.chunks, "compressors": comp}
        if self.shards:
            opts["shards"] = self.shards
        return opts


def setup(
    comm: Any,
    *,
    size: int = 4096,
    chunks: int = 512,
    shards: int = 0,
    split: str = "aligned",
    codec: str = "none",
    fsync: bool = False,
    root: str | None = None,
    hints: dict[str, Any] | None = None,
) -> Setup:
    """Collective: the rank's box of a ``size``^2 float64 matrix and its data."""
    shape = (size, size)
    if split == "aligned":  # MPI darray BLOCK on the Dims_create grid
        lay = layouts.block(shape, "<f8", comm=comm)
    elif split == "misaligned":  # grid cut at a third of each dimension, like 333/667
        grid = layouts.dims_create(comm.size, 2)
        coords = np.unravel_index(comm.rank, grid)
        start, ext = [], []
        for n, p, c in zip(shape, grid, coords, strict=True):
            edges = [0] + [(3 * k + 2) * n // (3 * p) for k in range(p - 1)] + [n]
            start.append(edges[c])
            ext.append(edges[c + 1] - edges[c])
        lay = layouts.Subarray(shape, start, ext, "<f8")
    else:
        raise ValueError(f"unknown split {split!r}")
    rows = np.arange(lay.start[0], lay.start[0] + lay.shape[0], dtype="<f8")
    cols = np.arange(lay.start[1], lay.start[1] + lay.shape[1], dtype="<f8")
    local = np.ascontiguousarray(np.add.outer(rows * size, cols))
    d = tempfile.mkdtemp(prefix="collio-bench-zarr-", dir=root) if comm.rank == 0 else None
    return Setup(
        comm, comm.bcast(d, root=0), shape, (chunks, chunks), (shards, shards) if shards else None,
        codec, lay, local, fsync, dict(hints or {}),
    )  # fmt: skip


def fresh(s: Setup, name: str) -> str:
    """Collective: a new empty array (rank 0 creates it), not timed."""
    path = os.path.join(s.root, f"{name}.zarr")
    if s.comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(path + ".locks", ignore_errors=True)
        zarr.create_array(path, **s.create_options())
        os.makedirs(path + ".locks")
    s.comm.Barrier()
    return path


def _units(s: Setup) -> Iterator[tuple[int, int]]:
    """Grid coordinates of the units (chunks or shards) this rank's box meets."""
    ranges = [
        range(st // u, -(-(st + n) // u)) if n else range(0)
        for st, n, u in zip(s.lay.start, s.lay.shape, s.unit, strict=True)
    ]
    yield from itertools.product(*ranges)


def _fsync_units(s: Setup, path: str, units: Iterator[tuple[int, int]]) -> None:
    for c in units:
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(os.path.join(path, "c", *map(str, c)), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def write_plain(s: Setup, path: str) -> None:
    """Each rank assigns its own box (correct only for unit-aligned boxes)."""
    arr = zarr.open_array(path, mode="r+")
    arr[s.lay.slices] = s.local
    if s.fsync:
        _fsync_units(s, path, _units(s))


def write_locked(s: Setup, path: str) -> None:
    """Each rank writes its box unit by unit under an exclusive lock per unit."""
    arr = zarr.open_array(path, mode="r+")
    box = s.lay.slices
    for c in _units(s):
        reg = tuple(
            slice(max(i * u, b.start), min((i + 1) * u, b.stop))
            for i, u, b in zip(c, s.unit, box, strict=True)
        )
        within = tuple(
            slice(r.start - b.start, r.stop - b.start) for r, b in zip(reg, box, strict=True)
        )
        part = s.local[within]
        with open(os.path.join(path + ".locks", f"{c[0]}.{c[1]}"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                arr[reg] = part
                if s.fsync:
                    _fsync_units(s, path, iter([c]))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def write_collio(s: Setup, path: str, **hints: Any) -> None:
    """Collective: collio's write; close() fsyncs only with ``-e``."""
    h = {**s.hints, **hints}
    with collio.open(path, "r+", comm=s.comm, backend="zarr", hints=h, fsync=s.fsync) as f:
        f.write_all(s.local, s.lay)


def write_collio_shuffle(s: Setup, path: str) -> None:
    """Collective: collio with every chunk through its aggregator (``romio_cb_write=enable``)."""
    write_collio(s, path, romio_cb_write="enable")


def verify(s: Setup, path: str) -> bool:
    """Collective: every rank's box reads back (plain zarr) as written."""
    ok = np.array_equal(zarr.open_array(path, mode="r")[s.lay.slices], s.local)
    return bool(s.comm.allreduce(int(ok), op=MPI.MIN))


def bench(s: Setup, iterations: int = 5, shuffle: bool = False) -> dict[str, Any]:
    """Collective: time the methods alternately; medians, MiB/s and ratios (same on all ranks)."""
    methods: dict[str, Callable[[Setup, str], None]] = {}
    if s.aligned:
        methods["plain"] = write_plain
    methods["locked"] = write_locked
    methods["collio"] = write_collio
    if shuffle:
        methods["shuffle"] = write_collio_shuffle
    names = list(methods)
    times: dict[str, list[float]] = {m: [] for m in names}
    ok: dict[str, bool] = {}
    for it in range(iterations):
        for m in names[it % len(names) :] + names[: it % len(names)]:
            path = fresh(s, m)
            s.comm.Barrier()
            t0 = MPI.Wtime()
            methods[m](s, path)
            s.comm.Barrier()
            times[m].append(MPI.Wtime() - t0)
            if it == iterations - 1:
                ok[m] = verify(s, path)
    nbytes = int(np.prod(s.shape)) * 8
    base = "plain" if "plain" in times else "locked"
    out: dict[str, Any] = {
        "ranks": s.comm.size, "shape": list(s.shape), "chunks": list(s.chunks),
        "shards": list(s.shards) if s.shards else None, "codec": s.codec, "fsync": s.fsync,
        "aligned": s.aligned, "iterations": iterations, "baseline": base, "methods": {},
    }  # fmt: skip
    for m in names:
        med = float(np.median(times[m]))
        out["methods"][m] = {
            "median_s": med, "min_s": min(times[m]), "max_s": max(times[m]),
            "MiB_s": nbytes / MiB / med, "ratio_to_baseline": med / float(np.median(times[base])),
            "verified": ok.get(m, False), "times": times[m],
        }  # fmt: skip
    return out


def table(res: dict[str, Any]) -> str:
    head = (
        f"zarr write {res['shape'][0]}x{res['shape'][1]} float64, chunks {res['chunks']}, "
        f"shards {res['shards']}, codec {res['codec']}, {res['ranks']} ranks, "
        f"{'aligned' if res['aligned'] else 'misaligned'}, fsync {res['fsync']}, "
        f"medians of {res['iterations']}"
    )
    lines = [head, f"{'method':8} {'median s':>9} {'MiB/s':>8} {'min s':>7} {'max s':>7} "
             f"{'x ' + res['baseline']:>9} ok"]  # fmt: skip
    for m, r in res["methods"].items():
        lines.append(
            f"{m:8} {r['median_s']:9.3f} {r['MiB_s']:8.1f} {r['min_s']:7.3f} {r['max_s']:7.3f} "
            f"{r['ratio_to_baseline']:9.2f} {'yes' if r['verified'] else 'NO'}"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--chunks", type=int, default=512)
    ap.add_argument("--shards", type=int, default=0, help="shard edge (0: no sharding)")
    ap.add_argument("--split", choices=["aligned", "misaligned"], default="aligned")
    ap.add_argument("--codec", choices=["none", "zstd", "blosc"], default="none")
    ap.add_argument("-i", "--iterations", type=int, default=5)
    ap.add_argument("-e", "--fsync", action="store_true", help="fsync chunk files (IOR's -e)")
    ap.add_argument("--cb-buffer-size", default=None)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--shuffle", action="store_true", help="also collio with every chunk shuffled")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    hints = {"cb_buffer_size": a.cb_buffer_size} if a.cb_buffer_size else {}
    s = setup(comm, size=a.size, chunks=a.chunks, shards=a.shards, split=a.split,
              codec=a.codec, fsync=a.fsync, root=a.dir, hints=hints)  # fmt: skip
    try:
        res = bench(s, a.iterations, a.shuffle)
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(s.root, ignore_errors=True)
    if comm.rank == 0:
        print(json.dumps(res) if a.json else table(res), flush=True)


if __name__ == "__main__":
    main()
