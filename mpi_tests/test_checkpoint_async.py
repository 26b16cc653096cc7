"""``async_save``'s copies, made while the ranks agree on the save."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio.testing import checkpoint as model


@pytest.mark.mpi
def test_a_copy_that_fails_on_one_rank_fails_the_save_at_wait(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last rank runs out of memory copying one piece: ``async_save`` returns on
    every rank (the others have gone on), ``wait`` raises the same error on every rank,
    and the checkpoint saved before is kept, byte for byte."""
    path = str(comm.bcast(os.path.join(str(mpi_tmp_path), "model.ckpt"), root=0))
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    state = model.rows_state(comm.rank, comm.size, scale=2)
    victim = state["b"][0]
    if comm.rank == comm.size - 1:
        real = np.copy

        def copy(a: Any, *args: Any, **kw: Any) -> Any:
            if a is victim:
                raise MemoryError("no memory for a copy of 'b'")
            return real(a, *args, **kw)

        monkeypatch.setattr(np, "copy", copy)
    h = ckpt.async_save(path, state, comm=comm)
    monkeypatch.undo()
    err = raises_everywhere(comm, collio.CollioError, h.wait)
    assert f"rank {comm.size - 1}" in str(err) and "no memory" in str(err)
    spec = model.rows_layouts(comm.rank, comm.size)
    got = ckpt.load(path, dict(spec), comm=comm)
    for name, lay in spec.items():
        want = np.ascontiguousarray(model.rows_reference(name)[lay.slices])  # type: ignore[attr-defined]
        assert got[name].tobytes() == want.tobytes(), (comm.rank, name)
    assert [n for n in os.listdir(os.path.dirname(path)) if n != "model.ckpt"] == []
