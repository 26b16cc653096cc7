"""The engine and the simulator take the same decisions for the same call: path, window, rounds.

Both ask :mod:`collio.policy`; this runs each call for real (its ``stats.last_call``) and
through the simulator for the job's ranks, and compares.  Run at 4, 1 and 3 ranks.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import on_local_fs

import collio
from collio.bench.patterns import make_workload
from collio.hints import Hints
from collio.sim import SimConfig, simulate

CASES = [
    ("rowblock", "64x100", {}),  # disjoint large runs: direct
    ("rowblock", "64x100", {"romio_cb_write": "enable", "romio_cb_read": "enable"}),
    ("colblock", "96x100", {}),  # many small runs: two-phase
    ("colblock", "96x100", {"romio_cb_write": "disable", "romio_cb_read": "disable"}),
    ("colblock", "96x100", {"direct_threshold": 1}),  # small runs count as large
    ("colblock", "64x32768", {}),  # interleaved runs of 64 KiB: compared, direct
    ("colblock", "64x32768", {"romio_cb_write": "disable", "romio_cb_read": "disable"}),
    ("cyclic", "64", {"cb_nodes": 3, "cb_buffer_size": 2048}),
    ("block2d", "60", {"striping_unit": 1000, "cb_buffer_size": 3000}),
    ("ior", None, {"cb_nodes": 2, "cb_buffer_size": 3333}),
    ("colblock", "1024x1024", {}),  # min_rounds shrinks the window below cb_buffer_size
    ("cyclic", "1024", {"min_rounds": 4, "cb_buffer_size": 1 << 22}),
    ("colblock", "1024x1024", {"striping_unit": 3 << 20}),  # alignment above the window
    ("rowblock", "1024x1024", {"romio_cb_write": "disable", "romio_cb_read": "disable"}),
]  # fmt: skip


def _decided(stats: collio.Stats) -> tuple[str, int, int]:
    last = stats.last_call
    return last["path"], last["window"], last["rounds"]


def _real(comm, path, work, hints, writing):
    """The engine's (path, window, rounds) of one write (or read, checked byte for byte)."""
    lay = work.layout(comm.rank)
    if writing:
        with collio.open(path, "w", comm=comm, hints=hints) as f:
            f.write_all(work.data(comm.rank), lay)
            return _decided(f.stats)
    with collio.open(path, "r", comm=comm, hints=hints) as f:
        got = f.read_all(lay)
        decided = _decided(f.stats)
    assert np.array_equal(got, work.data(comm.rank))
    return decided


@pytest.mark.mpi
def test_engine_and_simulator_decide_alike(comm, mpi_tmp_path):
    local = on_local_fs(mpi_tmp_path)
    seen = set()
    for i, (pattern, size, hints) in enumerate(CASES):
        work = make_workload(pattern, comm.size, size=size, block_size=1000, transfer=500,
                             segments=20, cyclic_block=4)  # fmt: skip
        path = str(mpi_tmp_path / f"{i}.bin")
        for writing, more in ((True, {}), (False, {}), (False, {"mapped_reads": "disable"})):
            h = {**hints, **more}
            real = _real(comm, path, work, h, writing)
            cfg = SimConfig(hints=Hints.coerce(h), ppn=comm.size, writing=writing, local_fs=local)
            sim = simulate(work, cfg)
            assert (sim.path.value, sim.window, sim.rounds) == real, (pattern, size, h, writing)
            assert comm.allgather(real) == [real] * comm.size  # (agreed: the same everywhere)
            seen.add(real[0])
    # every path a posix file can take was compared (mapped only where reads map)
    assert {"direct", "two-phase"} | ({"mapped"} if local else set()) <= seen, seen
