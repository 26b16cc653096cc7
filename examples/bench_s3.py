"""S3: collio's multipart write and ranged-GET read beside gather-to-0 and the server's ceiling.

    mpiexec -n 4 python examples/bench_s3.py [--mib 256] [--repeat 5] [--endpoint-url URL]

A global float64 matrix in column blocks (4 ranks, 256 MiB by default).  Every
iteration runs each method once, the writes then the reads, in an order that
rotates from one iteration to the next (so load changes, and the server's
tidying up after a big request, hit all alike):

* ``collio write``: ``collio.open("s3://...", "w")`` + ``write_all`` + close
  (multipart upload created, parts uploaded by the aggregators, completed);
* ``gather write``: the whole matrix gathered on rank 0 (MPI, straight into place),
  which uploads it as one multipart upload (parts of collio's size, as many threads);
* ``ceiling write``: rank 0 uploads the same bytes, already in memory, as parts of
  the same size (create + parts + complete): what the server can take;
* ``collio read``: ``read_all`` of every rank's block;
* ``ceiling read``: rank 0 reads the whole object with large ranged GETs
  (``--get-size`` 64 MiB, ``--get-threads`` 4 at once).

Waiting ranks sleep in ``Ibarrier``/``Test`` (no busy polling), so the baselines
get the CPU the server needs.  Peak RSS is per phase (``/proc/self/clear_refs``).
Without ``--endpoint-url`` rank 0 runs moto's server in a child process.
The methods are plain functions of (comm, url, key, data, ...) and ``timed`` measures
any of them, so ``collio-bench`` can reuse them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import collio  # first: it turns on MPICH's single-copy messages before mpi4py starts MPI

# isort: split
from mpi4py import MPI

from collio import layouts
from collio.backends.s3.client import client_for, get_into
from collio.backends.s3.plan import S3Target
from collio.testing.s3 import fake_credentials, serve_moto

MiB = 1 << 20
BUCKET = "collio-bench"


# ------------------------------------------------------------- measurement
def quiet_barrier(comm: MPI.Comm) -> None:
    """A barrier that sleeps instead of spinning (leaves the CPU to the server)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def timed(comm: MPI.Comm, fn: Callable[[], Any], server: Any = None) -> tuple[float, int, float]:
    """(seconds of ``fn`` on all ranks, this rank's peak RSS in bytes, CPU seconds).

    The CPU seconds are this rank's; on rank 0 the local server's are added.
    """
    quiet_barrier(comm)
    _trim()
    reset_peak_rss()
    cpu0 = _cpu(server)
    t = time.perf_counter()
    fn()
    quiet_barrier(comm)
    sec, peak = time.perf_counter() - t, peak_rss()
    return sec, peak, _cpu(server) - cpu0


def _cpu(server: Any) -> float:
    t = os.times()
    mine = t.user + t.system
    if server is not None:
        import psutil

        c = psutil.Process(server.pid).cpu_times()
        mine += c.user + c.system
    return mine


def _trim() -> None:
    """Return memory freed by earlier phases to the system (glibc), so phases don't pollute
    each other's peak RSS: every method runs in the same processes."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- the data
def column_block(comm: MPI.Comm, shape: tuple[int, int]) -> Any:
    """This rank's column block of the matrix."""
    return layouts.block(shape, "<f8", comm=comm, grid=(1, comm.size))


def _values(shape: tuple[int, int], c0: int, nc: int) -> np.ndarray:
    rows = np.arange(shape[0], dtype="<f8")[:, None] * shape[1]
    return rows + np.arange(c0, c0 + nc, dtype="<f8")


# ------------------------------------------------------------ the methods
def s3_client(url: str | None, threads: int) -> Any:
    return client_for(url, None, 5, threads + 2)


def upload_parts(client: Any, key: str, buf: np.ndarray, part: int, threads: int) -> None:
    """One process: multipart upload of ``buf`` in parts of ``part`` bytes, ``threads`` at once."""
    from collio.backends.s3 import upload

    raw = buf.reshape(-1).view(np.uint8)
    t = S3Target(BUCKET, key)
    uid = upload.create(client, t)
    starts = range(0, len(raw), part)
    tags = _pool(threads).map(
        lambda i: upload.upload_part(client, t, uid, i, raw[i * part : (i + 1) * part]),
        range(len(starts)),
    )
    etags = {i + 1: e for i, e in enumerate(tags)}
    upload.complete(client, t, uid, etags, len(starts))


_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """One lasting pool per size (as collio keeps its request threads for a file)."""
    if threads not in _pools:
        _pools[threads] = concurrent.futures.ThreadPoolExecutor(threads)
    return _pools[threads]


def read_ranged(client: Any, key: str, out: np.ndarray, get_size: int, threads: int) -> None:
    """One process: the whole object with ranged GETs of ``get_size`` bytes, ``threads`` at once."""
    raw = out.reshape(-1).view(np.uint8)
    t = S3Target(BUCKET, key)
    starts = list(range(0, len(raw), get_size))
    list(_pool(threads).map(lambda a: get_into(client, t, a, raw[a : a + get_size], None), starts))


def collio_write(comm, url, key, local, lay, hints, opts) -> dict[str, Any]:
    with collio.open(f"s3://{BUCKET}/{key}", "w", comm=comm, hints=hints, **opts) as f:
        f.write_all(local, lay)
        return dict(f.backend.describe())


def collio_read(comm, url, key, lay, hints, opts) -> np.ndarray:
    with collio.open(f"s3://{BUCKET}/{key}", "r", comm=comm, hints=hints, **opts) as f:
        back: np.ndarray = f.read_all(lay)
    return back


def gather_write(comm, url, key, local, lay, shape, part, threads) -> None:
    """Gather the matrix on rank 0 (straight into place: one subarray type per rank)."""
    blocks = comm.allgather((lay.start[1], lay.shape[1]))
    if comm.rank != 0:
        comm.Send([local, MPI.DOUBLE], dest=0, tag=7)
        return
    whole = np.empty(shape, "<f8")
    whole[:, lay.start[1] : lay.start[1] + lay.shape[1]] = local
    reqs, types = [], []
    for r, (c0, nc) in enumerate(blocks):
        if r == 0 or nc == 0:
            continue
        ty = MPI.DOUBLE.Create_subarray(shape, (shape[0], nc), (0, c0)).Commit()
        types.append(ty)
        reqs.append(comm.Irecv([whole, 1, ty], source=r, tag=7))
    MPI.Request.Waitall(reqs)
    for ty in types:
        ty.Free()
    upload_parts(s3_client(url, threads), key, whole, part, threads)


def ceiling_write(comm, url, key, whole, part, threads) -> None:
    if whole is not None:
        upload_parts(s3_client(url, threads), key, whole, part, threads)


def ceiling_read(comm, url, key, out, get_size, threads) -> None:
    if out is not None:
        read_ranged(s3_client(url, threads), key, out, get_size, threads)


# -------------------------------------------------------------------- main
def run(args: argparse.Namespace, comm: MPI.Comm, url: str, server: Any) -> dict[str, Any]:
    """Alternating iterations of the five methods; per-method seconds, peak RSS, CPU."""
    ncols = 8192
    shape = (args.mib * MiB // (8 * ncols), ncols)
    lay = column_block(comm, shape)
    res: dict[str, Any] = {"shape": shape, "nbytes": shape[0] * shape[1] * 8, "ok": True}
    seen: dict[str, list[tuple[float, int, float]]] = {}

    def record(name: str, fn: Callable[..., Any], *fn_args: Any) -> Any:
        out: list[Any] = []
        seen.setdefault(name, []).append(timed(comm, lambda: out.append(fn(*fn_args)), server))
        return out[0]

    for it in range(args.repeat):
        res["ok"] &= iteration(args, comm, url, lay, shape, record, res, it)
        if comm.rank == 0:
            print(f"iteration {it + 1}/{args.repeat} done", flush=True)
    res["ok"] = comm.allreduce(res["ok"], op=MPI.LAND)
    res["times"] = {k: [t for t, _, _ in v] for k, v in seen.items()}
    res["peak_any"] = {k: max(comm.allgather(max(p for _, p, _ in v))) for k, v in seen.items()}
    res["peak_rank0"] = {k: comm.bcast(max(p for _, p, _ in v), root=0) for k, v in seen.items()}
    res["peak_others"] = {
        k: max(comm.allgather(max(p for _, p, _ in v) if comm.rank else 0)) for k, v in seen.items()
    }
    res["cpu"] = {k: [comm.allreduce(c) for _, _, c in v] for k, v in seen.items()}
    return res


def iteration(args, comm, url, lay, shape, record, res, it: int) -> bool:
    """One round of the methods, each holding only its own data while timed.

    The order rotates from one iteration to the next (writes among themselves,
    reads among themselves), so that no method always follows the same one: the
    server tidies up after a big request (dropping a replaced object's files),
    and whoever comes next pays for it.
    """
    hints = {"cb_buffer_size": args.cb_buffer_size}
    opts = {"endpoint_url": url, "max_concurrency": args.threads}
    th = args.threads
    mine = (lay.start[1], lay.shape[1])

    def collio_w() -> None:
        local = _values(shape, *mine)
        info = record("collio write", collio_write, comm, url, "c", local, lay, hints, opts)
        res["part"] = int(info["part_size"])

    def gather_w() -> None:
        local = _values(shape, *mine)
        record("gather write", gather_write, comm, url, "g", local, lay, shape, res["part"], th)

    def ceiling_w() -> None:
        whole = _values(shape, 0, shape[1]) if comm.rank == 0 else None
        record("ceiling write", ceiling_write, comm, url, "x", whole, res["part"], th)

    ok = [True]

    def collio_r() -> None:
        back = record("collio read", collio_read, comm, url, "c", lay, hints, opts)
        ok[0] &= bool(np.array_equal(back, _values(shape, *mine)))

    def ceiling_r() -> None:
        out = np.empty(shape, "<f8") if comm.rank == 0 else None
        record("ceiling read", ceiling_read, comm, url, "c", out, args.get_size, args.get_threads)
        if out is not None:
            ok[0] &= bool(np.array_equal(out, _values(shape, 0, shape[1])))

    if args.collio_only:  # (iteration 0 starts with collio: the baselines use its part size)
        writes, reads = [collio_w], [collio_r]
    else:
        writes, reads = [collio_w, gather_w, ceiling_w], [collio_r, ceiling_r]
    for step in _rotate(writes, it) + _rotate(reads, it):
        step()
    return ok[0]


def _rotate(steps: list[Any], k: int) -> list[Any]:
    k %= len(steps)
    return steps[k:] + steps[:k]


def report(res: dict[str, Any], args: argparse.Namespace, nranks: int) -> None:
    """The table on rank 0: medians, ratios, memory against the bound."""
    mib = res["nbytes"] / MiB
    med = {k: float(np.median(v)) for k, v in res["times"].items()}
    own = res["nbytes"] / nranks / MiB
    bound = own + 2 * args.cb_buffer_size / MiB + 100
    print(
        f"\n{res['shape'][0]} x {res['shape'][1]} float64 ({mib:.0f} MiB) in column blocks, "
        f"{nranks} ranks, part {res['part'] / MiB:.2f} MiB, cb_buffer_size "
        f"{args.cb_buffer_size / MiB:.0f} MiB, {args.repeat} alternating iterations; medians:"
    )
    print(f"  {'method':<14}{'s':>7}{'MiB/s':>7}{'min-max s':>13}{'CPU s':>7}   peak RSS MiB")
    for k, v in med.items():
        lo, hi = min(res["times"][k]), max(res["times"][k])
        cpu = float(np.median(res["cpu"][k]))
        print(
            f"  {k:<14}{v:7.2f}{mib / v:7.0f}{lo:7.2f}-{hi:<5.2f}{cpu:7.1f}   "
            f"rank 0 {res['peak_rank0'][k] / MiB:4.0f}, others {res['peak_others'][k] / MiB:4.0f}"
        )
    print("  (CPU s: all ranks plus the local server)")
    if "ceiling write" in med:
        w, g, c = med["collio write"], med["gather write"], med["ceiling write"]
        r, cr = med["collio read"], med["ceiling read"]
        print("ratios (same run):")
        print(f"  collio write time / ceiling write time   {w / c:.2f}   (target <= 1.15)")
        print(f"  collio write time / gather-to-0 time     {w / g:.2f}   (target <= 1.00)")
        print(f"  collio read speed / one-process read     {cr / r:.2f}   (target >= 0.80)")
    peak = max(res["peak_any"]["collio write"], res["peak_any"]["collio read"]) / MiB
    print(
        f"memory per rank: own data {own:.0f} + 2 x cb_buffer_size + 100 = {bound:.0f} MiB "
        f"allowed; collio's peak {peak:.0f} MiB (max over ranks)"
    )
    if "gather write" in med:
        print(
            f"gather-to-0 holds all {mib:.0f} MiB on rank 0 (peak "
            f"{res['peak_rank0']['gather write'] / MiB:.0f} MiB); rank 0 also runs both "
            "baselines, whose leftovers (thread arenas) weigh on its later collio peaks: "
            "--collio-only measures collio alone"
        )
    print("data verified" if res["ok"] else "DATA MISMATCH")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="global matrix size in MiB")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--endpoint-url", default=None, help="an S3 store (default: moto, local)")
    ap.add_argument("--cb-buffer-size", type=int, default=16 * MiB)
    ap.add_argument("--threads", type=int, default=8, help="requests in flight per process")
    ap.add_argument("--get-size", type=int, default=64 * MiB, help="ceiling read: GET size")
    ap.add_argument("--get-threads", type=int, default=4, help="ceiling read: GETs at once")
    ap.add_argument("--collio-only", action="store_true", help="no baselines (clean memory)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    fake_credentials()
    server, url = None, args.endpoint_url
    if comm.rank == 0:
        if url is None:
            server, url = serve_moto()
        s3_client(url, args.threads).create_bucket(Bucket=BUCKET)
    url = comm.bcast(url, root=0)
    try:
        res = run(args, comm, url, server)
        if comm.rank == 0:
            report(res, args, comm.size)
    finally:
        quiet_barrier(comm)
        if server is not None:
            server.terminate()
            server.wait()
    if not res["ok"]:
        comm.Abort(1)


if __name__ == "__main__":
    main()
