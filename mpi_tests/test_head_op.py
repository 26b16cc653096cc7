"""Every call's head on collio's duplicate starts one persistent allreduce (HeadOp).

The duplicate collio makes of a communicator sets up its head operation once
(``MPI_Allreduce_init``); every head on it starts that operation, whatever the call, so
ranks making different calls still meet in it.  Each test checks the bytes (against
numpy and ROMIO) or the agreed error on every rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import mismatch_message, raises_everywhere, read_file
from mpi4py import MPI

import collio
from collio import collective

pytestmark = pytest.mark.mpi(min_size=1)
N = 4096


def _data(step: int, rank: int) -> Any:
    return np.random.default_rng(977 * step + rank).integers(0, 256, N, np.uint8)


class _Counted:
    """A head operation's request that counts its starts (the rest as the request)."""

    def __init__(self, req: Any) -> None:
        self.req, self.starts = req, 0

    def Start(self) -> None:  # noqa: N802 - mpi4py's name
        self.starts += 1
        self.req.Start()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.req, name)


def _reads_beside_writes(comm: MPI.Comm, f: Any, step: int) -> None:
    """Step ``step`` of a series, rank 0 reading while the others write: the same
    MismatchError on every rank."""
    p, r = comm.size, comm.rank
    out = np.empty(N, np.uint8)
    at = (step * p + r) * N

    def call() -> None:
        if r == 0:
            f.read_at_all(at, out)
        else:
            f.write_at_all(at, _data(step, r))

    want_msg = mismatch_message(comm, "read_at_all", "write_at_all")
    raises_everywhere(comm, collio.MismatchError, call, match=want_msg)


def test_every_call_of_a_series_starts_the_head_operation_once(comm, mpi_tmp_path):
    """A time series of write_at_all then read_at_all: each call's one head is a start of
    the duplicate's head operation (none made per call), and the bytes are numpy's and
    ROMIO's."""
    path, theirs = str(mpi_tmp_path / "ours.bin"), str(mpi_tmp_path / "romio.bin")
    p, r, steps = comm.size, comm.rank, 10
    fh = MPI.File.Open(comm, theirs, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    with collio.open(path, "w", comm=comm) as f:
        op = collective._HEAD_OPS.get(f._ctx.comm.py2f())
        assert comm.allgather(op is not None) == [True] * p
        counted = op.req = _Counted(op.req)
        guessed = []
        try:
            for s in range(steps):
                f.write_at_all((s * p + r) * N, _data(s, r))
                guessed.append(f.stats.last_call["guessed"])
                fh.Write_at_all((s * p + r) * N, _data(s, r))
            out = np.empty(N, np.uint8)
            wrong = 0
            for s in range(steps):
                f.read_at_all((s * p + r) * N, out)
                wrong += not np.array_equal(out, _data(s, r))
        finally:
            op.req = counted.req
    fh.Close()
    assert comm.allgather((counted.starts, wrong)) == [(2 * steps, 0)] * p
    assert guessed == [False, False] + [True] * (steps - 2)
    comm.Barrier()
    want = b"".join(_data(s, q).tobytes() for s in range(steps) for q in range(p))
    assert read_file(path) == want and read_file(theirs) == want


def test_ranks_in_different_calls_meet_in_the_head_operation(comm, mpi_tmp_path):
    """A series' step where rank 0 reads while the others write: every rank raises the
    same MismatchError from the one head operation, the writes are taken back, and the
    file holds the steps before it, as ROMIO wrote them."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    path, theirs = str(mpi_tmp_path / "ours.bin"), str(mpi_tmp_path / "romio.bin")
    p, r, steps = comm.size, comm.rank, 5
    fh = MPI.File.Open(comm, theirs, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    with collio.open(path, "w", comm=comm) as f:
        for s in range(steps):
            f.write_at_all((s * p + r) * N, _data(s, r))
            fh.Write_at_all((s * p + r) * N, _data(s, r))
        _reads_beside_writes(comm, f, steps)
        f.write_at_all((steps * p + r) * N, _data(steps, r))  # (the file goes on)
        fh.Write_at_all((steps * p + r) * N, _data(steps, r))
    fh.Close()
    comm.Barrier()
    want = b"".join(_data(s, q).tobytes() for s in range(steps + 1) for q in range(p))
    assert read_file(path) == want and read_file(theirs) == want


def test_a_freed_communicator_frees_its_head_operation(comm, mpi_tmp_path):
    """The user's communicator freed (its files closed): collio's duplicate and its head
    operation are freed, so that a communicator given the same handle later has none."""
    mine = comm.Dup()
    with collio.open(str(mpi_tmp_path / "f.bin"), "w", comm=mine) as f:
        f.write_at_all(comm.rank * N, _data(0, comm.rank))
        handle = f._ctx.comm.py2f()
    kept = handle in collective._HEAD_OPS
    mine.Free()
    gone = handle not in collective._HEAD_OPS
    assert comm.allgather((kept, gone)) == [(True, True)] * comm.size


def test_a_head_interrupted_in_its_wait_is_completed_by_the_next(comm, monkeypatch):
    """The last rank's patient head is interrupted in its wait (the others' complete):
    its next head completes the operation it left started, then starts it again, and
    every rank's next heads agree (starting an active request would fail on that rank
    alone and leave the others waiting)."""
    from collio import comms

    c = comms.private(comm).comm
    if comm.allgather(collective._HEAD_OPS.get(c.py2f()) is None) != [False] * comm.size:
        pytest.skip("no persistent head operation (MPI before 4)")
    last = comm.rank == comm.size - 1

    def interrupted(req, **kw):
        raise KeyboardInterrupt

    if last:
        monkeypatch.setattr(collective, "sleep_until_done", interrupted)
    try:
        first = collective.call_head(c, "sync", (1, "x"), False, patient=True)[0]
    except KeyboardInterrupt:
        first = "interrupted"
    monkeypatch.undo()
    then = [collective.call_head(c, "sync", (1, "x"), comm.rank == 0, patient=p)[0]
            for p in (True, False)]  # fmt: skip
    got = comm.allgather((first, then))
    want = [(False, [True, True])] * (comm.size - 1) + [("interrupted", [True, True])]
    assert got == want, got


def test_a_rank_failing_to_set_up_the_head_operation_leaves_heads_that_meet(
    comm, mpi_tmp_path, monkeypatch
):
    """Rank 0 alone fails to set up a new duplicate's head operation: no rank keeps one,
    the duplicate is taken anew (on the first, rank 0 would be a collective behind), and
    a series of calls on it writes numpy's bytes."""
    real = collective.HeadOp

    class Failing(real):
        __slots__ = ()

        def __init__(self, c):
            if comm.rank == 0:
                raise MemoryError("injected: no room for the head operation")
            super().__init__(c)

    mine = comm.Dup()
    monkeypatch.setattr(collective, "HeadOp", Failing)
    path = str(comm.bcast(str(mpi_tmp_path / "f.bin"), root=0))
    p, r, steps = comm.size, comm.rank, 6
    try:
        with collio.open(path, "w", comm=mine) as f:
            kept = f._ctx.comm.py2f() in collective._HEAD_OPS
            for s in range(steps):
                f.write_at_all((s * p + r) * N, _data(s, r))
    finally:
        monkeypatch.undo()
        mine.Free()
    assert comm.allgather(kept) == [False] * p
    comm.Barrier()
    want = b"".join(_data(s, q).tobytes() for s in range(steps) for q in range(p))
    assert read_file(path) == want


def test_without_a_head_operation_heads_still_agree_and_meet(comm, mpi_tmp_path, monkeypatch):
    """No rank can set up the head operation (an MPI without persistent collectives):
    none is kept, every head is a nonblocking allreduce, a series writes numpy's and
    ROMIO's bytes, and a step where rank 0 reads while the others write raises the same
    MismatchError on every rank, the file going on after it."""

    class Missing(collective.HeadOp):
        __slots__ = ()

        def __init__(self, c):
            raise NotImplementedError("injected: MPI_Allreduce_init is missing")

    mine = comm.Dup()
    monkeypatch.setattr(collective, "HeadOp", Missing)
    path = str(comm.bcast(str(mpi_tmp_path / "ours.bin"), root=0))
    theirs = str(mpi_tmp_path / "romio.bin")
    p, r, steps = comm.size, comm.rank, 5
    fh = MPI.File.Open(comm, theirs, MPI.MODE_CREATE | MPI.MODE_WRONLY)
    try:
        with collio.open(path, "w", comm=mine) as f:
            kept = f._ctx.comm.py2f() in collective._HEAD_OPS
            guessed = []
            for s in range(steps):
                f.write_at_all((s * p + r) * N, _data(s, r))
                guessed.append(f.stats.last_call["guessed"])
                fh.Write_at_all((s * p + r) * N, _data(s, r))
            if p > 1:
                _reads_beside_writes(comm, f, steps)
            f.write_at_all((steps * p + r) * N, _data(steps, r))  # (the file goes on)
            fh.Write_at_all((steps * p + r) * N, _data(steps, r))
    finally:
        monkeypatch.undo()
        mine.Free()
        fh.Close()
    assert comm.allgather((kept, guessed)) == [(False, [False, False] + [True] * 3)] * p
    comm.Barrier()
    want = b"".join(_data(s, q).tobytes() for s in range(steps + 1) for q in range(p))
    assert read_file(path) == want and read_file(theirs) == want
