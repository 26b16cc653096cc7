"""Collective calls leave nothing for the cycle collector, at any rank count: a cycle
made per call keeps what it holds until a full collection, whose time lands in some
later call."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio import layouts
from collio.testing import checkpoint as model


def _left(comm: MPI.Intracomm, fn: Callable[[], bool]) -> list[str]:
    """The kinds of objects in cycles that ``fn`` left on any rank (after a first call,
    which may fill caches); ``fn`` says whether what it got was right, which every rank
    learns (a wrong rank raising alone would leave the others in the gather)."""
    ok = fn()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        ok = fn() and ok
        gc.collect()
        mine = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    every = comm.allgather((ok, mine))
    assert all(good for good, _ in every), [r for r, (good, _) in enumerate(every) if not good]
    return sorted(set().union(*(kinds for _, kinds in every)))


@pytest.mark.mpi
def test_saves_loads_and_calls_make_no_cycles(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    d = str(comm.bcast(str(mpi_tmp_path), root=0))
    path = os.path.join(d, "rows.ckpt")
    state = model.rows_state(comm.rank, comm.size)
    shifted = {"a": model.shifted_rows(comm.rank, comm.size)}

    def saves() -> bool:
        ckpt.save(path, state, comm=comm)
        ckpt.async_save(path, state, comm=comm).wait()
        return True

    def loads() -> bool:
        got = ckpt.load(path, shifted, comm=comm)["a"]
        return got.tobytes() == model.rows_reference("a")[shifted["a"].slices].tobytes()

    lay = layouts.block((16 * comm.size, 50), "<f8", grid=(comm.size, 1), rank=comm.rank,
                        size=comm.size)  # fmt: skip
    data = np.full((16, 50), comm.rank, "<f8")

    def calls() -> bool:
        with collio.open(os.path.join(d, "f.bin"), "w", comm=comm) as f:
            f.write_all(data, lay)
            f.write_all_many([(data, lay)])
        with collio.open(os.path.join(d, "f.bin"), "r", comm=comm) as f:
            return bool(f.read_all(lay).tobytes() == data.tobytes())

    assert _left(comm, saves) == []
    assert _left(comm, loads) == []
    assert _left(comm, calls) == []


@pytest.mark.mpi
def test_an_async_save_on_a_freed_communicator_makes_no_cycle(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """An async save whose communicator is freed while it runs (its duplicate freed once
    it ends) leaves no cycle holding the save."""
    d = str(comm.bcast(str(mpi_tmp_path), root=0))
    state = model.rows_state(comm.rank, comm.size)

    def freed() -> bool:
        c = comm.Dup()
        h = ckpt.async_save(os.path.join(d, "freed.ckpt"), state, comm=c)
        c.Free()
        h.wait()
        return True

    assert _left(comm, freed) == []
