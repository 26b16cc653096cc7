"""The MPI side of tests/test_faults.py: one job per fault, each rank writes what it saw.

``mpiexec -n 3 python tests/fault_job.py CASE DIR [ARGS...]``; every rank writes
``DIR/result-RANK.json`` (a rank that is killed writes nothing).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import collio
from collio import layouts
from collio.backends import register_backend
from collio.backends.posix import PosixBackend

comm = MPI.COMM_WORLD
SHAPE = (512, 1024)  # 4 MiB of float64


def _data(seed: int) -> tuple[layouts.Layout, np.ndarray]:
    lay = layouts.block(SHAPE, "<f8", comm=comm, grid=(1, comm.size))
    glob = np.random.default_rng(seed).standard_normal(SHAPE)
    return lay, np.ascontiguousarray(glob[lay.slices])


class KilledMidWrite(PosixBackend):
    """A real file; the last rank dies (SIGKILL) right after its second round's write."""

    name = "killed-mid-write"
    writes = 0

    def write_at(self, offset: int, buf: np.ndarray) -> None:
        super().write_at(offset, buf)
        type(self).writes += 1
        if comm.rank == comm.size - 1 and type(self).writes == 2:
            os.kill(os.getpid(), signal.SIGKILL)


register_backend("killed-mid-write", KilledMidWrite)


def kill_mid_write(d: str, target: str) -> dict[str, object]:
    lay, piece = _data(1)
    hints = {"atomic_commit": True, "cb_buffer_size": 65536, "romio_cb_write": "enable"}
    with collio.open(target, "w", comm=comm, hints=hints, backend="killed-mid-write") as f:
        f.write_all(piece, lay)
    return {"survived": True}  # (never reached: mpiexec ends the job)


def rewrite(d: str, target: str) -> dict[str, object]:
    lay, piece = _data(2)
    with collio.open(target, "w", comm=comm, hints={"atomic_commit": True}) as f:
        f.write_all(piece, lay)
    return {"ok": True}


def _s3(d: str, url: str, bucket: str, pid: str, how: str, timeouts: str) -> dict[str, object]:
    """Open an upload, then stop the server (SIGSTOP: frozen; SIGTERM: gone) and write;
    with ``timeouts`` "short" (1 s, 2 attempts), else the backend's defaults."""
    server = int(pid)
    opts: dict[str, object] = {"endpoint_url": url}
    if timeouts == "short":
        opts.update(connect_timeout=1, read_timeout=1, retries=2)
    lay = layouts.Segments([comm.rank << 18], [1 << 18])  # 256 KiB each: one part
    data = np.full(1 << 18, comm.rank + 1, np.uint8)
    out: dict[str, object] = {}
    f = collio.open(f"s3://{bucket}/frozen.bin", "w", comm=comm, **opts)
    comm.Barrier()
    if comm.rank == 0:
        os.kill(server, signal.SIGTERM if how == "stop" else signal.SIGSTOP)
    comm.Barrier()
    t0 = time.monotonic()
    try:
        with f:
            try:
                f.write_all(data, lay)
            finally:
                out["write_seconds"] = time.monotonic() - t0
                if how == "freeze-then-thaw" and comm.rank == 0:
                    os.kill(server, signal.SIGCONT)  # the abort at close reaches the server
                comm.Barrier()
    except collio.CollioError as exc:
        later = exc.close_error
        out.update(cls=type(exc).__name__, msg=str(exc), ranks=list(exc.ranks))
        out["close_error"] = None if later is None else [type(later).__name__, str(later)]
    out["total_seconds"] = time.monotonic() - t0
    if how == "freeze" and comm.rank == 0:
        os.kill(server, signal.SIGCONT)
    return out


def main() -> None:
    case, d, *args = sys.argv[1:]
    fn = {"kill-mid-write": kill_mid_write, "rewrite": rewrite, "s3": _s3}[case]
    result = fn(d, *args)
    with open(os.path.join(d, f"result-{comm.rank}.json"), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
