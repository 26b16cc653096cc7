"""The MPI side of tests/test_checkpoint_jobs.py: save in one job, load in another.

``mpiexec -n N python tests/checkpoint_job.py CASE PATH``; prints ``ok`` on rank 0
when every rank got what it must.  Cases: ``save``; ``load`` (the test state's other
decomposition at this job's size, and the saving decomposition when the size is
the saver's; each mapped and read into new arrays); ``killed`` (save over PATH, rank
1 killed inside the write); ``failing`` (save row shards over PATH, which the job's
last rank, started under ``ulimit -f``, fails to write part of: the save must fail
alike on every rank); ``threads`` (MPI started below ``MPI_THREAD_MULTIPLE``: async_save
refused on every rank, save works); ``untold`` (a failed async save nobody waited
for, on a communicator freed since: said at exit).
"""

from __future__ import annotations

import os
import signal
import sys

from mpi4py import MPI

import collio
import collio.checkpoint as ckpt
from collio.testing import checkpoint as model

comm = MPI.COMM_WORLD


def _check(
    got: dict[str, object], spec: dict[str, object], maps: bool | None = None, path: str = ""
) -> None:
    """Every array byte for byte; with ``maps``, mapped where its piece is one range of
    the file (one range of its array, in one of the array's chunks)."""
    for name, lay in spec.items():
        want = model.expected(name, lay)  # type: ignore[arg-type]
        arr = got[name]
        assert arr.tobytes(order="A") == want.tobytes(order="A"), (comm.rank, name)  # type: ignore[attr-defined]
        if maps is not None:
            one = model.one_range(name, lay) and model.mappable(path, name, lay)  # type: ignore[arg-type]
            assert model.mapped(arr) == (maps and one), (comm.rank, name, one)


def _load_both(path: str, spec: dict[str, object]) -> None:
    """Mapped and read into new arrays: the same bytes."""
    for maps in (True, False):
        hints = {"checkpoint_map": "enable" if maps else "disable"}
        _check(ckpt.load(path, spec, hints=hints), spec, maps, path)


def _failing(path: str) -> None:
    """Row shards of 32 MiB and more: the last rank's piece of the first array ends
    below its file-size limit, its pieces of the next ones start above it, so it fails
    in the middle of its own direct writes while the other ranks' writes succeed."""
    seen: list[str] = []
    real = collio.File.write_all_many

    def recorded(self: collio.File, items: object, **kw: bool) -> None:
        try:
            real(self, items, **kw)
        finally:  # (the call's path, as the check agreed it: before any byte moved)
            seen.append(f"{kw.get('_disjoint')}")

    collio.File.write_all_many = recorded  # type: ignore[method-assign]
    try:
        ckpt.save(path, model.rows_state(comm.rank, comm.size, scale=64))
    except collio.CollioError as exc:
        got = (type(exc).__name__, str(exc))
    else:
        got = ("no error", "")
    every = comm.allgather(got)
    assert seen == ["True"], seen
    assert got[0] == "BackendError" and all(g == got for g in every), every
    assert f"rank {comm.size - 1}" in got[1], got


def _threads(path: str) -> None:
    """MPI below ``MPI_THREAD_MULTIPLE`` (the job's environment sets mpi4py's level):
    ``async_save``, whose thread would make MPI calls beside the job's, raises the same
    ModeError on every rank and writes nothing; a blocking save works."""
    assert MPI.Query_thread() < MPI.THREAD_MULTIPLE, MPI.Query_thread()
    state = model.rows_state(comm.rank, comm.size)
    try:
        ckpt.async_save(path, state)
    except collio.ModeError as exc:
        got = (type(exc).__name__, str(exc))
    else:
        got = ("no error", "")
    every = comm.allgather(got)
    assert got[0] == "ModeError" and "MPI_THREAD_MULTIPLE" in got[1], got
    assert all(g[0] == got[0] and "MPI_THREAD_MULTIPLE" in g[1] for g in every), every
    assert not os.path.exists(path)
    ckpt.save(path, state)
    spec = model.rows_layouts(comm.rank, comm.size)
    got = ckpt.load(path, dict(spec))
    for name, lay in spec.items():
        want = model.rows_reference(name)[lay.slices]  # type: ignore[attr-defined]
        assert got[name].tobytes() == want.tobytes(), (comm.rank, name)


def main(case: str, path: str) -> None:
    if case == "save":
        ckpt.save(path, model.save_state(comm.rank, comm.size), metadata={"ranks": comm.size})
    elif case == "load":
        saved = ckpt.info(path).metadata["ranks"]
        spec = model.load_spec(comm.rank, comm.size)
        _load_both(path, spec)
        if saved == comm.size:
            same = dict(model.save_layouts(comm.rank, comm.size))
            _load_both(path, same)
    elif case == "killed":
        write_many = collio.File.write_all_many

        def dying(self: collio.File, items: object, **kw: bool) -> None:
            if comm.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            write_many(self, items, **kw)

        collio.File.write_all_many = dying  # type: ignore[method-assign]
        ckpt.save(path, model.save_state(comm.rank, comm.size))
    elif case == "failing":
        _failing(path)
    elif case == "threads":
        _threads(path)
    elif case == "untold":  # (a failed async save, its handle and communicator gone)
        import gc
        import time

        dup = comm.Dup()
        h = ckpt.async_save(os.path.join(path, "absent", "model.ckpt"),
                            model.rows_state(comm.rank, comm.size), comm=dup)  # fmt: skip
        while not h.done():  # (over, but nobody told: no wait())
            time.sleep(0.01)
        del h
        dup.Free()
        gc.collect()
    comm.Barrier()
    if comm.rank == 0:
        print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
