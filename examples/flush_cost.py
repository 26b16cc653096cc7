"""What a flush costs on this storage: does the hint ``early_flush`` pay here?

    python examples/flush_cost.py [DIR] [-r 3]

One process, no MPI.  For each size: pwrite that many MiB into a new file in DIR
(default: a temporary directory), wait until the kernel has handed every page to
the device (``sync_file_range`` with WAIT_BEFORE | WRITE | WAIT_AFTER), then time
the ``fsync`` that follows: what is left for it is the device's own flush (its
volatile cache, a virtual disk's host).  Medians of ``-r`` repeats.

When that time grows with the size, one fsync at the end of a write pays all of it
after the last byte; collio's ``early_flush`` (default on) flushes while the call
still shuffles, so most of it overlaps.  When it stays near zero (a device with
power-loss protection, tmpfs), early flushes cost little and gain little.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from collio.backends.fsync import sync_file_range

MiB = 1 << 20
WAIT_ALL = 1 | 2 | 4  # SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER


def one(path: str, buf: np.ndarray, nbytes: int) -> tuple[float, float, float]:
    """(pwrite, data handed to the device, fsync after) in seconds, for a new file."""
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fsync(fd)
        t0 = time.perf_counter()
        os.pwrite(fd, memoryview(buf)[:nbytes], 0)  # type: ignore[arg-type]
        t1 = time.perf_counter()
        if sync_file_range is not None:
            sync_file_range(fd, 0, nbytes, WAIT_ALL)
        t2 = time.perf_counter()
        os.fsync(fd)
        t3 = time.perf_counter()
    finally:
        os.close(fd)
    return t1 - t0, t2 - t1, t3 - t2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", nargs="?", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="1,8,32,128", help="MiB, comma-separated")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    buf = np.random.default_rng(0).integers(0, 256, max(sizes) * MiB, dtype=np.uint8)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = os.path.join(d, "flush_cost.bin")
        print(f"{'MiB':>5} {'pwrite ms':>10} {'to device ms':>13} {'fsync after ms':>15}")
        for mib in sizes:
            t = np.median([one(path, buf, mib * MiB) for _ in range(args.repeats)], axis=0)
            w, dev, fs = (x * 1e3 for x in t)
            print(f"{mib:5d} {w:10.1f} {dev:13.1f} {fs:15.1f}")


if __name__ == "__main__":
    main()
