"""``collio-bench --flatten-speed``: seconds to decode MPI derived datatypes into byte runs.

What ``File.set_view`` and ``layouts.from_datatype`` pay for a new filetype: a 3-D
subarray and a CYCLIC(4) darray of about ``runs`` runs each, each freshly built (nothing
cached), flattened by :func:`collio.datatypes.flatten`.  One process, no communication.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from mpi4py import MPI

from .. import datatypes

__all__ = ["flatten_speed", "format_flatten"]


def _median_seconds(make: Callable[[], MPI.Datatype], repeat: int) -> tuple[float, int]:
    times, nruns = [], 0
    for _ in range(repeat):
        dt = make().Commit()
        try:
            t = time.perf_counter()
            nruns = datatypes.flatten(dt).nruns
            times.append(time.perf_counter() - t)
        finally:
            dt.Free()
    return statistics.median(times), nruns


def flatten_speed(runs: int = 10**6, repeat: int = 5) -> dict[str, float]:
    """Medians of ``repeat`` flattenings of a subarray and a darray of about ``runs`` runs."""
    side = max(1, int(round(runs**0.5)))
    sizes, subsizes, starts = [2 * side, 2 * side, 64], [side, side, 32], [side // 2, side // 2, 16]

    def subarray() -> MPI.Datatype:
        return MPI.DOUBLE.Create_subarray(sizes, subsizes, starts)

    n = 4 * side  # CYCLIC(4) on a 2 x 2 grid: n/2 local rows of n/8 runs, n*n/16 runs in all

    def darray() -> MPI.Datatype:
        dist = [MPI.DISTRIBUTE_CYCLIC] * 2
        return MPI.DOUBLE.Create_darray(4, 1, [n, n], dist, [4, 4], [2, 2])

    t_sub, r_sub = _median_seconds(subarray, repeat)
    t_dar, r_dar = _median_seconds(darray, repeat)
    return {"subarray_runs": r_sub, "subarray_s": t_sub, "darray_runs": r_dar, "darray_s": t_dar}


def format_flatten(t: dict[str, float]) -> str:
    """One line for humans."""
    return (
        f"flattening (medians): a subarray of {int(t['subarray_runs'])} runs "
        f"{t['subarray_s']:.3f} s, a darray of {int(t['darray_runs'])} runs {t['darray_s']:.3f} s"
    )
