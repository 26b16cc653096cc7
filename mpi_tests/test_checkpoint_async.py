"""``async_save``'s copies, made while the ranks agree on the save."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import numpy as np
import pytest
from helpers import assert_rows_load, raises_everywhere
from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio.checkpoint import asyncsave, writer
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
    asyncsave.forget()  # (no copy kept from an earlier test's save: this one makes it)
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
    assert_rows_load(comm, path)
    assert [n for n in os.listdir(os.path.dirname(path)) if n != "model.ckpt"] == []


@pytest.mark.mpi
def test_items_that_fail_on_one_rank_before_the_return_fail_the_save_at_wait(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first rank fails to work out its items, which ``async_save`` does before it
    returns: it returns on every rank all the same, ``wait`` raises the same error on
    every rank, and the checkpoint saved before is kept, byte for byte."""
    path = str(comm.bcast(os.path.join(str(mpi_tmp_path), "model.ckpt"), root=0))
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    if comm.rank == 0:

        def items(plan: Any, rank: int) -> Any:
            raise MemoryError("no memory for the items")

        monkeypatch.setattr(writer, "_items", items)
    h = ckpt.async_save(path, model.rows_state(comm.rank, comm.size, scale=2), comm=comm)
    monkeypatch.undo()
    err = raises_everywhere(comm, collio.CollioError, h.wait)
    assert "rank 0" in str(err) and "no memory for the items" in str(err)
    assert_rows_load(comm, path)
    assert [n for n in os.listdir(os.path.dirname(path)) if n != "model.ckpt"] == []


def test_a_bad_hint_or_option_on_one_rank_is_raised_by_async_save_itself(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """What the save's open would refuse of its own arguments (a hint that is no size, an
    option the backend does not take), given on the last rank alone, is raised by
    ``async_save`` on every rank before it returns, not by ``wait``; nothing is written
    and the checkpoint saved before is kept."""
    path = str(comm.bcast(os.path.join(str(mpi_tmp_path), "model.ckpt"), root=0))
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm)
    last = comm.rank == comm.size - 1
    state = model.rows_state(comm.rank, comm.size, scale=2)
    for kw, text in (({"hints": {"cb_buffer_size": "lots"}}, "is not a size"),
                     ({"stripe_count": 4}, "unknown options ['stripe_count']")):  # fmt: skip
        err = raises_everywhere(
            comm, collio.CollioError,
            lambda kw=kw: ckpt.async_save(path, state, comm=comm, **(kw if last else {})),
        )  # fmt: skip
        assert f"rank {comm.size - 1}" in str(err) and text in str(err), str(err)
    assert_rows_load(comm, path)
    assert [n for n in os.listdir(os.path.dirname(path)) if n != "model.ckpt"] == []


def _may_lower_a_threads_priority() -> bool:
    """Whether this system lets a thread lower its own priority (a container may not)."""
    ok: list[bool] = []

    def probe() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, asyncsave.NICE)
            ok.append(os.getpriority(os.PRIO_PROCESS, 0) == asyncsave.NICE)
        except OSError:
            ok.append(False)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return ok[0]


@pytest.mark.mpi
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's niceness: Linux")
def test_the_save_runs_in_a_thread_of_its_own_at_the_lowest_priority(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writing runs in another thread, at niceness 19 (read by that thread itself:
    on Linux ``getpriority`` of id 0 is the calling thread's); the caller's thread keeps
    its own niceness, and the checkpoint holds the state byte for byte."""
    if not comm.allreduce(_may_lower_a_threads_priority(), op=MPI.LAND):
        pytest.skip("this system does not let a thread lower its priority")
    seen: list[tuple[int, int]] = []
    ready: list[bool] = []
    real = asyncsave.write

    def write(*args: Any, **kw: Any) -> None:
        seen.append((threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0)))
        ready.append(args[2].items is not None)  # (no items left to work out in Python)
        real(*args, **kw)

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    monkeypatch.setattr(asyncsave, "write", write)
    path = str(comm.bcast(os.path.join(str(mpi_tmp_path), "model.ckpt"), root=0))
    ckpt.async_save(path, model.rows_state(comm.rank, comm.size), comm=comm).wait()
    monkeypatch.undo()
    assert len(seen) == 1, seen
    assert seen[0][0] != threading.get_native_id()
    assert seen[0][1] == asyncsave.NICE, (seen, mine)
    assert ready == [True], ready
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine
    assert_rows_load(comm, path)


@pytest.mark.mpi
def test_freeing_the_communicator_while_a_save_runs_lets_the_save_finish(
    comm: MPI.Intracomm, mpi_tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user frees the communicator of a save still running (its thread held back
    until then): the save's duplicate outlives it until the save is done, so ``wait``
    returns on every rank and the checkpoint holds the state byte for byte."""
    path = str(comm.bcast(os.path.join(str(mpi_tmp_path), "model.ckpt"), root=0))
    go = threading.Event()
    real = asyncsave.write

    def write(*args: Any, **kw: Any) -> None:
        go.wait(60)  # (the save starts only once its communicator is freed)
        real(*args, **kw)

    monkeypatch.setattr(asyncsave, "write", write)
    user = comm.Dup()
    h = ckpt.async_save(path, model.rows_state(comm.rank, comm.size), comm=user)
    monkeypatch.undo()
    user.Free()
    go.set()
    failed = None
    try:
        h.wait()
    except Exception as exc:  # noqa: BLE001 - agreed below, so no rank hangs in load
        failed = exc
    assert comm.allgather(repr(failed)) == [repr(None)] * comm.size
    assert_rows_load(comm, path)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_async_saves_fill_the_copies_the_last_one_kept(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """A second async save fills the copies the first made (same names, shapes, dtypes)
    only once the first is done: each checkpoint holds its own call's values although
    the arrays changed right after each call; a changed shape gets a new copy, and
    ``release_buffers`` lets the kept copies go."""
    d = str(comm.bcast(str(mpi_tmp_path), root=0))
    paths = [os.path.join(d, f"save{k}.ckpt") for k in range(3)]
    asyncsave.forget()
    state = model.rows_state(comm.rank, comm.size)
    first = {n: (v[0].copy() if isinstance(v, tuple) else v.copy()) for n, v in state.items()}
    h0 = ckpt.async_save(paths[0], state, comm=comm)
    kept = dict(asyncsave._background(comm).staged)

    def change(flip: int) -> None:  # (the job goes on: its arrays change at once)
        for v in state.values():
            (v[0] if isinstance(v, tuple) else v).reshape(-1).view(np.uint8)[...] ^= flip

    change(0x5A)
    h1 = ckpt.async_save(paths[1], state, comm=comm)  # (without waiting for h0)
    again = asyncsave._background(comm).staged
    assert kept and {k: id(a) for k, a in again.items()} == {k: id(a) for k, a in kept.items()}
    change(0x0F)
    h1.wait()
    h0.wait()
    spec = model.rows_layouts(comm.rank, comm.size)
    spec_all = {**spec, "rep": None}
    for path, flip in ((paths[0], 0), (paths[1], 0x5A)):
        got = ckpt.load(path, spec_all, comm=comm)
        for name, value in first.items():
            want = (np.frombuffer(value.tobytes(), np.uint8) ^ flip).tobytes()
            assert got[name].tobytes() == want, (path, name)
    # a changed shape: a copy of its own, the right bytes
    other = {"rep": np.arange(11, dtype="<i8")}
    ckpt.async_save(paths[2], other, comm=comm).wait()
    assert ckpt.load(paths[2], {"rep": None}, comm=comm)["rep"].tobytes() == other["rep"].tobytes()
    # (the last save's copies only: a replicated entry is copied by the ranks writing it)
    assert set(asyncsave._background(comm).staged) <= {("rep", (11,), "<i8", "C")}
    collio.release_buffers()
    assert asyncsave._background(comm).staged == {}


@pytest.mark.mpi
def test_a_save_after_an_async_save_of_the_same_target_is_the_one_left(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """A job's background save, then a blocking save of the same path before waiting
    for it (a last save at the end of a run): the later save's bytes are what the path
    holds and loads, not the earlier one's committed after it."""
    path = str(comm.bcast(os.path.join(str(mpi_tmp_path), "model.ckpt"), root=0))
    h = ckpt.async_save(path, model.rows_state(comm.rank, comm.size, scale=2), comm=comm,
                        metadata={"step": 1})  # fmt: skip
    ckpt.save(path, model.rows_state(comm.rank, comm.size), comm=comm, metadata={"step": 2})
    h.wait()
    assert ckpt.info(path).metadata == {"step": 2}
    assert_rows_load(comm, path)


@pytest.mark.mpi
def test_a_load_and_info_after_an_async_save_read_what_it_commits(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """``info`` and ``load`` of a path an async save is still writing (no ``wait`` yet)
    read the checkpoint it commits, not the one before it (here: none at all)."""
    path = str(comm.bcast(os.path.join(str(mpi_tmp_path), "new.ckpt"), root=0))
    h = ckpt.async_save(path, model.rows_state(comm.rank, comm.size), comm=comm,
                        metadata={"step": 3})  # fmt: skip
    assert ckpt.info(path).metadata == {"step": 3}
    assert_rows_load(comm, path)
    assert h.done()
    h.wait()


@pytest.mark.mpi
@pytest.mark.parametrize("then", ["async_save", "save"])
def test_a_failed_async_save_nobody_waited_for_is_raised_by_the_next_save(
    comm: MPI.Intracomm, mpi_tmp_path: Any, then: str
) -> None:
    """An async save into a directory that does not exist, its handle dropped without
    ``wait``: the next save on the communicator raises its error on every rank (and
    does not save), the one after it saves; a handle whose ``wait`` raised the error
    is not raised again."""
    d = str(comm.bcast(str(mpi_tmp_path), root=0))
    bad = os.path.join(d, "absent", "model.ckpt")
    good = os.path.join(d, "model.ckpt")
    state = model.rows_state(comm.rank, comm.size)
    first = ckpt.async_save(bad, state, comm=comm)  # (its wait() never called)
    again = getattr(ckpt, then)
    err = raises_everywhere(comm, collio.CollioError, lambda: again(good, state, comm=comm))
    assert "absent" in str(err) and "wait() had not raised" in "".join(err.__notes__)
    assert not comm.bcast(os.path.exists(good), root=0)  # (that save did not run)
    # (the handle's own error, unchanged by the later save's note, is still its wait()'s)
    own = raises_everywhere(comm, type(err), first.wait)
    assert str(own) == str(err) and not getattr(own, "__notes__", [])
    h = again(good, state, comm=comm)
    if h is not None:
        h.wait()
    assert_rows_load(comm, good)
    # (told by its own wait: not raised again by the next save)
    h = ckpt.async_save(bad, state, comm=comm)
    raises_everywhere(comm, collio.CollioError, h.wait)
    ckpt.save(good, state, comm=comm)
    assert_rows_load(comm, good)


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_a_failed_async_save_waited_for_on_some_ranks_only_is_raised_on_all(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """A job polls its failed async save and rank 0 alone calls ``wait()`` once
    ``done()`` says so: the next save raises the error on every rank (before, rank 0
    went on into the save and waited there for ranks that had raised)."""
    d = str(comm.bcast(str(mpi_tmp_path), root=0))
    state = model.rows_state(comm.rank, comm.size)
    h = ckpt.async_save(os.path.join(d, "absent", "model.ckpt"), state, comm=comm)
    if comm.rank == 0:
        while not h.done():
            threading.Event().wait(0.01)
        with pytest.raises(collio.CollioError):
            h.wait()
    good = os.path.join(d, "model.ckpt")
    if comm.size > 1:
        raises_everywhere(comm, collio.CollioError, lambda: ckpt.save(good, state, comm=comm))
    ckpt.save(good, state, comm=comm)
    assert_rows_load(comm, good)


@pytest.mark.mpi
def test_an_async_save_of_a_relative_path_writes_where_it_was_called(
    comm: MPI.Intracomm, mpi_tmp_path: Any
) -> None:
    """A relative path names the file from the directory of the call, not from wherever
    the job's working directory is when the save's thread opens it."""
    d = str(comm.bcast(str(mpi_tmp_path), root=0))
    if comm.rank == 0:
        os.makedirs(os.path.join(d, "a"))
        os.makedirs(os.path.join(d, "b"))
    comm.Barrier()
    back = os.getcwd()
    try:
        os.chdir(os.path.join(d, "a"))
        h = ckpt.async_save("model.ckpt", model.rows_state(comm.rank, comm.size), comm=comm)
        os.chdir(os.path.join(d, "b"))
        h.wait()
    finally:
        os.chdir(back)
    assert_rows_load(comm, os.path.join(d, "a", "model.ckpt"))
    assert not os.path.exists(os.path.join(d, "b", "model.ckpt"))
