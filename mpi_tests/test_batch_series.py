"""A time series of 200-item batches: each step the same shapes one batch further on.

The ranks' runs of step ``s`` are those of step 0 moved by ``s`` batches, and the arrays
are the same ones updated in place, so a two-phase step reuses the plan of the one
before it, moved (:mod:`collio.plancache`), with new layout objects every step
(:mod:`collio.boxes` finds their templates by shape).  The last step writes from new
arrays elsewhere in memory, and reads fill new arrays: the kept plan serves them too,
its pieces moved to the arrays' places.  A bad
item on one rank and a different count on one rank fail everywhere and write nothing,
and the series goes on with its kept plan.  Every byte is checked against numpy and
against ROMIO (one ``Write_at_all`` per item), and every step is read back.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pytest
from helpers import raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio import layouts

#: Items per batch, float64 per rank per item (480 bytes: windows of a few KiB cut some
#: items' runs inside), steps in the series.
ITEMS, N, STEPS = 200, 60, 4
#: Both directions two-phase (every step plans or reuses a plan), or collio's choice.
SHUFFLE = {"romio_cb_write": "enable", "romio_cb_read": "enable"}
#: Two-phase in many rounds of 4 KiB through two aggregators.
ROUNDS = {**SHUFFLE, "cb_buffer_size": 4096, "cb_nodes": 2}


def _item_bytes(p: int) -> int:
    return 8 * N * p


def _layouts(comm: MPI.Intracomm, step: int) -> list[Any]:
    """Step ``step``'s layouts, made anew: item k is rank r's piece of a 1-D array at
    ``(step * ITEMS + k)`` items into the file, the ranks' pieces side by side."""
    p, r = comm.size, comm.rank
    return [
        layouts.Subarray(
            (N * p,), (N * r,), (N,), "<f8", offset=(step * ITEMS + k) * _item_bytes(p)
        )
        for k in range(ITEMS)
    ]


def _values(step: int, k: Any, rank: Any, i: Any) -> Any:
    """Element ``i`` of rank ``rank``'s piece of item ``k`` at step ``step`` (exact in float64)."""
    return ((step * ITEMS + k) * 64 + rank) * 1024.0 + i


def _data(comm: MPI.Intracomm, step: int) -> list[np.ndarray[Any, Any]]:
    i = np.arange(N, dtype=np.float64)
    return [_values(step, k, comm.rank, i) for k in range(ITEMS)]


def _fill(arrays: list[np.ndarray[Any, Any]], comm: MPI.Intracomm, step: int) -> None:
    """Step ``step``'s values into the kept arrays, in place."""
    for a, d in zip(arrays, _data(comm, step), strict=True):
        a[...] = d


def _image(p: int, steps: int) -> bytes:
    """The file numpy says the series leaves: every step's items, the ranks side by side."""
    s = np.arange(steps)[:, None, None, None]
    k = np.arange(ITEMS)[None, :, None, None]
    r = np.arange(p)[None, None, :, None]
    i = np.arange(N)[None, None, None, :]
    return np.asarray(_values(s, k, r, i), "<f8").tobytes()


def _romio_series(path: str, comm: MPI.Intracomm, steps: int) -> None:
    """The same series through ROMIO: one ``Write_at_all`` per item."""
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    try:
        for step in range(steps):
            for k, d in enumerate(_data(comm, step)):
                at = (step * ITEMS + k) * _item_bytes(comm.size) + 8 * N * comm.rank
                fh.Write_at_all(at, d)
    finally:
        fh.Close()


@pytest.mark.mpi
@pytest.mark.parametrize("hints", [SHUFFLE, ROUNDS, {}], ids=["two-phase", "rounds", "chosen"])
def test_a_batch_series_at_moved_offsets(comm, mpi_tmp_path, hints):
    """Four steps, each a new batch of the last one's shapes one batch further on, the
    first three from the same arrays, the last from new ones; before step 2 a bad item on
    the last rank, before step 3 a shorter batch on the last rank: the same error
    everywhere, nothing written, and the series goes on.  Two-phase steps reuse the plan
    before them, moved, the last one with its pieces at the new arrays' places; every
    step is read back into the same outputs, then into new ones."""
    path, romio = str(mpi_tmp_path / "series.bin"), str(mpi_tmp_path / "romio.bin")
    last = comm.size - 1
    shuffled = hints.get("romio_cb_write") == "enable"
    reused: list[bool] = []
    kept = [np.empty(N) for _ in range(ITEMS)]
    with collio.open(path, "w", comm=comm, hints=hints) as f:
        for step in range(STEPS):
            lays = _layouts(comm, step)
            if step < STEPS - 1:
                _fill(kept, comm, step)
                datas = kept
            else:
                datas = _data(comm, step)
            if step == 2:
                bad = list(datas)
                if comm.rank == last:
                    bad[117] = bad[117].astype(np.float32)
                raises_everywhere(
                    comm, collio.LayoutError,
                    partial(f.write_all_many, list(zip(bad, lays, strict=True))),
                    match=f"rank {last}: item 117: data dtype float32",
                )  # fmt: skip
            if step == 3 and comm.size > 1:
                items = list(zip(datas, lays, strict=True))
                short = items[:-1] if comm.rank == last else items
                err = raises_everywhere(comm, collio.MismatchError,
                                        partial(f.write_all_many, short))  # fmt: skip
                assert f"rank {last}: {ITEMS - 1}" in str(err)
            f.write_all_many(list(zip(datas, lays, strict=True)))
            call = f.stats.last_call
            assert call["items"] == ITEMS
            assert call["extent"] == [step * ITEMS * _item_bytes(comm.size),
                                      (step + 1) * ITEMS * _item_bytes(comm.size)]  # fmt: skip
            if shuffled:
                assert call["path"] == "two-phase"
            reused.append(bool(call.get("plan_reused")))
        read_reused: list[bool] = []
        outs = [np.empty(N) for _ in range(ITEMS)]
        for step in range(STEPS):
            for o in outs:
                o[...] = -1.0
            back = f.read_all_many(_layouts(comm, step), out=outs)
            assert all(b is o for b, o in zip(back, outs, strict=True))
            for k, (g, want) in enumerate(zip(back, _data(comm, step), strict=True)):
                np.testing.assert_array_equal(g, want, err_msg=f"step {step} item {k}")
            read_reused.append(bool(f.stats.last_call.get("plan_reused")))
        for step in range(STEPS):  # into new arrays every time
            fresh = f.read_all_many(_layouts(comm, step))
            for k, (g, want) in enumerate(zip(fresh, _data(comm, step), strict=True)):
                np.testing.assert_array_equal(g, want, err_msg=f"new arrays: step {step} item {k}")
            read_reused.append(bool(f.stats.last_call.get("plan_reused")))
    if shuffled:  # (agreed stats: the same on every rank)
        assert reused == [False, True, True, True]
        assert read_reused == [False] + [True] * (2 * STEPS - 1)
    _romio_series(romio, comm, STEPS)
    comm.Barrier()
    ours, theirs = read_file(path), read_file(romio)
    assert ours == _image(comm.size, STEPS)
    assert ours == theirs
