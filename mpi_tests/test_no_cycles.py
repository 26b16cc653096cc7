"""Collective calls leave nothing for the cycle collector, at any rank count: a cycle
made per call keeps what it holds until a full collection, whose time lands in some
later call."""

from __future__ import annotations

import gc
import os
import traceback
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


@pytest.mark.mpi
def test_failed_calls_make_no_cycles(comm: MPI.Intracomm, mpi_tmp_path: Any) -> None:
    """A call refused on one rank keeps none of its arrays in a cycle: each rank's error
    is kept while the ranks agree, by a frame that its own traceback reaches."""
    d = str(comm.bcast(str(mpi_tmp_path), root=0))
    r, p = comm.rank, comm.size
    bad = p - 1  # (the one rank at -n 1)
    n = 64
    lay = layouts.block((p * n,), "<f8", rank=r, size=p)
    old = np.full(n, r + 1.0)
    path = os.path.join(d, "f.bin")
    with collio.open(path, "w", comm=comm) as f:
        f.write_all(old, lay)
    ckpt.save(os.path.join(d, "ok.ckpt"), {"a": (old, lay)}, comm=comm)

    def refused(call: Callable[[], Any], error: type[Exception], text: str) -> bool:
        try:
            call()
        except error as e:
            return text in str(e) and (p == 1 or f"rank {bad}" in str(e))
        return False

    def calls() -> bool:
        short = np.zeros(n - 1) if r == bad else np.zeros(n)
        ok = True
        with collio.open(path, "r+", comm=comm) as f:
            ok &= refused(lambda: f.write_all(short, lay), collio.LayoutError, "does not match")
            after = layouts.Subarray((2 * p * n,), (n,), (p * n + r * n,), "<f8")
            ok &= refused(lambda: f.write_all_many([(np.zeros(n), lay), (short, after)]),
                          collio.LayoutError, "item 1")  # fmt: skip
            # (counts that differ, the last rank's own items overlapping: its error is
            # not the one raised)
            if p > 1:
                twice = [(np.zeros(n), lay)] * (2 if r == bad else 1)
                ok &= refused(lambda: f.write_all_many(twice), collio.MismatchError, "items")
            out = np.empty(n, "<f4" if r == bad else "<f8")
            ok &= refused(lambda: f.read_all(lay, out=out), collio.LayoutError, "dtype")
            ok &= bool(f.read_all(lay).tobytes() == old.tobytes())
        return ok

    def checkpoints() -> bool:
        target = os.path.join(d, "ok.ckpt")
        short = np.zeros(n - 1) if r == bad else np.zeros(n)
        ok = refused(lambda: ckpt.save(target, {"a": (short, lay)}, comm=comm),
                     collio.LayoutError, "'a'")  # fmt: skip
        unknown = {"zz": None} if r == bad else {"a": lay}
        ok &= refused(lambda: ckpt.load(target, unknown, comm=comm), collio.LayoutError, "zz")
        return ok and bool(ckpt.load(target, {"a": lay}, comm=comm)["a"].tobytes() == old.tobytes())

    assert _left(comm, calls) == []
    assert _left(comm, checkpoints) == []


def test_an_agreed_error_keeps_where_its_cause_was_raised(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """The cause of an agreed error (the failing rank's own) carries its traceback as
    text, not frames (which would hold a cycle): a report still shows where it was raised."""
    d = str(comm.bcast(str(mpi_tmp_path), root=0))
    r, p = comm.rank, comm.size
    lay = layouts.block((8 * p,), "<f8", rank=r, size=p)
    with collio.open(os.path.join(d, "note.bin"), "w", comm=comm) as f:
        with pytest.raises(collio.LayoutError) as info:
            f.write_all(np.zeros(7 if r == p - 1 else 8), lay)
    cause = info.value.__cause__
    if r == p - 1:
        note = "\n".join(getattr(cause, "__notes__", []))
        ok = cause is not None and cause.__traceback__ is None and "in as_bytes" in note
    else:
        ok = cause is None
    every = comm.allgather(ok)
    assert all(every), every


def test_a_failed_call_leaves_the_callers_own_exception_as_it_was(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """A collective call refused inside the caller's ``except`` block: the caller's
    exception (the context of the rank's own error) keeps its traceback, with no note."""
    d = str(comm.bcast(str(mpi_tmp_path), root=0))
    r, p = comm.rank, comm.size
    lay = layouts.block((8 * p,), "<f8", rank=r, size=p)

    def users() -> None:
        raise KeyError("the caller's own")

    with collio.open(os.path.join(d, "ctx.bin"), "w", comm=comm) as f:
        try:
            users()
        except KeyError as mine:
            with pytest.raises(collio.LayoutError):
                f.write_all(np.zeros(7 if r == p - 1 else 8), lay)
            kept = mine.__traceback__ is not None and not getattr(mine, "__notes__", [])
            kept = kept and "users" in "".join(traceback.format_tb(mine.__traceback__))
    every = comm.allgather(kept)
    assert all(every), every
